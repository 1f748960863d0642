"""FlashAttention-2 forward for Ampere/Ada (mma.sync + cp.async), our own CuTe DSL kernel.

One CTA computes one (query tile, q head, batch) triple.  ``warps`` warps split the query tile by
rows, 16 rows per warp (one m16n8k16 row block each), so every warp owns whole softmax rows and no
cross-warp reduction is ever needed.

Data flow per CTA:
  * Q tile: cp.async gmem -> swizzled smem, then ldmatrix into registers once; it stays there for
    the whole key loop (its smem is reused, see below).
  * K/V tiles: a ring of ``stages`` smem slots, each holding one K tile and one V tile; the tile
    ``stages - 1`` ahead is in flight (cp.async, one commit group per tile) while the current one
    is consumed.  Key tiles are walked from the last one down, so the tiles that need masking (the
    sequence tail and, if causal, the diagonal) come first; the others run without mask code.
  * S = Q·Kᵀ and O += P·V on mma.sync with fp32 accumulators; K through ldmatrix, V through
    ldmatrix.trans.
  * Online softmax in registers: running max and sum per row, exp2 with log2(e) folded into the
    scale, rows reduced within the quad of threads that share them.
  * Epilogue: O / rowsum -> dtype -> smem (the Q region) -> 16-byte stores; LSE (natural log) by one
    thread per row.  A row with no visible key writes O = 0 and LSE = -inf.
  The key loop is the attention toolkit's mma.sync mainloop (mma_sync.py: the ring, both GEMMs,
  the mask of mask.py, the online softmax and finalisation of softmax.py), shared with the decode
  family.

Shared memory: the Q tile aliases the ring's last slot.  Q is read into registers before the first
loop iteration's barrier, and that slot is first written (with the tile ``stages - 1`` ahead) after
it, so one CTA needs ``stages · 2 · tile_n · D`` elements, not that plus the Q tile.  The epilogue
reuses the same region for O after a barrier.

Causal masking is bottom-right aligned (query row i sees keys j <= i + seqlen_k - seqlen_q), as in
FlashAttention-2 for seqlen_q != seqlen_k.  GQA/MQA read kv head h // (Hq / Hkv) in place.
Variable-length batches (varlen) index packed (total_tokens, heads, D) tensors through int32
cu_seqlens; the grid is sized by max_seqlen_q and tiles past a sequence's end exit at once.

Split-KV (``splits`` > 1, dense, for decode): the grid's x is (query tile, split); each CTA walks
its split's contiguous share of the key tiles its row block sees and writes O normalised by its
own row sum (fp32) and its LSE to a workspace (O = 0, LSE = -inf when it saw no key); ``combine``,
launched next from the same host function on the same stream, merges the splits by LSE weight.
``pack_gqa`` (seqlen_q == 1): a CTA's rows are the q heads that share one kv head, so K/V are read
once per kv head.  ``notes/attention-sm80.md`` (v3) has the measurements behind both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass.cute.nvgpu import cpasync, warp

from ..abi import DTYPE_BYTES, Signature
from ..atoms.common import cutlass_dtype
from ..atoms.sm80 import acc_mn_view
from ..atoms.targets import Target
from ..registry import register
from ..variant import Variant
from . import contract, mask, mma_sync, softmax
from .base import DTYPES, TOOLKIT_SOURCES, AttentionKernel, AttentionVariant, causal_field, varlen_field
from .softmax import LOG2_E

MAX_SPLITS = 32
# The split counts the default tier builds (dense, 64-row tile); see enumerate_attention.
DEFAULT_SPLITS = (4, 16)
# Packed-GQA decode always splits (runtime: the fewest splits that fill the SMs); 2 serves large
# batches at short contexts, where 4 splits left one key tile per CTA (B16 H32/8 Sk512: 19.6 µs,
# SDPA 8.6 on the H100, 2026-11-25).
PACK_SPLITS = (2, 4, 16)
# Combine kernel: one warp per query row, this many rows per CTA.
COMBINE_WARPS = 4
HEAD_DIMS = (64, 128)
# Row block of one warp: one m16n8k16 A fragment.
ROWS_PER_WARP = 16


@dataclass(frozen=True)
class KvOptions:
    """The compile-time switches of attention over a KV cache (the contract's kvcache variant
    fields) as the kernel sees them."""
    paged: bool
    kv_dtype: Any  # cutlass numeric type of k_cache/v_cache
    fp8: bool
    local: bool
    softcap: bool
    sinks: bool


class KvArgs:
    """The KV-cache kernel arguments beyond q/k/v/o/lse, handed from the host entry to the kernel."""

    def __init__(self, block_table, cache_seqlens, sinks, kv_descale, softcap, window_left,
                 window_right):
        self.block_table = block_table
        self.cache_seqlens = cache_seqlens
        self.sinks = sinks
        self.kv_descale = kv_descale
        self.softcap = softcap
        self.window_left = window_left
        self.window_right = window_right


# ------------------------------------------------------------------------------------------------
# The variant: config, calling convention, manifest fields
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttentionSm80(AttentionVariant):
    family: ClassVar[str] = "sm80"
    required_sass = (r"HMMA", r"LDGSTS", r"LDSM")
    sources = ("attention/sm80.py", "attention/mma_sync.py", "atoms/sm80.py", *TOOLKIT_SOURCES)
    HEAD_DIMS = HEAD_DIMS

    tile_m: int = field(default=128, metadata={"tag": "m"})
    tile_n: int = field(default=64, metadata={"tag": "n"})
    warps: int = field(default=8, metadata={"tag": "w"})
    stages: int = field(default=2, metadata={"tag": "s"})
    causal: bool = causal_field()
    varlen: bool = varlen_field()
    # Decode with GQA packed (seqlen_q == 1 only, split-KV only): one CTA's query rows are the
    # Hq/Hkv q-heads that share a kv head, so K/V are read once per kv head instead of once per
    # q head.  With one query the bottom-right causal mask hides nothing: built non-causal, used
    # for both.
    pack_gqa: bool = field(default=False, metadata={"tag": "decode"})
    # Split-KV (flash-decoding): each CTA walks one of ``splits`` contiguous key-tile ranges and
    # writes an fp32 partial O and its LSE to a workspace; a second kernel combines them.  The
    # default 1 adds nothing to the name, so every non-split variant keeps its name.
    splits: int = field(default=1, metadata={"tag": "kv"})

    @property
    def name(self) -> str:
        n = super().name  # splits is the last field: "_kv<splits>" ends the name
        return n.removesuffix("_kv1") if self.splits == 1 else n

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self) -> int:
        # The Q tile (and later O) aliases the last K/V slot; see the module docstring.
        return self.stages * 2 * self.tile_n * self.head_dim * DTYPE_BYTES[self.dtype]

    def can_implement(self) -> str | None:
        t = self.tgt
        if t.family != "sm80":
            return f"target {self.target} is not an sm80-family target"
        if (problem := self.check_problem()) is not None:
            return problem
        if self.tile_m != ROWS_PER_WARP * self.warps:
            return f"tile_m must be {ROWS_PER_WARP}·warps (one row block per warp, Q in registers)"
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            return "tile_n must be a multiple of 16 in [16, 256]"
        if self.tile_m > 2 * self.tile_n:
            return "the Q tile must fit in one K/V slot (tile_m <= 2·tile_n)"
        rows_per_copy = self.threads // (64 // 8)
        if self.tile_n % rows_per_copy or self.tile_m % rows_per_copy:
            return f"tiles must be whole copy passes of {rows_per_copy} rows"
        if self.stages < 2:
            return "stages must be >= 2"
        if self.splits < 1 or self.splits > MAX_SPLITS:
            return f"splits must be in [1, {MAX_SPLITS}]"
        if self.splits > 1 and self.varlen:
            return "split-KV is dense-only"
        if self.pack_gqa and (self.splits < 2 or self.causal or self.varlen):
            return "pack_gqa (seqlen_q == 1 decode) needs splits > 1, dense, non-causal"
        return self.smem_problem()

    def describe(self) -> dict[str, Any]:
        return {
            **self.contract_fields(),
            "tile": [self.tile_m, self.tile_n],
            "warps": self.warps,
            "stages": self.stages,
            "splits": self.splits,
            "pack_gqa": self.pack_gqa,
            "smem_bytes": self.smem_bytes(),
            # The tile the default tier picks for this head_dim: selection prefers it over the
            # "full" tier's alternatives of the same target.
            "preferred": (self.splits == 1 and (self.tile_m, self.tile_n, self.warps, self.stages)
                          == default_tile(self.tgt, self.head_dim)),
        }

    def make_kernel(self):
        k = FlashFwdSm80(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_m=self.tile_m,
            tile_n=self.tile_n, warps=self.warps, stages=self.stages, causal=self.causal,
            splits=self.splits, pack_gqa=self.pack_gqa,
        )
        if self.varlen:
            return k.packed
        return k.dense_split if self.splits > 1 else k.dense


# The default tile per target and head_dim: (tile_m, tile_n, warps, stages).  Q in registers caps
# a warp at 16 rows, so tile_m = 16·warps.  Measured on the H100 (sm_90 build, bf16, B1 H16 S8192,
# CUDA events): D=128 with 128x128 K/V tiles 314 TFLOP/s vs 278 with 128x64 (causal 267 vs 240),
# but that needs 128 KB of shared memory, so sm_86/sm_89/sm_120a (99 KB) keep 128x64.  D=64: 128x128
# tiles beat 128x64 by 15-20 %; a third stage was within 3 % and is left to the "full" tier.
def default_tile(target: Target, head_dim: int) -> tuple[int, int, int, int]:
    if head_dim == 64:
        return (128, 128, 8, 2)     # 64 KB
    if target.smem_per_cta >= 128 * 1024:
        return (128, 128, 8, 2)     # 128 KB
    return (128, 64, 8, 2)          # 64 KB


# "full" adds these (tile_n, stages) alternatives per head_dim, for benchmarking; can_implement
# drops those that do not fit a target's shared memory (128x128 K/V tiles at D=128 on sm_86/89/120a).
_ALTERNATIVES = {
    64: ((64, 2), (64, 3), (128, 3)),
    128: ((64, 2), (64, 3), (128, 2)),
}


@register("attention")
def enumerate_attention(target: Target, tier: str) -> list[AttentionSm80]:
    if target.family != "sm80":
        return []

    def make(dtype, d, causal, varlen, tile_n=None, stages=None, tile_m=None, warps=None):
        tm, tn, w, s = default_tile(target, d)
        return AttentionSm80(target=target.name, dtype=dtype, head_dim=d, tile_m=tile_m or tm,
                             tile_n=tile_n or tn, warps=warps or w, stages=stages or s, causal=causal,
                             varlen=varlen)

    if tier == "test":
        return [make("bf16", 64, False, False), make("f16", 128, True, True)]
    problems = [(dt, d, c, vl) for dt in DTYPES for d in HEAD_DIMS
                for c in (False, True) for vl in (False, True)]
    out = [make(*p) for p in problems]
    # 64-row query tiles (4 warps) for dense problems whose 128-row grid leaves SMs idle
    # (B·H·ceil(Sq/128) < SMs, e.g. B1 H8 S512: 32 CTAs on 132 SMs); the loader picks them then.
    out += [make(*p, tile_m=64, warps=4) for p in problems if not p[3]]
    # Split-KV for decode-shaped problems (few query rows, long keys: B·Hq·ceil(Sq/64) CTAs leave
    # SMs idle); the loader picks the split count that fills 1-2 waves.
    out += [dataclasses.replace(make(*p, tile_m=64, warps=4), splits=sp)
            for p in problems if not p[3] for sp in DEFAULT_SPLITS]
    # ... and for seqlen_q == 1 with GQA, the q-heads of one kv head packed into one CTA's rows.
    out += [dataclasses.replace(make(*p, tile_m=64, warps=4), splits=sp, pack_gqa=True)
            for p in problems if not p[3] and not p[2] for sp in PACK_SPLITS]
    if tier == "full":
        out += [make(*p, tile_n=tn, stages=st) for p in problems for tn, st in _ALTERNATIVES[p[1]]]
    out = list({v.name: v for v in out}.values())  # alternatives may repeat the default
    return [v for v in out if v.can_implement() is None]


# ------------------------------------------------------------------------------------------------
# Attention over a KV cache (contract.signature_kvcache): the same kernel, K/V rows gathered
# through the block table, per-sequence key counts, window/softcap/sinks, fp8 K/V
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttentionKvcacheSm80(Variant):
    """The sm80 family over a KV cache.  Pages of any power-of-two size (the kernel addresses
    key rows, so a page may be smaller or larger than a key tile): the page size is a launch-time
    symbol, manifest ``page_sizes``.  Any seqlen_q, dense or packed (varlen) q."""

    op: ClassVar[str] = "attention_kvcache"
    family: ClassVar[str] = "sm80"
    required_sass = (r"HMMA", r"LDGSTS", r"LDSM")
    sources = AttentionSm80.sources

    dtype: str = field(default="bf16", metadata={"tag": ""})
    kv_dtype: str = field(default="bf16", metadata={"tag": "c"})
    head_dim: int = field(default=128, metadata={"tag": "d"})
    tile_m: int = field(default=128, metadata={"tag": "m"})
    tile_n: int = field(default=64, metadata={"tag": "n"})
    warps: int = field(default=8, metadata={"tag": "w"})
    stages: int = field(default=2, metadata={"tag": "s"})
    causal: bool = field(default=True, metadata={"tag": "causal"})
    paged: bool = field(default=True, metadata={"tag": "paged"})
    local: bool = field(default=False, metadata={"tag": "win"})
    softcap: bool = field(default=False, metadata={"tag": "cap"})
    sinks: bool = field(default=False, metadata={"tag": "sink"})
    varlen: bool = field(default=False, metadata={"tag": "varlen"})

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def fp8(self) -> bool:
        return self.kv_dtype != self.dtype

    def smem_bytes(self) -> int:
        # dtype K/V ring (Q/O alias its last slot); fp8: one dtype slot plus the fp8 ring
        tile = 2 * self.tile_n * self.head_dim
        if self.fp8:
            return tile * DTYPE_BYTES[self.dtype] + self.stages * tile * DTYPE_BYTES[self.kv_dtype]
        return self.stages * tile * DTYPE_BYTES[self.dtype]

    def can_implement(self) -> str | None:
        base = AttentionSm80(target=self.target, dtype=self.dtype, head_dim=self.head_dim,
                             tile_m=self.tile_m, tile_n=self.tile_n, warps=self.warps,
                             stages=self.stages, causal=self.causal)
        why = base.can_implement()
        if why:
            return why
        if self.kv_dtype not in (self.dtype, "e4m3"):
            return f"kv_dtype must be {self.dtype} or e4m3"
        if self.fp8:
            if not self.tgt.fp8:
                return f"fp8 K/V need a target with e4m3 conversions; {self.target} has none"
            if self.tile_n % (self.threads // (self.head_dim // 16)):
                return "fp8 K/V tiles must be whole copy passes"
        if self.smem_bytes() > self.tgt.smem_per_cta:
            return f"needs {self.smem_bytes()} B of shared memory, {self.target} has {self.tgt.smem_per_cta}"
        return None

    def signature(self) -> Signature:
        return contract.signature_kvcache(self.dtype, self.kv_dtype, self.head_dim, self.paged, None,
                                          varlen_q=self.varlen)

    def describe(self) -> dict[str, Any]:
        d = contract.manifest_fields_kvcache(
            self.dtype, self.kv_dtype, self.head_dim, paged=self.paged, page_size=None,
            causal=self.causal, local=self.local, softcap=self.softcap, sinks=self.sinks,
            varlen_q=self.varlen)
        d["page_sizes"] = list(contract.PAGE_SIZES) if self.paged else []
        d.update({
            "tile": [self.tile_m, self.tile_n],
            "warps": self.warps,
            "stages": self.stages,
            "splits": 1,
            "smem_bytes": self.smem_bytes(),
            "preferred": (self.tile_m, self.tile_n, self.warps, self.stages)
            == default_tile(self.tgt, self.head_dim),
        })
        return d

    def make_kernel(self):
        kv = KvOptions(paged=self.paged, kv_dtype=cutlass_dtype(self.kv_dtype), fp8=self.fp8,
                       local=self.local, softcap=self.softcap, sinks=self.sinks)
        k = FlashFwdSm80(
            dtype=cutlass_dtype(self.dtype), head_dim=self.head_dim, tile_m=self.tile_m,
            tile_n=self.tile_n, warps=self.warps, stages=self.stages, causal=self.causal, kv=kv)
        if self.fp8:  # (the contract's k_descale and v_descale in place of kv_descale)
            return k.kvcache_packed_f8 if self.varlen else k.kvcache_f8
        return k.kvcache_packed if self.varlen else k.kvcache


@register("attention_kvcache")
def enumerate_attention_kvcache(target: Target, tier: str) -> list[AttentionKvcacheSm80]:
    if target.family != "sm80":
        return []

    def make(dtype, d, kv_dtype=None, **switches):
        tm, tn, w, s = default_tile(target, d)
        return AttentionKvcacheSm80(target=target.name, dtype=dtype, kv_dtype=kv_dtype or dtype,
                                    head_dim=d, tile_m=tm, tile_n=tn, warps=w, stages=s, **switches)

    if tier == "test":
        # sm_90 (the build the GPU tests run): one of each switch (paged/dense cache, causal or
        # not, window, softcap, sinks, fp8, varlen); elsewhere the plain build (compile checks).
        out = [make("bf16", 128)]
        if target.name == "sm_90":
            out += [
                make("f16", 64, varlen=True, local=True, softcap=True, sinks=True),
                make("bf16", 128, "e4m3", causal=False),
                make("bf16", 64, paged=False, causal=False, local=True, varlen=True),
            ]
    elif tier == "default":
        # What the selection picks where this family is the only prefill kernel (Ampere, Ada,
        # sm_120): chunked prefill / speculative verification, bf16, head_dim 128, causal, paged
        # (any page size), dense and packed q.  The sm_90 build of the same two is the one an H100
        # runs by name (Hopper's selection takes the sm90 family's): its run record is what labels
        # the sm_80/86 cubins portability-build.  Build-time budget of the default bundle: other
        # dtypes, head_dims, fp8 and the switches are in "full".
        out = [make("bf16", 128, varlen=vl) for vl in (False, True)]
    else:
        # Every dtype, head_dim, cache dtype (fp8 where the target converts e4m3) and q form,
        # plain and with every switch on (a variant with a switch on serves calls without it:
        # window -1, softcap 0, sinks -inf), and the dense-cache form.
        out = [make(dt, d, kv, varlen=vl, **sw) for dt in DTYPES for d in HEAD_DIMS
               for kv in (None, "e4m3") for vl in (False, True)
               for sw in ({}, {"local": True, "softcap": True, "sinks": True})]
        out += [make(dt, d, paged=False, varlen=vl) for dt in DTYPES for d in HEAD_DIMS for vl in (False, True)]
    return [v for v in out if v.can_implement() is None]


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class FlashFwdSm80(AttentionKernel):
    """Host side: ``dense``/``packed`` (the two calling conventions) build smem layouts, copy and
    MMA atoms and launch ``kernel``; device side: ``kernel`` and its jit helpers."""

    def __init__(self, *, dtype, head_dim: int, tile_m: int, tile_n: int, warps: int, stages: int,
                 causal: bool, splits: int = 1, pack_gqa: bool = False, kv: "KvOptions | None" = None):
        super().__init__(dtype=dtype, head_dim=head_dim, causal=causal, local=kv is not None and kv.local)
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.warps = warps
        self.threads = 32 * warps
        self.stages = stages
        self.splits = splits
        self.pack_gqa = pack_gqa
        # Attention over a KV cache (paged or dense, per-sequence key counts on the device): the
        # compile-time switches of that contract; None for the plain dense/varlen kernels.
        self.kv = kv

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def dense(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
              lse: cute.Tensor, softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        # grid: (query tiles, q heads, batch)
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        self._launch(q, k, v, o, lse, None, None, softmax_scale, grid, stream)

    @cute.jit
    def dense_split(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                    lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor,
                    softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        # grid: (query tiles x splits, q heads, batch); then the combine kernel on the same stream.
        # pack_gqa (seqlen_q == 1): (tiles of the Hq/Hkv q-heads of a kv head x splits, kv heads, batch)
        if cutlass.const_expr(self.pack_gqa):
            grid = (cute.ceil_div(q.shape[2] // k.shape[2], self.tile_m) * self.splits, k.shape[2],
                    q.shape[0])
        else:
            grid = (cute.ceil_div(q.shape[1], self.tile_m) * self.splits, q.shape[2], q.shape[0])
        self._launch(q, k, v, o_partial, lse_partial, None, None, softmax_scale, grid, stream)
        self.combine(o_partial, lse_partial, o, lse).launch(
            grid=(cute.ceil_div(q.shape[1], COMBINE_WARPS), q.shape[2], q.shape[0]),
            block=[32 * COMBINE_WARPS, 1, 1], stream=stream)

    @cute.jit
    def packed(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
               lse: cute.Tensor, cu_seqlens_q: cute.Tensor, cu_seqlens_k: cute.Tensor,
               softmax_scale: cutlass.Float32, max_seqlen_q: cutlass.Int32, stream: cuda.CUstream):
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, grid, stream)

    @cute.jit
    def kvcache(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                sinks: cute.Tensor, kv_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                stream: cuda.CUstream):
        # grid: (query tiles, q heads, batch); the contract's kvcache signature, dense q
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        cache = KvArgs(block_table, cache_seqlens, sinks, kv_descale, softcap, window_left, window_right)
        self._launch(q, k_cache, v_cache, o, lse, None, None, softmax_scale, grid, stream, cache)

    @cute.jit
    def kvcache_packed(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                       o: cute.Tensor, lse: cute.Tensor, block_table: cute.Tensor,
                       cache_seqlens: cute.Tensor, cu_seqlens_q: cute.Tensor, sinks: cute.Tensor,
                       kv_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                       softcap: cutlass.Float32, window_left: cutlass.Int32,
                       window_right: cutlass.Int32, max_seqlen_q: cutlass.Int32,
                       stream: cuda.CUstream):
        # the packed-q form: q/o (Tq, Hq, D), lse (Hq, Tq), sequence b's queries cu[b]:cu[b+1]
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        cache = KvArgs(block_table, cache_seqlens, sinks, kv_descale, softcap, window_left, window_right)
        self._launch(q, k_cache, v_cache, o, lse, cu_seqlens_q, None, softmax_scale, grid, stream, cache)

    # e4m3 caches: the contract's k_descale and v_descale (Hkv,) tensors, each with its own stride
    # (0: one factor for every kv head), reach the kernel as the pair ``KvArgs.kv_descale``.
    @cute.jit
    def kvcache_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                   lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                   sinks: cute.Tensor, k_descale: cute.Tensor, v_descale: cute.Tensor,
                   softmax_scale: cutlass.Float32, softcap: cutlass.Float32, window_left: cutlass.Int32,
                   window_right: cutlass.Int32, stream: cuda.CUstream):
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        cache = KvArgs(block_table, cache_seqlens, sinks, (k_descale, v_descale), softcap, window_left,
                       window_right)
        self._launch(q, k_cache, v_cache, o, lse, None, None, softmax_scale, grid, stream, cache)

    @cute.jit
    def kvcache_packed_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                          o: cute.Tensor, lse: cute.Tensor, block_table: cute.Tensor,
                          cache_seqlens: cute.Tensor, cu_seqlens_q: cute.Tensor, sinks: cute.Tensor,
                          k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                          softcap: cutlass.Float32, window_left: cutlass.Int32,
                          window_right: cutlass.Int32, max_seqlen_q: cutlass.Int32,
                          stream: cuda.CUstream):
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        cache = KvArgs(block_table, cache_seqlens, sinks, (k_descale, v_descale), softcap, window_left,
                       window_right)
        self._launch(q, k_cache, v_cache, o, lse, cu_seqlens_q, None, softmax_scale, grid, stream, cache)

    @cute.jit
    def _launch(self, mQ, mK, mV, mO, mLSE, mCuQ, mCuK, softmax_scale, grid, stream, cache=None):
        D = self.head_dim
        fp8 = cutlass.const_expr(self.kv is not None and self.kv.fp8)
        # 64-element (128-byte) swizzled rows: ldmatrix and 16-byte cp.async without bank conflicts.
        atom = cute.make_composed_layout(
            cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        sQ_layout = cute.tile_to_shape(atom, (self.tile_m, D), (0, 1))
        # K and V tiles of every stage: mode 2 is (K of slot 0, V of slot 0, K of slot 1, ...).
        # fp8 K/V: the cp.async ring holds the fp8 tiles (sKV8) and one K/V slot holds the current
        # tile converted to dtype for ldmatrix.
        sKV_layout = cute.tile_to_shape(atom, (self.tile_n, D, 2 * (1 if fp8 else self.stages)), (0, 1, 2))
        sKV8_layout = None
        g2s_kv = None
        if cutlass.const_expr(fp8):
            sKV8_layout = cute.make_layout((self.tile_n, D, 2 * self.stages),
                                           stride=(D, 1, self.tile_n * D))
            cols = D // 16
            g2s_kv = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                    self.kv.kv_dtype, num_bits_per_copy=128),
                cute.make_layout((self.threads // cols, cols), stride=(cols, 1)),
                cute.make_layout((1, 16)))
        SharedStorage = self._storage(sKV_layout, sKV8_layout)
        if cutlass.const_expr(not fp8):
            sKV8_layout = cute.make_layout(1)  # unused

        vec = 128 // self.dtype.width
        thr_layout = cute.make_layout((self.threads // 8, 8), stride=(8, 1))
        val_layout = cute.make_layout((1, vec))
        g2s = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                self.dtype, num_bits_per_copy=128),
            thr_layout, val_layout)
        if cutlass.const_expr(not fp8):
            g2s_kv = g2s
        s2g = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128),
            thr_layout, val_layout)
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (self.warps, 1, 1),
            permutation_mnk=(self.warps * 16, 16, 16),
        )
        if cutlass.const_expr(cache is None):
            self.kernel(
                mQ, mK, mV, mO, mLSE, mCuQ, mCuK, softmax_scale * LOG2_E,
                sQ_layout, sKV_layout, g2s, s2g, tiled_mma, SharedStorage,
                None, None, None, None, cutlass.Float32(0.0), cutlass.Int32(0), cutlass.Int32(0),
                g2s, cute.make_layout(1),
            ).launch(grid=grid, block=[self.threads, 1, 1], smem=SharedStorage.size_in_bytes(),
                     stream=stream)
        else:
            self.kernel(
                mQ, mK, mV, mO, mLSE, mCuQ, mCuK, softmax_scale * LOG2_E,
                sQ_layout, sKV_layout, g2s, s2g, tiled_mma, SharedStorage,
                cache.block_table, cache.cache_seqlens, cache.sinks, cache.kv_descale,
                cache.softcap, cache.window_left, cache.window_right, g2s_kv, sKV8_layout,
            ).launch(grid=grid, block=[self.threads, 1, 1], smem=SharedStorage.size_in_bytes(),
                     stream=stream)

    def _storage(self, sKV_layout, sKV8_layout):
        """The CTA's shared memory: the K/V ring (Q and O alias its last slot); fp8 K/V add their
        cp.async ring.  (Annotations built as objects: this module's annotations are strings.)"""
        fields = {"kv": cute.struct.Align[
            cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]}
        if sKV8_layout is not None:
            fields["kv8"] = cute.struct.Align[
                cute.struct.MemRange[self.kv.kv_dtype, cute.cosize(sKV8_layout)], 1024]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mCuQ, mCuK, scale_log2: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
               g2s: cute.TiledCopy, s2g: cute.TiledCopy, tiled_mma: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, mTable, mSeqlens, mSinks, mDescale,
               softcap: cutlass.Float32, win_l: cutlass.Int32, win_r: cutlass.Int32,
               g2s_kv: cute.TiledCopy, sKV8_layout: cute.Layout):
        D, BM, BN, S = self.head_dim, self.tile_m, self.tile_n, self.stages
        kv = self.kv
        fp8 = cutlass.const_expr(kv is not None and kv.fp8)
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        split = 0
        if cutlass.const_expr(self.splits > 1):
            split = m_block % self.splits
            m_block = m_block // self.splits

        # ---- this CTA's sequence: (seqlen, D) views of q/k/v/o for its heads, and its LSE row
        if cutlass.const_expr(kv is not None):
            # KV cache: keys 0..k_len of sequence `batch` live in pages (paged: page
            # block_table[b][j // PS], row j % PS; dense: page b, row j), read row by row in
            # load_kv_cache.  seqK/seqV are unused.
            k_len = mSeqlens[batch]
            if cutlass.const_expr(mCuQ is not None):
                q_start = mCuQ[batch]
                q_len = mCuQ[batch + 1] - q_start
                kv_head = head // (mQ.shape[1] // mK.shape[2])
                seqQ = cute.domain_offset((q_start, 0), mQ[None, head, None])
                seqO = cute.domain_offset((q_start, 0), mO[None, head, None])
                seqL = cute.domain_offset((q_start,), mLSE[head, None])
            else:
                q_len = mQ.shape[1]
                kv_head = head // (mQ.shape[2] // mK.shape[2])
                seqQ = mQ[batch, None, head, None]
                seqO = mO[batch, None, head, None]
                seqL = mLSE[batch, head, None]
            seqK = mK[0, None, kv_head, None]
            seqV = mV[0, None, kv_head, None]
        elif cutlass.const_expr(mCuQ is not None):
            q_start = mCuQ[batch]
            q_len = mCuQ[batch + 1] - q_start
            k_start = mCuK[batch]
            k_len = mCuK[batch + 1] - k_start
            kv_head = head // (mQ.shape[1] // mK.shape[1])
            seqQ = cute.domain_offset((q_start, 0), mQ[None, head, None])
            seqK = cute.domain_offset((k_start, 0), mK[None, kv_head, None])
            seqV = cute.domain_offset((k_start, 0), mV[None, kv_head, None])
            seqO = cute.domain_offset((q_start, 0), mO[None, head, None])
            seqL = cute.domain_offset((q_start,), mLSE[head, None])
        elif cutlass.const_expr(self.pack_gqa):
            # seqlen_q == 1: rows are the q-heads [head·G, head·G + G) of kv head `head`
            group = mQ.shape[2] // mK.shape[2]
            q_len = group
            k_len = mK.shape[1]
            kv_head = head
            seqQ = cute.domain_offset((head * group, 0), mQ[batch, 0, None, None])
            seqK = mK[batch, None, kv_head, None]
            seqV = mV[batch, None, kv_head, None]
            seqO = cute.domain_offset((head * group, 0), mO[split, batch, None, 0, None])
            seqL = cute.domain_offset((head * group,), mLSE[split, batch, None, 0])
        else:
            q_len = mQ.shape[1]
            k_len = mK.shape[1]
            kv_head = head // (mQ.shape[2] // mK.shape[2])
            seqQ = mQ[batch, None, head, None]
            seqK = mK[batch, None, kv_head, None]
            seqV = mV[batch, None, kv_head, None]
            if cutlass.const_expr(self.splits > 1):
                # mO / mLSE are the fp32 workspace: (splits, B, Hq, Sq, D) and (splits, B, Hq, Sq)
                seqO = mO[split, batch, head, None, None]
                seqL = mLSE[split, batch, head, None]
            else:
                seqO = mO[batch, None, head, None]
                seqL = mLSE[batch, head, None]

        # KV cache: k_descale folds into the score scale, v_descale into O; softcap (runtime value,
        # <= 0: off) through softmax.softcap_scores; the window's -1 sides through mask.window.
        cap_pre = None
        use_cap = None
        o_scale = None
        sink = None
        win = (None, None)
        if cutlass.const_expr(kv is not None):
            if cutlass.const_expr(fp8):
                scale_log2 = scale_log2 * mDescale[0][kv_head]
                o_scale = mDescale[1][kv_head]
            if cutlass.const_expr(kv.softcap):
                use_cap = softcap > 0.0
                cap = cutlass.max(softcap, 1e-30)
                cap_pre = scale_log2 / (cap * LOG2_E) if use_cap else 0.0
                scale_log2 = cap * LOG2_E if use_cap else scale_log2
            if cutlass.const_expr(kv.sinks):
                sink = mSinks[head]
            win = mask.window(self.mask, win_l, win_r, q_len, k_len)

        m0 = m_block * BM
        if m0 < q_len:
            # ---- key-tile range: [n_lo, n_end); tiles >= n_mask (or, windowed, < mask_lo) need
            # the mask
            n_lo, n_end, mask_lo, n_mask = mask.key_tiles(self.mask, m0, m0 + BM, q_len, k_len, BN,
                                                          win=win)
            # This CTA's key tiles: [n_lo, n_hi), walked from the top.  Split-KV cuts the row
            # block's visible range into `splits` contiguous chunks; an empty chunk (causal rows
            # that see few keys) runs no iteration and writes O = 0, LSE = -inf (weight 0).
            n_hi = n_end
            if cutlass.const_expr(self.splits > 1):
                chunk = (n_end + (self.splits - 1)) // self.splits
                n_lo = cutlass.min(n_end, split * chunk)
                n_hi = cutlass.min(n_end, n_lo + chunk)

            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            sKV = storage.kv.get_tensor(sKV_layout)
            # Q (and at the end O) live in the last slot (2 tiles of BN x D elements); fp8 K/V have
            # one dtype slot (the converted tile), so Q lives in it.
            slots = 1 if fp8 else S
            sQ = cute.make_tensor(storage.kv.data_ptr() + (slots - 1) * 2 * BN * D, sQ_layout)
            # V as (D, BN) per stage for the B operand of P·V.
            sVt = cute.composition(
                sKV, cute.make_layout((D, BN, 2 * S), stride=(BN, 1, BN * D)))

            # ---- gmem -> smem partitions (coordinates are tile-local: (row, col))
            thr_g2s = g2s.get_slice(tidx)
            gQ = cute.local_tile(seqQ, (BM, D), (m_block, 0))
            tQgQ = thr_g2s.partition_S(gQ)
            tQsQ = thr_g2s.partition_D(sQ)
            tQcQ = thr_g2s.partition_S(cute.make_identity_tensor((BM, D)))
            cache = None
            fp8_ring = None
            if cutlass.const_expr(kv is not None):
                # K/V rows are gathered one by one (mma_sync.load_kv_rows): the partitions hold
                # this thread's column offsets only (row stride 0), each row adds its page offset.
                thr_kv = g2s_kv.get_slice(tidx)
                row_cols = cute.make_layout((BN, D), stride=(0, 1))
                ring = sKV
                if cutlass.const_expr(fp8):
                    ring = storage.kv8.get_tensor(sKV8_layout)
                    fp8_ring = (thr_kv, ring, sKV)
                kv_parts = (thr_kv.partition_S(cute.make_tensor(seqK.iterator, row_cols)),
                            thr_kv.partition_S(cute.make_tensor(seqV.iterator, row_cols)),
                            thr_kv.partition_D(ring),
                            thr_kv.partition_S(cute.make_identity_tensor((BN, D))))
                cache = (mK, mV, mTable, batch, k_len, kv.paged)
            else:
                kv_parts = mma_sync.kv_partitions(g2s, tidx, seqK, seqV, sKV, BN, D)
            # ---- MMA partitions
            thr_mma, q_regs, frags, acc_O = mma_sync.operands(tiled_mma, tidx, self.dtype, sQ, sKV, sVt, (BM, D))

            # ---- prologue: Q, then the first S-1 K/V tiles (highest first), one group each
            for r in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
                if m0 + tQcQ[0, r, 0][0] < q_len:
                    cute.copy(g2s, tQgQ[None, r, None], tQsQ[None, r, None])
                else:
                    tQsQ[None, r, None].fill(0)
            cute.arch.cp_async_commit_group()
            # ---- key tiles, last first (mma_sync.py)
            softcap_arg = None
            if cutlass.const_expr(kv is not None and kv.softcap):
                softcap_arg = (cap_pre, use_cap)
            mask_lo_arg = None
            if cutlass.const_expr(self.mask.local):
                mask_lo_arg = mask_lo
            row_max, row_sum = mma_sync.mainloop(
                self.mask, self.dtype, BN, S, (BM, BN), g2s_kv, kv_parts, n_lo, n_hi, n_mask, q_len,
                k_len, tiled_mma, thr_mma, q_regs, frags, acc_O, scale_log2, m0, cache=cache, win=win,
                mask_lo=mask_lo_arg, softcap=softcap_arg, fp8_ring=fp8_ring)

            # ---- epilogue
            cute.arch.cp_async_wait_group(0)
            if cutlass.const_expr(o_scale is not None):
                acc_O.store(acc_O.load() * o_scale)
            softmax.finalize(acc_mn_view(acc_O), acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((BM, D)))),
                             row_max, row_sum, scale_log2, m0, q_len, seqL, tidx, sink=sink)
            if cutlass.const_expr(self.splits > 1):
                # fp32 partial O straight from the accumulators (a few KB per CTA).
                tOgP = thr_mma.partition_C(cute.local_tile(seqO, (BM, D), (m_block, 0)))
                tOcP = thr_mma.partition_C(cute.make_identity_tensor((BM, D)))
                for i in cutlass.range_constexpr(cute.size(acc_O)):
                    if m0 + tOcP[i][0] < q_len:
                        tOgP[i] = acc_O[i]
            else:
                rO = cute.make_fragment_like(acc_O, self.dtype)
                rO.store(acc_O.load().to(self.dtype))
                cute.arch.barrier()  # every warp is done reading the slot that O now overwrites
                r2s = cute.make_tiled_copy_C(
                    cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32),
                    tiled_mma).get_slice(tidx)
                sO = cute.make_tensor(sQ.iterator, sQ_layout)
                cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
                cute.arch.barrier()
                thr_s2g = s2g.get_slice(tidx)
                tOsO = thr_s2g.partition_S(sO)
                tOgO = thr_s2g.partition_D(cute.local_tile(seqO, (BM, D), (m_block, 0)))
                tOcO = thr_s2g.partition_D(cute.make_identity_tensor((BM, D)))
                tOrO = cute.make_fragment_like(tOsO, self.dtype)
                cute.copy(s2g, tOsO, tOrO)
                for r in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                    if m0 + tOcO[0, r, 0][0] < q_len:
                        cute.copy(s2g, tOrO[None, r, None], tOgO[None, r, None])

    @cute.kernel
    def combine(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        """Split-KV combine: one warp per query row (softmax.combine_splits)."""
        softmax.combine_splits(mOp, mLp, mO, mLSE, self.head_dim, self.splits, self.dtype, COMBINE_WARPS)
