"""Chunked prefill over a paged fp8 (e4m3) KV cache on sm_90a with fp8 WGMMAs: q quantized to
e4m3 by the caller (per (sequence, kv head) ``q_descale``, FlashAttention-3's convention for an
fp8 cache), K/V pages read by TMA boxes, the fp8 forward's consumers (attention/sm90_fp8.py).

* Producer warp 0 (attention/sm90.py ``produce_paged``): Q slabs by TMA, then per key tile
  tile_n / page_box boxes (64, 32 or 16 rows) of K and of V, each from the page the block table
  names; V boxes land in (keys, D) staging slots.
* Warps 1-3 of the producer warpgroup transpose each staged V tile into the K-major slot P·V
  reads (``FlashFwdSm90Fp8.transpose_tile``: keys of each 16-key group in the order a thread's own
  P registers hold them).
* Consumers: S = Q·Kᵀ and O += P·V as fp8 WGMMAs (k32 steps); q_descale·k_descale folds into the
  score scale, v_descale into O; O leaves as bfloat16.  V rows past the sequence in its last tile
  (a page's unused rows may hold NaN) are zeroed in the transposed slot (:meth:`zero_v_tail`).

Arguments (:func:`signature_kvcache_fp8`): the kvcache contract (contract.signature_kvcache) with
q e4m3, o bf16 and ``q_descale`` (B, Hkv) f32 (any strides: a per-tensor factor is a zero-stride
view) before the cache's ``k_descale`` and ``v_descale`` (Hkv,) each.  No window, softcap or sinks (their arguments are ignored).
Accuracy: that of fp8 attention (P in e4m3 for P·V), judged against float32 attention of the
de-scaled e4m3 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature, TensorArg
from ..atoms.smem import BARRIER_BYTES, SMEM_ALIGN, STATIC_SMEM, round_up
from ..atoms.targets import Target
from ..registry import register
from . import contract, layout
from .sm90 import _Bar, AttentionKvcacheSm90, default_config, default_schedule
from .sm90_fp8 import AttentionFp8Sm90, FlashFwdSm90Fp8, transpose_register_split

KV_FP8_HEAD_DIMS = (128,)
# page boxes: 64 rows (pages of 64, 128 and 256 rows), 32 and 16 rows (pages of 16 and 32: 4 and 8
# boxes of 4 KB / 2 KB per K or V tile)
KV_FP8_PAGE_BOXES = (64, 32, 16)


def transposed_key(col):
    """The key (within its tile) whose V column is ``col`` of a transposed V slot: in each 16-key
    group, column 4t + c holds key 2t + (0, 1, 8, 9)[c] (fp8_order.transposed_key, as arithmetic
    on plain or device integers)."""
    c = col % 16
    return col - c + 2 * (c // 4) + c % 2 + 8 * ((c % 4) // 2)


def signature_kvcache_fp8(head_dim: int, varlen_q: bool = False) -> Signature:
    """contract.signature_kvcache for q e4m3 over an e4m3 cache: o bf16, ``q_descale`` (B, Hkv) f32
    inserted before ``k_descale`` (B: sequences; packed q: cu_seqlens_q's B1 - 1)."""
    base = contract.signature_kvcache("e4m3", "e4m3", head_dim, True, None, varlen_q=varlen_q)
    args = []
    for a in base.args:
        if a.name == "o":
            a = TensorArg("o", "bf16", a.shape, a.stride)
        if a.name == "k_descale":
            args.append(TensorArg("q_descale", "f32", ("B", "Hkv"), ("sQDb", "sQDh"), align=4))
        args.append(a)
    div = dict(base.divisibility)
    for s in (x for a in args if a.name == "o" for x in a.stride if isinstance(x, str)):
        div[s] = 8  # 16-byte rows of bfloat16
    return Signature(tuple(args), tuple(sorted(div.items())))


@dataclass(frozen=True, kw_only=True)
class AttentionKvcacheFp8Sm90(AttentionKvcacheSm90):
    """A paged-cache prefill variant with fp8 WGMMAs: e4m3 q and cache, bf16 O, descales."""

    DTYPES: ClassVar[tuple[str, ...]] = ("e4m3",)
    HEAD_DIMS: ClassVar[tuple[int, ...]] = KV_FP8_HEAD_DIMS
    sources = ("attention/sm90_kvcache_fp8.py", *AttentionFp8Sm90.sources)

    dtype: str = field(default="e4m3", metadata={"tag": ""})

    def sass_requirements(self) -> tuple[str, ...]:
        # (AttentionFp8Sm90: QGMMA with both operands in smem and with A from registers; the
        # transposing warps' ldmatrix.trans / stmatrix); K/V page boxes by 4D TMA
        return (
            rf"\bQGMMA\.64x{self.tile_n}x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[",
            rf"\bQGMMA\.64x{self.head_dim}x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[",
            r"\bUTMALDG\.3D\b" if self.varlen else r"\bUTMALDG\.4D\b", r"\bUTMALDG\.4D\b",
            r"\bSTG\.E\.128\b" if self.varlen else r"\bUTMASTG\.4D\b",
            r"\bSYNCS\.", r"\bUSETMAXREG\.", r"\bMUFU\.EX2\b", r"\bLDSM\.16\.MT88\.4\b", r"\bSTSM\.16\.M88\.4\b",
        )

    def smem_bytes(self) -> int:
        q = round_up(self.tile_m * self.head_dim, SMEM_ALIGN)
        kv = 3 * self.stages * round_up(self.tile_n * self.head_dim, SMEM_ALIGN)  # K, V, V staging
        o = round_up(self.tile_m * self.head_dim * 2, SMEM_ALIGN)
        return BARRIER_BYTES + q + kv + o

    def can_implement(self) -> str | None:
        if self.tgt.name != "sm_90a":
            return "fp8 WGMMAs need sm_90a"
        if (problem := self.check_problem()) is not None:
            return problem
        if self.kv_dtype != "e4m3":
            return "the cache is e4m3"
        if self.page_box not in KV_FP8_PAGE_BOXES or self.tile_n % self.page_box:
            return f"page_box must be one of {KV_FP8_PAGE_BOXES} and divide tile_n"
        if self.tile_n % 64 or self.tile_m != 128:
            return "128-row query tiles (two consumer warpgroups), key tiles of a multiple of 64 (the V transpose)"
        if self.local or self.softcap or self.sinks or self.deep_staging:
            return "no window/softcap/sink switches, no deep staging"
        if self.persistent or self.k_first or self.lazy_rescale:
            return "not persistent, no k_first, no lazy_rescale (the paged producer)"
        if not (self.overlap and self.pingpong) or self.stages < 2:
            return "overlap and ping-pong, two or more stages"
        live = self.tile_n // 2 + self.head_dim // 2 + self.tile_n // 8
        budget = transpose_register_split(self.consumers)[1]
        if live + 32 > budget:
            return f"{live} live accumulator registers do not fit {budget}"
        return self.smem_problem(STATIC_SMEM)

    def signature(self) -> Signature:
        return signature_kvcache_fp8(self.head_dim, self.varlen)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["dtypes"] = {**d["dtypes"], "o": "bf16", "descale": "f32"}
        d["constraints"] = {**d["constraints"], "stride_divisibility_elems": {"q": 16, "kv": 16, "o": 8},
                            "q_descale": "float32 (B, Hkv), any strides",
                            "accuracy": "fp8 attention (P in e4m3) against float32 of the de-scaled inputs"}
        producer, consumer = transpose_register_split(self.consumers)
        d["registers_per_role"] = {"producer": producer, "consumer": consumer}
        d["v_transpose"] = {"warps": 3, "order": "keys of each 16-key group as P's registers hold them"}
        d["preferred"] = (self.tile_n, self.stages) == (128, 2)
        return d

    def make_kernel(self):
        k = FlashFwdSm90KvcacheFp8(
            head_dim=self.head_dim, tile_m=self.tile_m, tile_n=self.tile_n, stages=self.stages,
            causal=self.causal, overlap=self.overlap, pingpong=self.pingpong,
            early_rescale=self.early_rescale, page_box=self.page_box)
        return k.kvcache_fp8_packed if self.varlen else k.kvcache_fp8


@register("attention_kvcache")
def enumerate_attention_kvcache_fp8(target: Target, tier: str) -> list[AttentionKvcacheFp8Sm90]:
    if target.name != "sm_90a" or tier == "test":
        return []

    def make(varlen, causal=True, tile_n=None, stages=None, page_box=64):
        tm, tn, s, ov, pp = default_config(128, True, cache=True)
        return AttentionKvcacheFp8Sm90(
            target=target.name, dtype="e4m3", kv_dtype="e4m3", head_dim=128, causal=causal, tile_m=tm,
            tile_n=tile_n or tn, stages=stages or s, overlap=ov, pingpong=pp, varlen=varlen, page_box=page_box,
            **default_schedule(128, True, varlen=True))

    if tier == "default":
        # causal, head_dim 128: 16-row boxes (any page of 16 rows or more) for dense and packed q,
        # 64-row boxes (pages of 64-256, 0-6 % faster there) for packed q (a server's chunked prefill).
        # H100: 1.03-1.17x our bf16 dense varlen path (notes/attention-kvcache.md)
        return [make(False, page_box=16), make(True, page_box=16), make(True)]
    out = [make(vl, c) for vl in (False, True) for c in (True, False)]
    out += [make(False, tile_n=192), make(False, stages=3)]
    # pages of 16 and 32 rows (vLLM's default 16), causal, dense and packed q
    out += [make(vl, page_box=pb) for pb in (32, 16) for vl in (False, True)]
    return [v for v in out if v.can_implement() is None]


class FlashFwdSm90KvcacheFp8(FlashFwdSm90Fp8):
    """The fp8 kernel with V transposed in the kernel, over a paged cache (page boxes by TMA)."""

    def __init__(self, *, head_dim: int, tile_m: int, tile_n: int, stages: int, causal: bool,
                 overlap: bool, pingpong: bool, early_rescale: bool, page_box: int):
        super().__init__(head_dim=head_dim, tile_m=tile_m, tile_n=tile_n, stages=stages, causal=causal,
                         overlap=overlap, pingpong=pingpong, early_rescale=early_rescale,
                         persistent=False, k_first=False, v_transpose=True)
        self.page_box = page_box

    @cute.jit
    def kvcache_fp8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                    lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                    sinks: cute.Tensor, q_descale: cute.Tensor, k_descale: cute.Tensor,
                    v_descale: cute.Tensor, softmax_scale: cutlass.Float32, softcap: cutlass.Float32, window_left: cutlass.Int32,
                    window_right: cutlass.Int32, stream: cuda.CUstream):
        # q/o (B, Sq, Hq, D) -> (Sq, D, Hq, B); both caches (P, PS, Hkv, D) -> (PS, D, Hkv, P)
        # (V as K: its (keys, D) boxes land in the staging slots)
        mQ, mK, _, mO = layout.dense_views(q, k_cache, k_cache, o)
        mV = layout.dense_views(v_cache, v_cache, v_cache, v_cache)[0]
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        self._launch(mQ, mK, mV, mO, lse, None, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     (q_descale, k_descale, v_descale))

    @cute.jit
    def kvcache_fp8_packed(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                           o: cute.Tensor, lse: cute.Tensor, block_table: cute.Tensor,
                           cache_seqlens: cute.Tensor, cu_seqlens_q: cute.Tensor, sinks: cute.Tensor,
                           q_descale: cute.Tensor, k_descale: cute.Tensor, v_descale: cute.Tensor,
                           softmax_scale: cutlass.Float32,
                           softcap: cutlass.Float32, window_left: cutlass.Int32,
                           window_right: cutlass.Int32, max_seqlen_q: cutlass.Int32,
                           stream: cuda.CUstream):
        # packed q/o (Tq, Hq, D) -> (Tq, D, Hq); the caches as in ``kvcache_fp8``
        mQ, _, _, mO = layout.packed_views(q, q, q, o)
        mK = layout.dense_views(k_cache, k_cache, k_cache, k_cache)[0]
        mV = layout.dense_views(v_cache, v_cache, v_cache, v_cache)[0]
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mV, mO, lse, cu_seqlens_q, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     (q_descale, k_descale, v_descale))

    def problem_scales(self, scale_log2, mDescale, head, batch, n_heads, n_kv_heads):
        """scale·log2(e)·q_descale[batch, kv head]·k_descale[kv head], and v_descale[kv head]."""
        kv_head = head // (n_heads // n_kv_heads)
        qd, kd, vd = mDescale
        return scale_log2 * (qd[batch, kv_head] * kd[kv_head]), vd[kv_head]

    @cute.jit
    def zero_v_tail(self, sV, slot, tile, k_len, ltid, wg):
        """The V rows of key tile ``tile`` past the sequence's last key, zeroed in the transposed
        slot ``slot`` before this warpgroup's P·V reads it (a page's unused rows may hold NaN;
        NaN times P = 0 stays NaN).  Column c of a 16-key group holds key 2(c // 4) +
        KEY_OFFSETS[c % 4] (fp8_order.transposed_key); a column is zeroed where its key is past
        the end.  Only the sequence's last tile has such keys."""
        BN, D = self.tile_n, self.head_dim
        lim = k_len - tile * BN
        if lim < BN:
            sVs = sV[None, None, slot]  # (D, keys) K-major: a 16-key group of a row is 16 bytes
            g0 = lim // 16  # the first 16-key group holding a key past the end
            zeros = cute.make_rmem_tensor(16, self.dtype)
            zeros.fill(0.0)
            groups = cute.zipped_divide(sVs, (1, 16))  # ((1, 16), (D, groups))
            # groups wholly past the end: 16-byte chunks of zeros
            for idx in cutlass.range(ltid + cute.ceil_div(lim, 16) * D, (BN // 16) * D, 128, unroll=1):
                cute.autovec_copy(zeros, groups[(0, None), (idx % D, idx // D)])
            # the group holding the last key: its columns past the end, one byte each (thread =
            # head_dim row: head_dim 128)
            if g0 * 16 < lim:
                for c in cutlass.range_constexpr(16):
                    if transposed_key(c) >= lim - g0 * 16:
                        sVs[ltid, g0 * 16 + c] = self.dtype(0.0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=int(_Bar.EPILOGUE) + wg, number_of_threads=128)


__all__ = ["AttentionKvcacheFp8Sm90", "FlashFwdSm90KvcacheFp8", "KV_FP8_HEAD_DIMS", "enumerate_attention_kvcache_fp8",
           "signature_kvcache_fp8", "transposed_key"]
