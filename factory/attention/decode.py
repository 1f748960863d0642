"""Decode attention (seqlen_q 1-16) for sm_90: packed query rows, key-split warps, split-KV
combined inside the launch (a cluster's CTAs through DSMEM) or by a second, PDL-launched kernel.
Our own CuTe DSL kernel (mma.sync + cp.async, like the sm80 family it borrows its tile code from).

Why a kernel of its own (notes/attention-decode.md): the sm80 family's decode variants give every
CTA a 64-row query tile for the 4 real rows of a GQA group (one row per q head, seqlen_q = 1), so
16x the useful MMA work runs on the tensor cores, and at short contexts the K/V tiles come from L2
faster than that work drains: the kernel is bound by padding, not by memory.  Here:

* Rows: a CTA's 16 rows (one m16n8k16 A fragment) are (query, q head) pairs of one kv head,
  row r = s·G + h (G = Hq/Hkv): the G q heads of a GQA group and up to 16/G queries
  (speculative decoding), so K/V are read once for all of them.  G·Sq > 16 takes several row
  blocks (CTAs along grid x, each reading the K/V).  MHA has G = 1: rows are the queries.
* Warps: every warp holds all 16 rows and owns a ``tile_n / warps``-key slice of each key tile:
  S = Q·Kᵀ and O += P·V of its slice, its own online softmax (running max and sum per row).  The
  MMA work per key is 16 rows, not 64, and all four tensor-core quadrants of the SM work.
* K/V: a ring of ``stages`` cp.async slots shared by the CTA (one barrier per tile), tiles walked
  last first (the causal/tail tile needs the mask; the others run without mask code), as in the
  sm80 family.  Q is loaded once, row by row (its rows are not one strided tile), into a padded
  smem tile that aliases the ring's last slot and is read into registers before that slot is
  first written.
* End of the key loop: the warps' partials meet in shared memory (the ring, now free): per row
  M = max m_w, L = Σ l_w·2^(m_w - M), O = Σ O_w·2^(m_w - M) / L; each thread then owns
  ``head_dim·16 / threads`` contiguous outputs of one row.
* Split-KV (``splits`` > 1): a CTA walks one of ``splits`` contiguous ranges of the key tiles.
  - ``cluster``: the ``splits`` CTAs of a row block form one thread-block cluster.  After a
    cluster barrier (every CTA is done with its ring) the others push their normalised O and LSE
    into rank 0's ring with ``st.async`` (DSMEM), counted by an mbarrier armed with the byte count
    at the start; rank 0 merges them by LSE weight and writes O and LSE.  One launch, no
    workspace.
  - otherwise: every CTA writes its normalised O (fp32) and LSE into the workspace of the
    contract's split-KV signature and a combine kernel (one warp per query row) merges them; it is
    launched with programmatic dependent launch, so its launch overlaps this kernel's tail.
  A split with no key tile, and rows that see no key, give O = 0 and LSE = -inf (weight 0).

Causal masking is bottom-right aligned (query s sees keys j <= s + Sk - Sq); with one query it
hides nothing.  The arguments are the attention contract's dense ones (``contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass.cute.nvgpu import cpasync, warp

from ..abi import DTYPE_BYTES, Signature, TensorArg
from ..atoms.common import add, quad_allreduce
from ..atoms.sm80 import acc_as_a_layout, acc_mn_view
from ..atoms.e4m3_order import V_JOIN, q_pair_slot, v_column
from ..atoms.sm90_e4m3 import e4m3_join_to_f16x2x2, e4m3x4_to_f16x2x2
from ..atoms.sm90_matrix import ldsm_x4, ldsm_x4_trans
from ..atoms.targets import Target
from ..registry import register
from . import contract, mask, mma_sync, softmax
from .base import DTYPES, TOOLKIT_SOURCES, AttentionKernel, AttentionVariant, causal_field
from .mma_sync import load_kv
from .softmax import LN_2, LOG2_E

HEAD_DIMS = (64, 128)
KV_HEAD_DIMS = (64, 128, 256)  # the KV-cache build also takes head_dim 256 (bf16 paged caches)
ROWS = 16  # query rows of a CTA: one m16n8k16 A fragment
# page_run: key tiles per block of block-table entries (32 lanes / 4 row groups of a warp)
TABLE_TILES = 8
# Cluster sizes: 8 is the portable maximum; 16 needs the non-portable attribute, which the DSL's
# exported module loader sets on every kernel.
CLUSTER_SPLITS = (2, 4, 8, 16)
MAX_SPLITS = 32
COMBINE_WARPS = 4  # combine kernel: one warp per query row
SMEM_PER_SM = 228 * 1024
_RESERVED_SMEM = 1024  # per CTA, by the driver


@dataclass(frozen=True, kw_only=True)
class AttentionDecode(AttentionVariant):
    family: ClassVar[str] = "sm90_decode"
    sources = ("attention/decode.py", "attention/mma_sync.py", "atoms/sm80.py", *TOOLKIT_SOURCES)
    HEAD_DIMS = HEAD_DIMS

    rows: int = field(default=ROWS, metadata={"tag": "q"})
    tile_n: int = field(default=64, metadata={"tag": "n"})
    warps: int = field(default=4, metadata={"tag": "w"})
    stages: int = field(default=3, metadata={"tag": "s"})
    causal: bool = causal_field(True)
    splits: int = field(default=1, metadata={"tag": "kv"})
    # splits > 1: merge the splits inside the launch (a cluster of `splits` CTAs, DSMEM), else
    # through a workspace and a second kernel.
    cluster: bool = field(default=False, metadata={"tag": "cl"})
    # Programmatic dependent launch: the grid may start while the previous kernel of the stream
    # finishes (it waits for it before touching memory) and lets the next one start early.
    pdl: bool = field(default=False, metadata={"tag": "pdl"})
    # S = Q·Kᵀ accumulated in two independent chains (even and odd k16 steps), summed after.
    ilp: bool = field(default=False, metadata={"tag": "x2"})
    # Resident CTAs per SM asked of the compiler (launch bounds: registers capped to fit them);
    # 0: none asked.
    min_ctas: int = field(default=0, metadata={"tag": "o"})

    @property
    def name(self) -> str:
        n = super().name  # min_ctas is the last field: "_o0" (none asked) is left out
        return n.removesuffix("_o0")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def sass_requirements(self) -> tuple[str, ...]:
        req = (r"\bHMMA\.16816\.F32", r"\bLDGSTS\.", r"\bLDSM\.16\.M88\.4\b", r"\bLDSM\.16\.MT88\.4\b")
        if self.cluster:
            req += (r"\bSTAS\b", r"\bUCGABAR_ARV\b|\bCGABAR")
        return req

    def ring_bytes(self) -> int:
        return self.stages * 2 * self.tile_n * self.head_dim * DTYPE_BYTES[self.dtype]

    def scratch_bytes(self) -> int:
        """The warps' partials (O, max, sum per row), then (cluster) the other splits' O and LSE
        that rank 0 receives: both reuse the ring."""
        warps = self.warps * ROWS * (self.head_dim + 2) * 4
        recv = (self.splits - 1) * ROWS * (self.head_dim + 1) * 4 if self.cluster else 0
        return max(warps, recv)

    def smem_bytes(self) -> int:
        return max(self.ring_bytes(), self.scratch_bytes()) + 16

    def ctas_per_sm(self) -> int:
        """CTAs one SM holds by shared memory and registers (~184 a thread without launch
        bounds: two CTAs of 128 threads; ``min_ctas`` caps them to fit that many)."""
        by_regs = max(self.min_ctas, 65536 // (self.threads * 184))
        return max(1, min(by_regs, SMEM_PER_SM // (self.smem_bytes() + _RESERVED_SMEM)))

    def can_implement(self) -> str | None:
        t = self.tgt
        if t.name != "sm_90":
            return "the decode attention kernel is built for sm_90 (mma.sync, clusters, PDL)"
        if (problem := self.check_problem()) is not None:
            return problem
        if self.rows != ROWS:
            return f"rows must be {ROWS} (one m16n8k16 A fragment)"
        if self.warps not in (4, 8):
            return "warps must be 4 or 8"
        if self.tile_n % (16 * self.warps) or not 16 <= self.tile_n <= 256:
            return "tile_n must be a multiple of 16·warps (a k16 slice per warp) in [16, 256]"
        if self.tile_n % (self.threads // 8):
            return "tile_n must be whole copy passes"
        if self.stages < 2:
            return "stages must be >= 2"
        if ROWS * (self.head_dim + 8) > 2 * self.tile_n * self.head_dim:
            return "the Q tile must fit in one K/V slot"
        if not 1 <= self.splits <= MAX_SPLITS:
            return f"splits must be in [1, {MAX_SPLITS}]"
        if self.cluster and self.splits not in CLUSTER_SPLITS:
            return f"cluster splits must be one of {CLUSTER_SPLITS}"
        if self.head_dim * ROWS % self.threads or self.head_dim * ROWS // self.threads % 4:
            return "each thread must own a multiple of 4 outputs of one row"
        if self.smem_bytes() > t.smem_per_cta:
            return f"needs {self.smem_bytes()} B of shared memory, {self.target} has {t.smem_per_cta}"
        if self.min_ctas and (self.min_ctas * (self.smem_bytes() + _RESERVED_SMEM) > SMEM_PER_SM
                              or self.min_ctas * self.threads > 1024):
            return f"{self.min_ctas} CTAs do not fit one SM"
        return None

    def signature(self) -> Signature:
        return contract.signature(self.dtype, self.head_dim, False, 1 if self.cluster else self.splits)

    def describe(self) -> dict[str, Any]:
        return {
            **self.contract_fields(),
            "tile": [ROWS, self.tile_n],
            "warps": self.warps,
            "threads": self.threads,
            "stages": self.stages,
            # The workspace convention (runtime/attention.py split_workspace): cluster variants
            # merge in the launch and take none.
            "splits": 1 if self.cluster else self.splits,
            "pack_gqa": False,
            # What the decode rule selects on (runtime/attention.py decode_pick): rows per CTA
            # (q heads x queries of one kv head), the key splits and how they merge.
            "decode_rows": ROWS,
            "kv_splits": self.splits,
            "cluster": [self.splits if self.cluster else 1, 1],
            "ctas_per_sm": self.ctas_per_sm(),
            "smem_bytes": self.smem_bytes(),
            "pdl": self.pdl,
            "preferred": is_default(self),
        }

    def make_kernel(self):
        k = FlashDecodeSm90(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_n=self.tile_n,
            warps=self.warps, stages=self.stages, causal=self.causal, splits=self.splits,
            cluster=self.cluster, pdl=self.pdl, ilp=self.ilp, min_ctas=self.min_ctas,
        )
        return k.dense_split if self.splits > 1 and not self.cluster else k.dense


@dataclass(frozen=True, kw_only=True)
class AttentionDecodeKV(AttentionDecode):
    """The decode kernel over a KV cache (contract.signature_kvcache): per-sequence key counts
    (cache_seqlens), a dense (B, max_seqlen, Hkv, D) cache or a paged one read through the block
    table (any power-of-two page size: the kernel addresses rows, so a page may be smaller or
    larger than a key tile), and the window, softcap and sink switches.  Split-KV merges in a
    cluster (no workspace), or, for 32 splits, through the contract's fp32 workspace and the
    PDL-launched combine kernel (which adds the sink)."""

    op: ClassVar[str] = "attention_kvcache"
    family: ClassVar[str] = "sm90_decode"
    HEAD_DIMS = KV_HEAD_DIMS

    kv_dtype: str = field(default="bf16", metadata={"tag": "c"})
    paged: bool = field(default=True, metadata={"tag": "paged"})
    local: bool = field(default=False, metadata={"tag": "win"})
    softcap: bool = field(default=False, metadata={"tag": "cap"})
    sinks: bool = field(default=False, metadata={"tag": "sink"})
    # fp8 caches: the MMAs read their K/V operands straight from a ring of ``stages`` raw e4m3 tiles
    # (ldmatrix, then e4m3 -> f16 in registers); no converted ring.
    direct: bool = field(default=False, metadata={"tag": "rc"})
    # direct fp8 build: each warp copies the rows of its own key slice, so a tile needs no CTA barrier
    # (a warp waits for its own copies only) and the warps of a CTA run out of step.
    own: bool = field(default=False, metadata={"tag": "ow"})
    # direct fp8 build: each copy's address from this thread's K/V chunk address (taken once) plus
    # page·page stride + row·row stride in unsigned 32x64-bit products (the page index and row as
    # unsigned: the contract's block table holds pages >= 0), not the cache tensor's full signed
    # 64-bit index arithmetic per copy.
    fast_addr: bool = field(default=False, metadata={"tag": "fa"})
    # Workspace splits merged in the launch: every split writes its normalised O and LSE to the
    # workspace, then counts itself in its CTA group's arrival counter (``counters``); the split
    # that arrives last merges all of them in split order and sets the counter back to 0.
    last: bool = field(default=False, metadata={"tag": "lm"})
    # ``page_run`` (bf16/f16 paged caches, head_dim <= 128; "full", for measuring): each thread copies
    # R = tile_n / (threads / 8) consecutive rows of a tile, so over pages of >= R rows its rows lie in
    # one page: one K and one V address per tile (its chunk address in page 0, row 0, taken once, +
    # page · page stride + row · row stride), each further row one 64-bit add.  The block-table
    # entries come TABLE_TILES tiles at a time, one per lane (lane l: tile l / 4 of the block, the
    # warp's row group l % 4), read a block ahead, and reach the copying lanes by a shuffle.  Pages
    # of fewer rows take the row-by-row copy.  Without it (the default) every row takes its own table
    # entry, read one tile ahead, and its own index computation.
    page_run: bool = field(default=False, metadata={"tag": "pr"})
    # direct fp8 build: only the prologue's copies check rows against the sequence length (tiles go
    # last first, so the one tile that may hold rows past it, the last, is always a prologue tile);
    # the key loop's copies and block-table reads go unchecked: no predicated zero-fill stores.
    tail_zero: bool = field(default=False, metadata={"tag": "tz"})
    sources = (*AttentionDecode.sources, "atoms/e4m3_order.py", "atoms/sm90_e4m3.py", "atoms/sm90_matrix.py")

    @property
    def name(self) -> str:
        return AttentionVariant.name.fget(self).replace("_o0_", "_")

    def ring_bytes(self) -> int:
        if self.direct:  # raw e4m3 K and V tiles, one byte an element
            return self.stages * 2 * self.tile_n * self.head_dim
        return super().ring_bytes()

    def sass_requirements(self) -> tuple[str, ...]:
        req = super().sass_requirements()
        if self.kv_dtype == "e4m3":  # the packed conversion: one instruction per two e4m3 values
            req += (r"\bF2FP\.F16\.E4M3\.UNPACK_B\b",)
        return req

    def raw_bytes(self) -> int:
        """fp8 caches: the ring of raw e4m3 K/V tiles that cp.async fills ahead of the converted
        ring (FP8_RAW_STAGES tiles in flight)."""
        return FP8_RAW_STAGES * 2 * self.tile_n * self.head_dim if self.kv_dtype == "e4m3" and not self.direct else 0

    def smem_bytes(self) -> int:
        raw = self.raw_bytes()
        return super().smem_bytes() + (raw + 128 if raw else 0)

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why:
            return why
        if self.kv_dtype not in (self.dtype, "e4m3"):
            return f"the K/V cache dtype must be {self.dtype} or e4m3"
        if self.kv_dtype == "e4m3" and not self.paged:
            return "fp8 caches are built paged only"
        if self.kv_dtype == "e4m3" and (self.tile_n * self.head_dim // 16) % self.threads:
            return "fp8 K/V tiles must be whole copy passes"
        if self.kv_dtype == "e4m3" and self.head_dim != 128:
            return "fp8 caches are built for head_dim 128"
        if self.direct and (self.kv_dtype != "e4m3" or self.tile_n // self.warps not in (16, 32) or self.ilp):
            return "direct e4m3 operands: fp8 caches, 16 or 32 keys per warp, one S chain"
        if (self.own or self.fast_addr or self.tail_zero) and not self.direct:
            return "warp-own copies and the short copy addresses: the direct e4m3 build only"
        if not self.causal:
            return "built bottom-right causal (one query: the same as no mask)"
        if self.page_run and (not self.paged or self.kv_dtype == "e4m3" or self.head_dim > 128):
            return "page runs: bf16/f16 paged caches, head_dim <= 128"
        if self.last and (self.splits < 2 or self.cluster or self.splits % (self.threads // ROWS)
                          or (self.kv_dtype == "e4m3" and not self.direct)):
            return ("the last-arrival merge: workspace splits (a multiple of threads / 16, no cluster) of "
                    "bf16/f16 caches or of the direct e4m3 build")
        return None

    def signature(self) -> Signature:
        return contract.signature_kvcache(self.dtype, self.kv_dtype, self.head_dim, self.paged, None,
                                          splits=1 if self.cluster else self.splits, counters=self.last)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(contract.manifest_fields_kvcache(
            self.dtype, self.kv_dtype, self.head_dim, paged=self.paged, page_size=None, causal=self.causal,
            local=self.local, softcap=self.softcap, sinks=self.sinks))
        d["page_sizes"] = list(contract.PAGE_SIZES) if self.paged else []
        d["max_seqlen_q"] = DECODE_MAX_SEQLEN_Q
        if self.last:  # the workspace splits' arrival counters (zero at launch, left zero); the rule names it
            d["workspace"] = {"form": "counters"}
            d["preferred"] = False
        return d

    def make_kernel(self):
        k = FlashDecodeSm90(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_n=self.tile_n,
            warps=self.warps, stages=self.stages, causal=self.causal, splits=self.splits,
            cluster=self.cluster, pdl=self.pdl, ilp=self.ilp, min_ctas=self.min_ctas,
            kv=True, paged=self.paged, local=self.local, softcap=self.softcap, sinks=self.sinks,
            fp8=self.kv_dtype == "e4m3", direct=self.direct, own=self.own, fast_addr=self.fast_addr,
            last=self.last, page_run=self.page_run, tail_zero=self.tail_zero,
        )
        if self.kv_dtype == "e4m3":  # (the contract's k_descale and v_descale in place of kv_descale)
            if self.last:
                return k.kvcache_last_f8
            return k.kvcache_split_f8 if self.splits > 1 and not self.cluster else k.kvcache_f8
        if self.last:
            return k.kvcache_last
        return k.kvcache_split if self.splits > 1 and not self.cluster else k.kvcache


ROPE_NEOX = 1  # FlashDecodeSm90.rope: GPT-NeoX halves (element i pairs with i + R/2)
ROPE_INTERLEAVED = 2  # GPT-J pairs (2j, 2j + 1)


@dataclass(frozen=True, kw_only=True)
class AttentionDecodeKVRope(AttentionDecodeKV):
    """The KV-cache decode kernel that applies the rotary embedding to q in its prologue (the cache
    holds keys already rotated, e.g. by ``rope_kvcache`` with q left out): q is loaded as usual,
    rotated in shared memory at positions ``cache_seqlens[b] - seqlen_q + s`` from a float32
    ``cos_sin_cache`` (max_position, R) (R/2 cosines then R/2 sines, R a multiple of 16, the first R
    columns of each head rotated), then read into registers.  The arguments are the KV-cache
    contract's with ``cos_sin_cache`` after ``kv_descale``.  A separate op: the KV-cache selection
    never takes these; the runtime launches the twin of the variant it selected."""

    op: ClassVar[str] = "attention_kvcache_rope"
    interleaved: bool = field(default=False, metadata={"tag": "gptj"})

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why:
            return why
        if self.kv_dtype != self.dtype:
            return "the rotary prologue is built for bf16/f16 caches"
        return None

    def signature(self) -> Signature:
        sig = super().signature()
        args = list(sig.args)
        at = next(i for i, a in enumerate(args) if a.name == "kv_descale") + 1
        args.insert(at, TensorArg("cos_sin_cache", "f32", ("MAXPOS", "R"), ("sCp", 1)))
        return Signature(tuple(args), tuple(sorted((*sig.divisibility, ("R", 16), ("sCp", 4)))))

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["rope"] = "interleaved" if self.interleaved else "neox"
        d["rotary_multiple"] = 16
        return d

    def make_kernel(self):
        k = FlashDecodeSm90(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_n=self.tile_n,
            warps=self.warps, stages=self.stages, causal=self.causal, splits=self.splits,
            cluster=self.cluster, pdl=self.pdl, ilp=self.ilp, min_ctas=self.min_ctas,
            kv=True, paged=self.paged, local=self.local, softcap=self.softcap, sinks=self.sinks,
            rope=ROPE_INTERLEAVED if self.interleaved else ROPE_NEOX, page_run=self.page_run,
        )
        return k.kvcache_rope_split if self.splits > 1 and not self.cluster else k.kvcache_rope


def rope_twin(v: "AttentionDecodeKV", interleaved: bool = False) -> AttentionDecodeKVRope:
    """The rotary-prologue build of KV-cache variant ``v`` (same tile, splits, switches)."""
    import dataclasses
    return AttentionDecodeKVRope(**{f.name: getattr(v, f.name) for f in dataclasses.fields(v)},
                                 interleaved=interleaved)


DECODE_MAX_SEQLEN_Q = 16


# The default config per head_dim: (tile_n, warps, stages, pdl, ilp, min_ctas); the runtime's
# decode rule (runtime/attention.py decode_pick) prefers it where a bundle has several.  H100,
# bf16 D128 (notes/attention-decode.md): 64-key tiles in a 3-stage ring (96 KB, two
# CTAs per SM) were the best or within 2 % of the best of five configs on most of 52 shapes.
# PDL (``pdl``) is built where it paid: the second-kernel split, and twins of the cluster
# splits that the rule takes for grids leaving half the SMs idle (it cost up to 18 % on grids of
# ~128 CTAs: the next grid's early CTAs doubled up on the idle SMs and ran last).
DEFAULT = {128: (64, 4, 3, False, False, 0), 64: (64, 4, 4, False, False, 0),
           # head_dim 256 (KV-cache decode only): two 64 KB stages, one CTA per SM, 254 registers
           256: (64, 4, 2, False, False, 0)}
# fp8 e4m3 caches (head_dim 128), the converting build (``direct`` off; "full", for measuring): a
# 2-stage ring of converted (f16) tiles fed from a ring of FP8_RAW_STAGES raw e4m3 tiles that
# cp.async keeps in flight: 64 + 48 KB, two CTAs per SM.
FP8_STAGES = 2
FP8_RAW_STAGES = 3
# fp8 e4m3 caches, the direct build (the default): (tile_n, warps, stages) -- 128-key tiles, 32 keys
# per warp, a ring of 3 raw e4m3 tiles (96 KB, two CTAs per SM).  H100, page 16/64, bf16 over fp8 at
# the rule's split count (notes/attention-kvcache.md): 1.40-1.77x here against 1.51-1.76x for 64-key
# tiles (3 or 4 stages: three CTAs per SM) and 1.55-1.77x for 128-key tiles in 2 stages.
FP8_DIRECT = (128, 4, 3)
# The default fp8 builds take the direct build with warp-own copies and short copy addresses (``own``,
# ``fast_addr``): H100, page 16/64, each variant by name beside the plain direct build, same pages
# (notes/attention-kvcache.md): the same or faster at every shape and split count measured (B64 H32/8
# 2k unsplit 101.4 vs 102.8 µs, B4 4k at 4 splits 19.4 vs 21.8, MQA B8 4k at 8 splits 12.3 vs 13.5,
# B1 32k at 8 splits 40.2 vs 46.2); the plain build stays in "full" for measuring.  With them the
# length check in the prologue only (``tail_zero``: no predicated zero-fill stores in the key loop,
# 772 -> 690 SASS per loop trip); H200, page 16/64, beside the same builds without it, same pages:
# never slower, up to 5-7 % faster where one CTA per SM runs (B16 H32/8 4k 40.0 vs 41.6 µs, B4 4k
# 18.6 vs 19.5, B1 32k 24.4 vs 26.1), within 1 % at B64 2k; those stay in "full" for measuring.
FP8_OWN = dict(own=True, fast_addr=True, tail_zero=True)
FP8_OWN_PLAIN = dict(own=True, fast_addr=True)
# (tile_n, warps, ilp) of the fp8 build of one CTA per SM: 8 warps over 128-key tiles, FP8_WIDE_STAGES
# raw tiles (128 KB).  The rule takes it where the grid leaves half the SMs idle, at 8 cluster splits
# with PDL in the default tier (H100, page 16/64: MQA B8 H16/1 4k 11.8/11.7 µs vs 12.3/12.1 for 4
# warps); at 2 splits of a grid within the SMs it ties or loses (B8 H32/8 8k 56.4/56.3 vs 55.7/53.8).
FP8_WIDE = (128, 8, False)
FP8_WIDE_STAGES = 4
# (tile_n, warps, ilp, stages) of the bf16/f16-cache builds of 8 warps over 128-key tiles: each warp
# still owns a 16-key slice of a tile, so a CTA walks half the tiles one after another with twice
# the warps to hide each one's latency.  head_dim 128: 192 KB, one CTA per SM; head_dim 64: 96 KB and
# 124 registers, two per SM.  The selection (tests/kvcache_rules.py _wide_pick, C decode_wide_pick) takes them
# where they ran faster on the H100 (notes/attention-kvcache.md): MQA-like grids that leave half the
# SMs idle (head_dim 128), and head_dim 64 at half the default build's split count.
KV_WIDE = {128: (128, 8, False, 3), 64: (128, 8, False, 3)}
# Split counts built: merged in a cluster (8 is the portable cluster maximum; 16-CTA clusters ran
# 2x slower than 8: co-scheduling), and through the workspace and the combine kernel.
CLUSTER_BUILT = (2, 4, 8)
GLOBAL_BUILT = (32,)
# "full": alternatives, for measuring.
FULL_CONFIGS = {128: ((128, 4, 2, False, False, 0), (64, 4, 4, False, False, 0), (64, 4, 3, False, True, 0),
                      (64, 4, 2, False, False, 3)),
                64: ((128, 4, 3, False, False, 0),)}


def is_default(v: "AttentionDecode") -> bool:
    """The default config (PDL aside: the split decides it, see DEFAULT)."""
    tn, w, st, _, ilp, mc = DEFAULT.get(v.head_dim, (0,) * 6)
    if getattr(v, "kv_dtype", None) == "e4m3":
        if not (v.direct and v.own and v.fast_addr and v.tail_zero):
            return False
        tn, w, st = FP8_DIRECT
    return (v.tile_n, v.warps, v.stages, v.ilp, v.min_ctas) == (tn, w, st, ilp, mc)


def make(target: str, dtype: str, head_dim: int, config: tuple, splits: int, cluster: bool) -> AttentionDecode:
    tn, w, st, pdl, ilp, mc = config
    return AttentionDecode(target=target, dtype=dtype, head_dim=head_dim, tile_n=tn, warps=w, stages=st,
                           causal=True, splits=splits, cluster=cluster and splits > 1, pdl=pdl, ilp=ilp,
                           min_ctas=mc)


@register("attention")
def enumerate_decode(target: Target, tier: str) -> list[AttentionDecode]:
    if target.name != "sm_90":
        return []
    if tier == "test":  # one of each path: unsplit, cluster merge (and its PDL twin), second kernel
        c, p = DEFAULT[128], (*DEFAULT[128][:3], True, *DEFAULT[128][4:])
        out = [make(target.name, "bf16", 128, c, 1, False), make(target.name, "bf16", 128, c, 4, True),
               make(target.name, "bf16", 128, p, 4, True), make(target.name, "bf16", 128, p, 32, False)]
        return [v for v in out if v.can_implement() is None]
    out = []
    splits = [(1, False)] + [(sp, True) for sp in CLUSTER_BUILT] + [(sp, False) for sp in GLOBAL_BUILT]
    for dt in DTYPES:
        for d in HEAD_DIMS:
            configs = [DEFAULT[d]] + (list(FULL_CONFIGS[d]) if tier == "full" else [])
            for c in configs:
                for sp, cl in splits:
                    if sp > 1:  # PDL: the second-kernel splits always, the cluster splits as twins
                        pc = (*c[:3], True, *c[4:])
                        if (dt, d, sp, cl) == ("bf16", 128, 8, True) and c == DEFAULT[d]:
                            # the 8-cluster's PDL twin (taken where 8 splits leave half the SMs
                            # idle, as the 8-warp build): 8 warps over 128-key tiles
                            pc = (*KV_WIDE[128][:2], KV_WIDE[128][3], True, False, 0)
                        out.append(make(target.name, dt, d, pc, sp, cl))
                    if sp == 1 or cl:
                        out.append(make(target.name, dt, d, c, sp, cl))
    out = list({v.name: v for v in out}.values())
    return [v for v in out if v.can_implement() is None]


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class FlashDecodeSm90:
    def __init__(self, *, dtype, head_dim: int, tile_n: int, warps: int, stages: int, causal: bool,
                 splits: int, cluster: bool, pdl: bool = False, ilp: bool = False, min_ctas: int = 0,
                 kv: bool = False, paged: bool = False, local: bool = False, softcap: bool = False,
                 sinks: bool = False, fp8: bool = False, direct: bool = False, own: bool = False,
                 fast_addr: bool = False, rope: int = 0, last: bool = False, page_run: bool = False,
                 tail_zero: bool = False):
        self.dtype = dtype
        # ``page_run`` (bf16/f16 paged caches, head_dim <= 128; AttentionDecodeKV.page_run): a thread's
        # copy rows are consecutive (one page over pages of >= rows_run rows), the table entries a
        # block of TABLE_TILES tiles ahead, one per lane (fetch_block, table_entry).
        self.page_run = kv and paged and not fp8 and page_run and head_dim <= 128
        self.rows_run = tile_n // (32 * warps // 8)
        # ``rope`` (KV-cache builds, bf16/f16 caches): q is rotated in the prologue, in shared
        # memory between its load and the registers' read (ROPE_NEOX / ROPE_INTERLEAVED).  0: off.
        self.rope = rope
        # Workspace splits merged by the last split to arrive (AttentionDecodeKV.last): no combine
        # kernel; ``counters`` holds one arrival counter per CTA group.
        self.last = last and kv and splits > 1 and not (cluster and splits > 1)
        # Attention over a KV cache (contract.signature_kvcache): per-sequence key counts from
        # cache_seqlens; ``paged``: K/V rows addressed through the block table; window, softcap
        # and sink switches.  All off: the dense attention contract, code unchanged.
        self.kv = kv
        self.paged = paged
        self.local = local
        self.softcap = softcap
        self.sinks = sinks
        # fp8 e4m3 K/V (paged): each thread cp.asyncs its 16-byte chunks of a tile into a ring of
        # raw e4m3 tiles (FP8_RAW_STAGES in flight) and, after the current tile's MMAs, converts
        # its own chunks of the next tile (e4m3x2 -> f16x2, one instruction per pair) into the
        # 2-stage ring of converted tiles the MMAs read.  The MMAs run in f16 (``mdtype``): for
        # bf16 q, Q is converted once, scaled by a power of two that puts the CTA's largest |q|
        # at 2^13..2^14 (exact exponent shift; no f16 overflow), and the scale comes back out of
        # the score scale.  k_descale folds into the score scale, v_descale into O.
        self.fp8 = fp8
        # ``direct`` (fp8): no converted ring; the ``stages`` ring holds raw e4m3 K/V tiles (128-byte
        # rows, 16-byte chunks swizzled by row % 8) and each warp reads its operands from it with
        # ldmatrix and converts them in registers (gemm_qk_raw, gemm_pv_raw).  Q is then always
        # staged through registers (scale_q), its head_dim columns in the MMA's k order.
        self.direct = fp8 and direct
        # ``own`` (direct): a thread's copy rows are those of its warp's key slice (copy_row), so a
        # warp waits for its own cp.async groups and syncs only itself before reading a tile: no CTA
        # barrier in the key loop.  The slot a warp refills is one only it has read.
        self.own = self.direct and own
        # ``fast_addr`` (direct): copy addresses as this thread's chunk address in page 0, row 0
        # (taken once) + page·page stride + row·row stride (unsigned 32x64-bit products)
        self.fast_addr = self.direct and fast_addr
        # ``tail_zero`` (direct): the key loop's copies and page reads skip the length check (its
        # tiles lie below the last tile, which the prologue loads)
        self.tail_zero = self.direct and tail_zero
        self.mdtype = cutlass.Float16 if fp8 else dtype
        self.q_convert = fp8 and (dtype is not cutlass.Float16 or self.direct)
        self.raw_stages = FP8_RAW_STAGES
        self.c_per_row = head_dim // 16  # fp8 chunks of one row
        self.rows_pp = (32 * warps) // self.c_per_row  # rows of one pass
        self.passes = tile_n // self.rows_pp
        self.head_dim = head_dim
        self.tile_n = tile_n
        self.warps = warps
        self.threads = 32 * warps
        self.stages = stages
        self.causal = causal
        self.mask = mask.MaskSpec(causal=causal, local=local)
        self.splits = splits
        self.cluster = cluster and splits > 1
        self.pdl = pdl
        self.ilp = ilp
        self.min_ctas = min_ctas
        self.bnw = tile_n // warps  # keys of one warp's slice of a tile
        self.tpr = self.threads // ROWS  # threads per row in the merge
        self.epr = head_dim // self.tpr  # outputs per thread in the merge
        v = AttentionDecode(target="sm_90", dtype="bf16" if dtype is cutlass.BFloat16 else "f16",
                            head_dim=head_dim, tile_n=tile_n, warps=warps, stages=stages,
                            causal=causal, splits=splits, cluster=cluster, min_ctas=min_ctas)
        self.smem_elems = (v.smem_bytes() - 16) // 2
        if self.direct:
            self.smem_elems = (max(stages * 2 * tile_n * head_dim, v.scratch_bytes()) + 1) // 2
        self.raw_elems = FP8_RAW_STAGES * 2 * tile_n * head_dim
        assert not fp8 or ((stages == 2 or self.direct) and ROWS * head_dim // 8 % self.threads == 0)
        assert not self.direct or (self.bnw in (16, 32) and head_dim == 128 and stages >= 2)
        self.recv_bytes = ROWS * (head_dim + 1) * 4  # what one split pushes to rank 0

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def dense(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
              lse: cute.Tensor, softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        self._launch(q, k, v, o, lse, None, None, softmax_scale, stream)

    @cute.jit
    def dense_split(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                    lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor,
                    softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        self._launch(q, k, v, o, lse, o_partial, lse_partial, softmax_scale, stream)
        self.combine(o_partial, lse_partial, o, lse, None).launch(
            grid=(cute.ceil_div(q.shape[1], COMBINE_WARPS), q.shape[2], q.shape[0]),
            block=[32 * COMBINE_WARPS, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def kvcache(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                kv_descale: cute.Tensor, softmax_scale: cutlass.Float32, softcap: cutlass.Float32,
                window_left: cutlass.Int32, window_right: cutlass.Int32, stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, None, None, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, kv_descale)

    @cute.jit
    def kvcache_split(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                      lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor, block_table: cute.Tensor,
                      cache_seqlens: cute.Tensor, sinks: cute.Tensor, kv_descale: cute.Tensor,
                      softmax_scale: cutlass.Float32, softcap: cutlass.Float32, window_left: cutlass.Int32,
                      window_right: cutlass.Int32, stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, o_partial, lse_partial, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, kv_descale)
        self.combine(o_partial, lse_partial, o, lse, sinks).launch(
            grid=(cute.ceil_div(q.shape[1], COMBINE_WARPS), q.shape[2], q.shape[0]),
            block=[32 * COMBINE_WARPS, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def kvcache_rope(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                     lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                     kv_descale: cute.Tensor, cos_sin_cache: cute.Tensor, softmax_scale: cutlass.Float32,
                     softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                     stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, None, None, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, kv_descale,
                     cos_sin_cache)

    @cute.jit
    def kvcache_rope_split(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                           lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor,
                           block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                           kv_descale: cute.Tensor, cos_sin_cache: cute.Tensor, softmax_scale: cutlass.Float32,
                           softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                           stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, o_partial, lse_partial, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, kv_descale,
                     cos_sin_cache)
        self.combine(o_partial, lse_partial, o, lse, sinks).launch(
            grid=(cute.ceil_div(q.shape[1], COMBINE_WARPS), q.shape[2], q.shape[0]),
            block=[32 * COMBINE_WARPS, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def kvcache_last(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                     lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor, counters: cute.Tensor,
                     block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                     kv_descale: cute.Tensor, softmax_scale: cutlass.Float32, softcap: cutlass.Float32,
                     window_left: cutlass.Int32, window_right: cutlass.Int32, stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, o_partial, lse_partial, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, kv_descale, mCnt=counters)

    # e4m3 caches: the contract's k_descale and v_descale (Hkv,) tensors, each with its own stride
    # (0: one factor for every kv head), reach the kernel as the pair mDesc.
    @cute.jit
    def kvcache_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                   lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                   k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                   softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                   stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, None, None, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, (k_descale, v_descale))

    @cute.jit
    def kvcache_split_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                         lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor,
                         block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                         k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                         softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                         stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, o_partial, lse_partial, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, (k_descale, v_descale))
        self.combine(o_partial, lse_partial, o, lse, sinks).launch(
            grid=(cute.ceil_div(q.shape[1], COMBINE_WARPS), q.shape[2], q.shape[0]),
            block=[32 * COMBINE_WARPS, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def kvcache_last_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                        lse: cute.Tensor, o_partial: cute.Tensor, lse_partial: cute.Tensor, counters: cute.Tensor,
                        block_table: cute.Tensor, cache_seqlens: cute.Tensor, sinks: cute.Tensor,
                        k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                        softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                        stream: cuda.CUstream):
        self._launch(q, k_cache, v_cache, o, lse, o_partial, lse_partial, softmax_scale, stream,
                     block_table, cache_seqlens, sinks, softcap, window_left, window_right, (k_descale, v_descale),
                     mCnt=counters)

    @cute.jit
    def _launch(self, mQ, mK, mV, mO, mLSE, mOp, mLp, softmax_scale, stream,
                mBT=None, mSeq=None, mSinks=None, softcap=None, wl=None, wr=None, mDesc=None, mCS=None,
                mCnt=None):
        D, BN, S = self.head_dim, self.tile_n, self.stages
        # K/V: 64-element (128-byte) swizzled rows (ldmatrix and 16-byte cp.async without bank
        # conflicts); mode 2 is (K of slot 0, V of slot 0, K of slot 1, ...).
        atom = cute.make_composed_layout(
            cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        sKV_layout = cute.tile_to_shape(atom, (BN, D, 2 * S), (0, 1, 2))
        # Q: rows padded by 16 bytes (ldmatrix without conflicts; rows are loaded one by one).
        sQ_layout = cute.make_layout((ROWS, D), stride=(D + 8, 1))

        SharedStorage = self.shared_storage()
        vec = 128 // self.dtype.width
        g2s = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                self.dtype, num_bits_per_copy=128),
            cute.make_layout((self.threads // 8, 8), stride=(8, 1)), cute.make_layout((1, vec)))
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.mdtype, cutlass.Float32, (16, 8, 16)), (1, 1, 1),
            permutation_mnk=(ROWS, 16, 16))
        group = mQ.shape[2] // mK.shape[2]
        row_blocks = cute.ceil_div(group * mQ.shape[1], ROWS)
        grid = (row_blocks * self.splits, mK.shape[2], mQ.shape[0])
        score_mul = None
        cap_s = None
        if cutlass.const_expr(self.softcap):
            # scores s become cap·tanh(s·scale/cap)/scale (so the softmax's scale still applies);
            # softcap 0 at launch: off
            score_mul = softmax_scale / softcap
            cap_s = softcap / softmax_scale
        kern = self.kernel(mQ, mK, mV, mO, mLSE, mOp, mLp, softmax_scale * LOG2_E, sQ_layout,
                           sKV_layout, g2s, tiled_mma, SharedStorage, mBT, mSeq, mSinks, score_mul, cap_s, wl, wr,
                           mDesc, mCS, mCnt)
        extra = {"min_blocks_per_mp": self.min_ctas, "preferred_smem_carveout": 100} if self.min_ctas else {}
        if cutlass.const_expr(self.cluster):
            kern.launch(grid=grid, block=[self.threads, 1, 1], cluster=(self.splits, 1, 1),
                        smem=SharedStorage.size_in_bytes(), stream=stream, use_pdl=self.pdl, **extra)
        else:
            kern.launch(grid=grid, block=[self.threads, 1, 1], smem=SharedStorage.size_in_bytes(),
                        stream=stream, use_pdl=self.pdl, **extra)

    def shared_storage(self):
        """The ring (converted tiles for fp8 caches), [fp8: the raw e4m3 ring], the cluster merge's
        mbarrier."""
        fields = {"kv": cute.struct.Align[cute.struct.MemRange[self.mdtype, self.smem_elems], 1024]}
        if self.fp8 and not self.direct:
            fields["raw"] = cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, self.raw_elems], 128]
        fields["bar"] = cute.struct.MemRange[cutlass.Int64, 1]
        # (built from a dict: this module's annotations are strings, which cute.struct does not evaluate)
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mOp, mLp, scale_log2: cutlass.Float32,
               sQ_layout: cute.Layout, sKV_layout: cute.ComposedLayout, g2s: cute.TiledCopy,
               tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr, mBT, mSeq, mSinks,
               score_mul, cap, wl, wr, mDesc, mCS=None, mCnt=None):
        D, BN, S, W, SP, BNW = self.head_dim, self.tile_n, self.stages, self.warps, self.splits, self.bnw
        tidx, _, _ = cute.arch.thread_idx()
        bx, kv_head, batch = cute.arch.block_idx()
        wid = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        split = bx % SP
        row0 = (bx // SP) * ROWS
        group = mQ.shape[2] // mK.shape[2]
        q_len = mQ.shape[1]
        k_len = mK.shape[1]
        if cutlass.const_expr(self.kv):
            k_len = mSeq[batch]
        v_descale = None
        if cutlass.const_expr(self.fp8):
            # s·k_descale: the scale (and, with softcap on, tanh's argument; its output keeps the
            # softcap in true units: divided here, multiplied back by the scale)
            k_descale = mDesc[0][kv_head]
            v_descale = mDesc[1][kv_head]
            scale_log2 = scale_log2 * k_descale
            if cutlass.const_expr(self.softcap):
                score_mul = score_mul * k_descale
                cap = cap / k_descale
        n_rows = group * q_len
        if cutlass.const_expr(self.pdl or (SP > 1 and not self.cluster and not self.last)):
            # The next grid (the combine kernel, or with pdl whatever follows) may be scheduled
            # once every CTA of this one has started; it waits for this grid before reading.
            cute.arch.griddepcontrol_launch_dependents()

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        bar = storage.bar.data_ptr()
        if cutlass.const_expr(self.cluster):
            if wid == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(bar, 1)
                    if split == 0:  # what the other splits push: O and LSE of 16 rows each
                        cute.arch.mbarrier_arrive_and_expect_tx(bar, (SP - 1) * self.recv_bytes)
            cute.arch.mbarrier_init_fence()

        # ---- key tiles [0, n_end); tiles >= n_mask need the mask; this split's [n_lo, n_hi)
        # (the block's rows are queries row0 // group .. its last row's, at most q_len - 1)
        s_last = cutlass.min(q_len - 1, (row0 + ROWS - 1) // group)
        win = mask.window(self.mask, wl, wr, q_len, k_len)  # (None, None) without the window switch
        n_begin, n_end, mask_lo, n_mask = mask.key_tiles(self.mask, row0 // group, s_last + 1, q_len, k_len, BN,
                                                         win=win)
        n_lo = n_begin
        n_hi = n_end
        if cutlass.const_expr(SP > 1 and self.local):  # the window's first tile may be > 0
            chunk = (n_end - n_begin + (SP - 1)) // SP
            n_lo = cutlass.min(n_end, n_begin + split * chunk)
            n_hi = cutlass.min(n_end, n_lo + chunk)
        elif cutlass.const_expr(SP > 1):
            chunk = (n_end + (SP - 1)) // SP
            n_lo = cutlass.min(n_end, split * chunk)
            n_hi = cutlass.min(n_end, n_lo + chunk)

        # Q aliases the last slot (read into registers before that slot is first written).
        q_off = (S - 1) * 2 * BN * D
        sRawD = None
        if cutlass.const_expr(self.direct):
            # (sKV: only the MMA operands' shapes are taken from it; the raw ring is sRawD)
            sKV = cute.make_tensor(storage.kv.data_ptr(), sKV_layout)
            sRawD = cute.make_tensor(cute.recast_ptr(storage.kv.data_ptr(), dtype=cutlass.Float8E4M3FN),
                                     cute.make_layout(S * 2 * BN * D))
            q_off = (S - 1) * BN * D  # (f16 elements: the raw slot's byte offset / 2)
        else:
            sKV = storage.kv.get_tensor(sKV_layout)
        sQ = cute.make_tensor(storage.kv.data_ptr() + q_off, sQ_layout)
        sVt = cute.composition(sKV, cute.make_layout((D, BN, 2 * S), stride=(BN, 1, BN * D)))
        # This warp's key slice of every slot.
        sKw = cute.local_tile(sKV, (BNW, D, 2 * S), (wid, 0, 0))
        sVtw = cute.local_tile(sVt, (D, BNW, 2 * S), (0, wid, 0))

        tKgK = tVgV = tKVsKV = tKVcKV = None
        if cutlass.const_expr(not self.fp8):
            seqK = mK[batch, None, kv_head, None]
            seqV = mV[batch, None, kv_head, None]
            tKgK, tVgV, tKVsKV, tKVcKV = mma_sync.kv_partitions(g2s, tidx, seqK, seqV, sKV, BN, D)

        # The warp's operands over its key slice: tSsK (CPY, BNW/16, D/16, 2S), tOsV (CPY, D/16, BNW/16, 2S).
        thr_mma, (s2r_Q, _, tSrQ), (tSrK, tSsK, tSrK_v, s2r_K, tOsV, tOrV, tOrV_v, s2r_V), acc_O = \
            mma_sync.operands(tiled_mma, lane, self.mdtype, sQ, sKw, sVtw, (ROWS, D))

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # the previous grid's writes are visible from here
        # ---- prologue: Q row by row (zero rows past the block's queries), then S-1 K/V tiles
        g2s_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                       self.dtype, num_bits_per_copy=128)
        vec = 128 // self.dtype.width
        per_row = D // vec
        if cutlass.const_expr(not self.q_convert):
            for i in cutlass.range_constexpr((ROWS * per_row + self.threads - 1) // self.threads):
                idx = tidx + i * self.threads
                r = idx // per_row
                c = idx % per_row
                if idx < ROWS * per_row:
                    dst = cute.local_tile(sQ[r, None], (vec,), (c,))
                    row = row0 + r
                    if row < n_rows:
                        s = row // group
                        head = kv_head * group + (row - s * group)
                        cute.copy(g2s_atom, cute.local_tile(mQ[batch, s, head, None], (vec,), (c,)), dst)
                    else:
                        dst.fill(0)
        cute.arch.cp_async_commit_group()
        ps_shift = 0
        pages = None
        if cutlass.const_expr(self.paged):  # page sizes are powers of two (checked by the runtime)
            ps_shift = 31 - cutlass.Int32(cute.arch.clz(cutlass.Int32(mK.shape[1])))
            # This thread's rows' page indices for the next tile to load, read one tile ahead
            # (their latency hides behind a tile's MMAs instead of stalling the copy issue).
            pages = cute.make_rmem_tensor((self.passes if self.fp8 else self.tile_n // (self.threads // 8),),
                                          cutlass.Int32)
        run_ok = None  # (page_run) pages of >= rows_run rows: one table entry per thread per tile
        raddr = None  # (page_run) this thread's K and V chunk byte addresses in page 0, row 0; byte strides
        if cutlass.const_expr(self.page_run):
            run_ok = ps_shift >= (self.rows_run.bit_length() - 1)
            eb = self.dtype.width // 8
            raddr = (cute.local_tile(mK[0, 0, kv_head, None], (vec,), (tidx % 8,)).iterator.toint(),
                     cute.local_tile(mV[0, 0, kv_head, None], (vec,), (tidx % 8,)).iterator.toint(),
                     cutlass.Uint64(mK.stride[0]) * eb, cutlass.Uint64(mK.stride[1]) * eb,
                     cutlass.Uint64(mV.stride[0]) * eb, cutlass.Uint64(mV.stride[1]) * eb)
        kreg = vreg = None
        if cutlass.const_expr(self.fp8 and not self.direct):
            kreg = cute.make_rmem_tensor(cute.make_layout((self.passes, 16), stride=(16, 1)), mK.element_type)
            vreg = cute.make_rmem_tensor(cute.make_layout((self.passes, 16), stride=(16, 1)), mK.element_type)
        R = self.raw_stages
        sRaw = None
        addr = None  # (fast_addr) this thread's K and V chunk addresses in page 0, row 0; the strides
        if cutlass.const_expr(self.direct):
            # Raw e4m3 tiles n_hi-1 .. n_hi-S+1 into slots 0.. (one cp.async group each, after Q's
            # empty one: the ring's wait counts are the bf16 path's), Q's loads in flight with them.
            qr = self.load_q_regs(mQ, batch, kv_head, row0, n_rows, group, tidx)
            if cutlass.const_expr(self.fast_addr):
                cc = tidx % self.c_per_row
                addr = (cute.local_tile(mK[0, 0, kv_head, None], (16,), (cc,)).iterator.toint(),
                        cute.local_tile(mV[0, 0, kv_head, None], (16,), (cc,)).iterator.toint(),
                        cutlass.Uint64(mK.stride[0]), cutlass.Uint64(mK.stride[1]),
                        cutlass.Uint64(mV.stride[0]), cutlass.Uint64(mV.stride[1]))
            pages_pro = cute.make_rmem_tensor(cute.make_layout((self.passes, S), stride=(1, self.passes)),
                                              cutlass.Int32)
            for s in cutlass.range_constexpr(S):
                self.fetch_pages_fp8(mBT, pages_pro[None, s], batch, cutlass.max(n_hi - 1 - s, n_lo), k_len, tidx,
                                     ps_shift)
            for s in cutlass.range_constexpr(S - 1):
                if n_hi - 1 - s >= n_lo:
                    self.load_raw(mK, mV, pages_pro[None, s], sRawD, s, kv_head, n_hi - 1 - s, tidx, ps_shift,
                                  k_len, addr)
                cute.arch.cp_async_commit_group()
            for p in cutlass.range_constexpr(self.passes):
                pages[p] = pages_pro[p, S - 1]
            inv_qs, qs = self.scale_q(qr, sQ, storage.kv.data_ptr() + q_off + ROWS * (D + 8), row0, n_rows, tidx,
                                      wid, lane, perm=True)
            scale_log2 = scale_log2 * inv_qs
            if cutlass.const_expr(self.softcap):
                score_mul = score_mul * inv_qs
                cap = cap * qs
        elif cutlass.const_expr(self.fp8):
            # Raw e4m3 tiles: tile t (t-th from the top) in raw slot t % R; cp.async group t + 1
            # (group 0: Q).  Each thread reads back only the chunks it copied: no barrier.
            sRaw = storage.raw.get_tensor(cute.make_layout((BN, D, 2 * R), stride=(D, 1, BN * D)))
            qr = None
            if cutlass.const_expr(self.q_convert):  # Q's loads in flight first
                qr = self.load_q_regs(mQ, batch, kv_head, row0, n_rows, group, tidx)
            # the first R + 1 tiles' page indices, all loads in flight before the first is used
            pages_pro = cute.make_rmem_tensor(cute.make_layout((self.passes, R + 1), stride=(1, self.passes)),
                                              cutlass.Int32)
            for s in cutlass.range_constexpr(R + 1):  # (a tile past the split's first reads that one's: unused)
                self.fetch_pages_fp8(mBT, pages_pro[None, s], batch, cutlass.max(n_hi - 1 - s, n_lo), k_len, tidx,
                                     ps_shift)
            for s in cutlass.range_constexpr(R):
                if n_hi - 1 - s >= n_lo:
                    self.load_fp8_async(mK, mV, pages_pro[None, s], sRaw, s, kv_head, n_hi - 1 - s, tidx, ps_shift)
                cute.arch.cp_async_commit_group()
            for p in cutlass.range_constexpr(self.passes):
                pages[p] = pages_pro[p, R]
            if cutlass.const_expr(self.q_convert):
                inv_qs, qs = self.scale_q(qr, sQ, storage.kv.data_ptr() + (S - 1) * 2 * BN * D + ROWS * (D + 8),
                                          row0, n_rows, tidx, wid, lane)
                scale_log2 = scale_log2 * inv_qs
                if cutlass.const_expr(self.softcap):
                    score_mul = score_mul * inv_qs
                    cap = cap * qs
            # tile 0 converted into slot 0, its raw slot refilled with tile R
            cute.arch.cp_async_wait_group(R - 1)
            if n_hi - 1 >= n_lo:
                self.convert_fp8(sRaw, 0, kreg, vreg, sKV, 0, tidx, n_hi - 1, k_len)
                if n_hi - 1 - R >= n_lo:
                    self.load_fp8_async(mK, mV, pages, sRaw, 0, kv_head, n_hi - 1 - R, tidx, ps_shift)
                    if n_hi - 2 - R >= n_lo:
                        self.fetch_pages_fp8(mBT, pages, batch, n_hi - 2 - R, k_len, tidx, ps_shift)
            cute.arch.cp_async_commit_group()
        elif cutlass.const_expr(self.page_run):
            if run_ok:
                # the table entries of copies 0 .. 2·TABLE_TILES-1 (pages[0], pages[1]: a ring of two blocks)
                for b in cutlass.range_constexpr(2):
                    pages[b] = self.fetch_block(mBT, batch, b, n_lo, n_hi, k_len, tidx, ps_shift)
                for s in cutlass.range_constexpr(S - 1):
                    pg = self.table_entry(pages, s, tidx)
                    if n_hi - 1 - s >= n_lo:
                        self.load_kv_run(g2s_atom, sKV, pg, raddr, n_hi - 1 - s, s, k_len, tidx, ps_shift)
                    cute.arch.cp_async_commit_group()
            else:
                self.prologue_rows(g2s_atom, mK, mV, mBT, pages, sKV, batch, kv_head, n_lo, n_hi, k_len, tidx,
                                   ps_shift)
            cute.arch.cp_async_wait_group(S - 1)
        else:
            for s in cutlass.range_constexpr(S - 1):
                if n_hi - 1 - s >= n_lo:
                    if cutlass.const_expr(self.paged):
                        self.fetch_pages(mBT, pages, batch, n_hi - 1 - s, k_len, tidx, ps_shift)
                        self.load_kv_paged(g2s_atom, mK, mV, pages, sKV, kv_head, n_hi - 1 - s, s, k_len,
                                           tidx, ps_shift)
                    else:
                        load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_hi - 1 - s, s, k_len, BN)
                cute.arch.cp_async_commit_group()
            if cutlass.const_expr(self.paged):
                if n_hi - S >= n_lo:
                    self.fetch_pages(mBT, pages, batch, n_hi - S, k_len, tidx, ps_shift)
            cute.arch.cp_async_wait_group(S - 1)
        cute.arch.barrier()
        if cutlass.const_expr(self.rope):
            self.rotate_q(sQ, mCS, row0, n_rows, group, q_len, k_len, tidx)
            cute.arch.barrier()
        cute.copy(s2r_Q, s2r_Q.partition_S(sQ), s2r_Q.retile(tSrQ))
        if cutlass.const_expr(self.own):
            cute.arch.barrier()  # every warp has read Q (it lies in slot S-1) before any warp refills that slot

        raw_addr = lane_k = lane_v = None
        if cutlass.const_expr(self.direct):
            # ldmatrix row addresses of this lane (matrix lane // 8, row r = lane % 8) in a slot: K
            # matrices (keys +8·(m%2), 16-byte chunk m//2 of a chunk pair), V matrices (keys +8·(m%2),
            # chunk m//2); chunk c of row j lies at chunk c ^ (j % 8) = c ^ r.
            raw_addr = sRawD.iterator.toint()
            lm = lane // 8
            lr = lane % 8
            key = wid * BNW + (lm % 2) * 8 + lr
            lane_k = key * D + (((lm // 2) ^ lr) << 4)
            lane_v = lane_k
        row_max = cute.make_rmem_tensor(acc_O.shape[0][1] * acc_O.shape[1], cutlass.Float32)
        row_sum = cute.make_rmem_tensor(acc_O.shape[0][1] * acc_O.shape[1], cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # ---- key tiles, last first; this warp computes its slice of each.  page_run: two copies of the
        # loop, for pages of >= rows_run rows and row by row (one loop holding both copy paths took ~35
        # more registers: head_dim 64, 4 warps 126 -> 160; head_dim 128 184 -> 168 with spills)
        st = SimpleNamespace(raddr=raddr, S=S, BN=BN, D=D, BNW=BNW, n_lo=n_lo, n_hi=n_hi, mK=mK, mV=mV, mBT=mBT, batch=batch,
                             kv_head=kv_head, tidx=tidx, ps_shift=ps_shift, k_len=k_len, pages=pages, sKV=sKV,
                             sRawD=sRawD, sRaw=sRaw, addr=addr, g2s=g2s, g2s_atom=g2s_atom, tKgK=tKgK,
                             tVgV=tVgV, tKVsKV=tKVsKV, tKVcKV=tKVcKV, thr_mma=thr_mma, tiled_mma=tiled_mma,
                             tSrQ=tSrQ, tSsK=tSsK, tSrK=tSrK, tSrK_v=tSrK_v, s2r_K=s2r_K, tOsV=tOsV, tOrV=tOrV,
                             tOrV_v=tOrV_v, s2r_V=s2r_V, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                             scale_log2=scale_log2, score_mul=score_mul, cap=cap, n_mask=n_mask,
                             mask_lo=mask_lo, row0=row0, q_len=q_len, group=group, win=win, wid=wid,
                             raw_addr=raw_addr, lane_k=lane_k, lane_v=lane_v, kreg=kreg, vreg=vreg, R=R)
        if cutlass.const_expr(self.page_run):
            if run_ok:
                self.key_loop(st, True)
            else:
                self.key_loop(st, False)
        else:
            self.key_loop(st, False)

        # ---- the warps' partials meet in the (now free) ring
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        f32 = cute.recast_ptr(storage.kv.data_ptr(), dtype=cutlass.Float32)
        scr_O = cute.make_tensor(f32, cute.make_layout((ROWS, D, W), stride=(D, 1, ROWS * D)))
        scr_m = cute.make_tensor(f32 + W * ROWS * D, cute.make_layout((ROWS, W), stride=(1, ROWS)))
        scr_l = cute.make_tensor(f32 + W * ROWS * (D + 1), cute.make_layout((ROWS, W), stride=(1, ROWS)))
        tOcO = thr_mma.partition_C(cute.make_identity_tensor((ROWS, D)))
        for i in cutlass.range_constexpr(cute.size(acc_O)):
            rr, cc = tOcO[i]
            if cutlass.const_expr(self.direct):  # n8 block 2c + e holds head_dim 16c + 2·col + e
                cc = v_column(cc)
            scr_O[rr, cc, wid] = acc_O[i]
        c_mn = acc_mn_view(tOcO)
        for r in cutlass.range_constexpr(cute.size(row_max)):
            total = quad_allreduce(row_sum[r], add)
            if lane % 4 == 0:
                scr_m[c_mn[r, 0][0], wid] = row_max[r]
                scr_l[c_mn[r, 0][0], wid] = total
        cute.arch.barrier()

        # Each thread: outputs [c0, c0 + epr) of row `mr`.
        mr = tidx // self.tpr
        c0 = (tidx % self.tpr) * self.epr
        mx = -cutlass.Float32.inf
        for w in cutlass.range_constexpr(W):
            mx = cute.arch.fmax(mx, scr_m[mr, w])
        m_ref = 0.0 if mx == -cutlass.Float32.inf else mx
        acc = cute.make_rmem_tensor(self.epr, cutlass.Float32)
        acc.fill(0.0)
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(W):
            e = cute.math.exp2((scr_m[mr, w] - m_ref) * scale_log2, fastmath=True)
            total = total + scr_l[mr, w] * e
            for j in cutlass.range_constexpr(self.epr):
                acc[j] = acc[j] + e * scr_O[mr, c0 + j, w]
        has_keys = total > 0.0
        inv = cute.arch.rcp_approx(total if has_keys else 1.0)
        scale = inv if has_keys else 0.0
        if cutlass.const_expr(self.fp8):
            scale = scale * v_descale
        for j in cutlass.range_constexpr(self.epr):
            acc[j] = acc[j] * scale
        lse = -cutlass.Float32.inf
        if has_keys:
            lse = (m_ref * scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2

        row = row0 + mr
        s_row = row // group
        head = kv_head * group + (row - s_row * group)
        if cutlass.const_expr(SP == 1):
            if cutlass.const_expr(self.sinks):
                lse = self.add_sink(acc, lse, mSinks[head])
            if row < n_rows:
                self.store_row(acc, lse, mO, mLSE, batch, s_row, head, c0, tidx)
        elif cutlass.const_expr(self.cluster):
            # Every CTA is done with its ring (the partials above): rank 0 may receive.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            recv_O = cute.make_tensor(f32, cute.make_layout((ROWS, D, SP - 1), stride=(D, 1, ROWS * D)))
            recv_L = cute.make_tensor(f32 + (SP - 1) * ROWS * D, cute.make_layout((ROWS, SP - 1), stride=(1, ROWS)))
            if split != 0:
                bits = cute.recast_tensor(acc, cutlass.Int32)
                for j in cutlass.range_constexpr(self.epr // 4):
                    dst = cute.local_tile(recv_O[mr, None, split - 1], (4,), (c0 // 4 + j,))
                    cute.arch.store_async_dsmem(dst.iterator, (bits[4 * j], bits[4 * j + 1], bits[4 * j + 2],
                                                               bits[4 * j + 3]), bar, 0)
                if c0 == 0:
                    lse_t = cute.make_rmem_tensor(1, cutlass.Float32)
                    lse_t[0] = lse
                    lbits = cute.recast_tensor(lse_t, cutlass.Int32)
                    dstl = cute.local_tile(recv_L[mr, None], (1,), (split - 1,))
                    cute.arch.store_async_dsmem(dstl.iterator, lbits[0], bar, 0)
            else:
                cute.arch.mbarrier_wait(bar, 0)
                lmax = lse
                for sp in cutlass.range_constexpr(SP - 1):
                    lmax = cute.arch.fmax(lmax, recv_L[mr, sp])
                l_ref = 0.0 if lmax == -cutlass.Float32.inf else lmax
                w0 = cute.math.exp2((lse - l_ref) * LOG2_E, fastmath=True)
                wsum = w0
                for j in cutlass.range_constexpr(self.epr):
                    acc[j] = acc[j] * w0
                for sp in cutlass.range_constexpr(SP - 1):
                    wsp = cute.math.exp2((recv_L[mr, sp] - l_ref) * LOG2_E, fastmath=True)
                    wsum = wsum + wsp
                    for j in cutlass.range_constexpr(self.epr):
                        acc[j] = acc[j] + wsp * recv_O[mr, c0 + j, sp]
                has = wsum > 0.0
                winv = cute.arch.rcp_approx(wsum if has else 1.0)
                wsc = winv if has else 0.0
                for j in cutlass.range_constexpr(self.epr):
                    acc[j] = acc[j] * wsc
                lse_all = -cutlass.Float32.inf
                if has:
                    lse_all = l_ref + cute.math.log2(wsum, fastmath=True) * LN_2
                if cutlass.const_expr(self.sinks):
                    lse_all = self.add_sink(acc, lse_all, mSinks[head])
                if row < n_rows:
                    self.store_row(acc, lse_all, mO, mLSE, batch, s_row, head, c0, tidx)
        else:
            # fp32 partial O and LSE into the workspace (splits, B, Hq, Sq[, D])
            if row < n_rows:
                dst = cute.local_tile(mOp[split, batch, head, s_row, None], (self.epr,), (c0 // self.epr,))
                cute.autovec_copy(acc, dst)
                if c0 == 0:
                    mLp[split, batch, head, s_row] = lse
            if cutlass.const_expr(self.last):
                self.merge_last(mOp, mLp, mO, mLSE, mCnt, mSinks, storage.bar.data_ptr(), f32, batch, kv_head,
                                bx // SP, (n_rows + ROWS - 1) // ROWS, mQ.shape[2], row0, n_rows, group, tidx)

    @cute.jit
    def key_loop(self, st, run: cutlass.Constexpr):
        """The key tiles of this split, last first (the kernel's state in ``st``); ``run``
        (page_run): the copies of pages of >= rows_run rows (load_kv_run), else row by row."""
        raddr = st.raddr
        S = st.S
        BN = st.BN
        D = st.D
        BNW = st.BNW
        n_lo = st.n_lo
        n_hi = st.n_hi
        mK = st.mK
        mV = st.mV
        mBT = st.mBT
        batch = st.batch
        kv_head = st.kv_head
        tidx = st.tidx
        ps_shift = st.ps_shift
        k_len = st.k_len
        pages = st.pages
        sKV = st.sKV
        sRawD = st.sRawD
        sRaw = st.sRaw
        addr = st.addr
        g2s = st.g2s
        g2s_atom = st.g2s_atom
        tKgK = st.tKgK
        tVgV = st.tVgV
        tKVsKV = st.tKVsKV
        tKVcKV = st.tKVcKV
        thr_mma = st.thr_mma
        tiled_mma = st.tiled_mma
        tSrQ = st.tSrQ
        tSsK = st.tSsK
        tSrK = st.tSrK
        tSrK_v = st.tSrK_v
        s2r_K = st.s2r_K
        tOsV = st.tOsV
        tOrV = st.tOrV
        tOrV_v = st.tOrV_v
        s2r_V = st.s2r_V
        acc_O = st.acc_O
        row_max = st.row_max
        row_sum = st.row_sum
        scale_log2 = st.scale_log2
        score_mul = st.score_mul
        cap = st.cap
        n_mask = st.n_mask
        mask_lo = st.mask_lo
        row0 = st.row0
        q_len = st.q_len
        group = st.group
        win = st.win
        wid = st.wid
        raw_addr = st.raw_addr
        lane_k = st.lane_k
        lane_v = st.lane_v
        kreg = st.kreg
        vreg = st.vreg
        R = st.R
        for it in cutlass.range(n_hi - n_lo, unroll=1):
            n_block = n_hi - 1 - it
            slot = it % S
            if cutlass.const_expr(not self.fp8 or self.direct):
                cute.arch.cp_async_wait_group(S - 2)
            if cutlass.const_expr(self.own):
                cute.arch.sync_warp()  # this warp's rows of tile n_block visible; its slot (it-1)%S free
            else:
                cute.arch.barrier()  # tile n_block visible; slot (it-1)%S free for reuse
            if cutlass.const_expr(self.direct):
                # (the copies first: issued after the Q·Kᵀ MMAs instead, they ran 3-11 % slower)
                if n_block - (S - 1) >= n_lo:
                    self.load_raw(mK, mV, pages, sRawD, (it + S - 1) % S, kv_head, n_block - (S - 1), tidx,
                                  ps_shift, k_len, addr, full=self.tail_zero)
                    if n_block - S >= n_lo:
                        self.fetch_pages_fp8(mBT, pages, batch, n_block - S, k_len, tidx, ps_shift,
                                             full=self.tail_zero)
                cute.arch.cp_async_commit_group()
            elif cutlass.const_expr(self.page_run):
                if n_block - (S - 1) >= n_lo:
                    if cutlass.const_expr(run):
                        # copy j = it + S - 1 (from the top); at the first copy of block b, block b + 1's
                        # entries are read into the ring slot block b - 1 held
                        j = it + S - 1
                        pg = self.table_entry(pages, j, tidx)
                        self.load_kv_run(g2s_atom, sKV, pg, raddr, n_block - (S - 1), (it + S - 1) % S,
                                         k_len, tidx, ps_shift)
                        if j % TABLE_TILES == 0:
                            b = j // TABLE_TILES + 1
                            nxt = self.fetch_block(mBT, batch, b, n_lo, n_hi, k_len, tidx, ps_shift)
                            if b % 2 == 0:
                                pages[0] = nxt
                            else:
                                pages[1] = nxt
                    else:
                        self.load_kv_paged(g2s_atom, mK, mV, pages, sKV, kv_head, n_block - (S - 1),
                                           (it + S - 1) % S, k_len, tidx, ps_shift)
                        if n_block - S >= n_lo:
                            self.fetch_pages(mBT, pages, batch, n_block - S, k_len, tidx, ps_shift)
                cute.arch.cp_async_commit_group()
            elif cutlass.const_expr(not self.fp8):
                if n_block - (S - 1) >= n_lo:
                    if cutlass.const_expr(self.paged):
                        self.load_kv_paged(g2s_atom, mK, mV, pages, sKV, kv_head, n_block - (S - 1),
                                           (it + S - 1) % S, k_len, tidx, ps_shift)
                        if n_block - S >= n_lo:
                            self.fetch_pages(mBT, pages, batch, n_block - S, k_len, tidx, ps_shift)
                    else:
                        load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block - (S - 1), (it + S - 1) % S, k_len, BN)
                cute.arch.cp_async_commit_group()

            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((ROWS, BNW)), cutlass.Float32)
            acc_S.fill(0.0)
            acc_S1 = cute.make_rmem_tensor(thr_mma.partition_shape_C((ROWS, BNW)), cutlass.Float32)
            if cutlass.const_expr(self.ilp):
                acc_S1.fill(0.0)
            if cutlass.const_expr(self.direct):
                self.gemm_qk_raw(tiled_mma, acc_S, tSrQ, raw_addr + slot * (2 * BN * D) + lane_k)
            else:
                nk = cute.size(tSsK.shape[2])
                cute.copy(s2r_K, tSsK[None, None, 0, 2 * slot], tSrK_v[None, None, 0])
                for kk in cutlass.range_constexpr(nk):
                    if cutlass.const_expr(kk + 1 < nk):
                        cute.copy(s2r_K, tSsK[None, None, kk + 1, 2 * slot], tSrK_v[None, None, kk + 1])
                    if cutlass.const_expr(self.ilp and kk % 2 == 1):
                        cute.gemm(tiled_mma, acc_S1, tSrQ[None, None, kk], tSrK[None, None, kk], acc_S1)
                    else:
                        cute.gemm(tiled_mma, acc_S, tSrQ[None, None, kk], tSrK[None, None, kk], acc_S)
            if cutlass.const_expr(self.ilp):
                acc_S.store(acc_S.load() + acc_S1.load())

            if cutlass.const_expr(self.softcap):
                # (a select per score: an ``if`` would yield the whole fragment through each branch)
                on = cap > 0.0
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    acc_S[i] = cutlass.select_(on, cute.math.tanh(acc_S[i] * score_mul, fastmath=True) * cap, acc_S[i])
            if cutlass.const_expr(self.local):
                if n_block >= n_mask or n_block < mask_lo:
                    cS = thr_mma.partition_C(cute.make_identity_tensor((ROWS, BNW)))  # (row, col)
                    mask.apply_mask(self.mask, acc_mn_view(acc_S), acc_mn_view(cS), row0, n_block * BN + wid * BNW,
                                    q_len, k_len, group=group, win=win)
            elif n_block >= n_mask:
                cS = thr_mma.partition_C(cute.make_identity_tensor((ROWS, BNW)))  # (row, col)
                mask.apply_mask(self.mask, acc_mn_view(acc_S), acc_mn_view(cS), row0, n_block * BN + wid * BNW,
                                q_len, k_len, group=group)
            if cutlass.const_expr(self.direct):
                # O's rows rescaled only where some row's max moved (a correction of exactly 1
                # changes nothing): after the first tiles most tiles skip the 64 multiplies
                corr = cute.make_rmem_tensor(cute.size(row_max), cutlass.Float32)
                softmax.online_softmax(acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr=corr)
                self.rescale_if_moved(acc_O, corr)
            else:
                softmax.online_softmax(acc_mn_view(acc_S), row_max, row_sum, scale_log2, o_mn=acc_mn_view(acc_O))

            if cutlass.const_expr(self.direct):
                self.gemm_pv_raw(tiled_mma, acc_O, acc_S, raw_addr + slot * (2 * BN * D) + BN * D + lane_v)
            else:
                mma_sync.gemm_pv(tiled_mma, acc_O, acc_S, self.mdtype, tOsV, tOrV, tOrV_v, s2r_V, slot)
            if cutlass.const_expr(self.fp8 and not self.direct):
                # tile it+1 (its group is it+2: R-1 later groups may still fly) converted into the
                # freed slot, its raw slot refilled with tile it+1+R (after the stores: in-order
                # issue keeps this thread's reads of the slot before the new copy's writes)
                if n_block - 1 >= n_lo:
                    cute.arch.cp_async_wait_group(R - 1)
                    self.convert_fp8(sRaw, (it + 1) % R, kreg, vreg, sKV, (it + 1) % S, tidx, n_block - 1, k_len)
                    if n_block - 1 - R >= n_lo:
                        self.load_fp8_async(mK, mV, pages, sRaw, (it + 1) % R, kv_head, n_block - 1 - R, tidx,
                                            ps_shift)
                        if n_block - 2 - R >= n_lo:
                            self.fetch_pages_fp8(mBT, pages, batch, n_block - 2 - R, k_len, tidx, ps_shift)
                cute.arch.cp_async_commit_group()

    @cute.jit
    def merge_last(self, mOp, mLp, mO, mLSE, mCnt, mSinks, flag_ptr, f32, batch, kv_head, rb, row_blocks, heads_q,
                   row0, n_rows, group, tidx):
        """The last-arrival merge of a CTA group (the ``splits`` CTAs of one row block): each CTA's
        partials (just stored) are released at GPU scope, then one thread adds 1 to the group's
        counter (acq_rel); the CTA that reads ``splits - 1`` back is the last: it sets the counter to
        0 for the next launch and merges the group's partials by LSE weight in split order (the
        same additions on every run), the sink joining there, and writes O and LSE.  Ordering: the
        CTA barrier, then the atomic's release (cumulative over the CTA's stores the barrier
        ordered before it); its acquire, then the barrier before the last CTA's loads.

        The merge: (1) the weights, ``threads / 16`` threads a row, each loading some splits' LSE
        (butterfly max and sum within the row's lanes), into shared memory (the free ring) with
        the row's 1/sum and LSE; (2) the partial O rows in 16-byte vectors, consecutive threads on
        consecutive vectors of a row (coalesced), every (row, vector) item's splits loaded before
        any output is stored."""
        SP, D, T = self.splits, self.head_dim, self.threads
        cute.arch.barrier()
        # the group's counter: element (batch, j % Hq, j // Hq) of counters (B, Hq, Sq), j the group
        # index within the batch entry (kv_head · row_blocks + rb < Hq · Sq)
        j = kv_head * row_blocks + rb
        cnt = mCnt.iterator + cute.crd2idx((batch, j % heads_q, j // heads_q), mCnt.layout)
        flag = cute.make_tensor(cute.recast_ptr(flag_ptr, dtype=cutlass.Int32), cute.make_layout(1))
        if tidx == 0:
            old = cute.arch.atomic_add(cnt, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            is_last = cutlass.Int32(0)
            if old == SP - 1:
                is_last = cutlass.Int32(1)
                cute.arch.store(cnt, cutlass.Int32(0))
            flag[0] = is_last
        cute.arch.barrier()
        if flag[0] != 0:
            sW = cute.make_tensor(f32, cute.make_layout((ROWS, SP), stride=(SP, 1)))
            sInv = cute.make_tensor(f32 + ROWS * SP, cute.make_layout(ROWS))
            sL = cute.make_tensor(f32 + ROWS * (SP + 1), cute.make_layout(ROWS))
            # (1) weights: row r's tpr threads (consecutive lanes of one warp) take splits q, q + tpr, ...
            tpr = T // ROWS
            mine = SP // tpr  # (can_implement: splits a multiple of tpr)
            offs = tuple(tpr >> b for b in range(1, tpr.bit_length()))  # the row's lanes: butterfly
            r = tidx // tpr
            q = tidx % tpr
            row = row0 + r
            s_row = row // group
            head = kv_head * group + (row - s_row * group)
            lr = cute.make_rmem_tensor(mine, cutlass.Float32)
            lr.fill(-cutlass.Float32.inf)
            if row < n_rows:
                for m in cutlass.range_constexpr(mine):
                    lr[m] = mLp[q + m * tpr, batch, head, s_row]
            lmax = -cutlass.Float32.inf
            for m in cutlass.range_constexpr(mine):
                lmax = cute.arch.fmax(lmax, lr[m])
            for off in offs:
                lmax = cute.arch.fmax(lmax, cute.arch.shuffle_sync_bfly(lmax, offset=off, mask=-1, mask_and_clamp=31))
            l_ref = 0.0 if lmax == -cutlass.Float32.inf else lmax
            wsum = cutlass.Float32(0.0)
            for m in cutlass.range_constexpr(mine):
                w = cute.math.exp2((lr[m] - l_ref) * LOG2_E, fastmath=True)
                wsum = wsum + w
                sW[r, q + m * tpr] = w
            for off in offs:
                wsum = wsum + cute.arch.shuffle_sync_bfly(wsum, offset=off, mask=-1, mask_and_clamp=31)
            if q == 0:
                has = wsum > 0.0
                inv = cute.arch.rcp_approx(wsum if has else 1.0)
                sInv[r] = inv if has else 0.0
                lse_all = -cutlass.Float32.inf
                if has:
                    lse_all = l_ref + cute.math.log2(wsum, fastmath=True) * LN_2
                sL[r] = lse_all
            cute.arch.barrier()
            # (2) the partial O rows: item (r, c) = O[r, 4c .. 4c + 4), items tidx, tidx + T, ...
            cpr = D // 4
            per = ROWS * cpr // T
            acc = cute.make_rmem_tensor(cute.make_layout((4, per), stride=(1, 4)), cutlass.Float32)
            acc.fill(0.0)
            for k in cutlass.range_constexpr(per):
                i = tidx + k * T
                ri = i // cpr
                rowi = row0 + ri
                if rowi < n_rows:
                    si = rowi // group
                    hi = kv_head * group + (rowi - si * group)
                    part = cute.make_rmem_tensor(cute.make_layout((4, SP), stride=(1, 4)), cutlass.Float32)
                    for sp in cutlass.range_constexpr(SP):
                        cute.autovec_copy(cute.local_tile(mOp[sp, batch, hi, si, None], (4,), (i % cpr,)),
                                          part[None, sp])
                    for sp in cutlass.range_constexpr(SP):
                        w = sW[ri, sp]
                        for e in cutlass.range_constexpr(4):
                            acc[e, k] = acc[e, k] + w * part[e, sp]
            for k in cutlass.range_constexpr(per):
                i = tidx + k * T
                ri = i // cpr
                rowi = row0 + ri
                if rowi < n_rows:
                    si = rowi // group
                    hi = kv_head * group + (rowi - si * group)
                    scale = sInv[ri]
                    lse_all = sL[ri]
                    if cutlass.const_expr(self.sinks):
                        sink = mSinks[hi]
                        if sink > -cutlass.Float32.inf:
                            mx = cute.arch.fmax(lse_all, sink)
                            lse_s = mx + cute.math.log2(cute.math.exp2((lse_all - mx) * LOG2_E, fastmath=True)
                                                        + cute.math.exp2((sink - mx) * LOG2_E, fastmath=True),
                                                        fastmath=True) * LN_2
                            scale = scale * cute.math.exp2((lse_all - lse_s) * LOG2_E, fastmath=True)
                            lse_all = lse_s
                    out = cute.make_rmem_tensor(4, self.dtype)
                    for e in cutlass.range_constexpr(4):
                        out[e] = (acc[e, k] * scale).to(self.dtype)
                    cute.autovec_copy(out, cute.local_tile(mO[batch, si, hi, None], (4,), (i % cpr,)))
                    if i % cpr == 0:
                        mLSE[batch, hi, si] = lse_all

    @cute.jit
    def store_row(self, acc, lse, mO, mLSE, batch, s_row, head, c0, tidx):
        out = cute.make_rmem_tensor(self.epr, self.dtype)
        out.store(acc.load().to(self.dtype))
        dst = cute.local_tile(mO[batch, s_row, head, None], (self.epr,), (c0 // self.epr,))
        cute.autovec_copy(out, dst)
        if c0 == 0:
            mLSE[batch, head, s_row] = lse

    @cute.jit
    def fetch_pages(self, mBT, pages, batch, n_block, k_len, tidx, ps_shift):
        """The page of each of this thread's rows of key tile ``n_block`` (see load_kv_paged):
        block_table[batch, key >> ps_shift]; rows past k_len are not read (0)."""
        per_pass = self.threads // 8
        for r in cutlass.range_constexpr(self.tile_n // per_pass):
            key = n_block * self.tile_n + r * per_pass + tidx // 8
            pg = 0
            if key < k_len:
                pg = mBT[batch, key >> ps_shift]
            pages[r] = pg

    @cute.jit
    def load_kv_paged(self, g2s_atom, mK, mV, pages, sKV, kv_head, n_block, slot, k_len, tidx, ps_shift):
        """cp.async K and V tile ``n_block`` of a paged cache into ``slot``, row by row: key j lies
        in page block_table[batch, j >> ps_shift] (``pages``, from fetch_pages), row
        j & (page_size - 1) (a thread's 16-byte chunks are those of the sm80 copy tiling: row
        tidx / 8 of each pass, chunk tidx % 8); rows past k_len are zeroed."""
        vec = 128 // self.dtype.width
        per_pass = self.threads // 8
        mask = (1 << ps_shift) - 1
        for r in cutlass.range_constexpr(self.tile_n // per_pass):
            row = r * per_pass + tidx // 8
            key = n_block * self.tile_n + row
            if key < k_len:
                page = pages[r]
                off = key & mask
                for cc in cutlass.range_constexpr(self.head_dim // (8 * vec)):
                    col = cc * 8 + tidx % 8
                    cute.copy(g2s_atom, cute.local_tile(mK[page, off, kv_head, None], (vec,), (col,)),
                              cute.local_tile(sKV[row, None, 2 * slot], (vec,), (col,)))
                    cute.copy(g2s_atom, cute.local_tile(mV[page, off, kv_head, None], (vec,), (col,)),
                              cute.local_tile(sKV[row, None, 2 * slot + 1], (vec,), (col,)))
            else:
                for cc in cutlass.range_constexpr(self.head_dim // (8 * vec)):
                    col = cc * 8 + tidx % 8
                    cute.local_tile(sKV[row, None, 2 * slot], (vec,), (col,)).fill(0)
                    cute.local_tile(sKV[row, None, 2 * slot + 1], (vec,), (col,)).fill(0)

    @cute.jit
    def prologue_rows(self, g2s_atom, mK, mV, mBT, pages, sKV, batch, kv_head, n_lo, n_hi, k_len, tidx, ps_shift):
        """The paged prologue row by row (fetch_pages, load_kv_paged): tiles n_hi-1 .. n_hi-S+1 into
        slots 0.., one cp.async group each, then the next tile's pages."""
        S = self.stages
        for s in cutlass.range_constexpr(S - 1):
            if n_hi - 1 - s >= n_lo:
                self.fetch_pages(mBT, pages, batch, n_hi - 1 - s, k_len, tidx, ps_shift)
                self.load_kv_paged(g2s_atom, mK, mV, pages, sKV, kv_head, n_hi - 1 - s, s, k_len, tidx, ps_shift)
            cute.arch.cp_async_commit_group()
        if n_hi - S >= n_lo:
            self.fetch_pages(mBT, pages, batch, n_hi - S, k_len, tidx, ps_shift)

    @cute.jit
    def fetch_block(self, mBT, batch, b, n_lo, n_hi, k_len, tidx, ps_shift):
        """``page_run``: this lane's block-table entry of block ``b`` (copies j = b·TABLE_TILES ..,
        copy j = key tile n_hi - 1 - j): lane l holds the page of copy b·TABLE_TILES + l / 4, row
        group l % 4 of its warp (rows g·R .. g·R+R-1 of the tile, g = 4·warp + l % 4, all in one
        page); 0 for tiles below n_lo and rows past k_len (not read)."""
        lane = tidx % 32
        n_block = n_hi - 1 - (b * TABLE_TILES + lane // 4)
        key = n_block * self.tile_n + ((tidx // 32) * 4 + lane % 4) * self.rows_run
        pg = 0
        if n_block >= n_lo and key < k_len:
            pg = mBT[batch, key >> ps_shift]
        return pg

    @cute.jit
    def table_entry(self, pages, j, tidx):
        """``page_run``: the page of this thread's rows in copy ``j``, from the lane of the ring that
        holds it (fetch_block; ring slot (j / TABLE_TILES) % 2).  Every lane of the warp takes part."""
        if cutlass.const_expr(isinstance(j, int)):  # (the prologue's copies)
            held = pages[(j // TABLE_TILES) % 2]
        else:
            held = cutlass.select_((j // TABLE_TILES) % 2 == 0, pages[0], pages[1])
        return cute.arch.shuffle_sync(held, (j % TABLE_TILES) * 4 + (tidx % 32) // 8)

    @cute.jit
    def load_kv_run(self, g2s_atom, sKV, page, raddr, n_block, slot, k_len, tidx, ps_shift):
        """``page_run``: cp.async this thread's rows g·R .. g·R+R-1 (g = tidx / 8, R = rows_run; chunk
        tidx % 8 of each, and +8, +16 .. for wider heads) of K and V tile ``n_block`` into ``slot``, all
        of them in ``page`` (table_entry): one K and one V address per tile from ``raddr`` (chunk
        addresses in page 0, row 0; byte strides: unsigned 32x64-bit products of page and row), each
        further row one row stride on; rows past k_len are zeroed."""
        vec = 128 // self.dtype.width
        R = self.rows_run
        c = tidx % 8
        row0 = (tidx // 8) * R
        key0 = n_block * self.tile_n + row0
        pg = cutlass.Uint64(cutlass.Uint32(page))
        rw = cutlass.Uint64(cutlass.Uint32(key0 & ((1 << ps_shift) - 1)))
        for i in cutlass.range_constexpr(2):
            a = raddr[i] + cutlass.Int64(pg * raddr[2 + 2 * i] + rw * raddr[3 + 2 * i])
            for r in cutlass.range_constexpr(R):
                row = row0 + r
                if key0 + r < k_len:
                    for cc in cutlass.range_constexpr(self.head_dim // (8 * vec)):
                        g = cute.make_tensor(cute.make_ptr(self.dtype, a + cutlass.Int64(raddr[3 + 2 * i] * r) + cc * 128,
                                                           cute.AddressSpace.gmem, assumed_align=16),
                                             cute.make_layout(vec))
                        cute.copy(g2s_atom, g, cute.local_tile(sKV[row, None, 2 * slot + i], (vec,), (cc * 8 + c,)))
                else:
                    for cc in cutlass.range_constexpr(self.head_dim // (8 * vec)):
                        cute.local_tile(sKV[row, None, 2 * slot + i], (vec,), (cc * 8 + c,)).fill(0)

    @cute.jit
    def copy_row(self, p, tidx):
        """``own``: the tile row of this thread's fp8 chunk in copy pass ``p``: row p·(32 / c_per_row) +
        lane / c_per_row of its warp's key slice (without ``own`` pass p covers rows p·rows_pp ..
        of the CTA: row p·rows_pp + tidx / c_per_row)."""
        lane = tidx % 32
        return (tidx // 32) * self.bnw + p * (32 // self.c_per_row) + lane // self.c_per_row

    @cute.jit
    def fetch_pages_fp8(self, mBT, pages, batch, n_block, k_len, tidx, ps_shift, full: cutlass.Constexpr = False):
        """fetch_pages for the fp8 copy tiling: pass p's row is p·rows_pp + tidx / c_per_row.  ``own``:
        one page per lane, of row lane % (keys per warp) of the warp's slice, in ``pages[0]`` (the copy
        takes each pass's from its lane by a shuffle, load_raw).  ``full``: the tile lies below the
        last one (every row < k_len: no check)."""
        if cutlass.const_expr(self.own):
            key = n_block * self.tile_n + (tidx // 32) * self.bnw + tidx % self.bnw
            if cutlass.const_expr(full):
                pages[0] = mBT[batch, key >> ps_shift]
            else:
                pg = 0
                if key < k_len:
                    pg = mBT[batch, key >> ps_shift]
                pages[0] = pg
        for p in cutlass.range_constexpr(0 if self.own else self.passes):
            key = n_block * self.tile_n + p * self.rows_pp + tidx // self.c_per_row
            pg = 0
            if key < k_len:
                pg = mBT[batch, key >> ps_shift]
            pages[p] = pg

    @cute.jit
    def load_fp8_async(self, mK, mV, pages, sRaw, rslot, kv_head, n_block, tidx, ps_shift):
        """cp.async this thread's 16-byte chunks (chunk tidx % c_per_row of its row in each pass)
        of K and V tile ``n_block`` into raw slot ``rslot``.  A row past k_len reads its row of
        page 0 (fetch_pages_fp8), in bounds; convert_fp8 writes zeros for it instead."""
        mask = (1 << ps_shift) - 1
        c = tidx % self.c_per_row
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mK.element_type,
                                   num_bits_per_copy=128)
        for p in cutlass.range_constexpr(self.passes):
            row = p * self.rows_pp + tidx // self.c_per_row
            off = (n_block * self.tile_n + row) & mask
            for i, src in enumerate((mK, mV)):
                g = cute.local_tile(src[pages[p], off, kv_head, None], (16,), (c,))
                # 16-byte aligned: the contract's strides are multiples of 16 fp8 elements
                g = cute.make_tensor(cute.make_ptr(src.element_type, g.iterator.toint(), cute.AddressSpace.gmem,
                                                   assumed_align=16), g.layout)
                cute.copy(atom, g, cute.local_tile(sRaw[row, None, 2 * rslot + i], (16,), (c,)))

    @cute.jit
    def convert_fp8(self, sRaw, rslot, kreg, vreg, sKV, slot, tidx, n_block, k_len):
        """This thread's chunks of raw slot ``rslot`` (tile ``n_block``) into registers, then
        converted into ``slot`` of the ring (store_fp8_regs)."""
        c = tidx % self.c_per_row
        for p in cutlass.range_constexpr(self.passes):
            row = p * self.rows_pp + tidx // self.c_per_row
            cute.autovec_copy(cute.local_tile(sRaw[row, None, 2 * rslot], (16,), (c,)), kreg[p, None])
            cute.autovec_copy(cute.local_tile(sRaw[row, None, 2 * rslot + 1], (16,), (c,)), vreg[p, None])
        self.store_fp8_regs(kreg, vreg, sKV, slot, tidx, n_block, k_len)

    @cute.jit
    def rotate_q(self, sQ, mCS, row0, n_rows, group, q_len, k_len, tidx):
        """Rotary embedding of the block's Q rows in shared memory, in place: query s of the
        sequence is at position k_len - q_len + s (the new tokens are the cache's last ones),
        clamped into ``mCS`` = cos_sin_cache (max_position, R) float32, cosines then sines.  A unit
        is 8 elements: neox, the vector at i < R/2 and its partner at i + R/2 (angle i); interleaved,
        one vector of 4 pairs (angles i/2).  Columns from R on are left as loaded."""
        vec = 8
        R = mCS.shape[1]
        half = R // 2
        upr = half // vec if cutlass.const_expr(self.rope == ROPE_NEOX) else R // vec
        cvec = vec if cutlass.const_expr(self.rope == ROPE_NEOX) else vec // 2
        last = mCS.shape[0] - 1
        rx = cute.make_rmem_tensor(cute.make_layout((vec, 2)), self.dtype)
        rc = cute.make_rmem_tensor(cute.make_layout(cvec), cutlass.Float32)
        rs = cute.make_rmem_tensor(cute.make_layout(cvec), cutlass.Float32)
        for u in range(tidx, ROWS * upr, self.threads):
            r = u // upr
            w = u - r * upr
            row = row0 + r
            if row < n_rows:
                pos = cutlass.max(cutlass.min(k_len - q_len + row // group, last), 0)
                gCS = cute.zipped_divide(mCS[pos, None], (cvec,))
                sH = cute.zipped_divide(sQ[r, None], (vec,))
                if cutlass.const_expr(self.rope == ROPE_NEOX):
                    cute.autovec_copy(gCS[None, w], rc)
                    cute.autovec_copy(gCS[None, w + half // vec], rs)
                    cute.autovec_copy(sH[None, w], rx[None, 0])
                    cute.autovec_copy(sH[None, w + half // vec], rx[None, 1])
                    x1 = rx[None, 0].load().to(cutlass.Float32)
                    x2 = rx[None, 1].load().to(cutlass.Float32)
                    c = rc.load()
                    sn = rs.load()
                    rx[None, 0].store((x1 * c - x2 * sn).to(self.dtype))
                    rx[None, 1].store((x2 * c + x1 * sn).to(self.dtype))
                    cute.autovec_copy(rx[None, 0], sH[None, w])
                    cute.autovec_copy(rx[None, 1], sH[None, w + half // vec])
                else:
                    cute.autovec_copy(gCS[None, w], rc)
                    cute.autovec_copy(gCS[None, w + R // vec], rs)
                    cute.autovec_copy(sH[None, w], rx[None, 0])
                    for j in cutlass.range_constexpr(vec // 2):
                        a = rx[2 * j, 0].to(cutlass.Float32)
                        b = rx[2 * j + 1, 0].to(cutlass.Float32)
                        rx[2 * j, 0] = (a * rc[j] - b * rs[j]).to(self.dtype)
                        rx[2 * j + 1, 0] = (b * rc[j] + a * rs[j]).to(self.dtype)
                    cute.autovec_copy(rx[None, 0], sH[None, w])

    @cute.jit
    def load_q_regs(self, mQ, batch, kv_head, row0, n_rows, group, tidx):
        """This thread's 8-element chunks of the block's Q rows (rows past the block's queries read
        its last row, in bounds; scale_q zeroes them)."""
        vec = 8
        per_row = self.head_dim // vec
        nq = ROWS * per_row // self.threads
        qr = cute.make_rmem_tensor(cute.make_layout((nq, vec), stride=(vec, 1)), self.dtype)
        for i in cutlass.range_constexpr(nq):
            idx = tidx + i * self.threads
            row = cutlass.min(row0 + idx // per_row, n_rows - 1)
            s = row // group
            head = kv_head * group + (row - s * group)
            cute.autovec_copy(cute.local_tile(mQ[batch, s, head, None], (vec,), (idx % per_row,)), qr[i, None])
        return qr

    @cute.jit
    def scale_q(self, qr, sQ, scratch_ptr, row0, n_rows, tidx, wid, lane, perm: cutlass.Constexpr = False):
        """bf16 Q (load_q_regs) -> f16 into ``sQ``, times qs = 2^k chosen so that the largest |q|
        of the block lands in [2^13, 2^14) (f16 holds it; the shift is exact); rows past the
        block's queries are zero.  ``scratch_ptr``: 4·warps bytes of free shared memory for the
        block's max.  ``perm``: head_dim columns stored in the MMA's k order of the direct e4m3
        operands (atoms/sm90_e4m3.py ``k_order``).  Returns (1/qs, qs)."""
        vec = 8
        per_row = self.head_dim // vec
        nq = ROWS * per_row // self.threads
        qf = cute.make_rmem_tensor(cute.make_layout((nq, vec), stride=(vec, 1)), cutlass.Float32)
        qf.store(qr.load().to(cutlass.Float32))
        amax = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(nq):
            keep = row0 + (tidx + i * self.threads) // per_row < n_rows
            for j in cutlass.range_constexpr(vec):
                qf[i, j] = cutlass.select_(keep, qf[i, j], cutlass.Float32(0.0))
                amax = cute.arch.fmax(amax, cute.math.absf(qf[i, j]))
        for off in (16, 8, 4, 2, 1):
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=off, mask=-1, mask_and_clamp=31))
        scr = cute.make_tensor(cute.recast_ptr(scratch_ptr, dtype=cutlass.Float32), cute.make_layout(self.warps))
        if lane == 0:
            scr[wid] = amax
        cute.arch.barrier()
        for w in cutlass.range_constexpr(self.warps):
            amax = cute.arch.fmax(amax, scr[w])
        t = cute.make_rmem_tensor(1, cutlass.Float32)
        t[0] = amax
        e = (cute.recast_tensor(t, cutlass.Int32)[0] >> 23) & 0xFF
        f = cutlass.min(cutlass.max(268 - e, 1), 253)  # qs = 2^(f - 127): 2^(14 - floor(log2 max)), clamped
        u = cute.make_rmem_tensor(2, cutlass.Int32)
        u[0] = f << 23
        u[1] = (254 - f) << 23
        uf = cute.recast_tensor(u, cutlass.Float32)
        qs = uf[0]
        qh = cute.make_rmem_tensor(cute.make_layout((nq, vec), stride=(vec, 1)), self.mdtype)
        qh.store((qf.load() * qs).to(self.mdtype))
        for i in cutlass.range_constexpr(nq):
            idx = tidx + i * self.threads
            if cutlass.const_expr(perm):
                # pair m (head_dim 8(c%2) + 2m + j of its 16-column group) at k 8(m%2) + 4(c%2) + 2(m//2) + j
                c = idx % per_row
                for m in cutlass.range_constexpr(vec // 2):
                    cute.autovec_copy(cute.local_tile(qh[i, None], (2,), (m,)),
                                      cute.local_tile(sQ[idx // per_row, None], (2,), (q_pair_slot(c, m),)))
            else:
                cute.autovec_copy(qh[i, None], cute.local_tile(sQ[idx // per_row, None], (vec,), (idx % per_row,)))
        return uf[1], qs

    @cute.jit
    def load_raw(self, mK, mV, pages, sRawD, slot, kv_head, n_block, tidx, ps_shift, k_len, addr=None,
                 full: cutlass.Constexpr = False):
        """cp.async this thread's 16-byte chunks (chunk tidx % c_per_row of its row in each pass) of
        K and V tile ``n_block`` into raw ``slot`` of the direct ring (row j's chunk c at chunk
        c ^ (j % 8) of its 128-byte row); rows past k_len are zeroed instead.  ``own``: the rows of
        the warp's slice (copy_row), each pass's page from the lane that read it (fetch_pages_fp8);
        ``fast_addr``: ``addr`` = (K chunk address, V chunk address, K page / row strides, V page /
        row strides) of this thread, the copy at chunk + page·page stride + row·row stride."""
        BN, D = self.tile_n, self.head_dim
        mask = (1 << ps_shift) - 1
        c = tidx % self.c_per_row
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mK.element_type,
                                   num_bits_per_copy=128)
        for p in cutlass.range_constexpr(self.passes):
            if cutlass.const_expr(self.own):
                row = self.copy_row(p, tidx)
            else:
                row = p * self.rows_pp + tidx // self.c_per_row
            key = n_block * BN + row
            soff = slot * (2 * BN * D) + row * D + ((c ^ (row % 8)) << 4)
            page = pages[p]
            if cutlass.const_expr(self.own):  # this pass's row's page, fetched by lane (row - warp's first)
                page = cute.arch.shuffle_sync(pages[0], p * (32 // self.c_per_row) + (tidx % 32) // self.c_per_row)
            if cutlass.const_expr(full):
                self.copy_raw_row(mK, mV, atom, sRawD, page, key & mask, soff, c, kv_head, addr)
            else:
                if key < k_len:
                    self.copy_raw_row(mK, mV, atom, sRawD, page, key & mask, soff, c, kv_head, addr)
                else:
                    for i in cutlass.range_constexpr(2):
                        z = cute.local_tile(sRawD, (16,), ((soff + i * BN * D) // 16,))
                        cute.recast_tensor(z, cutlass.Int32).fill(0)

    @cute.jit
    def copy_raw_row(self, mK, mV, atom, sRawD, page, off, soff, c, kv_head, addr):
        """load_raw's copy of this thread's K and V chunks of row ``off`` of ``page``."""
        BN, D = self.tile_n, self.head_dim
        if cutlass.const_expr(self.fast_addr):  # (fp8: element strides are byte strides)
            pg = cutlass.Uint64(cutlass.Uint32(page))
            rw = cutlass.Uint64(cutlass.Uint32(off))
            for i in cutlass.range_constexpr(2):
                a = addr[i] + cutlass.Int64(pg * addr[2 + 2 * i] + rw * addr[3 + 2 * i])
                g = cute.make_tensor(cute.make_ptr(mK.element_type, a, cute.AddressSpace.gmem, assumed_align=16),
                                     cute.make_layout(16))
                cute.copy(atom, g, cute.local_tile(sRawD, (16,), ((soff + i * BN * D) // 16,)))
        else:
            for i, src in enumerate((mK, mV)):
                g = cute.local_tile(src[page, off, kv_head, None], (16,), (c,))
                # 16-byte aligned: the contract's strides are multiples of 16 fp8 elements
                g = cute.make_tensor(cute.make_ptr(src.element_type, g.iterator.toint(),
                                                   cute.AddressSpace.gmem, assumed_align=16), g.layout)
                cute.copy(atom, g, cute.local_tile(sRawD, (16,), ((soff + i * BN * D) // 16,)))

    @cute.jit
    def rescale_if_moved(self, acc_O, corr):
        """O's rows times their corrections, skipped (warp-uniform) where every correction is 1."""
        moved = corr[0] != 1.0
        for i in cutlass.range_constexpr(1, cute.size(corr)):
            moved = moved | (corr[i] != 1.0)
        if cute.arch.vote_any_sync(moved):
            softmax.rescale(acc_mn_view(acc_O), corr)

    @cute.jit
    def gemm_qk_raw(self, tiled_mma, acc_S, tSrQ, addr):
        """acc_S += Q·Kᵀ over this warp's key slice (16 or 32 keys) of a raw e4m3 K tile: per pair
        of k16 steps and 16-key half one ldmatrix.x4 (matrix m: keys 8·(m%2).. of the half, k16 step
        2kp + m//2; ``addr``: this lane's row address of pair 0, half 0), each word -> the two f16x2
        registers of a B fragment (k order: atoms/sm90_e4m3.py); the next ldmatrix is issued before
        the current one's conversions."""
        D, NB = self.head_dim, self.bnw // 8
        buf = cute.make_rmem_tensor(NB * D, cutlass.Float16)
        rK = cute.make_tensor(buf.iterator, cute.make_layout(((2, 2), NB, D // 16), stride=((1, 2), 4, 4 * NB)))
        w = cute.recast_tensor(buf, cutlass.Int32)  # word h + 2·nb + 2·NB·kb
        steps = [(kp, kh) for kp in range(D // 32) for kh in range(NB // 2)]
        nxt = ldsm_x4(addr)
        for i, (kp, kh) in enumerate(steps):
            cur = nxt
            if cutlass.const_expr(i + 1 < len(steps)):
                kp1, kh1 = steps[i + 1]
                nxt = ldsm_x4((addr + kh1 * 16 * D) ^ (kp1 << 5))
            for m in cutlass.range_constexpr(4):
                lo, hi = e4m3x4_to_f16x2x2(cur[m])
                wi = 2 * (2 * kh + m % 2) + 2 * NB * (2 * kp + m // 2)
                w[wi] = lo
                w[wi + 1] = hi
            if cutlass.const_expr(kh == NB // 2 - 1):
                for kb in cutlass.range_constexpr(2 * kp, 2 * kp + 2):
                    cute.gemm(tiled_mma, acc_S, tSrQ[None, None, kb], rK[None, None, kb], acc_S)

    @cute.jit
    def gemm_pv_raw(self, tiled_mma, acc_O, acc_S, addr):
        """acc_O += P·V over this warp's key slice of a raw e4m3 V tile: per 16-key step and pair of
        16-byte head_dim chunks one ldmatrix.x4.trans (matrix m: keys 8·(m%2).., chunk 2cp + m//2),
        whose words hold bytes 2g, 2g+1 of keys 2t, 2t+1 (g = lane // 4, t = lane % 4); a byte
        permute of the key halves' words gives keys (2t, 2t+1, 2t+8, 2t+9) of column 2g (0x6420) and
        of 2g+1 (0x7531): the B fragments of n8 blocks 2c (head_dim 16c + 2g) and 2c + 1 (16c + 2g + 1)."""
        D = self.head_dim
        rP = cute.make_fragment_like(acc_S, self.mdtype)
        rP.store(acc_S.load().to(self.mdtype))
        tOrP = cute.make_tensor(rP.iterator, acc_as_a_layout(rP.layout))
        npair = D // 32
        buf = cute.make_rmem_tensor(2 * D, cutlass.Float16)
        rV = cute.make_tensor(buf.iterator, cute.make_layout(((2, 2), 4, npair), stride=((1, 2), 4, 16)))
        w = cute.recast_tensor(buf, cutlass.Int32)  # word h + 2·nb
        # acc_O ((2, 2), 1, D/8) as ((2, 2), 1, 4, pairs): the four n8 blocks of each chunk pair
        accv = cute.make_tensor(acc_O.iterator, cute.make_layout(((2, 2), 1, 4, npair), stride=((1, 2), 0, 4, 16)))
        steps = [(ks, cp) for ks in range(self.bnw // 16) for cp in range(npair)]
        nxt = ldsm_x4_trans(addr)
        for i, (ks, cp) in enumerate(steps):
            cur = nxt
            if cutlass.const_expr(i + 1 < len(steps)):
                ks1, cp1 = steps[i + 1]
                nxt = ldsm_x4_trans((addr + ks1 * 16 * D) ^ (cp1 << 5))
            for h in cutlass.range_constexpr(2):  # chunk 2cp + h: words (2h, 2h + 1)
                c = 2 * cp + h
                for e, sel in enumerate(V_JOIN):
                    lo, hi = e4m3_join_to_f16x2x2(cur[2 * h], cur[2 * h + 1], sel)
                    w[2 * (2 * c + e)] = lo
                    w[2 * (2 * c + e) + 1] = hi
            cute.gemm(tiled_mma, accv[None, None, None, cp], tOrP[None, None, ks], rV[None, None, cp],
                      accv[None, None, None, cp])

    @cute.jit
    def store_fp8_regs(self, kreg, vreg, sKV, slot, tidx, n_block, k_len):
        """The staged chunks of tile ``n_block`` converted to dtype into ``slot`` of the ring (two
        8-element chunks of the swizzled row each); rows past k_len zeroed."""
        c = tidx % self.c_per_row
        k8 = cute.make_tensor(kreg.iterator, cute.make_layout((self.passes, 2, 8), stride=(16, 8, 1)))
        v8 = cute.make_tensor(vreg.iterator, cute.make_layout((self.passes, 2, 8), stride=(16, 8, 1)))
        for p in cutlass.range_constexpr(self.passes):
            row = p * self.rows_pp + tidx // self.c_per_row
            for h in cutlass.range_constexpr(2):
                dk = cute.local_tile(sKV[row, None, 2 * slot], (8,), (2 * c + h,))
                dv = cute.local_tile(sKV[row, None, 2 * slot + 1], (8,), (2 * c + h,))
                if n_block * self.tile_n + row < k_len:
                    dk.store(k8[p, h, None].load().to(self.mdtype))
                    dv.store(v8[p, h, None].load().to(self.mdtype))
                else:
                    dk.fill(0)
                    dv.fill(0)

    @cute.jit
    def add_sink(self, acc, lse, sink):
        """Fold a learned sink logit into a finished row: the softmax denominator gains
        exp(sink) (no value row), so O scales by exp(lse - lse') with lse' = logaddexp(lse, sink);
        returns lse'.  A sink of -inf (no sinks given) changes nothing."""
        out = lse
        if sink > -cutlass.Float32.inf:
            mx = cute.arch.fmax(lse, sink)
            out = mx + cute.math.log2(cute.math.exp2((lse - mx) * LOG2_E, fastmath=True)
                                      + cute.math.exp2((sink - mx) * LOG2_E, fastmath=True), fastmath=True) * LN_2
            f = cute.math.exp2((lse - out) * LOG2_E, fastmath=True)
            for j in cutlass.range_constexpr(self.epr):
                acc[j] = acc[j] * f
        return out

    @cute.kernel
    def combine(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSinks):
        """Split-KV combine, one warp per query row (PDL: waits for the main grid first); with
        sinks the row's sink logit joins there (the splits leave it out)."""
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()
        sink = None
        if cutlass.const_expr(self.sinks):
            _, head, _ = cute.arch.block_idx()
            sink = mSinks[head]
        softmax.combine_splits(mOp, mLp, mO, mLSE, self.head_dim, self.splits, self.dtype, COMBINE_WARPS, sink=sink)


# --- attention over a KV cache ----------------------------------------------------------------------
# Split counts built: merged in a cluster (no PDL twins: the runtime takes the plain one), and
# 32 through the workspace and the PDL combine kernel (paged: few sequences whose K/V fit in L2,
# MQA).
KV_SPLITS = (1, 2, 4, 8)
KV_GLOBAL_SPLITS = (32,)
# Split counts of the last-arrival merge (workspace splits merged inside the launch).
LAST_SPLITS = (16, 32)


def make_kv(target: str, dtype: str, head_dim: int, splits: int, *, paged: bool = True,
            switches: bool = False, kv_dtype: str | None = None, config: tuple | None = None,
            direct: bool = True, stages: int | None = None, min_ctas: int | None = None,
            pdl: bool | None = None, last: bool = False, own: bool = False,
            fast_addr: bool = False, page_run: bool = False, tail_zero: bool = False) -> AttentionDecodeKV:
    """A KV-cache decode variant; fp8 caches take the direct build (``direct=False``: the converting
    one), in FP8_DIRECT's config unless ``config`` (tile_n, warps, ilp[, stages]) / ``stages`` say
    otherwise; ``pdl`` None: on for workspace splits merged by the combine kernel; ``last``: workspace
    splits merged by the last to arrive (no cluster, no second kernel)."""
    tn, w, st, _pdl, ilp, mc = DEFAULT[head_dim]
    fp8 = kv_dtype == "e4m3"
    direct = fp8 and direct
    if fp8:
        tn, w, st = FP8_DIRECT if direct else (tn, w, FP8_STAGES)
    if config:  # alternatives for measuring, and the 8-warp builds
        tn, w, ilp = config[:3]
        if len(config) > 3:
            st = config[3]
        elif direct and config == FP8_WIDE:
            st = FP8_WIDE_STAGES
    if stages:
        st = stages
    if min_ctas is not None:
        mc = min_ctas
    cluster = splits in CLUSTER_BUILT and not last
    return AttentionDecodeKV(target=target, dtype=dtype, head_dim=head_dim, tile_n=tn, warps=w, stages=st,
                             causal=True, splits=splits, cluster=cluster,
                             pdl=(splits > 1 and not cluster and not last) if pdl is None else pdl,
                             ilp=ilp, min_ctas=mc, kv_dtype=kv_dtype or dtype, paged=paged, local=switches,
                             softcap=switches, sinks=switches, direct=direct, own=own and direct,
                             fast_addr=fast_addr and direct, last=last, page_run=page_run,
                             tail_zero=tail_zero and direct)


@register("attention_kvcache")
def enumerate_decode_kv(target: Target, tier: str) -> list[AttentionDecodeKV]:
    """test: one of each path (paged and dense cache, unsplit and cluster-split, the window /
    softcap / sink switches, f16 and head_dim 64, fp8 caches); default: paged and dense caches for
    both dtypes and head_dims at every split count, the switch build (window + softcap + sinks in
    one variant: gpt-oss, Gemma 2) for bf16 paged caches, and bf16 q over fp8 e4m3 paged caches
    at head_dim 128 (the direct build with warp-own copies at every split count, plus its 8-warp
    one-CTA-per-SM build at 8 cluster splits with PDL)."""
    if target.name != "sm_90":
        return []
    t = target.name
    if tier == "test":
        out = [make_kv(t, "bf16", 128, 1), make_kv(t, "bf16", 128, 4), make_kv(t, "bf16", 128, 1, paged=False),
               make_kv(t, "bf16", 128, 4, paged=False), make_kv(t, "bf16", 128, 1, switches=True),
               make_kv(t, "bf16", 128, 4, switches=True), make_kv(t, "f16", 64, 1), make_kv(t, "f16", 64, 2),
               make_kv(t, "bf16", 128, 32), make_kv(t, "bf16", 128, 32, switches=True),
               # fp8 e4m3 caches (head_dim 128: D64's build spills)
               make_kv(t, "bf16", 128, 1, kv_dtype="e4m3", **FP8_OWN), make_kv(t, "f16", 128, 4, kv_dtype="e4m3"),
               # 8 warps over 128-key tiles, cluster merge with PDL
               make_kv(t, "bf16", 128, 4, config=KV_WIDE[128], pdl=True),
               # the last-arrival merge (8 warps over 128-key tiles), bf16 and e4m3 caches
               make_kv(t, "bf16", 128, 16, config=KV_WIDE[128], last=True),
               make_kv(t, "bf16", 128, 16, kv_dtype="e4m3", last=True, config=FP8_WIDE, **FP8_OWN)]
    else:
        out = [make_kv(t, dt, d, sp, paged=pg) for dt in DTYPES for d in HEAD_DIMS for sp in KV_SPLITS
               for pg in (True, False)]
        out += [make_kv(t, dt, d, sp) for dt in DTYPES for d in HEAD_DIMS for sp in KV_GLOBAL_SPLITS]
        out += [make_kv(t, "bf16", d, sp, switches=True) for d in HEAD_DIMS for sp in KV_SPLITS]
        # fp8 e4m3 paged caches under bf16 q, head_dim 128: every split count the paged rule picks
        out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", **FP8_OWN) for sp in KV_SPLITS + KV_GLOBAL_SPLITS]
        # head_dim 256 (Gemma-style heads): bf16 paged caches, the split counts that fit
        out += [make_kv(t, "bf16", 256, sp) for sp in KV_SPLITS + KV_GLOBAL_SPLITS]
        # fp8, grids that leave half the SMs idle (MQA): 8 warps over 128-key tiles (one 128 KB CTA per
        # SM) at 8 cluster splits with PDL
        out += [make_kv(t, "bf16", 128, 8, kv_dtype="e4m3", config=FP8_WIDE, pdl=True, **FP8_OWN)]
        if tier == "full":  # fp8 alternatives: the plain direct build (4 and 8 warps), the converting
            # build; direct 64-key tiles, 2-stage 128-key tiles
            fs = KV_SPLITS + KV_GLOBAL_SPLITS
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3") for sp in fs]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", config=FP8_WIDE) for sp in KV_SPLITS]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", direct=False) for sp in fs]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", direct=False, config=FP8_WIDE) for sp in (2, 4, 8)]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", config=(64, 4, False), stages=st)
                    for st in (3, 4, 6) for sp in fs]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", stages=2) for sp in fs]
            # short copy addresses without warp-own copies; the 8-warp build with both at 2 splits; 6
            # stages of one CTA per SM
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", fast_addr=True) for sp in fs]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", config=FP8_WIDE, fast_addr=True, own=ow,
                            pdl=sp == 8) for sp in (2, 8) for ow in (False, True)]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", stages=6, **FP8_OWN) for sp in (2, 4, 8)]
            # the default builds with the length check in every copy (no ``tail_zero``); 3 CTAs per SM
            # (two 128-key stages, or 64-key tiles in four), with and without it
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", **FP8_OWN_PLAIN) for sp in fs]
            out += [make_kv(t, "bf16", 128, 8, kv_dtype="e4m3", config=FP8_WIDE, pdl=True, **FP8_OWN_PLAIN),
                    make_kv(t, "bf16", 128, 16, kv_dtype="e4m3", last=True, config=FP8_WIDE, **FP8_OWN_PLAIN)]
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", tail_zero=tz, **kw, **FP8_OWN_PLAIN)
                    for sp in (1, 2, 4) for tz in (False, True)
                    for kw in ({"stages": 2}, {"config": (64, 4, False), "stages": 4})]
        # bf16 caches, 8 warps over 128-key tiles where the selection takes them: head_dim 128 at 8
        # splits with PDL (MQA-like grids; paged and dense), head_dim 64 paged unsplit and at 2 splits
        out += [make_kv(t, "bf16", 128, 8, paged=pg, config=KV_WIDE[128], pdl=True) for pg in (True, False)]
        out += [make_kv(t, "bf16", 64, sp, config=KV_WIDE[64]) for sp in (1, 2)]
        # workspace splits merged by the last split to arrive (no second kernel), bf16 head_dim 128
        # paged caches: where the selection takes them (tests/kvcache_rules.py _last_pick), 8 warps
        # over 128-key tiles at 16 and 32 splits and 4 warps over 64-key tiles at 16; "full": head_dim
        # 64, PDL twins, dense caches, for measuring
        out += [make_kv(t, "bf16", 128, sp, last=True, config=KV_WIDE[128]) for sp in LAST_SPLITS]
        out += [make_kv(t, "bf16", 128, 16, last=True)]
        # e4m3 caches: the 8-warp build at 16 splits (MQA B8 H16/1 4k page 16: 10.6 vs 12.1 µs for the
        # fp8 rule's pick before it, the bf16 cache's 10.5; B1 H32/8 32k 33.5 vs 34.4)
        out += [make_kv(t, "bf16", 128, 16, kv_dtype="e4m3", last=True, config=FP8_WIDE, **FP8_OWN)]
        if tier == "full":
            out += [make_kv(t, "bf16", d, sp, last=True, **kw) for d in HEAD_DIMS for sp in LAST_SPLITS
                    for kw in ({}, {"pdl": True}, {"config": KV_WIDE[d]})]
            out += [make_kv(t, "bf16", 128, 16, paged=False, last=True, **kw) for kw in ({}, {"config": KV_WIDE[128]})]
            # e4m3 caches (the direct build with warp-own copies): 4 and 8 warps, for measuring (4 warps
            # at 16: B1 H32/8 32k 33.3 µs; 32 splits lose: MQA B8 4k 14.6 / 15.3)
            out += [make_kv(t, "bf16", 128, sp, kv_dtype="e4m3", last=True, **kw, **FP8_OWN) for sp in LAST_SPLITS
                    for kw in ({}, {"config": FP8_WIDE})]
        if tier == "full":  # every split count, without PDL, for measuring
            out += [make_kv(t, "bf16", d, sp, config=KV_WIDE[d]) for d in HEAD_DIMS for sp in KV_SPLITS]
            out += [make_kv(t, "bf16", 128, 8, paged=False, config=KV_WIDE[128])]
            # page runs (head_dim 64 and 128 at the split counts the rule takes for B8 H64/8 8k, B64 H32/8
            # 1k, B16 H32/8 4k, MQA and B1 32k)
            out += [make_kv(t, "bf16", 64, sp, config=cf, page_run=True) for sp in (1, 2, 4)
                    for cf in (None, KV_WIDE[64])]
            out += [make_kv(t, "bf16", 128, sp, page_run=True) for sp in (1, 2, 4)]
            out += [make_kv(t, "bf16", 128, 16, last=True, config=KV_WIDE[128], page_run=True)]
    out = list({v.name: v for v in out}.values())
    return [v for v in out if v.can_implement() is None]


@register("attention_kvcache_rope")
def enumerate_decode_kv_rope(target: Target, tier: str) -> list[AttentionDecodeKVRope]:
    """The rotary-prologue twins: test, bf16 head_dim 128 paged neox unsplit and at 32 splits (the
    combine kernel) and interleaved at 4 (cluster); full, neox and interleaved twins of the bf16
    head_dim 128 paged caches' default builds at every split count.  Not in the default tier."""
    if target.name != "sm_90" or tier == "default":
        return []
    t = target.name
    if tier == "test":
        out = [rope_twin(make_kv(t, "bf16", 128, 1)), rope_twin(make_kv(t, "bf16", 128, 32)),
               rope_twin(make_kv(t, "bf16", 128, 4), interleaved=True)]
    else:
        base = [make_kv(t, "bf16", 128, sp) for sp in KV_SPLITS + KV_GLOBAL_SPLITS]
        base.append(make_kv(t, "bf16", 128, 8, config=KV_WIDE[128], pdl=True))
        out = [rope_twin(v, il) for v in base for il in (False, True)]
    return [v for v in out if v.can_implement() is None]
