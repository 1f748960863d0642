"""fp8 (e4m3) FlashAttention forward for Hopper (sm_90a): the sm90 family's kernel
(attention/sm90.py: TMA producer warp, two consumer warpgroups, intra-warpgroup overlap,
persistent CTAs) with fp8 WGMMAs, per-(batch, kv head) descale factors and a bfloat16 O.

* S = Q·Kᵀ: fp8 WGMMA (k32 steps), both operands K-major in smem as in the 16-bit kernel.
  ``q_descale·k_descale`` of the problem's (batch, kv head) multiplies the launch's
  softmax_scale·log2(e): the one FFMA per score of the online softmax applies it.
* P (fp32 in S's accumulator registers) -> e4m3 -> the register A operand of P·V.  The fp8 A
  fragment holds, per thread and 32-key block, four keys of one row per register; the
  accumulator holds pairs of keys of two rows.
* P·V: fp8 WGMMA needs V K-major (keys contiguous in smem).  Two ways (``v_layout``):
  - "bshd" (V as K, (B, Sk, Hkv, D)): V tiles land by TMA in staging slots; warps 1-3 of the
    producer warpgroup transpose them into the slots P·V reads (:meth:`transpose_tile`: per 16
    keys x 32 head_dim bytes one ldmatrix.x4.trans, four byte permutes, one stmatrix.x4),
    storing the keys of each 16-key group in the order a thread's own P registers hold them, so
    P needs two byte permutes per register pair and no exchange between threads
    (:meth:`store_p_local`).  Tiles of 64 or 128 keys, every head_dim.
  - "bhds" (V pre-transposed, (B, Hkv, D, Sk)): (D, keys) tiles reach smem by TMA as they are;
    keys stay in natural order, so P's 16-bit halves are exchanged inside each quad of threads
    (two shuffles and two byte permutes per register pair, :meth:`store_p_exchange`).
* O·v_descale -> bf16 -> its own smem slabs (O's type differs from Q's) -> TMA store; LSE in
  natural-log units of the de-scaled scores.

Arguments (contract.signature_fp8): q (B,Sq,Hq,D) e4m3, k (B,Sk,Hkv,D) e4m3, v (B,Hkv,D,Sk)
e4m3, o (B,Sq,Hq,D) bf16, lse (B,Hq,Sq) f32, q_descale/k_descale/v_descale (B,Hkv) f32 (any
strides: a per-tensor value is a zero-stride view), softmax_scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature
from ..atoms.sm90_matrix import ldsm_x4_trans, stsm_x4
from ..atoms.targets import Target
from ..registry import register
from . import contract, layout
from .fp8_order import LDSM_JOIN, P_EXCHANGE, exchange_sources, p_local_source
from .sm90 import WG_ROWS, AttentionSm90, FlashFwdSm90, default_schedule

FP8_HEAD_DIMS = (64, 128, 256)
# setmaxnreg budgets with the transposing warps (per thread: producer warpgroup, consumers)
TRANSPOSE_PRODUCER_REGS, TRANSPOSE_CONSUMER_REGS = 40, 232
# (three consumer warpgroups: 40 + 3·152 of the 512 per thread slot)
TRANSPOSE_CONSUMER_REGS_3 = 152
# two consumer warpgroups whose accumulators need more than 232 (head_dim 256, 128-key tiles:
# 64 + 128 + 16 live + 32 = 240): 24 + 2·240; the transposing warps then keep one ldmatrix.x4
# result in flight instead of four (no spills at 24)
TRANSPOSE_PRODUCER_REGS_WIDE, TRANSPOSE_CONSUMER_REGS_WIDE = 24, 240


def register_pool_fits(producer: int, consumer: int, consumers: int) -> bool:
    """Whether the setmaxnreg budgets fit the registers the CTA holds from its launch: every
    thread starts with the launch count (65536 / threads, rounded down to a multiple of 8: 168
    for 384 threads), the producer warpgroup's decrease returns registers to the CTA's pool and
    the consumers' increase waits until the pool holds what it asks for -- for ever where the
    budgets add up to more than the launch gave (2 consumers: producer + 2·consumer <= 504)."""
    threads = 128 * (1 + consumers)
    launch = min(255, 65536 // threads) // 8 * 8
    return producer + consumers * consumer <= (1 + consumers) * launch


def fp8_live_registers(head_dim: int, tile_n: int) -> int:
    """fp32 accumulator registers per consumer thread: S (tile_n / 2), O (head_dim / 2), and the
    e4m3 P of the previous tile (tile_n / 8) beside the next S (overlap)."""
    return tile_n // 2 + head_dim // 2 + tile_n // 8


def transpose_register_split(consumers: int, head_dim: int = 128, tile_n: int = 128) -> tuple[int, int]:
    """setmaxnreg budgets (producer warpgroup, consumers) per thread with the transposing warps."""
    if consumers == 3:
        return TRANSPOSE_PRODUCER_REGS, TRANSPOSE_CONSUMER_REGS_3
    if fp8_live_registers(head_dim, tile_n) + 32 > TRANSPOSE_CONSUMER_REGS:
        return TRANSPOSE_PRODUCER_REGS_WIDE, TRANSPOSE_CONSUMER_REGS_WIDE
    return TRANSPOSE_PRODUCER_REGS, TRANSPOSE_CONSUMER_REGS


@dataclass(frozen=True, kw_only=True)
class AttentionFp8Sm90(AttentionSm90):
    """An fp8 variant: e4m3 q/k/v, bf16 O, descales; tiles as the 16-bit family's fields."""

    op: ClassVar[str] = "attention_fp8"
    family: ClassVar[str] = "sm90"
    DTYPES: ClassVar[tuple[str, ...]] = ("e4m3",)
    HEAD_DIMS: ClassVar[tuple[int, ...]] = FP8_HEAD_DIMS
    sources = ("attention/sm90_fp8.py", "attention/fp8_order.py", "atoms/sm90_matrix.py", *AttentionSm90.sources)

    dtype: str = field(default="e4m3", metadata={"tag": ""})
    # how V arrives: "bshd" = (B, Sk, Hkv, D) like K, transposed in the kernel; "bhds" =
    # (B, Hkv, D, Sk), keys contiguous (the K-major B operand of P·V), read by TMA as it is
    v_layout: str = field(default="bshd", metadata={"tag": "v"})

    def sass_requirements(self) -> tuple[str, ...]:
        # nvdisasm prints fp8 WGMMAs as QGMMA: "QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR16],
        # RZ, !UPT" (both operands from smem) and "QGMMA.64x128x32.F32.E4M3.E4M3 R24, R152,
        # gdesc[UR16], R24" (A from registers); the P permute: SHFL.IDX and PRMT.
        return (
            rf"\bQGMMA\.64x{self.tile_n}x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[",
            rf"\bQGMMA\.64x{self.head_dim}x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[",
            # varlen: (tokens, D, heads) boxes and O by 16-byte stores
            *((r"\bUTMALDG\.3D\b", r"\bSTG\.E\.128\b") if self.varlen else (r"\bUTMALDG\.4D\b", r"\bUTMASTG\.4D\b")),
            r"\bSYNCS\.", r"\bUSETMAXREG\.", r"\bMUFU\.EX2\b",
            r"\bPRMT\b",
            # bhds: P's quad exchange; bshd: the transposing warps' ldmatrix.trans / stmatrix
            *((r"\bSHFL\.IDX\b",) if self.v_layout == "bhds"
              else (r"\bLDSM\.16\.MT88\.4\b", r"\bSTSM\.16\.M88\.4\b")),
            *self.ex2_sass(),
        )

    @property
    def o_in_staging(self) -> bool:
        """O's bf16 slabs over the V staging slots (V transposed in the kernel, one tile per CTA)
        where O's own slabs do not fit beside Q and the K / V / staging rings (head_dim 256 with
        128-key tiles: 32 + 3·64 + 64 KB).  The staging slots are idle by then: the last P·V
        the epilogue waits for read a V tile the transposing warps wrote after all staged tiles."""
        from ..atoms.smem import STATIC_SMEM
        if self.v_layout != "bshd" or self.persistent or self.stages * self.tile_n < 2 * self.tile_m:
            return False
        return self._smem_total(True) + STATIC_SMEM > self.tgt.smem_per_cta

    def _smem_total(self, own_o: bool) -> int:
        from ..atoms.smem import BARRIER_BYTES, SMEM_ALIGN, round_up
        q = round_up(self.tile_m * self.head_dim, SMEM_ALIGN)
        kv = (3 if self.v_layout == "bshd" else 2) * self.stages * round_up(self.tile_n * self.head_dim, SMEM_ALIGN)
        o = round_up(self.tile_m * self.head_dim * 2, SMEM_ALIGN) if own_o else 0
        return BARRIER_BYTES + q + kv + o

    def smem_bytes(self) -> int:
        return self._smem_total(not self.o_in_staging)

    def can_implement(self) -> str | None:
        if self.v_layout == "bshd" and not register_pool_fits(
                *transpose_register_split(self.consumers, self.head_dim, self.tile_n), self.consumers):
            return "the setmaxnreg budgets exceed the registers the CTA holds from its launch"
        if self.v_layout not in ("bshd", "bhds"):
            return "v_layout must be 'bshd' (transposed in the kernel) or 'bhds' (keys contiguous)"
        if self.v_layout == "bshd" and self.tile_n % 64:
            # (the V slot's K-major atoms: 64- or 128-byte swizzles (192 keys: three 64-byte
            # atoms), whose row bits the transposing lanes' own offsets hold: transpose_tile)
            return "the in-kernel V transpose takes tiles of a multiple of 64 keys"
        if self.varlen and self.v_layout != "bshd":
            return "packed variable-length fp8 takes v as k ((tokens, heads, head_dim), v_layout bshd)"
        if self.tile_n % 32:
            return "tile_n must be a multiple of 32 (fp8 WGMMA k32 steps of P·V)"
        if self.head_dim % 32:
            return "head_dim must be a multiple of 32 (fp8 WGMMA k32 steps of Q·Kᵀ)"
        problem = super().can_implement()
        if problem is not None and "live accumulator registers" in problem:
            # (the 16-bit family's register rule counts P at 16 bits: an fp8 P takes tile_n / 8
            # registers per consumer thread; the rule is the last check before the smem one)
            from ..atoms.sm90 import CONSUMER_REGS
            from ..atoms.smem import STATIC_SMEM
            live = fp8_live_registers(self.head_dim, self.tile_n)
            budget = (transpose_register_split(self.consumers, self.head_dim, self.tile_n)[1]
                      if self.v_layout == "bshd" else CONSUMER_REGS[self.consumers])
            if live + 32 > budget:
                return f"{live} live accumulator registers do not fit {budget}"
            return self.smem_problem(STATIC_SMEM)
        return problem

    def signature(self) -> Signature:
        return contract.signature_fp8(self.head_dim, self.v_layout, self.varlen)

    def contract_fields(self) -> dict[str, Any]:
        return contract.manifest_fields_fp8(self.head_dim, self.causal, self.v_layout, self.varlen)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        cfg = fp8_config(self.head_dim, self.causal, self.v_layout, self.varlen)
        d["preferred"] = (self.tile_n, self.stages) == (cfg["tile_n"], cfg["stages"])
        if self.v_layout == "bshd":
            producer, consumer = transpose_register_split(self.consumers, self.head_dim, self.tile_n)
            d["registers_per_role"] = {"producer": producer, "consumer": consumer}
            d["v_transpose"] = {"warps": 3, "order": "keys of each 16-key group as P's registers hold them"}
            if self.o_in_staging:
                d["tile_scheduler"] = {**d["tile_scheduler"], "o_smem": "v staging slots"}
        return d

    def make_kernel(self):
        k = FlashFwdSm90Fp8(
            head_dim=self.head_dim, tile_m=self.tile_m, tile_n=self.tile_n, stages=self.stages,
            causal=self.causal, overlap=self.overlap, pingpong=self.pingpong,
            early_rescale=self.early_rescale, persistent=self.persistent, k_first=self.k_first,
            v_transpose=self.v_layout == "bshd", o_in_staging=self.o_in_staging,
        )
        self.set_ex2(k)
        return k.packed_fp8 if self.varlen else k.dense_fp8

    @classmethod
    def ex2_built(cls) -> bool:
        return cls.make_kernel is AttentionFp8Sm90.make_kernel


def fp8_config(head_dim: int, causal: bool, v_layout: str = "bshd", varlen: bool = False) -> dict[str, Any]:
    """The fp8 tile per problem: 128 query rows (two consumer warpgroups, ping-pong, overlap);
    keys per tile 128 (dense head_dim 256 with V transposed in the kernel: O's slabs over the V
    staging slots, AttentionFp8Sm90.o_in_staging; packed varlen there: 64).  H100, B1 H16 S16384,
    TFLOP/s, two runs each unless one (notes/attention-fp8.md):
    V pre-transposed at head_dim 128 (no staging ring): three stages non-causal, 192-key tiles
    causal (884/915 vs 862/883 and 846/837 vs 822/818; with the in-kernel transpose three
    stages lose: 765/739 vs 836/850); V transposed in the kernel, causal: 192-key tiles (815/821
    vs 767/769; non-causal they lose: 776/805 vs 831/831); head_dim 256 with V pre-transposed:
    128-key tiles (non-causal 1,122 vs 942 at 64 keys, 96 keys 1,053; causal 1,175 vs 1,012);
    head_dim 256 with V transposed in the kernel: 128-key tiles (one run: non-causal 1,036 vs 913
    at 64 keys, causal 1,026 vs 919); head_dim 64, non-causal: 192 query rows (three consumer warpgroups; 616 vs 519 V as K, 597
    vs 504 pre-transposed).  (Packed varlen keeps the 128 x 128 tiles: the others were measured
    dense only.)"""
    cfg = {"tile_m": 128, "tile_n": 64 if head_dim == 256 else 128, "stages": 2, "overlap": True,
           "pingpong": True, **default_schedule(head_dim, causal)}
    if v_layout == "bhds" and head_dim == 128:
        cfg.update({"tile_n": 192} if causal else {"stages": 3})
    if v_layout == "bshd" and head_dim == 128 and causal and not varlen:
        cfg.update({"tile_n": 192})
    if head_dim == 256 and (v_layout == "bhds" or not varlen):
        cfg.update({"tile_n": 128})
    if head_dim == 64 and not causal and not varlen:
        cfg.update({"tile_m": 192})
    return cfg


@register("attention_fp8")
def enumerate_attention_fp8(target: Target, tier: str) -> list[AttentionFp8Sm90]:
    if target.name != "sm_90a":
        return []

    def make(d, causal, **kw):
        cfg = fp8_config(d, causal, kw.get("v_layout", "bshd"), kw.get("varlen", False))
        return AttentionFp8Sm90(target=target.name, head_dim=d, causal=causal, **{**cfg, **kw})

    if tier == "test":
        out = [make(128, False), make(128, True)]
    elif tier == "default":
        # head_dim 128 with V as K (a server's fp8 cache layout), transposed in the kernel: what
        # the selection picks for (B, Sk, Hkv, 128) V, causal and not (H100: 831-850 TFLOP/s
        # non-causal, 815-821 causal at B1 H16 S16384, notes/attention-fp8.md)
        out = [make(128, False), make(128, True)]
    else:
        out = [make(d, c, v_layout=vl) for d in FP8_HEAD_DIMS for c in (False, True) for vl in ("bshd", "bhds")]
        # head_dim 128 alternatives: 128/160/192-key tiles with two stages, three stages (fp8 tiles
        # are half the bytes of 16-bit ones: 196 KB with the staging ring)
        out += [make(128, c, tile_n=n, stages=st, v_layout=vl) for c in (False, True)
                for n, st in ((128, 2), (160, 2), (192, 2), (128, 3)) for vl in ("bshd", "bhds")]
        # head_dim 256, V transposed in the kernel: the 64-key tiles (a staging ring beside O's slabs)
        out += [make(256, c, tile_n=64) for c in (False, True)]
        # packed variable-length batches (cu_seqlens): one tile per CTA, V transposed in the kernel
        out += [make(d, c, varlen=True, **default_schedule(d, c, varlen=True)) for d in FP8_HEAD_DIMS
                for c in (False, True)]
    out = list({v.name: v for v in out}.values())
    return [v for v in out if v.can_implement() is None]


def _swizzle_bits(lay) -> tuple[int, int, int]:
    """(B, M, S) of a staged layout's swizzle Swizzle<B,M,S> on byte offsets (fp8 elements)."""
    m = re.fullmatch(r"S<(\d+),(\d+),(\d+)>", str(lay.inner))
    if m is None:
        raise ValueError(f"the V transpose expects swizzled slots, got {lay.inner}")
    return tuple(int(x) for x in m.groups())


def _swizzle(off, bits):
    """Swizzle<B,M,S> of a byte offset: bits [M+S, M+S+B) xor into bits [M, M+B) (128-byte
    swizzle <3,4,3>: the 16-byte chunk index xor the row index mod 8; 64-byte <2,4,3>)."""
    b, m, sh = bits
    return off ^ ((off >> sh) & (((1 << b) - 1) << m))


class FlashFwdSm90Fp8(FlashFwdSm90):
    """The sm90 kernel with e4m3 inputs, bf16 O, K-major V tiles, descales and the P permute."""

    def __init__(self, *, head_dim: int, tile_m: int, tile_n: int, stages: int, causal: bool,
                 overlap: bool, pingpong: bool, early_rescale: bool, persistent: bool, k_first: bool,
                 v_transpose: bool, o_in_staging: bool = False):
        super().__init__(dtype=cutlass.Float8E4M3FN, head_dim=head_dim, tile_m=tile_m, tile_n=tile_n,
                         stages=stages, causal=causal, overlap=overlap, pingpong=pingpong,
                         early_rescale=early_rescale, persistent=persistent, k_first=k_first)
        self.out_dtype = cutlass.BFloat16
        self.v_k_major = True
        self.v_transpose = v_transpose
        if v_transpose:
            # warps 1..3 of the producer warpgroup transpose V; they need more registers than
            # the TMA warp's budget: 40 + 2·232 per thread slot
            self.transpose_warps = 3
            self.producer_regs, self.consumer_regs = transpose_register_split(self.consumers, head_dim, tile_n)
            # (AttentionFp8Sm90.o_in_staging: one tile per CTA, O's slabs over the staging slots)
            self.o_in_vs = o_in_staging and not persistent

    @cute.jit
    def dense_fp8(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                  lse: cute.Tensor, q_descale: cute.Tensor, k_descale: cute.Tensor,
                  v_descale: cute.Tensor, softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        mQ, mK, _, mO = layout.dense_views(q, k, k, o)  # (S, D, H, B)
        if cutlass.const_expr(self.v_transpose):
            mVt = layout.dense_views(v, v, v, v)[0]  # (Sk, D, Hkv, B): (keys, D) tiles, as K
        else:
            # V (B, Hkv, D, Sk) -> (D, Sk, Hkv, B): the (D, keys) view the producer tiles
            mVt = cute.make_tensor(v.iterator, cute.select(v.layout, mode=[2, 3, 1, 0]))
        grid = self.dense_grid((cute.ceil_div(q.shape[1], self.cta_rows), q.shape[2], q.shape[0]))
        self._launch(mQ, mK, mVt, mO, lse, None, None, softmax_scale, grid, stream,
                     mDescale=(q_descale, k_descale, v_descale))

    @cute.jit
    def packed_fp8(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor, lse: cute.Tensor,
                   cu_seqlens_q: cute.Tensor, cu_seqlens_k: cute.Tensor, q_descale: cute.Tensor,
                   k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                   max_seqlen_q: cutlass.Int32, stream: cuda.CUstream):
        # (T, H, D) -> (T, D, H) for q, k, o and (v as k) v; a CTA offsets them by its sequence
        mQ, mK, _, mO = layout.packed_views(q, k, k, o)
        mV = layout.packed_views(v, v, v, v)[0]
        grid = (cute.ceil_div(max_seqlen_q, self.cta_rows), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mV, mO, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, grid, stream,
                     mDescale=(q_descale, k_descale, v_descale))

    def problem_scales(self, scale_log2, mDescale, head, batch, n_heads, n_kv_heads):
        """scale·log2(e)·q_descale·k_descale and v_descale of (batch, kv head)."""
        kv_head = head // (n_heads // n_kv_heads)
        qd, kd, vd = mDescale
        return scale_log2 * (qd[batch, kv_head] * kd[batch, kv_head]), vd[batch, kv_head]

    def p_operand_view(self, acc_S, tOrP):
        return None

    @cute.jit
    def store_p(self, acc_S, tOrP, tOrP_c, ltid):
        """P -> e4m3 in the fp8 A fragment of P·V (in-kernel transpose: :meth:`store_p_local`,
        pre-transposed V: :meth:`store_p_exchange`)."""
        if cutlass.const_expr(self.v_transpose):
            self.store_p_local(acc_S, tOrP)
        else:
            self.store_p_exchange(acc_S, tOrP, ltid)

    @cute.jit
    def store_p_local(self, acc_S, tOrP):
        """P -> e4m3, each thread's own registers only: A word (row half h, 16-key half kh) of a
        32-key block = the row-h halves of accumulator words W_{2kh} and W_{2kh+1}, i.e. keys
        16kh + {2t, 2t+1, 8+2t, 9+2t} at A columns 16kh + 4t .. 4t+3.  The transposing warps store
        V's keys at exactly those columns (:meth:`transpose_tile`), so P·V sums the right pairs.
        The fp32 values are taken in A byte order (fp8_order.p_local_source: a renaming of
        registers) and converted pairwise straight into the A words: no byte permutes."""
        n = cute.size(acc_S)
        ordered = cute.make_rmem_tensor(n, cutlass.Float32)
        for e in cutlass.range_constexpr(n):
            ordered[e] = acc_S[p_local_source(e)]
        cute.make_tensor(tOrP.iterator, cute.make_layout(n)).store(ordered.load().to(self.dtype))

    @cute.jit
    def transpose_tile(self, vs_ptr, v_ptr, vs_layout, v_layout, vs_slot, v_slot, lane, warp):
        """One V tile, staging slot (keys, D) -> V slot (D, keys) K-major, by this warp of the
        ``transpose_warps``, in units of 16 keys x 32 head_dim bytes (16-key groups dealt
        round-robin to the warps).  A unit: one ``ldmatrix.x4.trans`` (keys 0-7 / 8-15 of the group at two
        16-byte head_dim chunks: each lane gets bytes 2p, 2p+1 of keys 2q, 2q+1 per matrix, lane
        = 4p + q), four byte permutes (per chunk: head_dim columns 2p and 2p+1, each holding keys
        [2q, 2q+1, 8+2q, 9+2q], the order :meth:`store_p_local` gives P) and one ``stmatrix.x4``
        (8 head_dim rows x the group's 16 key bytes per matrix; lanes 16-31 swap their two words
        so that each matrix's rows have 8 distinct residues mod 8).  Both instructions touch 8
        distinct 16-byte bank groups per matrix of the swizzled slots (64- or 128-byte
        swizzles).  Addresses: the staged layouts' (outer) offsets, swizzled by hand (the
        layouts' Swizzle<B,4,3> on byte offsets), on the slots' 32-bit shared addresses."""
        BN, D, NT = self.tile_n, self.head_dim, self.transpose_warps
        vs_bits, v_bits = _swizzle_bits(vs_layout), _swizzle_bits(v_layout)
        # this lane's rows: the staging row it addresses for the ldmatrix, the V row for the
        # stmatrix, and its word order (fp8_order.ldsm_row / stsm_row / stsm_swap)
        mi = lane // 8
        mj = lane - 8 * mi
        l_key = 8 * (mi % 2) + mj
        l_col = 16 * (mi // 2)
        s_row = 16 * (mi // 2) + 2 * mj + ((mi % 2) ^ (mj // 4))
        swap = lane >= 16
        sel_a = cutlass.Int32(LDSM_JOIN[1]) if swap else cutlass.Int32(LDSM_JOIN[0])
        sel_b = cutlass.Int32(LDSM_JOIN[0]) if swap else cutlass.Int32(LDSM_JOIN[1])
        # swizzle(unit + lane) = unit ^ swizzle(lane): the lane parts hold every bit the swizzle
        # reads (the row mod 8), the unit parts (16-key groups, 32-byte head_dim blocks, slots)
        # are disjoint from them (replayed for every head_dim in tests/test_attention_fp8.py)
        vs_lane = _swizzle(cute.crd2idx((l_key, l_col, 0), vs_layout.outer), vs_bits)
        v_lane = _swizzle(cute.crd2idx((s_row, 0, 0), v_layout.outer), v_bits)
        vs_base = vs_ptr.toint()
        v_base = v_ptr.toint()
        # (the instructions are ordered as written: a group's loads are issued before its stores,
        # at most four in flight: 16 of the 40 registers; two at a 32-register budget)
        IF = 4 if self.producer_regs >= TRANSPOSE_PRODUCER_REGS else 1
        for g in cutlass.range(warp, BN // 16, NT, unroll=1):
            for c0 in cutlass.range_constexpr(0, D // 32, IF):
                regs = []
                for c in cutlass.range_constexpr(c0, min(c0 + IF, D // 32)):
                    src = cute.crd2idx((16 * g, 32 * c, vs_slot), vs_layout.outer)
                    regs.append(ldsm_x4_trans(vs_base + (src ^ vs_lane)))
                for c in cutlass.range_constexpr(c0, min(c0 + IF, D // 32)):
                    r = regs[c - c0]
                    dst = cute.crd2idx((32 * c, 16 * g, v_slot), v_layout.outer)
                    stsm_x4(v_base + (dst ^ v_lane),
                            cute.arch.prmt(r[0], r[1], sel_a), cute.arch.prmt(r[0], r[1], sel_b),
                            cute.arch.prmt(r[2], r[3], sel_a), cute.arch.prmt(r[2], r[3], sel_b))

    @cute.jit
    def store_p_exchange(self, acc_S, tOrP, ltid):
        """P -> e4m3 in the fp8 A fragment of P·V, keys in natural order (V pre-transposed).

        Accumulator (per thread t of a quad, row r and r + 8, 8-key block j): keys 8j + 2t + {0,1}
        of both rows, packed after conversion as one 32-bit word W_j = [r:2t, r:2t+1, r+8:2t,
        r+8:2t+1].  A fragment (per 32-key block): word (h, kh) = row r + 8h, keys 16kh + 4t ..
        16kh + 4t + 3.  Those four keys are the halves of row h of W_{2kh + t//2} of threads
        2(t%2) and 2(t%2) + 1.  Per kh: each thread sends W_{s%2} (first shuffle) and W_{1-s%2}
        (second), reads them from lanes [0,2,1,3][t] and [1,3,0,2][t] of its quad, and one byte
        permute per row picks the halves (the source order flips for t >= 2)."""
        BN = self.tile_n
        tmp = cute.make_rmem_tensor(acc_S.layout, self.dtype)
        tmp.store(acc_S.load().to(self.dtype))
        w = cute.recast_tensor(tmp, cutlass.Int32)      # BN / 8 words, word j = key block j
        a = cute.recast_tensor(tOrP, cutlass.Int32)     # BN / 8 words, 4 per 32-key block
        t = ltid % 4
        odd = t % 2
        quad = cute.arch.lane_idx() - t
        first, second = exchange_sources(t)
        src1 = quad + first
        src2 = quad + second
        low = t < 2
        sel_r0 = cutlass.Int32(P_EXCHANGE[False][0]) if low else cutlass.Int32(P_EXCHANGE[True][0])
        sel_r1 = cutlass.Int32(P_EXCHANGE[False][1]) if low else cutlass.Int32(P_EXCHANGE[True][1])
        for kb in cutlass.range_constexpr(BN // 32):
            for kh in cutlass.range_constexpr(2):
                w0 = w[4 * kb + 2 * kh]
                w1 = w[4 * kb + 2 * kh + 1]
                v1 = w1 if odd == 1 else w0
                v2 = w0 if odd == 1 else w1
                x = cute.arch.shuffle_sync(v1, src1)
                y = cute.arch.shuffle_sync(v2, src2)
                a[4 * kb + 2 * kh] = cutlass.Int32(cute.arch.prmt(x, y, sel_r0))
                a[4 * kb + 2 * kh + 1] = cutlass.Int32(cute.arch.prmt(x, y, sel_r1))


__all__ = ["AttentionFp8Sm90", "FP8_HEAD_DIMS", "FlashFwdSm90Fp8", "enumerate_attention_fp8",
           "fp8_config"]
