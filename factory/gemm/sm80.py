"""Ampere/Ada/consumer-Blackwell GEMM (sm_80, sm_86, sm_89, sm_120a; sm_90 portability build):
C = A·Bᵀ, batched.

One CTA computes a (tile_m, tile_n) block of C for one batch index:
  * a multistage cp.async pipeline streams (tile_m, tile_k) and (tile_n, tile_k) slabs of A and B
    into swizzled shared memory (stage count derived from the target's shared-memory capacity);
  * ldmatrix moves each k-block into registers one k-block ahead of the mma.sync that uses it;
  * fp32 accumulators are converted (and scaled for fp8) and staged through padded shared memory
    so global stores are 16-byte vectors.
Tails: rows past M (or N) are simply not loaded (they only feed C rows that are not stored); the
K tail is the last k-tile, whose out-of-range 16-byte vectors are zero-filled.  16-byte alignment
of every row and batch start is required (the signature's divisibility, checked by the loader).
Tiles are visited in groups of ``GROUP_M`` tile-rows so neighbouring CTAs share A and B in L2.

Epilogue fields (``bias``, ``silu_mul``, ``residual``; off by default, the same semantics and the
same packed gate/up weight layout as the sm90 family's): the fp32 accumulators are staged in
shared memory as fp32, and each thread's 16-byte output vector is computed from them,
``act(acc + bias[col]) + residual[row, col]``, before the same vector store.

fp8 scales: one per tensor (``scale_a``, ``scale_b`` of one element), or with ``row_scale`` one per
row of A and one per row of B (torch ``_scaled_mm``'s row-wise form, the sm90 family's
``scale_mode`` "row"): each accumulator is multiplied by scale_a[row]·scale_b[col] in registers
before the conversion to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import DTYPE_BYTES, Signature, TensorArg
from ..atoms import epilogue_sm80 as epi
from ..atoms import sm80 as atoms
from ..atoms.common import cutlass_dtype
from ..atoms.targets import Target
from ..registry import register
from . import tiles
from .common import GemmVariant

GROUP_M = 8
EPILOGUE_PAD_BYTES = 16  # per C row in shared memory: makes fragment stores bank-conflict free
MAX_STAGES = 5
# ``silu_mul``: the rows of B hold gate and up rows in blocks of this many, [gate 0..63; up 0..63;
# gate 64..127; ...] (runtime/epilogue.py ``pack_gate_up``; the sm90 family's GATE_UP_BLOCK), so
# a kernel tile of 128 (256) columns holds 64 (2 x 64) gate and the matching up columns.
GATE_UP_BLOCK = 64


@dataclass(frozen=True, kw_only=True)
class GemmSm80(GemmVariant):
    family: ClassVar[str] = "sm80"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm80.py", "gemm/common.py", "atoms/sm80.py", "atoms/common.py",
                                          "abi.py", "atoms/epilogue_sm80.py")

    tile: tuple[int, int, int] = field(default=(128, 128, 32), metadata={"tag": "t"})
    warps: tuple[int, int] = field(default=(2, 2), metadata={"tag": "w"})
    # Epilogue fields, in the order they apply to the fp32 accumulators: ``+ bias[col]`` (bias (N,),
    # the output dtype), ``silu_mul`` (out[:, j] = silu(gate_j)·up_j from gate/up rows of B in
    # blocks of GATE_UP_BLOCK, output N / 2 columns), ``+ residual[row, col]`` (the output's shape
    # and dtype, read as 16-byte vectors; may be ``c`` itself).  Off: the kernel is unchanged.
    bias: bool = field(default=False, metadata={"tag": "bias"})
    silu_mul: bool = field(default=False, metadata={"tag": "silumul"})
    residual: bool = field(default=False, metadata={"tag": "res"})
    # fp8: scale_a (M,) and scale_b (N,) float32, C[m, n] = scale_a[m]·scale_b[n]·Σ_k A[m, k]·B[n, k]
    # (``scale_mode`` "row"); off: one scale per tensor.
    row_scale: bool = field(default=False, metadata={"tag": "rowsc"})

    @property
    def scale_mode(self) -> str:
        """fp8 scales: "tensor" (one each) or "row" (scale_a (M,), scale_b (N,))."""
        return "row" if self.row_scale else "tensor"

    @property
    def has_epilogue(self) -> bool:
        return self.bias or self.silu_mul or self.residual

    @property
    def epilogue(self) -> list[str]:
        """The epilogue fields that are on, in the order they apply."""
        return [f for f in ("bias", "silu_mul", "residual") if getattr(self, f)]

    def signature(self) -> Signature:
        sig = super().signature()
        if self.row_scale:  # contiguous float32 vectors, one scale per row of A and of B
            args = tuple(a for a in sig.args if a.name not in ("scale_a", "scale_b"))
            args += (TensorArg("scale_a", "f32", ("M",), (1,), align=4),
                     TensorArg("scale_b", "f32", ("N",), (1,), align=4))
            return Signature(args, sig.divisibility)
        if not self.has_epilogue:
            return sig
        args, div = sig.args, dict(sig.divisibility)
        vc = self.vector(self.c)
        n_out = "N"
        if self.silu_mul:
            n_out = "NO"
            args = tuple(TensorArg("c", self.c, ("M", "NO", "L"), ("sCm", 1, "sCl")) if a.name == "c" else a
                         for a in args)
            div["NO"] = vc
        eb = DTYPE_BYTES[self.c]
        if self.bias:
            args += (TensorArg("bias", self.c, ("N",), (1,), align=eb),)
        if self.residual:
            args += (TensorArg("residual", self.c, ("M", n_out, "L"), ("sRm", 1, "sRl")),)
            div.update({"sRm": vc, "sRl": vc})
        return Signature(args, tuple(sorted(div.items())))

    def sass_requirements(self) -> tuple[str, ...]:
        # Ada's and consumer Blackwell's fp8 mma.sync disassembles as QMMA.  Hopper has no fp8
        # mma.sync unit: for the sm_90 portability build ptxas lowers it to two f16 HMMA.16816
        # per m16n8k32 (seen in SASS).
        if self.is_fp8 and self.tgt.fp8_mma_native:
            mma = r"\bQMMA\.16832\.F32\.E4M3"
        else:
            mma = r"\bHMMA\.16816\.F32"
        return (mma, r"\bLDGSTS\.E\.BYPASS\.LTC128B\.128", r"\bLDSM\.16\.M")

    def proof_level(self) -> str:
        """The native fp8 QMMA path (Ada, consumer Blackwell) has no executed counterpart (the sm_90
        build of the same source runs as f16 HMMA), so it is proven by its SASS only."""
        if self.is_fp8 and self.tgt.fp8_mma_native:
            return "sass-only"
        return self.tgt.proof

    @property
    def stages(self) -> int:
        """As many stages as the target's shared memory holds, between 3 and MAX_STAGES."""
        return max(2, min(MAX_STAGES, self.tgt.smem_per_cta // self._stage_bytes()))

    def _stage_bytes(self) -> int:
        m, n, k = self.tile
        return (m + n) * k * DTYPE_BYTES[self.ab]

    def _epilogue_bytes(self) -> int:
        m, n, _ = self.tile
        if self.has_epilogue:  # the accumulators are staged as fp32
            return m * (n * 4 + EPILOGUE_PAD_BYTES)
        return m * (n * DTYPE_BYTES[self.c] + EPILOGUE_PAD_BYTES)

    def smem_bytes(self) -> int:
        return max(self.stages * self._stage_bytes(), self._epilogue_bytes())

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]

    def can_implement(self) -> str | None:
        t = self.tgt
        if t.family != "sm80":
            return f"{t.name} is not an sm80-family target"
        if self.ab not in ("bf16", "f16", "e4m3"):
            return f"operand dtype {self.ab} not supported"
        if self.is_fp8:
            if not t.fp8:
                return f"fp8 mma.sync needs sm_89+, not {t.name}"
            if (self.a_major, self.b_major) != ("k", "k"):
                return "fp8 mma.sync takes K-major operands only"
            if self.c != "bf16":
                return "fp8 GEMM writes bf16"
            if self.row_scale and getattr(self, "split_k", 1) > 1:
                return "row scales run unsplit"
        elif self.row_scale:
            return "row scales apply to fp8 only"
        m, n, k = self.tile
        wm, wn = self.warps
        mma_k = 32 if self.is_fp8 else 16
        if m % (16 * wm) or n % (16 * wn) or k % mma_k:
            return f"tile {self.tile} does not divide into warps {self.warps} of MMAs"
        if k // mma_k < 2:
            return "tile_k must hold at least two MMA k-blocks (the register pipeline needs them)"
        if self.has_epilogue:
            if self.is_fp8 or self.c not in ("bf16", "f16"):
                return "epilogue fields take bf16/f16 operands and output"
            if getattr(self, "split_k", 1) > 1:
                return "epilogue fields run unsplit"
            if self.silu_mul and n % (2 * GATE_UP_BLOCK):
                return f"silu_mul needs a tile N of whole gate/up block pairs ({2 * GATE_UP_BLOCK} columns)"
        if self.stages < 3:
            return f"only {self.stages} stages fit in {t.smem_per_cta} bytes of shared memory"
        if self.smem_bytes() > t.smem_per_cta:
            return f"needs {self.smem_bytes()} bytes of shared memory, {t.name} has {t.smem_per_cta}"
        return None

    def make_kernel(self):
        k = GemmSm80Kernel(self)
        if getattr(self, "split_k", 1) > 1:
            return k.split
        if self.has_epilogue:
            return {(False, False): k, (True, False): k.with_bias, (False, True): k.with_res,
                    (True, True): k.with_bias_res}[(self.bias, self.residual)]
        return k.scaled if self.is_fp8 else k

    def describe(self) -> dict:
        d = super().describe()
        d.update(tile=list(self.tile), warps=list(self.warps), stages=self.stages, threads=self.threads)
        if self.is_fp8:
            d["scale_mode"] = self.scale_mode
        if self.has_epilogue:
            d["epilogue"] = self.epilogue
            if self.silu_mul:
                d["gate_up_block"] = GATE_UP_BLOCK
        return d


@dataclass(frozen=True, kw_only=True)
class GemmSm80SplitK(GemmSm80):
    """Split-K for decode-shaped problems (few output tiles, long K): CTA (tile, s) reduces its
    share of the k-tiles into an fp32 workspace slice, and a second kernel of the same launch
    sums the slices into C.  L must be 1; the loader allocates the (split_k, M, N) workspace."""

    split_k: int = field(default=4, metadata={"tag": "sk"})

    def can_implement(self) -> str | None:
        if self.split_k not in (2, 4, 8):
            return "split_k must be 2, 4 or 8"
        return super().can_implement()

    def _epilogue_bytes(self) -> int:  # the partial tile is staged as fp32
        m, n, _ = self.tile
        return m * (n * 4 + EPILOGUE_PAD_BYTES)

    def signature(self):
        base = super().signature()
        args = []
        for a in base.args:  # batch mode fixed to 1
            if a.name in ("a", "b", "c"):
                a = TensorArg(a.name, a.dtype, (*a.shape[:2], 1), a.stride, a.align)
            args.append(a)
        args.append(TensorArg("workspace", "f32", ("M", "N", self.split_k), ("sWm", 1, "sWs")))
        div = dict(base.divisibility)
        div.update(sWm=4, sWs=4)
        return Signature(tuple(args), tuple(sorted(div.items())))

    def describe(self) -> dict:
        d = super().describe()
        d.update(split_k=self.split_k, workspace={"dtype": "f32", "shape": ["split_k", "M", "N"]})
        return d


@register("gemm")
def enumerate_sm80(target: Target, tier: str) -> list[GemmVariant]:
    if target.family != "sm80":
        return []
    fp8 = tiles.SM80_FP8[target.fp8_mma_native]
    if tier == "test":
        specs = tiles.SM80_TEST + fp8[:1] + tiles.SM80_EPILOGUE_TEST
    else:
        specs = (tiles.SM80_DEFAULT + fp8 + tiles.SM80_FP8_ROW[target.fp8_mma_native]
                 + (tiles.SM80_FULL_EXTRA if tier == "full" else ()))
    out: list[GemmVariant] = [GemmSm80(target=target.name, **s) for s in specs]
    splits = tiles.SM80_SPLIT_K["test" if tier == "test" else "default"]
    out += [GemmSm80SplitK(target=target.name, **s) for s in splits]
    return out


class GemmSm80Kernel:
    """Host side (``__call__``) builds layouts, copies and the MMA; device side is ``kernel``."""

    def __init__(self, v: GemmSm80):
        self.v = v
        self.tile_m, self.tile_n, self.tile_k = v.tile
        self.threads = v.threads
        self.stages = v.stages
        self.ab_dtype = cutlass_dtype(v.ab)
        self.c_dtype = cutlass_dtype(v.c)
        self.a_contig = 1 if v.a_major == "k" else 0  # mode of (M, K) that is contiguous
        self.b_contig = 1 if v.b_major == "k" else 0
        self.is_fp8 = v.is_fp8
        self.row_scale = v.row_scale
        self.split_k = getattr(v, "split_k", 1)
        self.bias = v.bias
        self.silu_mul = v.silu_mul
        self.residual = v.residual
        self.has_epilogue = v.has_epilogue
        # the output tile: silu_mul writes half the kernel tile's columns
        self.tile_n_out = self.tile_n // 2 if v.silu_mul else self.tile_n

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
        self._launch(mA, mB, mC, None, None, stream)

    @cute.jit
    def with_bias(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mBias: cute.Tensor,
                  stream: cuda.CUstream):
        self._launch(mA, mB, mC, None, None, stream, mBias, None)

    @cute.jit
    def with_res(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mRes: cute.Tensor,
                 stream: cuda.CUstream):
        self._launch(mA, mB, mC, None, None, stream, None, mRes)

    @cute.jit
    def with_bias_res(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mBias: cute.Tensor,
                      mRes: cute.Tensor, stream: cuda.CUstream):
        self._launch(mA, mB, mC, None, None, stream, mBias, mRes)

    @cute.jit
    def split(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mWs: cute.Tensor, stream: cuda.CUstream):
        """Split-K: partial products into the fp32 workspace (M, N, split_k), then C = Σ partials."""
        self._launch(mA, mB, mWs, None, None, stream)
        threads = 256
        vec = atoms.VECTOR_BYTES * 8 // self.c_dtype.width
        total = cute.size(mC, mode=[0]) * cute.size(mC, mode=[1])
        self.reduce_kernel(mWs, mC).launch(
            grid=(cute.ceil_div(total, threads * vec), 1, 1), block=(threads, 1, 1), stream=stream,
        )

    @cute.kernel
    def reduce_kernel(self, mWs: cute.Tensor, mC: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        vec = atoms.VECTOR_BYTES * 8 // self.c_dtype.width
        N = cute.size(mC, mode=[1])
        first = (bid * 256 + tidx) * vec  # N is a multiple of vec: a vector never crosses a row
        m = first // N
        n = first - m * N
        if m < cute.size(mC, mode=[0]):
            acc = cute.make_rmem_tensor((vec,), cutlass.Float32)
            acc.fill(0.0)
            for s in cutlass.range_constexpr(self.split_k):
                for j in cutlass.range_constexpr(vec):
                    acc[j] = acc[j] + mWs[m, n + j, s]
            out = cute.make_rmem_tensor((vec,), self.c_dtype)
            out.store(acc.load().to(self.c_dtype))
            for j in cutlass.range_constexpr(vec):
                mC[m, n + j, 0] = out[j]

    @cute.jit
    def scaled(
        self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mScaleA: cute.Tensor,
        mScaleB: cute.Tensor, stream: cuda.CUstream,
    ):
        """fp8: C = (scale_a·scale_b)·A·Bᵀ with the scales read on the device (graph-safe); with
        ``row_scale`` C[m, n] = scale_a[m]·scale_b[n]·(A·Bᵀ)[m, n]."""
        self._launch(mA, mB, mC, mScaleA, mScaleB, stream)

    def _launch(self, mA, mB, mC, mScaleA, mScaleB, stream, mBias=None, mRes=None):
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        sA_layout = atoms.smem_layout(self.ab_dtype, self.a_contig, (tm, tk), self.stages)
        sB_layout = atoms.smem_layout(self.ab_dtype, self.b_contig, (tn, tk), self.stages)
        c_dtype = mC.element_type  # the fp32 workspace when splitting K
        # epilogue fields: the accumulators are staged as fp32
        s_dtype = cutlass.Float32 if cutlass.const_expr(self.has_epilogue) else c_dtype
        c_pad = atoms.VECTOR_BYTES * 8 // s_dtype.width
        sC_layout = cute.make_layout((tm, tn), stride=(tn + c_pad, 1))
        copy_A = atoms.g2s_tiled_copy(self.ab_dtype, self.a_contig, (tm, tk), self.threads)
        copy_B = atoms.g2s_tiled_copy(self.ab_dtype, self.b_contig, (tn, tk), self.threads)
        copy_C = atoms.vector_tiled_copy(c_dtype, 1, (tm, self.tile_n_out), self.threads)
        mma = atoms.tiled_mma(self.ab_dtype, self.v.warps)

        tiles_m = cute.ceil_div(cute.size(mC, mode=[0]), tm)
        tiles_n = cute.ceil_div(cute.size(mC, mode=[1]), tn)
        if cutlass.const_expr(self.silu_mul):  # the kernel's N is b's rows (gate and up)
            tiles_n = cute.ceil_div(cute.size(mB, mode=[0]), tn)
        if cutlass.const_expr(self.has_epilogue):
            self.kernel(
                mA, mB, mC, mScaleA, mScaleB, sA_layout, sB_layout, sC_layout, copy_A, copy_B, copy_C, mma,
                mBias, mRes,
            ).launch(
                grid=(tiles_m * tiles_n, 1, cute.size(mC, mode=[2])),
                block=(self.threads, 1, 1),
                smem=self.v.smem_bytes(),
                stream=stream,
            )
        else:
            self.kernel(
                mA, mB, mC, mScaleA, mScaleB, sA_layout, sB_layout, sC_layout, copy_A, copy_B, copy_C, mma,
            ).launch(
                grid=(tiles_m * tiles_n, 1, cute.size(mC, mode=[2])),
                block=(self.threads, 1, 1),
                smem=self.v.smem_bytes(),
                stream=stream,
            )

    @cute.kernel
    def kernel(
        self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mScaleA, mScaleB,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, sC_layout: cute.Layout,
        copy_A: cute.TiledCopy, copy_B: cute.TiledCopy, copy_C: cute.TiledCopy, mma: cute.TiledMma,
        mBias=None, mRes=None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, batch = cute.arch.block_idx()
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        M = cute.size(mC, mode=[0])
        N = cute.size(mC, mode=[1])
        K = cute.size(mA, mode=[1])
        N_out = N
        if cutlass.const_expr(self.silu_mul):  # the kernel's N: b's rows; c has N / 2 columns
            N = cute.size(mB, mode=[0])

        # ---- grouped rasterisation: GROUP_M tile-rows share each B column block in L2 ----------
        tiles_m = (M + tm - 1) // tm
        tiles_n = (N + tn - 1) // tn
        per_group = GROUP_M * tiles_n
        group = bid // per_group
        first_m = group * GROUP_M
        group_rows = cutlass.min(tiles_m - first_m, GROUP_M)
        tile_m_idx = first_m + (bid % per_group) % group_rows
        tile_n_idx = (bid % per_group) // group_rows

        coord = (tile_m_idx, tile_n_idx, None)
        # Split-K: the grid's z is the split (mC is the fp32 workspace); A and B have one batch.
        ab_batch = 0 if cutlass.const_expr(self.split_k > 1) else batch
        gA = cute.local_tile(mA[None, None, ab_batch], (tm, tn, tk), coord, proj=(1, None, 1))
        gB = cute.local_tile(mB[None, None, ab_batch], (tm, tn, tk), coord, proj=(None, 1, 1))
        gC = cute.local_tile(mC[None, None, batch], (tm, self.tile_n_out, tk), coord, proj=(1, 1, None))
        # Coordinate tensors mirror the tiles, for predication.
        cA = cute.local_tile(cute.make_identity_tensor((M, K)), (tm, tn, tk), (tile_m_idx, tile_n_idx, None), proj=(1, None, 1))
        cB = cute.local_tile(cute.make_identity_tensor((N, K)), (tm, tn, tk), (tile_m_idx, tile_n_idx, None), proj=(None, 1, 1))
        cC = cute.local_tile(cute.make_identity_tensor((M, N_out)), (tm, self.tile_n_out, tk), (tile_m_idx, tile_n_idx, None), proj=(1, 1, None))

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.v.smem_bytes(), byte_alignment=128)
        sA = cute.make_tensor(cute.recast_ptr(storage, dtype=self.ab_dtype), sA_layout)
        sB_ptr = cute.recast_ptr(storage + cute.cosize(sA_layout) * self.ab_dtype.width // 8, dtype=self.ab_dtype)
        sB = cute.make_tensor(sB_ptr, sB_layout)
        c_dtype = mC.element_type
        s_dtype = cutlass.Float32 if cutlass.const_expr(self.has_epilogue) else c_dtype
        sC = cute.make_tensor(cute.recast_ptr(storage, dtype=s_dtype), sC_layout)

        # ---- global -> shared partitions and predicates ----------------------------------------
        thr_A = copy_A.get_slice(tidx)
        thr_B = copy_B.get_slice(tidx)
        tAgA = thr_A.partition_S(gA)  # (CPY, CPY_M, CPY_K, k_tiles)
        tAsA = thr_A.partition_D(sA)  # (CPY, CPY_M, CPY_K, stages)
        tAcA = thr_A.partition_S(cA)
        tBgB = thr_B.partition_S(gB)
        tBsB = thr_B.partition_D(sB)
        tBcB = thr_B.partition_S(cB)
        k_tiles = cute.size(tAgA, mode=[3])
        # This CTA's k-tiles: [k_begin, k_begin + k_count) (all of them unless splitting K).
        k_begin = cutlass.Int32(0)
        k_count = k_tiles
        if cutlass.const_expr(self.split_k > 1):
            per_split = (k_tiles + self.split_k - 1) // self.split_k
            k_begin = batch * per_split
            k_count = k_tiles - k_begin
            if k_count > per_split:
                k_count = per_split
            if k_count < 0:
                k_count = 0

        A_ops = (copy_A, tAgA, tAsA, tAcA, M, K)
        B_ops = (copy_B, tBgB, tBsB, tBcB, N, K)
        has_tail = K % tk != 0
        # Prologue: stages-1 tiles in flight.
        for s in cutlass.range_constexpr(self.stages - 1):
            if s < k_count:
                if has_tail and k_begin + s == k_tiles - 1:
                    self._load(A_ops, k_begin + s, s, True)
                    self._load(B_ops, k_begin + s, s, True)
                else:
                    self._load(A_ops, k_begin + s, s, False)
                    self._load(B_ops, k_begin + s, s, False)
            cute.arch.cp_async_commit_group()

        # ---- shared -> register partitions -----------------------------------------------------
        thr_mma = mma.get_slice(tidx)
        tCrA = mma.make_fragment_A(thr_mma.partition_A(sA)[None, None, None, 0])
        tCrB = mma.make_fragment_B(thr_mma.partition_B(sB)[None, None, None, 0])
        acc = mma.make_fragment_C(thr_mma.partition_C(sC if cutlass.const_expr(self.silu_mul) else gC))
        acc.fill(0.0)
        s2r_A = cute.make_tiled_copy_A(atoms.s2r_atom(self.ab_dtype, self.a_contig), mma)
        s2r_B = cute.make_tiled_copy_B(atoms.s2r_atom(self.ab_dtype, self.b_contig), mma)
        tXsA = s2r_A.get_slice(tidx).partition_S(sA)
        tXrA = s2r_A.get_slice(tidx).retile(tCrA)
        tXsB = s2r_B.get_slice(tidx).partition_S(sB)
        tXrB = s2r_B.get_slice(tidx).retile(tCrB)
        k_blocks = cute.size(tCrA, mode=[2])

        read_stage = cutlass.Int32(0)
        write_stage = cutlass.Int32(self.stages - 1)
        cute.arch.cp_async_wait_group(self.stages - 2)
        cute.arch.sync_threads()
        cute.copy(s2r_A, tXsA[None, None, 0, read_stage], tXrA[None, None, 0])
        cute.copy(s2r_B, tXsB[None, None, 0, read_stage], tXrB[None, None, 0])

        # ---- main loop: tile k_tile is in registers/smem; tile k_tile+stages-1 is being fetched
        for k_tile in range(k_count):
            for kb in cutlass.range_constexpr(k_blocks):
                if kb == k_blocks - 1:
                    # Move to the next stage: wait for it to land, and make sure every warp is
                    # done with the stage the next cp.async will overwrite.
                    read_stage = read_stage + 1
                    if read_stage == self.stages:
                        read_stage = 0
                    cute.arch.cp_async_wait_group(self.stages - 2)
                    cute.arch.sync_threads()
                kb_next = (kb + 1) % k_blocks
                cute.copy(s2r_A, tXsA[None, None, kb_next, read_stage], tXrA[None, None, kb_next])
                cute.copy(s2r_B, tXsB[None, None, kb_next, read_stage], tXrB[None, None, kb_next])
                if kb == 0:
                    fetch = k_tile + self.stages - 1
                    if fetch < k_count:
                        if has_tail and k_begin + fetch == k_tiles - 1:
                            self._load(A_ops, k_begin + fetch, write_stage, True)
                            self._load(B_ops, k_begin + fetch, write_stage, True)
                        else:
                            self._load(A_ops, k_begin + fetch, write_stage, False)
                            self._load(B_ops, k_begin + fetch, write_stage, False)
                    cute.arch.cp_async_commit_group()
                    write_stage = write_stage + 1
                    if write_stage == self.stages:
                        write_stage = 0
                cute.gemm(mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)

        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

        if cutlass.const_expr(self.has_epilogue):
            self._fused_epilogue(acc, sC, gC, cC, thr_mma, copy_C, tidx, tile_n_idx, batch, M, N_out, mBias,
                                 mRes, coord)
        else:
            # ---- epilogue: registers -> padded smem -> 16-byte global stores -------------------
            out = cute.make_fragment_like(acc, c_dtype)
            if cutlass.const_expr(self.row_scale):
                epi.apply_row_col_scales(acc, thr_mma.partition_C(cC), mScaleA, mScaleB)
                out.store(acc.load().to(c_dtype))
            elif cutlass.const_expr(self.is_fp8):
                scale = mScaleA[0] * mScaleB[0]
                out.store((acc.load() * scale).to(c_dtype))
            else:
                out.store(acc.load().to(c_dtype))
            cute.autovec_copy(out, thr_mma.partition_C(sC))
            cute.arch.sync_threads()
            thr_C = copy_C.get_slice(tidx)
            tCsC = thr_C.partition_S(sC)
            tCgC = thr_C.partition_D(gC)
            tCcC = thr_C.partition_D(cC)
            staged = cute.make_fragment_like(tCsC)
            cute.autovec_copy(tCsC, staged)
            for i in cutlass.range_constexpr(cute.size(tCgC, mode=[1])):
                for j in cutlass.range_constexpr(cute.size(tCgC, mode=[2])):
                    m, n = tCcC[0, i, j]
                    if m < M and n < N:
                        cute.copy(copy_C, staged[None, i, j], tCgC[None, i, j])

    @cute.jit
    def _fused_epilogue(self, acc, sC, gC, cC, thr_mma, copy_C, tidx, tile_n_idx, batch, M, N_out, mBias, mRes,
                        coord):
        """fp32 accumulators -> padded smem; per 16-byte output vector: act(acc + bias) + residual
        (the residual read as one vector at the output's coordinates, before its store)."""
        cute.autovec_copy(acc, thr_mma.partition_C(sC))
        cute.arch.sync_threads()
        tm, tn_out = self.tile_m, self.tile_n_out
        thr_C = copy_C.get_slice(tidx)
        tCgC = thr_C.partition_D(gC)
        tCcC = thr_C.partition_D(cC)
        tCcL = thr_C.partition_D(cute.make_identity_tensor((tm, tn_out)))  # coordinates in the tile
        col0 = tile_n_idx * self.tile_n  # the tile's first kernel column (bias index)
        for i in cutlass.range_constexpr(cute.size(tCgC, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(tCgC, mode=[2])):
                m, n = tCcC[0, i, j]
                if m < M and n < N_out:
                    vals = cute.make_fragment_like(tCgC[None, i, j], cutlass.Float32)
                    epi.epilogue_vector(sC, tCcL[None, i, j], vals, mBias, col0, GATE_UP_BLOCK, self.bias,
                                        self.silu_mul)
                    out = cute.make_fragment_like(tCgC[None, i, j])
                    if cutlass.const_expr(self.residual):
                        gR = cute.local_tile(mRes[None, None, batch], (tm, tn_out, self.tile_k), coord,
                                             proj=(1, 1, None))
                        cute.copy(copy_C, thr_C.partition_D(gR)[None, i, j], out)
                        out.store((vals.load() + out.load().to(cutlass.Float32)).to(self.c_dtype))
                    else:
                        out.store(vals.load().to(self.c_dtype))
                    cute.copy(copy_C, out, tCgC[None, i, j])

    @cute.jit
    def _load(self, ops, k_tile, stage, tail: cutlass.Constexpr):
        """Copy one k-tile of one operand; rows past ``extent_mn`` are skipped, and on the tail
        tile 16-byte vectors past K are zero-filled (they meet the other operand's tail)."""
        tiled_copy, gsrc, sdst, coords, extent_mn, K = ops
        for i in cutlass.range_constexpr(cute.size(sdst, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(sdst, mode=[2])):
                mn, k = coords[0, i, j, k_tile]
                if cutlass.const_expr(tail):
                    if k < K:
                        if mn < extent_mn:
                            cute.copy(tiled_copy, gsrc[None, i, j, k_tile], sdst[None, i, j, stage])
                    else:
                        sdst[None, i, j, stage].fill(0)
                else:
                    if mn < extent_mn:
                        cute.copy(tiled_copy, gsrc[None, i, j, k_tile], sdst[None, i, j, stage])
