"""Decode GEMM over pre-packed weights: C = (sa·sb)·A·Bᵀ for M ≤ 16, fp8 e4m3 in, bf16 out.

Built for sm_90 (executed on the H100) and for Blackwell: the datacenter target (sm_100a/sm_100f:
10.0, 10.3) and consumer Blackwell (sm_120a: 12.0), both ``sass-only``.  Nothing here needs an
arch-specific feature (mma.sync, 16-byte loads, clusters with DSMEM, PDL are all sm_90+), so the
source is the same; what differs is how ptxas runs the m16n8k32 e4m3 MMA: 10.0, like 9.0, has no
fp8 mma.sync unit and lowers it to two f16 ``HMMA.16816.F32`` (seen in SASS), 12.0 runs it as
``QMMA.16832.F32.E4M3.E4M3`` (``Target.fp8_mma_native``).

For a 16-32 MB weight matrix every TMA kernel here stops at the time of a pure TMA read of those
bytes (notes/gemm-sm90.md, the decode stream); plain 16-byte loads read them ~8 % faster.  So this kernel
feeds mma.sync (m16n8k32, the activations as the 16-row operand) from registers that 16-byte loads
fill, straight from global memory: no shared-memory staging, no TMA.  The weight loads do not
allocate in L1 (read once); the activations, which every N-warp of an SM reads, stay there.

Packed weights (``runtime/packed.py: pack_b``, done once when a server loads its weights): B (N, K)
stored as (N/8, K/64, 8, 64), i.e. [nb, kc, r, j] = B[8 nb + r, 64 kc + j].  Lane 4 g + q of a
warp loads the 16 bytes [nb, kc, g, 16 q : 16 q + 16]: a warp's load is 512 contiguous bytes.  The
lane's 16 activation bytes of rows g and g + 8 at the same K offsets are loaded alike.  Inside a
64-byte chunk the two k32 MMA steps then see the K order permuted, but identically for both
operands (step s takes bytes 8 s .. 8 s + 7 of each lane's 16 as its k and k + 16 words), so
the sums are exact dot products with no shuffles.

CTA: ``warps_n`` × ``warps_k`` warps, each warp ``atoms`` n8 atoms (8·atoms weight rows) over
K / (cluster_k · warps_k) of K; a cluster of ``cluster_k`` CTAs splits K further.  Grid
(N / rows, cluster_k), one wave where the loader's selection can have it (runtime/packed.py);
``griddepcontrol.launch_dependents`` comes first (a dependent grid is scheduled only once every
CTA of this one has run it, so CTAs of a second wave are never locked out).  A warp loads
``unroll`` 64-byte chunks per batch (16·atoms·unroll bytes of weights per thread); with
``early_b`` the first batch is issued before
``griddepcontrol.wait`` (B must not be written by a kernel still running: the loader's
``b_constant``), the activations always after it.  Partial sums: the K-warps through shared
memory (every thread sums a few outputs), then the cluster's CTAs into rank 0 through DSMEM
(st.async on an mbarrier armed with the byte count), which scales, converts and stores C.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature, TensorArg
from ..atoms.targets import Target
from ..registry import register
from . import tiles
from .common import GemmVariant

M_MAX = 16  # the MMA's row count: activations rows per call at most
PACK_FORMAT = "rows8_k64"  # [N/8][K/64][8][64]: see the module docstring
EARLY_LDG_SASS = r"(?s)\bLDG\.E\.NA\.128\b.*?\bACQBULK\b"  # early_b: weight loads before the PDL wait


@dataclass(frozen=True, kw_only=True)
class GemmDecode(GemmVariant):
    family: ClassVar[str] = "decode"
    sources: ClassVar[tuple[str, ...]] = ("gemm/decode.py", "gemm/common.py", "abi.py")

    warps_n: int = field(default=2, metadata={"tag": "wn"})
    warps_k: int = field(default=4, metadata={"tag": "wk"})
    atoms: int = field(default=4, metadata={"tag": "g"})
    unroll: int = field(default=2, metadata={"tag": "u"})
    cluster_k: int = field(default=4, metadata={"tag": "ck"})
    early_b: bool = field(default=False, metadata={"tag": "eb"})

    @property
    def rows(self) -> int:
        return 8 * self.atoms * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_n * self.warps_k

    @property
    def ctas_per_sm(self) -> int:
        """CTAs each SM must hold for the grid to be one wave (registers capped to fit them)."""
        return max(1, 1024 // self.threads // 2)

    def sass_requirements(self) -> tuple[str, ...]:
        # Hopper and datacenter Blackwell run fp8 mma.sync as f16 HMMA, consumer Blackwell as QMMA;
        # 16-byte weight loads that do not allocate in L1 (.NA); PDL; the DSMEM reduction.
        mma = r"\bQMMA\.16832\.F32\.E4M3\.E4M3\b" if self.tgt.fp8_mma_native else r"\bHMMA\.16816\.F32"
        req = (mma, r"\bLDG\.E\.NA\.128\b", r"\bLDG\.E\.128\b", r"\bACQBULK\b")
        if self.cluster_k > 1:
            req += (r"\bSTAS\b",)
        if self.early_b:
            req += (EARLY_LDG_SASS,)
        return req

    def proof_level(self) -> str:
        return self.tgt.proof

    def red_row(self) -> int:
        return self.rows + 4  # padded: the 8 lanes of one column land on different banks

    def smem_bytes(self) -> int:
        return 4 * (self.warps_k * M_MAX * self.red_row() + max(1, self.cluster_k - 1) * M_MAX * self.rows) + 64

    def can_implement(self) -> str | None:
        t = self.tgt
        if not builds_for(t):
            return "the packed decode kernel is built for sm_90 and the Blackwell targets (fp8 mma.sync, PDL, clusters)"
        if self.cluster_k > 1 and not t.clusters:
            return f"{t.name} has no thread block clusters"
        if self.early_b and t.family == "sm100":
            # ptxas for 10.x needs more than the 128 registers that 2 CTAs of 256 threads per SM
            # leave: the early_b twins spill (5 LDL + 5 STL, 24-byte frame; the plain ones take
            # 118-120).  On 10.x the plain variant serves b_constant too.
            return "early_b spills on the datacenter Blackwell targets at 2 CTAs per SM"
        if (self.ab, self.c, self.a_major, self.b_major) != ("e4m3", "bf16", "k", "k"):
            return "e4m3 in, bf16 out, K-major only"
        if self.cluster_k not in (1, 2, 4):
            return "cluster_k must be 1, 2 or 4"
        if self.threads not in (128, 256, 512) or (M_MAX * self.rows) % self.threads \
                or M_MAX * self.rows // self.threads not in (1, 2, 4):
            return "128, 256 or 512 threads, each summing 1, 2 or 4 whole outputs"
        if self.smem_bytes() * self.ctas_per_sm > t.smem_per_cta:
            return f"needs {self.smem_bytes()} bytes of shared memory"
        return None

    def k_multiple(self) -> int:
        """K (bytes) must be a multiple of this: whole load batches for every warp of every CTA."""
        return 64 * self.unroll * self.warps_k * self.cluster_k

    def signature(self) -> Signature:
        args = (
            TensorArg("a", "e4m3", ("M", "K"), ("sAm", 1)),
            # Packed weights (N / 8, K / 64, 8, 64) seen as (N / 8, K / 64, lane, 16 bytes).
            TensorArg("b", "e4m3", ("NB", "KC", 32, 16), ("sBn", 512, 16, 1)),
            TensorArg("c", "bf16", ("M", "N"), ("sCm", 1)),
            TensorArg("scale_a", "f32", (1,), (1,), align=4),
            TensorArg("scale_b", "f32", (1,), (1,), align=4),
        )
        div = {"sAm": 16, "K": self.k_multiple(), "sBn": 512, "sCm": 8, "N": self.rows,
               "NB": self.rows // 8, "KC": self.unroll * self.warps_k * self.cluster_k}
        return Signature(args, tuple(sorted(div.items())))

    def make_kernel(self):
        return GemmDecodeKernel(self).scaled

    def describe(self) -> dict:
        d = super().describe()
        d.update(
            packed_b={"format": PACK_FORMAT, "shape": ["N/8", "K/64", 32, 16],
                      "element": "[nb, kc, 4 r + i, j] = B[8 nb + r, 64 kc + 16 i + j]"},
            threads=self.threads, cluster=[1, self.cluster_k], rows_per_cta=self.rows,
            ctas_per_sm=self.ctas_per_sm, max_m=M_MAX, k_multiple=self.k_multiple(),
            smem_bytes=self.smem_bytes(),
        )
        return d


def builds_for(t: Target) -> bool:
    """sm_90 (the Hopper build, which runs on an H100: sm_90a adds nothing this kernel uses) and
    every Blackwell target with fp8 mma.sync: sm_100a/sm_100f/sm_103a and sm_120a."""
    return t.name == "sm_90" or (t.capability >= (10, 0) and t.fp8)


@register("gemm")
def enumerate_decode(target: Target, tier: str) -> list[GemmVariant]:
    # The H100's shapes serve Blackwell as well (unmeasured there: notes/blackwell.md, decode).
    if not builds_for(target):
        return []
    out = []
    for wn, wk, g, u, ck in tiles.DECODE_SHAPES["test" if tier == "test" else "default"]:
        for eb in (False, True):
            v = GemmDecode(target=target.name, ab="e4m3", c="bf16", warps_n=wn, warps_k=wk, atoms=g,
                           unroll=u, cluster_k=ck, early_b=eb)
            if v.can_implement() is None:
                out.append(v)
    return out


class GemmDecodeKernel:
    def __init__(self, v: GemmDecode):
        self.v = v
        self.ck = v.cluster_k
        self.wn, self.wk, self.g, self.u = v.warps_n, v.warps_k, v.atoms, v.unroll
        self.rows = v.rows
        self.threads = v.threads
        self.early_b = v.early_b
        self.cl = self.ck > 1  # a cluster along K: partial sums through DSMEM

    @cute.jit
    def scaled(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mSa: cute.Tensor,
               mSb: cute.Tensor, stream: cuda.CUstream):
        op = cute.nvgpu.warp.MmaFP8Op(cutlass.Float8E4M3FN, cutlass.Float32, (16, 8, 32))
        tiled_mma = cute.make_tiled_mma(op)

        @cute.struct
        class SharedStorage:
            red_w: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.wk * M_MAX * self.v.red_row()], 16]
            red_c: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, max(1, self.ck - 1) * M_MAX * self.rows], 16]
            bar: cute.struct.MemRange[cutlass.Int64, 1]

        self.shared_storage = SharedStorage
        n_blocks = cute.size(mC, mode=[1]) // self.rows
        self.kernel(mA, mB, mC, mSa, mSb, tiled_mma).launch(
            grid=(n_blocks, self.ck, 1), block=(self.threads, 1, 1), cluster=(1, self.ck, 1),
            stream=stream, use_pdl=True, min_blocks_per_mp=self.v.ctas_per_sm, preferred_smem_carveout=100,
        )

    @staticmethod
    def _weights_atom():
        """16-byte weight loads that do not allocate in L1: the weights are read once, and
        allocating them evicts the activations every N-warp of the SM reads again (measured on
        the H100, fp8 16 x 4096 x 4096: 8.05 -> 7.44 us; the activations through the read-only
        path or bypassing L1 changed nothing more)."""
        nv = cute.nvgpu
        return cute.make_copy_atom(nv.CopyG2ROp(), cutlass.Float8E4M3FN, num_bits_per_copy=128,
                                   l1c_evict_priority=nv.CacheEvictionPriority.NO_ALLOCATE)

    @cute.jit
    def _load_b(self, mB, tCrB, nb0, kc, g, q):  # noqa: PLR0913
        """This lane's weights for one batch: 16 bytes per (n8 atom, 64-byte chunk)."""
        atom = self._weights_atom()
        for j in cutlass.range_constexpr(self.g):
            for c in cutlass.range_constexpr(self.u):
                cute.copy(atom, mB[nb0 + j, kc + c, 4 * g + q, None],
                          cute.make_tensor(tCrB.iterator + (16 * self.u * j + 16 * c), cute.make_layout(16)))

    @cute.jit
    def _load_a(self, gA16, stg, M, g, q, kc):
        """This lane's activations for one batch: 16 bytes of rows g and g + 8 per chunk.  Rows
        past M read row M - 1 instead: they only feed rows of C that are never stored."""
        for c in cutlass.range_constexpr(self.u):
            for h in cutlass.range_constexpr(2):
                row = cutlass.min(g + 8 * h, M - 1)
                cute.autovec_copy(gA16[(0, None), (row, 4 * (kc + c) + q)],
                                  cute.make_tensor(stg.iterator + (32 * c + 16 * h), cute.make_layout(16)))

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mSa: cute.Tensor,
               mSb: cute.Tensor, tiled_mma: cute.TiledMma):
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g = lane // 4
        q = lane % 4
        wn = warp % self.wn
        wk = warp // self.wn
        rank = cute.arch.make_warp_uniform(by)  # the CTA's K slice (= its rank in a cluster along K)
        M = cute.size(mA, mode=[0])
        K = cute.size(mA, mode=[1])
        chunks = K // (64 * self.ck * self.wk)  # 64-byte K chunks per warp
        batches = chunks // self.u
        nb0 = bx * (self.rows // 8) + wn * self.g
        kc0 = (rank * self.wk + wk) * chunks

        # Registers: per batch, the weights of atom j, chunk c are 16 bytes at 16 (u j + c) (k32
        # step 2 c + s: bytes 8 s .. 8 s + 7, b0 then b1); the activations 32 bytes at 32 c (row
        # g, then row g + 8), moved into the MMA's own A fragment.
        tCrB = cute.make_rmem_tensor(
            cute.make_layout(((4, 2), self.g, 2 * self.u), stride=((1, 4), 16 * self.u, 8)), cutlass.Float8E4M3FN)
        # The next kernel's CTAs may take our SMs as ours leave (it is scheduled once every CTA of
        # this grid has run this or exited, so a second wave is never locked out).
        cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.early_b):
            self._load_b(mB, tCrB, nb0, kc0, g, q)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        red_w = storage.red_w.get_tensor(
            cute.make_layout((self.wk, M_MAX, self.rows), stride=(M_MAX * self.v.red_row(), self.v.red_row(), 1)))
        red_c = storage.red_c.get_tensor(
            cute.make_layout((max(1, self.ck - 1), M_MAX, self.rows), stride=(M_MAX * self.rows, self.rows, 1)))
        per_t = M_MAX * self.rows // self.threads
        red_cv = cute.make_tensor(red_c.iterator, cute.make_layout(
            (max(1, self.ck - 1), M_MAX, self.rows // per_t, per_t), stride=(M_MAX * self.rows, self.rows, per_t, 1)))
        bar = storage.bar.data_ptr()
        if cutlass.const_expr(self.cl):
            if warp == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(bar, 1)
                    if rank == 0:  # the others' partial sums of the rows that exist
                        cute.arch.mbarrier_arrive_and_expect_tx(bar, (self.ck - 1) * M * self.rows * 4)
            cute.arch.mbarrier_init_fence()
            cute.arch.cluster_arrive_relaxed()

        thr_mma = tiled_mma.get_slice(lane)
        stg = cute.make_rmem_tensor(cute.make_layout(32 * self.u), cutlass.Float8E4M3FN)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_shape_A((M_MAX, 64 * self.u)))
        gA16 = cute.zipped_divide(mA, (1, 16))  # ((1, 16), (M, K / 16))
        cC = cute.make_identity_tensor((M_MAX, 8 * self.g))
        tCcC = thr_mma.partition_C(cC)
        acc = cute.make_rmem_tensor(tCcC.shape, cutlass.Float32)
        acc.fill(0.0)

        cute.arch.griddepcontrol_wait()
        for b in range(batches):
            if cutlass.const_expr(self.early_b):
                if b > 0:
                    self._load_b(mB, tCrB, nb0, kc0 + b * self.u, g, q)
            else:
                self._load_b(mB, tCrB, nb0, kc0 + b * self.u, g, q)
            self._load_a(gA16, stg, M, g, q, kc0 + b * self.u)
            # step ks = 2 c + s; A value (v0, v1, v2): byte v0 of the row-(g + 8 v1) word v2.
            for ks in cutlass.range_constexpr(2 * self.u):
                for v2 in cutlass.range_constexpr(2):
                    for v1 in cutlass.range_constexpr(2):
                        for v0 in cutlass.range_constexpr(4):
                            tCrA[(v0, v1, v2), 0, ks] = stg[32 * (ks // 2) + 16 * v1 + 8 * (ks % 2) + 4 * v2 + v0]
            cute.gemm(tiled_mma, acc, tCrA, tCrB, acc)

        # The K-warps: every thread writes its partial sums, then sums whole outputs.
        n_w = wn * 8 * self.g
        for v in cutlass.range_constexpr(cute.size(acc)):
            m, n = tCcC[v]
            red_w[wk, m, n_w + n] = acc[v]
        cute.arch.sync_threads()
        # Each thread sums `per` adjacent outputs of one row (one vector store to rank 0).
        per = M_MAX * self.rows // self.threads
        col = (tidx % (self.rows // per)) * per
        m = tidx // (self.rows // per)
        part = cute.make_rmem_tensor(cute.make_layout(per), cutlass.Float32)
        for i in cutlass.range_constexpr(per):
            s = red_w[0, m, col + i]
            for w in cutlass.range_constexpr(1, self.wk):
                s = s + red_w[w, m, col + i]
            part[i] = s
        scale = mSa[0] * mSb[0]
        if cutlass.const_expr(self.cl):
            # Rank 0 reads its shared memory only once the mbarrier has counted every byte the
            # others store there; they may exit right after their stores.
            cute.arch.cluster_wait()
            if rank == 0:
                cute.arch.mbarrier_wait(bar, 0)
                for i in cutlass.range_constexpr(per):
                    s = part[i]
                    for r in cutlass.range_constexpr(self.ck - 1):
                        s = s + red_c[r, m, col + i]
                    part[i] = s
            elif m < M:
                bits = cute.recast_tensor(part, cutlass.Int32)
                dst = red_cv[rank - 1, m, col // per, None].iterator
                if cutlass.const_expr(per == 1):
                    cute.arch.store_async_dsmem(dst, bits[0], bar, 0)
                elif cutlass.const_expr(per == 2):
                    cute.arch.store_async_dsmem(dst, (bits[0], bits[1]), bar, 0)
                else:
                    cute.arch.store_async_dsmem(dst, (bits[0], bits[1], bits[2], bits[3]), bar, 0)
        if rank == 0:
            if m < M:
                for i in cutlass.range_constexpr(per):
                    mC[m, bx * self.rows + col + i] = (part[i] * scale).to(cutlass.BFloat16)
