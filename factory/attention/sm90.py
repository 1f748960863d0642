"""FlashAttention-3-class forward for Hopper (sm_90a): TMA, WGMMA, warp specialization.  Our own
CuTe DSL kernel.

One CTA computes one (query tile, q head, batch) triple; query tiles of ``tile_m`` = 64·W rows.

Warp roles (``1 + W`` warpgroups of 128 threads):

* warpgroup 0, warp 0 — the **producer**: TMA loads of the CTA's Q (one 64-row slab per consumer
  warpgroup, one mbarrier each), then the K and V tiles the tile's rows can see, last first, into
  two rings of ``stages`` swizzled smem slots (``PipelineTmaAsync``: a "full" mbarrier per slot
  completed by the TMA's byte count, an "empty" one the consumer warps arrive on).  K and V have
  separate rings, so S = Q·Kᵀ of a tile starts as soon as its K has landed.  The warpgroup gives
  its registers back (setmaxnreg) and its other three warps leave.
* warpgroups 1..W — the **consumers**, one 64-row slab of the query tile each, all reading the same
  K/V slots.  Per key tile: S = Q·Kᵀ on WGMMA with both operands in smem (fp32 accumulators in
  registers), the mask where the tile touches the diagonal or the key tail, the online softmax in
  exp2 with log2(e)·scale folded into one FFMA per score, P converted to 16 bits *in registers* —
  the accumulator layout of S is the register-A layout of the next WGMMA (atoms/sm90.py) — and
  O += P·V with P from registers and V from smem (MN-major).  ``overlap`` (intra-warpgroup overlap,
  FA3): the S GEMM of the next tile is issued before this tile's P·V, so the softmax of one tile
  runs while the tensor cores work on the other.  ``pingpong``: the consumer warpgroups take turns
  issuing their GEMMs (named barriers), so one warpgroup's softmax runs under the other's GEMMs.
* Epilogue per consumer warpgroup: O / rowsum -> dtype -> its Q slab in smem (Q is dead by then)
  -> one TMA store (rows past seqlen_q are clipped by the TMA; varlen: 16-byte stores, below);
  LSE (natural log) from registers.
  A row with no visible key writes O = 0 and LSE = -inf.

Persistent variants (the default for dense and varlen problems): a grid of min(tiles, 132) CTAs
(fewer on a device with fewer SMs), each walking its share of the tiles (causal: longest rows
first, dealt in zigzag rounds); the producer loads the next tile's Q once the consumers' last S
GEMM of the current one has read theirs, O leaves through its own smem slabs.  head_dim 256
(``o_in_q``: no smem for O's own slabs) writes O through Q's slabs as one tile per CTA does, and
the next tile's Q loads once O's store has read them.

Tails need no code on the load side: TMA zero-fills rows past seqlen (Q and K/V), and masked
scores are -inf, so the zero rows of V meet P = 0.  Causal masking is bottom-right aligned (query
i sees keys j <= i + seqlen_k - seqlen_q); key tiles no row of the tile sees are never loaded,
tiles every row sees fully run without mask code.  GQA/MQA read kv head h // (Hq / Hkv) in place.
Causal grids walk query tiles from the last (longest rows) to the first.

``varlen`` (packed sequences, int32 cu_seqlens): a CTA offsets the (tokens, D, heads) TMA tensors
to its sequence, so boxes past a sequence's end read the next sequence's tokens (finite; masked
keys meet P = 0, extra query rows are never stored) or the TMA's zero fill past the last token;
O leaves by predicated 16-byte stores instead of the TMA store, which would write into the next
sequence.  The grid is sized by max_seqlen_q and tiles past a sequence's end exit at once;
persistent varlen CTAs walk that grid as a virtual one (``tile_coords``), skipping its empty
slots.

The arguments are the sm80 family's (dense: q, k, v, o, lse, softmax_scale; varlen: q, k, v, o,
lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, max_seqlen_q): the loader needs no launch code.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from ..abi import DTYPE_BYTES, Signature, TensorArg
from ..atoms import sm90 as atoms
from ..atoms.common import cutlass_dtype
from ..atoms.smem import BARRIER_BYTES as _BARRIER_BYTES
from ..atoms.smem import SMEM_ALIGN as _SMEM_ALIGN
from ..atoms.smem import STATIC_SMEM as _STATIC_SMEM
from ..atoms.smem import round_up as _round_up
from ..atoms.targets import Target
from ..registry import register
from . import contract, layout, mask, softmax, softmax_ex2
from .base import DTYPES, TOOLKIT_SOURCES, AttentionVariant, causal_field, varlen_field
from .softmax import LOG2_E

HEAD_DIMS = (64, 128, 256)
# Rows of one consumer warpgroup: one WGMMA M.
WG_ROWS = 64
# Dense problems with fewer queries than this run the sm80 family's kernels on a 9.0 device
# (runtime/attention.py select; manifest "min_seqlen_q").  H100, bf16, graph replay
# (notes/attention-sm90.md): one query, 32 heads (MHA, the grid full without split-KV): 128-row
# tile 179.6 µs vs the sm_90 build's 64-row tile 177.2; four queries (B4 H32/8 Sk 8192) 96.1 vs
# 123.8, 16..64 queries (Sk 4096) 51 vs 64.  (Split-KV and packed-GQA decode, which this family
# lacks, are chosen before this rule applies.)
MIN_SEQLEN_Q = 2
# Grid of a persistent variant: at most the H100 SXM's (and H200's) SM count, fixed at build time
# (the arguments carry no device facts); on a device with fewer SMs (%nsmid) the CTAs past its
# count leave at once and the others share their tiles, so no CTA waits for a second wave.
PERSISTENT_CTAS = 132
# dynamic: the int32 words of the runtime's counters a launch uses (tile counter, arrival counter)
TILE_COUNTER_WORDS = 2
# Causal persistent order: CTAs in flight per kv head (the section width, tile_coords).
CAUSAL_CTAS_PER_KV_HEAD = 4
# lazy_rescale: how far (log2 units) a row's max may pass its reference before the warp rescales
LAZY_RESCALE_LOG2 = 8.0


class _Bar(enum.IntEnum):
    """Named hardware barriers (id 0 is __syncthreads)."""

    EPILOGUE = 1  # + consumer warpgroup: its 128 threads before the TMA store of O
    SCHEDULE = 4  # + consumer warpgroup: "your turn to issue GEMMs" (ping-pong)


def merge_words(head_dim: int) -> int:
    """kv_split: fp32 words one consumer thread of rank 1 sends rank 0: its O fragment (a 64 x
    head_dim accumulator over 128 threads), then the max and the sum of each of its two rows."""
    return WG_ROWS * head_dim // 128 + 4


def merge_floats(head_dim: int) -> int:
    """kv_split's receiving buffer in rank 0's shared memory, fp32 words (thread-contiguous)."""
    return 128 * merge_words(head_dim)


# ------------------------------------------------------------------------------------------------
# The variant: config, calling convention, manifest fields
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttentionSm90(AttentionVariant):
    family: ClassVar[str] = "sm90"
    sources = ("attention/sm90.py", "atoms/sm90.py", "attention/layout.py", "atoms/smem.py",
               "attention/softmax_ex2.py", "atoms/exp2_poly.py", *TOOLKIT_SOURCES)
    HEAD_DIMS = HEAD_DIMS

    tile_m: int = field(default=128, metadata={"tag": "m"})
    tile_n: int = field(default=128, metadata={"tag": "n"})
    stages: int = field(default=2, metadata={"tag": "s"})
    causal: bool = causal_field()
    varlen: bool = varlen_field()
    # Intra-warpgroup overlap: S of the next key tile is issued before P·V of this one.  (ptxas
    # moves the P·V wait above the softmax, which then overlaps only the other warpgroup's GEMMs:
    # notes/attention-sm90.md.)
    overlap: bool = field(default=False, metadata={"tag": "ov"})
    # The consumer warpgroups take turns issuing their GEMMs (named barriers).
    pingpong: bool = field(default=False, metadata={"tag": "pp"})
    # With overlap: O is rescaled while S of the next tile is on the tensor cores, before P·V is
    # issued, instead of after P·V has retired (FA3's RescaleOBeforeGemm).
    early_rescale: bool = field(default=False, metadata={"tag": "er"})
    # Persistent CTAs: a grid of min(tiles, PERSISTENT_CTAS), each walking tiles (causal: longest
    # rows first); the next tile's Q loads while this one's O is stored (O gets its own smem).
    persistent: bool = field(default=False, metadata={"tag": "ps"})
    # The producer issues a tile's first K before its Q and each K one tile ahead of its V.
    k_first: bool = field(default=False, metadata={"tag": "kf"})
    # With overlap, in the mainloop: a warp keeps its rows' reference max until one row's max
    # passes it by more than LAZY_RESCALE_LOG2 (P <= 2^8: the same relative precision in 16 bits),
    # and rescales O only then (FA4's conditional rescale; the running sum follows the reference).
    lazy_rescale: bool = field(default=False, metadata={"tag": "lz"})
    # Persistent: one copy of the consumer code per consumer warpgroup, the warpgroup index a
    # compile-time constant in each.  At head_dim 256 ptxas then builds the WGMMA descriptors
    # (Q slab, K/V slot, k-step) on the uniform datapath, 4 uniform instructions per WGMMA
    # instead of 4 R2UR + 4 vector instructions (SASS: 31 vs 316 R2UR); the cubin grows by half.
    const_wg: bool = field(default=False, metadata={"tag": "cw"})
    # Under-filled grids: a cluster of two CTAs per query tile, each walking half of its key tiles
    # (the upper half to rank 0) with K/V of its own; rank 1 pushes its O, row maxima and row sums
    # into rank 0's shared memory (st.async, DSMEM), rank 0 merges them (the split-KV merge) and
    # stores O.  Each SM loads half of the tile's K/V bytes and walks half of its key tiles.
    kv_split: bool = field(default=False, metadata={"tag": "ks"})
    # Persistent, O through its own smem slabs by TMA: the warp that issues a tile's O store does
    # not wait for the store to read the slab; it waits before the next tile's O is written there
    # (and once before the CTA exits), so the next tile's first GEMM does not wait on the store.
    store_defer: bool = field(default=False, metadata={"tag": "sd"})
    # Exponentials of the key tiles' softmax off the MUFU pipe in part (attention/softmax_ex2.py):
    # ``ex2_fma`` of every 16 of a thread's scores by a polynomial on the FMA pipe (degree 2 where
    # P is e4m3, 3 where it is 16-bit; 0: none, and the name has no tag), or ``ex2_pairs``: pairs
    # of scores through ex2.approx.ftz.bf16x2 (bf16 P).
    ex2_fma: int = field(default=0, metadata={"tag": "xf"})
    ex2_pairs: bool = field(default=False, metadata={"tag": "xb"})
    # Causal: on a query tile's first (diagonal) key tile, a consumer warpgroup whose rows see no
    # key of the tile's upper half masks and exponentiates only the lower half and writes P = 0
    # into the upper one (half the exponentials of that tile for the upper warpgroup of a square
    # diagonal tile).
    diag_half: bool = field(default=False, metadata={"tag": "dh"})
    # O from registers into its smem slab by stmatrix (8x8 16-bit matrices, four per instruction)
    # instead of one 32-bit store per two elements (dense, 16-bit O by TMA store): fewer
    # instructions in the epilogue (the 64 x 64 slab: 16 STS.32 and their swizzled addresses).
    o_stmatrix: bool = field(default=False, metadata={"tag": "om"})
    # With dynamic: the producer warp passes each tile's (query tile, q head, batch) with its index
    # through the shared-memory slot (it computes them for its loads), so the consumer warps skip
    # the schedule's integer divisions at every tile start.  (Declared before ``dynamic``: the
    # name ends in ``_sc_dy``.)
    slot_coords: bool = field(default=False, metadata={"tag": "sc"})
    # Persistent, dense: each CTA takes its next tile from a global tile counter (atomic add) as it
    # finishes one, instead of a fixed deal; the tiles in order (causal: longest rows first), the
    # producer warp passes each index to the consumers through a shared-memory slot.  The counter
    # and an arrival counter are the runtime's zeroed int32 words (``tile_counters``); the last CTA
    # to finish sets both back to 0.
    dynamic: bool = field(default=False, metadata={"tag": "dy"})
    # Persistent, dense, not causal: a cluster of two CTAs on adjacent query tiles of one (batch,
    # head), both walking the same key tiles; each CTA's producer loads half of every K and V tile
    # and multicasts it into both CTAs' slots (TMA multicast), so each SM reads half of the K/V
    # bytes from L2.  A slot is free once the consumers of both CTAs have released it.  With an
    # odd number of query tiles the pair's second tile of a head lies past the end (its Q loads as
    # zeros, its O and LSE rows are not written).
    kv_mcast: bool = field(default=False, metadata={"tag": "mc"})

    @property
    def name(self) -> str:
        # ex2_fma is named only where it is used (the other names stay as they were)
        return "_".join(t for t in super().name.split("_") if t != "xf0")

    def config(self) -> dict[str, Any]:
        # the exponential options appear only where used (manifests and cache keys of the other
        # variants stay as they were)
        c = super().config()
        for k in ("store_defer", "ex2_fma", "ex2_pairs", "dynamic", "slot_coords", "o_stmatrix", "diag_half",
                  "kv_mcast"):
            if not c[k]:
                del c[k]
        return c

    @classmethod
    def ex2_built(cls) -> bool:
        """Whether this class's kernels take the ex2_fma / ex2_pairs options."""
        return cls.make_kernel is AttentionSm90.make_kernel

    @property
    def ex2_degree(self) -> int:
        return 2 if self.dtype == "e4m3" else 3

    def ex2_sass(self) -> tuple[str, ...]:
        """SASS the exponential options leave: the polynomial's floor (an add rounding toward
        -inf), the paired exponentials (MUFU.EX2.BF16, two per ex2.approx.ftz.bf16x2)."""
        return (((r"\bFADD\.RM\b",) if self.ex2_fma else ())
                + ((r"\bMUFU\.EX2\.BF16\b",) if self.ex2_pairs else ()))

    def ex2_describe(self) -> dict[str, Any]:
        if not (self.ex2_fma or self.ex2_pairs):
            return {}
        return {"exp2": {"fma_per_16": self.ex2_fma, "degree": self.ex2_degree} if self.ex2_fma
                else {"bf16_pairs": True}}

    @property
    def consumers(self) -> int:
        return self.tile_m // WG_ROWS

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def sass_requirements(self) -> tuple[str, ...]:
        # HGMMA with both operands in smem (S = Q·Kᵀ: "gdesc" twice) and with A from registers
        # (P·V: a register operand "R<n>" first): nvdisasm prints
        #   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;      (both smem)
        #   HGMMA.64x128x16.F32.BF16 R88, R24, gdesc[UR8].tnspB, R88, UP0 ; (A in registers)
        # (fp16 inputs print no input type: "HGMMA.64x128x16.F32 R24, ...").
        # Varlen: (tokens, D, heads) TMA boxes (3D) and O by 16-byte stores (a TMA store would
        # write past the sequence into the next one).
        d = r"\.BF16" if self.dtype == "bf16" else ""
        store = r"\bSTG\.E\.128\b" if self.varlen else r"\bUTMASTG\.4D\b"
        # lazy_rescale: the warp's vote on whether a reference max moves
        return (
            rf"\bHGMMA\.64x{self.tile_n}x16\.F32{d} R\d+, gdesc\[",
            rf"\bHGMMA\.64x{self.head_dim}x16\.F32{d} R\d+, R\d+, gdesc\[",
            r"\bUTMALDG\.3D\b" if self.varlen else r"\bUTMALDG\.4D\b", store,
            r"\bSYNCS\.", r"\bUSETMAXREG\.", r"\bMUFU\.EX2\b",
        ) + ((r"\bVOTE\.ANY\b",) if self.lazy_rescale else ()) + ((r"\bSTSM\.",) if self.o_stmatrix else ()) + (
            # kv_split: rank 1's partial by st.async into rank 0, after the cluster's barrier
            (r"\bSTAS\.128\b", r"\bUCGABAR_ARV\b") if self.kv_split else ()) + (
            # kv_mcast: K/V halves multicast into both CTAs of the cluster
            (r"\bUTMALDG\.4D\.MULTICAST\b",) if self.kv_mcast else ()) + self.ex2_sass()

    def _smem_parts(self) -> tuple[int, int]:
        e = DTYPE_BYTES[self.dtype]
        q = _round_up(self.tile_m * self.head_dim * e, _SMEM_ALIGN)
        kv = 2 * self.stages * _round_up(self.tile_n * self.head_dim * e, _SMEM_ALIGN)
        return q, kv

    @property
    def o_in_q(self) -> bool:
        """Persistent, with O leaving through Q's slabs (the next tile's Q loads once O's TMA store
        has read them) where O's own slabs do not fit beside Q and the K/V stages: head_dim 256."""
        if not self.persistent:
            return False
        q, kv = self._smem_parts()
        return _BARRIER_BYTES + 2 * q + kv + _STATIC_SMEM > self.tgt.smem_per_cta

    def smem_bytes(self) -> int:
        q, kv = self._smem_parts()
        merge = _round_up(merge_floats(self.head_dim) * 4 + 8, _SMEM_ALIGN) if self.kv_split else 0
        return _BARRIER_BYTES + q * (2 if self.persistent and not self.o_in_q else 1) + kv + merge

    @property
    def epilogue_options_built(self) -> bool:
        """Whether this class's kernel takes ``o_stmatrix`` and ``diag_half`` (the stmatrix
        epilogue and the diagonal tile's half softmax of the shared consumer code)."""
        return type(self).make_kernel is AttentionSm90.make_kernel

    def can_implement(self) -> str | None:
        t = self.tgt
        if t.family != "sm90":
            return f"target {self.target} is not a Hopper (sm90) target"
        if (problem := self.check_problem()) is not None:
            return problem
        if self.tile_m % WG_ROWS or self.consumers not in (1, 2, 3):
            return "tile_m must be 64, 128 or 192 (one 64-row slab per consumer warpgroup)"
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            return "tile_n must be a multiple of 16 in [16, 256] (one WGMMA N, k16 steps of P·V)"
        if self.stages < 2:
            return "stages must be >= 2"
        if self.pingpong and self.consumers < 2:
            return "pingpong needs two or more consumer warpgroups"
        if self.early_rescale and not self.overlap:
            return "early_rescale needs overlap"
        if self.lazy_rescale and not self.overlap:
            return "lazy_rescale needs overlap"
        if self.const_wg and not self.persistent:
            return "const_wg needs persistent"
        if self.const_wg and type(self).make_kernel is not AttentionSm90.make_kernel:
            return "const_wg is built for this family's own kernels only"
        if self.store_defer and (not self.persistent or self.o_in_q or self.varlen):
            return "store_defer needs persistent, dense, O in its own smem slabs"
        if self.dynamic and (not self.persistent or type(self).make_kernel is not AttentionSm90.make_kernel):
            return "dynamic needs persistent and this family's own kernels"
        if self.slot_coords and not self.dynamic:
            return "slot_coords needs dynamic"
        if self.o_stmatrix and (self.dtype not in ("bf16", "f16") or not self.epilogue_options_built):
            return "o_stmatrix needs 16-bit O and this family's own kernels"
        if self.diag_half and (not self.causal or self.tile_n % 32 or self.ex2_fma or self.ex2_pairs
                               or not self.epilogue_options_built):
            return "diag_half needs causal, tile_n a multiple of 32, the plain exponentials and this family's own kernels"
        if self.kv_split and (self.tile_m != WG_ROWS or not self.overlap or self.persistent or self.varlen
                              or self.early_rescale or self.lazy_rescale or self.k_first):
            return ("kv_split takes one 64-row query tile per CTA pair, overlap, dense, one tile per CTA "
                    "and the plain mainloop")
        if self.kv_mcast and (not self.persistent or self.varlen or self.dynamic or self.kv_split
                              or type(self).make_kernel is not AttentionSm90.make_kernel):
            return "kv_mcast needs persistent, dense, the static schedule and this family's own kernels"
        if self.ex2_fma or self.ex2_pairs:
            if not type(self).ex2_built():
                return "ex2_fma / ex2_pairs are built for the sm90 and fp8 kernels only"
            if not 0 <= self.ex2_fma <= 16 or (self.ex2_fma and self.ex2_pairs):
                return "ex2_fma counts exponentials per 16 (0-16); ex2_pairs takes them all"
            if self.ex2_pairs and self.dtype not in ("bf16", "e4m3"):
                return "ex2_pairs rounds P to bf16: bf16 (or e4m3) inputs only"
        # fp32 registers per consumer thread: S (tile_n/2), O (head_dim/2), P (tile_n/4); with
        # overlap S of the next tile lives beside P of this one.
        live = self.tile_n // 2 + self.head_dim // 2 + self.tile_n // 4
        if live + 32 > atoms.CONSUMER_REGS[self.consumers]:
            return f"{live} live accumulator registers do not fit {atoms.CONSUMER_REGS[self.consumers]}"
        return self.smem_problem(_STATIC_SMEM)

    def describe(self) -> dict[str, Any]:
        return {
            **self.contract_fields(),
            "tile": [self.tile_m, self.tile_n],
            "warps": self.threads // 32,
            "stages": self.stages,
            "splits": 1,
            "pack_gqa": False,
            "overlap": self.overlap,
            "pingpong": self.pingpong,
            "early_rescale": self.early_rescale,
            "k_first": self.k_first,
            "smem_bytes": self.smem_bytes(),
            "min_seqlen_q": MIN_SEQLEN_Q,
            "tile_scheduler": ({"persistent": True, "max_ctas": PERSISTENT_CTAS,
                                "order": ("longest rows first, zigzag" if not self.dynamic
                                          else "longest rows first") if self.causal
                                else "query tiles fastest",
                                **({"dynamic": "global tile counter"} if self.dynamic else {}),
                                **({"coords": "from the producer warp"} if self.slot_coords else {}),
                                **({"o_smem": "q slabs"} if self.o_in_q else {})} if self.persistent
                               else {"persistent": False}),
            # Resident CTAs per SM: the setmaxnreg budgets hand the CTA the whole register file
            # (and the 128-row tiles' smem leaves no room for a second CTA): selection counts waves.
            "ctas_per_sm": 1,
            "threads": self.threads,
            "registers_per_role": {"producer": atoms.PRODUCER_REGS[self.consumers],
                                   "consumer": atoms.CONSUMER_REGS[self.consumers]},
            "preferred": not self.dynamic and (self.tile_m, self.tile_n, self.stages, self.overlap, self.pingpong)
                         == default_config(self.head_dim, self.causal, cache=getattr(self, "paged", False))
                         and all(getattr(self, k) == v for k, v in
                                 default_schedule(self.head_dim, self.causal, self.varlen,
                                                  persistent_all=not getattr(self, "paged", False)).items()),
            # the key tiles split between the two CTAs of a cluster per query tile (kv_split)
            **({"kv_splits": 2, "cluster": [2, 1]} if self.kv_split else {}),
            # two CTAs on adjacent query tiles, K/V multicast into both (kv_mcast)
            **({"cluster": [2, 1], "kv_multicast": 2} if self.kv_mcast else {}),
            **self.ex2_describe(),
            # dynamic: the runtime's two zeroed int32 words (tile counter, arrival counter)
            **({"workspace": {"form": "tile_counters", "words": TILE_COUNTER_WORDS}} if self.dynamic else {}),
        }

    def signature(self) -> Signature:
        sig = super().signature()
        if not self.dynamic:
            return sig
        args = list(sig.args)
        args.insert(5, TensorArg("tile_counters", "i32", (TILE_COUNTER_WORDS,), (1,), align=4))
        return Signature(tuple(args), sig.divisibility)

    def make_kernel(self):
        k = FlashFwdSm90(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_m=self.tile_m,
            tile_n=self.tile_n, stages=self.stages, causal=self.causal, overlap=self.overlap,
            pingpong=self.pingpong, early_rescale=self.early_rescale, persistent=self.persistent,
            k_first=self.k_first, o_in_q=self.o_in_q, lazy_rescale=self.lazy_rescale,
            const_wg=self.const_wg,
            kv_split=self.kv_split, store_defer=self.store_defer, dynamic=self.dynamic,
            slot_coords=self.slot_coords, o_stmatrix=self.o_stmatrix, diag_half=self.diag_half,
            kv_mcast=self.kv_mcast,
        )
        self.set_ex2(k)
        if self.dynamic:
            return k.packed_dynamic if self.varlen else k.dense_dynamic
        return k.packed if self.varlen else k.dense

    def set_ex2(self, k) -> None:
        """The exponential options onto kernel ``k`` (class defaults: all on MUFU.EX2)."""
        if self.ex2_fma or self.ex2_pairs:
            k.ex2_fma, k.ex2_degree, k.ex2_pairs = self.ex2_fma, self.ex2_degree, self.ex2_pairs


# The default config per problem: (tile_m, tile_n, stages, overlap, pingpong).  H100, bf16, CUDA
# graph replay (notes/attention-sm90.md): B1 H16 S16384 D128 non-causal plain 624 TFLOP/s,
# overlap 642, overlap + ping-pong 641 (cuDNN 658); causal 596 / 602 / 633 (cuDNN 623);
# B2 H16 S4096 D128 causal 444 / 478 / 497.  D64: three consumer warpgroups (192-row tiles, a
# third fewer K/V bytes per FLOP) 369 vs 347 TFLOP/s at B4 H16 S1024, 371 vs 349 (interleaved).
# D64 causal, persistent, interleaved by name: 192 rows 1007 vs 1215 µs at B1 H16 S16384, 602 vs
# 684 at B4 H32 S4096, 173 vs 192 at B4 H32/8 S2048, 177 vs 183 at B8 H16 S2048; 160 vs 149 at
# B32 H32 S512 (short rows: 128 there, which only a tuning table can pick).
#
# D256: 128 x 80 (FA3's tile): per consumer thread O is 64x256 fp32 / 128 threads = 128 registers,
# S 40, P 20 (+ addresses, row statistics) inside the 240 of setmaxnreg; smem Q 64 KB + 2 stages
# of K and V at 40 KB each = 224 KB (+ 2 KB barriers and the DSL's static KB) of 227.  A wider
# key tile needs a third less K/V per stage (no second stage) or more registers than 240.
def default_config(head_dim: int, causal: bool, cache: bool = False) -> tuple[int, int, int, bool, bool]:
    """``cache``: the paged-cache subclass's tile (its producers were built and measured on
    128-row tiles at head_dim 64)."""
    if head_dim == 256:
        # Causal 128x80 with overlap spills 4 LDL/STL since the masked/unmasked loop split
        # (168 registers at launch, the O accumulator alone is 128): 128x64 does not.
        return (128, 64 if causal else 80, 2, True, True)
    if head_dim == 64 and not (causal and cache):
        return (192, 128, 2, True, True)
    return (128, 128, 2, True, True)


# Alternatives per head_dim the tuner (scripts/tune.py attention) times beside the default
# config: (tile_m, tile_n, stages, overlap, pingpong).  Dense problems only; can_implement drops
# what does not fit (registers, smem).
TUNE_CONFIGS = {
    64: [(128, 128, 2, True, True), (192, 128, 2, True, True), (128, 192, 2, True, True)],
    128: [(128, 128, 2, True, True), (128, 160, 2, True, True), (128, 128, 2, True, False)],
    256: [(128, 80, 2, True, True), (128, 64, 2, True, True), (128, 80, 2, True, False),
          (128, 80, 2, False, True)],
}


# The default mainloop/scheduler options per problem (fields of AttentionSm90): H100, bf16,
# interleaved graph replay (notes/attention-sm90.md): persistent vs one tile per CTA
# B4 H16 S1024 D64 42.1 vs 47.1 µs, causal 34.1 vs 39.6; B2 H16 S4096 D128 407.5 vs 436.9,
# causal 250.0 vs 257.8; B4 H32/8 S2048 causal 242.0 vs 279.0; early_rescale on top
# S4096 395.0 vs 405.7, S16384 3229 vs 3323, causal 1570 vs 1663, D64 causal 33.9 vs 32.5 (not
# there); k_first 0-2 % better everywhere.  lazy_rescale (dense head_dim 128), each callable
# replayed back to back at the board's 700 W limit (bench_attention.py --sustained): B1 H16 S16384
# 3343 vs 3432 µs, causal 1783 vs 1840 (H100); B2 H16 S4096 445 vs 453, causal 262 vs 266, S16384
# 3473 vs 3472, causal 1864 vs 1885 (H200); interleaved, the wide grid's head_dim 128 shapes
# 0-6 % faster, none slower.  Dense head_dim 256 (H100, B1 H16 S16384, ncu one launch): 9.29 M
# cycles vs 10.10 M (tensor pipe 89 % vs 82 % busy, 23 % fewer instructions: O's 128 rescale
# multiplies per trip were on the warpgroup's path between its P·V and its next GEMMs);
# back to back at 700 W 6546 vs 6965 µs, causal 3326 vs 3480; B1 H8 S2048 59.0 vs 59.7.
# Lost and removed (their code and numbers: notes/attention-sm90.md): a schedule fence pinning
# the P·V wait below the softmax (twice, the second time at head_dim 256: cycles unchanged), the
# consumer warpgroups taking turns at the exponentials (fp8: 12-25 % more cycles) and a quarter
# of the exponentials from an FMA polynomial.
def default_schedule(head_dim: int, causal: bool, varlen: bool = False,
                     small: bool = False, persistent_all: bool = False) -> dict[str, bool]:
    """``small``: the 64-row tiles of under-filled grids (one tile per CTA: a grid of at most
    132 of them gains nothing from persistence).  ``persistent_all``: the schedule of this
    family's own 16-bit variants, persistent also at head_dim 256 (O leaves through Q's slabs,
    ``AttentionSm90.o_in_q``: its own O slabs do not fit beside the 128x80 tiles' smem, 296 KB)
    and for varlen problems (a virtual grid sized by the longest sequence, ``tile_coords``);
    without it (the kvcache and fp8 subclasses) only dense problems of head_dim <= 128 are."""
    big = not small and (persistent_all or (not varlen and head_dim <= 128))
    # const_wg (head_dim 256 non-causal, dense): the consumer code once per warpgroup, WGMMA
    # descriptors on the uniform datapath: B1 H16 S16384 6133 vs 6436 us with the lazy rescale
    # alone, sustained at the power cap (H100; notes/attention-sm90.md)
    # varlen head_dim 256 (8 packed sequences of 2048, H16, interleaved by name): the lazy rescale
    # and const_wg 748 vs 828 us, causal (lazy rescale) 470 vs 495; head_dim 128 (H200) the lazy
    # rescale 395.7 vs 403.2 us, causal 233.8 vs 236.4.  store_defer (causal, O in its
    # own slabs): B32 H32 S512 head_dim 128 205.5 vs 209.4 us (ncu 331.8 k vs 342.9 k cycles), head_dim
    # 64 158.0 vs 160.3 (192 rows), 147.5 vs 149.0 (128 rows)
    return {"persistent": big, "early_rescale": big and head_dim <= 128 and not (head_dim == 64 and causal),
            "k_first": big,
            "lazy_rescale": big and persistent_all and head_dim >= 128,
            "const_wg": big and persistent_all and head_dim == 256 and not causal,
            "store_defer": big and persistent_all and head_dim <= 128 and causal and not varlen,
            # kv_mcast (head_dim 256 non-causal, dense): a cluster of two CTAs on adjacent query tiles,
            # K/V halves multicast into both (half the L2->SM bytes): H100, by name, µs vs the static
            # build, sustained at the power cap / burst: B4 H32 S4096 3261 / 3289 vs 3349 / 3366, B1
            # H16 S16384 6364 / 6086 vs 6344 / 6191 (notes/attention-sm90.md)
            "kv_mcast": big and persistent_all and head_dim == 256 and not causal and not varlen}


# Ablations of the default configs (tier "full"): each mainloop/scheduler option on and off, so
# that one bench process times them side by side (scripts/bench_attention.py --candidates).
_ABLATIONS = tuple(
    {"persistent": ps, "early_rescale": er, "k_first": False, "const_wg": False, "store_defer": False}
    for ps in (False, True) for er in (False, True)
)


@register("attention")
def enumerate_attention(target: Target, tier: str) -> list[AttentionSm90]:
    if target.family != "sm90":
        return []

    def make(dtype, d, causal, tile_m=None, tile_n=None, stages=None, overlap=None,
             pingpong=None, **schedule):
        tm, tn, s, ov, pp = default_config(d, causal)
        ov = ov if overlap is None else overlap
        # (the lazy rescale lives in the overlapped mainloop only; the CTA pair's K/V multicast
        # only where asked: the ablations, twins and varlen builds below derive from these)
        return AttentionSm90(
            target=target.name, dtype=dtype, head_dim=d, causal=causal, tile_m=tile_m or tm,
            tile_n=tile_n or tn, stages=stages or s, overlap=ov, pingpong=pp if pingpong is None else pingpong,
            **{**default_schedule(d, causal, persistent_all=True), "kv_mcast": False,
               **({} if ov else {"lazy_rescale": False}), **schedule})

    if tier == "test":
        # The preferred tile and its 64-row twin: the loader's under-filled-grid rule and a tuning
        # table (runtime/attention.py select) have a choice in the test bundle.
        # (and the preferred tile's dynamic twin with the producer's tile coordinates, which the
        # selection takes for full grids)
        return [make("bf16", 128, True),
                make("bf16", 128, True, tile_m=64, pingpong=False, **default_schedule(128, True, small=True)),
                make("bf16", 128, True, dynamic=True, slot_coords=True)]
    problems = [(dt, d, c) for dt in DTYPES for d in HEAD_DIMS for c in (False, True)]
    # (the preferred builds: head_dim 256 non-causal with the K/V multicast pair)
    out = [make(*p, kv_mcast=default_schedule(*p[1:], persistent_all=True)["kv_mcast"]) for p in problems]
    # Packed variable-length batches (cu_seqlens): the dense problems' tiles and schedule.
    out += [dataclasses.replace(make(*p), varlen=True, **{k: default_schedule(*p[1:], varlen=True, persistent_all=True)[k]
                                                          for k in ("lazy_rescale", "const_wg", "store_defer")})
            for p in problems]
    # One consumer warpgroup (64-row tiles) for grids the default tile leaves under-filled (the
    # loader's rule, as for the sm80 family): B1 H8 S512 D64 non-causal ran 8.1 µs on 32 CTAs of
    # 128 rows vs 7.3 for the sm_90 build's 64 CTAs of 64 rows, 6.0 on 64-row sm_90a CTAs.
    # (A grid of at most 132 64-row tiles: persistent CTAs would change nothing.)
    out += [make(*p, tile_m=64, pingpong=False, **default_schedule(*p[1:], small=True))
            for p in problems]
    # head_dim 64 causal: the 64-row tile's kv_split twin (a cluster of two CTAs per query tile),
    # which the selection takes for causal grids of at most one CTA pair per two SMs with four key
    # tiles or more: B1 H8 S512 D64 causal 5.74 us vs 5.97 (H100, graphs of 20 calls); not causal
    # 5.78 vs 5.71 and two key tiles 4.80 vs 4.16 (tier full only).
    out += [make(dt, 64, True, tile_m=64, pingpong=False, kv_split=True, **default_schedule(64, True, small=True))
            for dt in DTYPES]
    # head_dim 64 causal, dense: the 128-row tile beside the preferred 192 rows, which the selection
    # takes for keys of at most four key tiles (fx_select.c attn_choose): B32 H32 S512 147.5 vs
    # 158.0 us (H100, interleaved by name; cuDNN 128.5)
    out += [make(dt, 64, True, tile_m=128) for dt in DTYPES]
    # head_dim 256 causal, dense: one tile per CTA beside the preferred persistent CTAs (whose O
    # leaves through Q's slabs, so each tile's Q waits for the last O store), which the selection
    # takes for at most 512 keys: B32 H32 S512 400.1 vs 424.5 us (H100, interleaved by name)
    out += [dataclasses.replace(make(dt, 256, True), persistent=False, k_first=False) for dt in DTYPES]
    # causal, dense, head_dim 64 on 128 and 192 rows, 128 and 256 (bf16 and fp16): the persistent builds'
    # dynamic twins (each next tile from a global counter), which the selection takes in their place
    # (fx_select.c attn_choose).  H100, interleaved by name, two calls: B32 H32 S512 D64 140.2 / 142.6
    # vs 147.8 / 148.9 us, D128 199.4 / 198.2 vs 201.4 / 205.9; D128 B8 H16 S2048 235.3 / 230.6 vs
    # 239.5 / 234.4, B4 H32 S4096 860.3 / 844.9 vs 872.0 / 856.3, B1 H16 S16384 1536.7 / 1518.1 vs
    # 1631.7 / 1536.3; the 192-row D64 build: B8 H16 S2048 166.5 / 166.0 vs 179.8 / 177.3, B4 H32
    # S4096 565.2 vs 569.2, B1 H16 S16384 1052.9 vs 1044.8.  Launches that may run at the same time
    # count in different words (runtime/counters.py: per stream, per graph capture; fx_attention:
    # the caller's workspace).  Each with the tile coordinates handed over by the producer warp
    # (slot_coords: no divisions per tile in the consumers; H100, B32 H32 S512 D64 137.9 vs 140.7 us,
    # B8 H16 S2048 D64 (192 rows) 163.4 vs 167.5, D128 197.4 vs 197.9 and 231.3 vs 232.2), the
    # diagonal tile's masked upper half skipped and O into its smem slab by stmatrix (diag_half,
    # o_stmatrix; H200, B32 H32 S512 D64 130.6 vs 133.5 us, cuDNN 129.7; B8 H16 S2048 D64 (192 rows)
    # 161.0 vs 164.8; B4 H32 S4096 561.7 vs 568.8), the twin the selection tries first.  Head_dim
    # 256 (H100, by name, vs the static persistent build): B4 H32 S4096 1654.4 vs 1803.6 us, B1 H16
    # S16384 3251.8 vs 3267.3, B8 H16 S2048 452.0 vs 454.1, B4 H32/8 S2048 431.3 vs 430.6.
    # Varlen, head_dim 64 and 128 (the producer passes over the virtual grid's empty slots; H200,
    # 8 packed sequences of 2048, H16, by name): 160.7 vs 182.0 us (cuDNN, dense, 181.1), head_dim
    # 128 227.0 vs 233.8 (bf16 in this tier, fp16 in full); head_dim 256 445.6 vs 446.3 (not built).
    out += [dataclasses.replace(v, dynamic=True, slot_coords=True, diag_half=True, o_stmatrix=True) for v in out
            if v.causal and v.persistent
            and (not v.varlen or (v.head_dim <= 128 and v.dtype == "bf16"))
            and (v.head_dim, v.tile_m) in ((64, 128), (64, 192), (128, 128), (256, 128))]
    # not causal, bf16, head_dim 128 (dense and varlen): the persistent builds' dynamic twins with the
    # producer's coordinates and the stmatrix epilogue (dense: also the deferred O-store wait), which
    # the selection takes in their place (fx_select.c attn_choose).  H100, interleaved by name, two
    # calls (us, twin vs the static build): B8 H16 S2048 405.2 / 385.6 vs 412.9 / 391.4, B32 H32 S512
    # 235.1 vs 241.8, B4 H32 S4096 1641.2 / 1522.4 vs 1721.8 / 1563.5; varlen (8 x 2048) 398.8 / 393.5
    # vs 403.0 / 397.3.  Head_dim 256's twin (B8 H16 S2048 749.6 / 732.1 vs 756.9 / 739.3, B32 H32
    # S512 484.6 vs 491.8, S4096 / S16384 within 0.2 %) is in the full tier (its cubin alone is 76 KB);
    # head_dim 64's (192 rows: B32 H32 S512 171.4 vs 173.2 but B8 H16 S2048 271.5 vs 264.8, B1 H16
    # S16384 2157.5 vs 2092.3) too, and the selection takes it nowhere.
    out += [dataclasses.replace(v, dynamic=True, slot_coords=True, o_stmatrix=True, store_defer=not v.varlen)
            for v in out if not v.causal and v.persistent and v.dtype == "bf16" and not v.dynamic
            and (v.head_dim, v.tile_m) == (128, 128)]
    if tier == "full":
        # head_dim 256 non-causal, dense: the preferred build without the K/V multicast pair (for
        # --candidates; the dynamic twins below are its)
        out += [make(dt, 256, False) for dt in DTYPES]
        # The tuner's alternatives (dense): scripts/tune.py attention picks among them per shape bucket.
        out += [make(dt, d, c, tile_m=tm, tile_n=tn, stages=s, overlap=ov, pingpong=pp, const_wg=False)
                for dt, d, c in problems for tm, tn, s, ov, pp in TUNE_CONFIGS[d]]
        out += [dataclasses.replace(make(*p), **a) for p in problems for a in _ABLATIONS]
        # the dense head_dim 128 and 256 defaults without the lazy rescale; the other persistent
        # bf16 defaults (head_dim 64, varlen) with it, for --candidates
        out += [dataclasses.replace(make(*p), lazy_rescale=False, const_wg=False) for p in problems if p[1] in (128, 256)]
        # head_dim 256 non-causal without the per-warpgroup consumer code (the default before it;
        # causal, with its second loop, keeps 293 R2UR with it: not built)
        out += [dataclasses.replace(make(*p), const_wg=False) for p in problems if p[1] == 256 and not p[2]]
        out += [dataclasses.replace(v, lazy_rescale=True) for v in out[:len(problems) * 2]
                if v.dtype == "bf16" and v.persistent and not v.lazy_rescale]
        # D64: the other query tile (128 <-> 192 rows) and 3 stages under the default schedule
        out += [make(dt, 64, c, tile_m=320 - make(dt, 64, c).tile_m) for dt, d, c in problems if d == 64]
        out += [make(dt, 64, c, stages=3) for dt, d, c in problems if d == 64]
        # the non-causal kv_split twins of D64's 64-row tiles (for --candidates)
        out += [dataclasses.replace(v, kv_split=True) for v in out
                if v.head_dim == 64 and v.tile_m == 64 and not v.varlen and not v.kv_split]
        # the dense persistent defaults (and the other D64 tile) with the deferred O-store wait;
        # head_dim 256 varlen with the per-warpgroup consumer code (with and without the lazy
        # rescale); D64 causal varlen on the 128-row tile
        out += [dataclasses.replace(v, store_defer=True) for v in out
                if v.persistent and not v.varlen and not v.o_in_q and not v.store_defer
                and (v.tile_m, v.tile_n, v.stages) in ((128, 128, 2), (192, 128, 2))
                and v.early_rescale == default_schedule(v.head_dim, v.causal)["early_rescale"]
                and v.lazy_rescale == (v.head_dim == 128) and v.k_first]
        out += [dataclasses.replace(make(dt, 256, c), varlen=True, const_wg=cw and not c, lazy_rescale=lz)
                for dt in DTYPES for c in (False, True) for lz, cw in ((False, False), (True, False), (False, True))]
        out += [dataclasses.replace(make(dt, 64, True, tile_m=128), varlen=True, store_defer=False) for dt in DTYPES]
        # head_dim 64 causal, 128 rows: 3 and 4 K/V stages (the next tile's first keys in flight
        # earlier); head_dim 128 causal with 3 stages (O through Q's slabs then)
        out += [make(dt, 64, True, tile_m=128, stages=s) for dt in DTYPES for s in (3, 4)]
        out += [make(dt, 128, True, stages=3) for dt in DTYPES]
        # the dense persistent bf16 defaults with K/V multicast over a CTA pair (kv_mcast)
        # (and fp16 at head_dim 128 and 256, not causal)
        out += [dataclasses.replace(make(dt, d, c), kv_mcast=True) for dt in DTYPES for d in HEAD_DIMS
                for c in (False, True) if (dt == "bf16" or (d >= 128 and not c))
                and not default_schedule(d, c, persistent_all=True)["kv_mcast"]]  # (not the preferred ones again)
        # (head_dim 128 not causal: 3 K/V stages, O through Q's slabs, more slack between the pair)
        out += [dataclasses.replace(make("bf16", 128, False), kv_mcast=True, stages=3)]
        # every variant with store_defer also without it (the defaults before it)
        out += [dataclasses.replace(v, store_defer=False) for v in out if v.store_defer and not v.dynamic]
        # varlen with one tile per CTA (the grid sized by the longest sequence)
        out += [dataclasses.replace(make(*p), varlen=True, persistent=False, early_rescale=False, k_first=False,
                                    lazy_rescale=False, const_wg=False, store_defer=False)
                for p in problems]
        # the dense persistent bf16 defaults (causal, and head_dim 128 not causal; head_dim 64
        # causal also on 128 rows) with the dynamic tile counter (for --candidates; some also in
        # the default tier)
        out += [dataclasses.replace(v, dynamic=True) for v in out[:len(problems)] + [make("bf16", 64, True, tile_m=128)]
                if v.dtype == "bf16" and v.persistent and not v.varlen and (v.causal or v.head_dim == 128)]
        # varlen head_dim 128 without the lazy rescale (the default before it)
        out += [dataclasses.replace(v, lazy_rescale=False) for v in out
                if v.varlen and v.persistent and v.head_dim == 128 and v.lazy_rescale and not v.dynamic]
        # varlen with the dynamic tile counter: the persistent bf16 causal builds (also the D64 128-row
        # tile) and the non-causal D128 one, each with its default mainloop (the lines below add their
        # twins with the producer's coordinates, the diagonal half, the stmatrix epilogue); the fp16
        # twins of the default tier's bf16 ones
        out += [dataclasses.replace(v, dynamic=True) for v in out
                if v.varlen and v.persistent and v.dtype == "bf16" and not v.dynamic and (v.causal or v.head_dim == 128)
                and v.lazy_rescale == default_schedule(v.head_dim, v.causal, True, persistent_all=True)["lazy_rescale"]]
        out += [dataclasses.replace(v, dtype="f16") for v in out if v.varlen and v.dynamic and v.dtype == "bf16"
                and v.slot_coords]
        # the default tier's dynamic twins without the producer's tile coordinates, the diagonal
        # half and the stmatrix epilogue (by name)
        out += [dataclasses.replace(v, slot_coords=False, diag_half=False, o_stmatrix=False) for v in out if v.slot_coords]
        # every dynamic variant with the tile coordinates passed by the producer warp
        out += [dataclasses.replace(v, slot_coords=True) for v in out if v.dynamic]
        # the causal ones also with O into smem by stmatrix, or with the diagonal tile's upper half
        # skipped
        out += [dataclasses.replace(v, **kw) for v in out
                if v.slot_coords and v.causal and not (v.diag_half or v.o_stmatrix)
                for kw in ({"o_stmatrix": True}, {"diag_half": True}, {"o_stmatrix": True, "diag_half": True})]
        # the non-causal bf16 persistent builds (also head_dim 64 on 128 rows) with the dynamic tile
        # counter, the producer's coordinates and the stmatrix epilogue, each step alone (head_dim
        # 128 dense also with the deferred O-store wait), for --candidates
        nc = [v for v in out[:len(problems) * 2] + [make("bf16", 64, False, tile_m=128)]
              if v.dtype == "bf16" and not v.causal and v.persistent and (not v.varlen or v.head_dim == 128)]
        out += [dataclasses.replace(v, store_defer=sd, dynamic=True, kv_mcast=False, **kw) for v in nc
                for sd in ((False, True) if v.head_dim == 128 and not v.varlen else (False,))
                for kw in ({}, {"slot_coords": True}, {"slot_coords": True, "o_stmatrix": True})]
    out = list({v.name: v for v in out}.values())
    return [v for v in out if v.can_implement() is None]


# ------------------------------------------------------------------------------------------------
# Attention over a paged KV cache (contract.signature_kvcache): chunked prefill and speculative
# verification against a cached prefix, K/V by TMA one page box at a time
# ------------------------------------------------------------------------------------------------
def register_split(consumers: int, gather: bool = False) -> tuple[int, int]:
    """setmaxnreg budgets (producer, consumer) per thread.  The cp.async gather producer computes
    row addresses in all 128 threads: 24 registers spilled, so it takes 40 (2 consumers: 40 +
    2·232 = 504 of 512 per thread slot).  So do the TMA producers issuing 16- and 32-row page
    boxes of head_dim 256 (each box row is four 128-byte swizzle boxes: 10-20 spilled
    instructions at 24 registers); callers pass ``gather`` for them too."""
    if gather and consumers == 2:
        return GATHER_PRODUCER_REGS, GATHER_CONSUMER_REGS
    return atoms.PRODUCER_REGS[consumers], atoms.CONSUMER_REGS[consumers]


GATHER_PRODUCER_REGS, GATHER_CONSUMER_REGS = 40, 232
DEEP_FP8_PRODUCER_REGS, DEEP_FP8_CONSUMER_REGS = 56, 224


# Rows of one K/V TMA box: the smallest page size this family reads by TMA (smaller pages go to
# the sm80 family's cp.async row gathers).  Pages of 64, 128 and 256 rows are whole boxes.
PAGE_BOX = 64


@dataclass(frozen=True, kw_only=True)
class AttentionKvcacheSm90(AttentionSm90):
    """The sm90a kernel over a paged KV cache: per-sequence key counts (cache_seqlens), pages of
    any size that is a multiple of ``page_box`` (the page size is a launch-time symbol, manifest
    ``page_sizes``), bottom-right causal or none, dense or packed q; switches for the sliding
    window, softcap and sinks; fp8 e4m3 caches (head_dim 128) on the cp.async gathers, converted
    into the dtype rings by the producer threads (``produce_gather_fp8``).  ``persistent`` (the
    16-bit page-box builds): 132 CTAs walk the query tiles of the launch grid (``kv_tiles``)."""

    op: ClassVar[str] = "attention_kvcache"
    family: ClassVar[str] = "sm90"

    kv_dtype: str = field(default="bf16", metadata={"tag": "c"})
    page_box: int = field(default=PAGE_BOX, metadata={"tag": "pb"})
    # the contract's switches: sliding window, softcap (tanh), attention sinks
    local: bool = field(default=False, metadata={"tag": "win"})
    softcap: bool = field(default=False, metadata={"tag": "cap"})
    sinks: bool = field(default=False, metadata={"tag": "sink"})
    # fp8 caches: two e4m3 staging tiles each for K and V (two tiles' copies in flight), not one.
    # H100: within 3 % of one tile (notes/attention-kvcache.md): the conversion, not the copies'
    # latency, bounds the fp8 producer; "full" only.
    deep_staging: bool = field(default=False, metadata={"tag": "st2"})

    # a paged cache (dense caches: the sm80 family)
    paged: ClassVar[bool] = True

    def sass_requirements(self) -> tuple[str, ...]:
        d = r"\.BF16" if self.dtype == "bf16" else ""
        store = r"\bSTG\.E\.128\b" if self.varlen else r"\bUTMASTG\.4D\b"
        return (
            rf"\bHGMMA\.64x{self.tile_n}x16\.F32{d} R\d+, gdesc\[",
            rf"\bHGMMA\.64x{self.head_dim}x16\.F32{d} R\d+, R\d+, gdesc\[",
            # Q by TMA ((tokens, D, heads) boxes for packed q); K/V by TMA page boxes or cp.async
            r"\bUTMALDG\.3D\b" if self.varlen else r"\bUTMALDG\.4D\b",
            r"\bUTMALDG\.4D\b" if self.page_box else r"\bLDGSTS\.E\.BYPASS\.128\b",
            store, r"\bSYNCS\.", r"\bUSETMAXREG\.", r"\bMUFU\.EX2\b",
        )

    @property
    def kv_fp8(self) -> bool:
        return self.kv_dtype == "e4m3"

    def smem_bytes(self) -> int:
        # fp8 caches: one K and one V staging tile of e4m3 beside the dtype rings
        staging = (2 * (2 if self.deep_staging else 1) * _round_up(self.tile_n * self.head_dim, _SMEM_ALIGN)
                   if self.kv_fp8 else 0)
        return super().smem_bytes() + staging

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why:
            return why
        if self.kv_dtype not in (self.dtype, "e4m3"):
            return f"the K/V cache dtype must be {self.dtype} or e4m3"
        if self.kv_fp8:
            if self.page_box:
                return "fp8 caches are read by the cp.async gathers (page_box 0)"
            if self.head_dim != 128:
                # (64: rows of 64 bytes, half a copy pass; 256: the producer's 40 registers spill
                # 22 instructions over two 128-byte copy columns)
                return "fp8 caches are built for head_dim 128 (one 16-byte copy per 16 elements, 8 per row)"
            if self.softcap:
                return "fp8 caches are built without the softcap switch (k_descale folds into the score scale)"
        elif self.deep_staging:
            return "deep_staging is for fp8 caches"
        if self.k_first:
            return "no k_first (K before V per tile): the paged producers"
        if self.persistent and (not self.page_box or self.kv_fp8 or type(self).make_kernel
                                is not AttentionKvcacheSm90.make_kernel):
            return "persistent is built on the TMA page boxes of 16-bit caches (this class's kernels)"
        if self.lazy_rescale and (not self.persistent or self.local or self.softcap or self.sinks):
            return "lazy_rescale is built on the persistent page-box builds without switches"
        if self.page_box and (self.page_box not in (16, 32, 64, 128) or self.tile_n % self.page_box):
            return "page_box must be 0 (cp.async row gathers), 16, 32, 64 or 128 and divide tile_n"
        if self.page_box and self.page_box < 32 and self.head_dim > 128:
            # (16-row boxes of 512-byte rows: the producer spills 70-100 instructions at 40
            # registers; pages of 16 rows take the gathers)
            return "head_dim 256 takes page boxes of 32 rows or more (or the cp.async gathers)"
        if self.local and not self.causal:
            return "the window switch is built on causal variants"
        if not self.page_box and (self.tile_n > 128 or self.tile_n % 16):
            # (one table read per producer thread covers a tile: 4 warps x 32 lanes >= tile_n rows)
            return "the cp.async gather takes tiles of at most 128 keys, a multiple of 16"
        return None

    def signature(self) -> Signature:
        return contract.signature_kvcache(self.dtype, self.kv_dtype, self.head_dim, True, None,
                                          varlen_q=self.varlen)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(contract.manifest_fields_kvcache(
            self.dtype, self.kv_dtype, self.head_dim, paged=True, page_size=None,
            causal=self.causal, local=self.local, softcap=self.softcap, sinks=self.sinks,
            varlen_q=self.varlen))
        d["page_sizes"] = [p for p in contract.PAGE_SIZES if p >= self.page_box]
        d["page_box"] = self.page_box
        d["kv_loads"] = "tma" if self.page_box else "cp.async"
        producer, consumer = register_split(self.consumers, gather=self.wide_producer)
        if self.deep_staging and self.consumers == 2:
            producer, consumer = DEEP_FP8_PRODUCER_REGS, DEEP_FP8_CONSUMER_REGS
        d["registers_per_role"] = {"producer": producer, "consumer": consumer}
        if self.persistent_preferred:
            # 16-bit caches by TMA page boxes: the persistent build of the default tile is the
            # preferred one (selection: fewest page sizes, then preferred)
            tile = (self.tile_m, self.tile_n, self.stages, self.overlap, self.pingpong)
            sched = box_schedule(self.head_dim, self.varlen)
            d["preferred"] = (tile == default_config(self.head_dim, True, cache=True)
                              and all(getattr(self, k) == v for k, v in sched.items()))
        return d

    @property
    def persistent_preferred(self) -> bool:
        """A 16-bit build over TMA page boxes, this class's kernels: persistent CTAs are its
        preferred schedule (H100, chunked prefill beside one tile per CTA: notes/attention-kvcache.md)."""
        return (bool(self.page_box) and not self.kv_fp8 and self.dtype in ("bf16", "f16")
                and type(self).make_kernel is AttentionKvcacheSm90.make_kernel)

    @property
    def epilogue_options_built(self) -> bool:
        """The stmatrix epilogue and the diagonal tile's half softmax: on the 16-bit page-box
        builds without switches (the consumer code they share with the dense kernel)."""
        return self.persistent_preferred and not (self.local or self.softcap or self.sinks)

    @property
    def wide_producer(self) -> bool:
        """The producer warpgroup takes the gathers' 40 registers (``register_split``); so do the
        persistent builds' producer warps issuing several boxes a tile or boxes of head_dim 256
        (the tile loop's coordinates beside them: 10-36 spilled instructions at 24 registers)."""
        return (not self.page_box or (self.head_dim > 128 and self.page_box < self.tile_n)
                or (self.persistent and (self.page_box < self.tile_n or self.head_dim > 128)))

    def make_kernel(self):
        k = FlashFwdSm90(
            dtype=self.cutlass_dtype, head_dim=self.head_dim, tile_m=self.tile_m,
            tile_n=self.tile_n, stages=self.stages, causal=self.causal, overlap=self.overlap,
            pingpong=self.pingpong, early_rescale=self.early_rescale, persistent=self.persistent,
            o_in_q=self.o_in_q, lazy_rescale=self.lazy_rescale, k_first=False, page_box=self.page_box,
            o_stmatrix=self.o_stmatrix, diag_half=self.diag_half, gather=not self.page_box, local=self.local,
            softcap=self.softcap, sinks=self.sinks, wide_producer=self.wide_producer,
            kv_dtype=cutlass_dtype(self.kv_dtype) if self.kv_fp8 else None,
            fp8_stages=2 if self.deep_staging else 1,
        )
        if self.kv_fp8:  # (the contract's k_descale and v_descale in place of kv_descale)
            return k.kvcache_packed_f8 if self.varlen else k.kvcache_f8
        return k.kvcache_packed if self.varlen else k.kvcache


def box_schedule(head_dim: int, varlen: bool) -> dict[str, bool]:
    """The schedule of the 16-bit page-box builds (``AttentionKvcacheSm90.persistent_preferred``):
    persistent CTAs and, at head_dim 128, the dense varlen default's consumer options: the early
    and the lazy rescale, the diagonal tile's half softmax, O into smem by stmatrix; at head_dim
    256 the lazy rescale (and for dense q the other two).  H100, chunked prefill, beside the
    persistent builds without them (with the producer's shift addressing; notes/attention-kvcache.md):
    16-row boxes 6.5-7.4 % faster (geomean), 64-row boxes 3.7-4.0 %, head_dim 256 10-12 %; the early
    rescale alone gains nothing, the lazy one without it 1-4 % less."""
    sched = {**default_schedule(head_dim, True, varlen=True), "persistent": True,
             "diag_half": False, "o_stmatrix": False}
    if head_dim == 128:
        sched.update(early_rescale=True, lazy_rescale=True, diag_half=True, o_stmatrix=True)
    elif head_dim == 256:
        sched.update(lazy_rescale=True, diag_half=not varlen, o_stmatrix=not varlen)
    return sched


@register("attention_kvcache")
def enumerate_attention_kvcache(target: Target, tier: str) -> list[AttentionKvcacheSm90]:
    if target.family != "sm90" or target.name != "sm_90a":
        return []

    def make(dtype, d, varlen, page_box=PAGE_BOX, switches=False, causal=True, kv_dtype=None, deep=False,
             stages=None, persistent=False, boxes=False):
        # the causal tiles for both masks (head_dim 256: 64-key tiles, one 64-row box each);
        # boxes: the page-box builds' schedule (box_schedule)
        tm, tn, s, ov, pp = default_config(d, True, cache=True)
        s = stages or s
        sched = (box_schedule(d, varlen) if boxes else
                 {**default_schedule(d, True, varlen=True), **({"persistent": True} if persistent else {})})
        return AttentionKvcacheSm90(
            target=target.name, dtype=dtype, kv_dtype=kv_dtype or dtype, head_dim=d, causal=causal, tile_m=tm,
            tile_n=tn, stages=s, overlap=ov, pingpong=pp, varlen=varlen, page_box=page_box,
            local=switches, softcap=switches, sinks=switches, deep_staging=deep, **sched)

    if tier == "test":
        out = [make("bf16", 128, False, boxes=True), make("bf16", 128, True, boxes=True),
               make("bf16", 128, False, page_box=0), make("f16", 64, True, page_box=0, switches=True),
               # head_dim 256 (TMA boxes; the gathers, packed q and no mask: "full")
               make("bf16", 256, False, boxes=True),
               # fp8 e4m3 caches: the gathers converting into the dtype rings
               make("bf16", 128, False, page_box=0, kv_dtype="e4m3")]
        return [v for v in out if v.can_implement() is None]
    if tier == "default":
        # bf16, head_dim 128, dense and packed q: TMA page boxes of 64 rows (pages of 64-256), the
        # cp.async gathers (any page size) and the window/softcap/sink build on the gathers; for
        # packed q (a server's chunked prefill) also boxes of 16 rows (pages of 16 and 32: 3-6 %
        # over the gathers on an H100).  Other dtypes, head_dims and page boxes: "full".
        # The page-box builds are persistent (132 CTAs walking the query tiles, longest rows
        # first; H100 and H200, beside one tile per CTA: 64-row boxes 3-7 % faster, 0.90-1.00x
        # our dense varlen path; 16-row boxes -6 to +9 %, +2.5 % on average, the dense-q ones in two
        # stages instead of three; head_dim 256 -1 to +13 %; notes/attention-kvcache.md), on the
        # page-box schedule (box_schedule: the lazy rescale and at head_dim 128 the dense varlen
        # default's other consumer options; H100 4-7 % at head_dim 128, 10-12 % at 256).
        out = [make("bf16", 128, vl, page_box=pb, boxes=bool(pb)) for vl in (False, True)
               for pb in (PAGE_BOX, 0)]
        out += [make("bf16", 128, True, page_box=16, boxes=True)]
        # dense q over pages of 16 and 32: 16-row boxes (the three-stage one-tile-per-CTA build,
        # 5-13 % over the gathers on an H100, is in "full")
        out += [make("bf16", 128, False, page_box=16, boxes=True)]
        out += [make("bf16", 128, vl, page_box=0, switches=True) for vl in (False, True)]
        # head_dim 256 (Gemma 2/3 layers): 64-row boxes (pages of 64-256) and the gathers (any
        # page size), dense and packed q, and the switch build (window/softcap/sinks) for packed q
        out += [make("bf16", 256, vl, page_box=pb, boxes=bool(pb)) for vl in (False, True)
                for pb in (PAGE_BOX, 0)]
        out += [make("bf16", 256, True, page_box=0, switches=True)]
        # fp8 e4m3 caches under bf16 q, head_dim 128: the converting gathers, dense and packed q
        out += [make("bf16", 128, vl, page_box=0, kv_dtype="e4m3") for vl in (False, True)]
    else:
        out = [make(dt, d, vl, page_box=pb, switches=sw, causal=c) for dt in DTYPES for d in HEAD_DIMS
               for vl in (False, True) for pb in (PAGE_BOX, 32, 16, 0) for sw in (False, True)
               for c in (True, False) if (not sw or pb in (16, 0)) and (c or not sw)]
        out += [make(dt, d, vl, page_box=0, causal=c, kv_dtype="e4m3", deep=dp) for dt in DTYPES for d in HEAD_DIMS
                for vl in (False, True) for c in (True, False) for dp in (False, True)]
        # persistent CTAs over the 16-bit page-box builds without switches (and the three-stage
        # dense-q 16-row boxes): the tile loop of ``kv_tiles``
        out += [dataclasses.replace(v, persistent=True) for v in out
                if v.page_box and not v.kv_fp8 and not v.local and v.dtype == "bf16" and v.causal]
        out += [make("bf16", 128, False, page_box=16, stages=3, persistent=ps) for ps in (False, True)]
        # the dense varlen defaults' consumer options on the persistent builds one by one: the
        # early rescale (head_dim 128) and the lazy rescale (head_dim 256)
        ps = [v for v in out if v.persistent and v.stages == 2 and not v.local and v.page_box in (16, PAGE_BOX)]
        out += [dataclasses.replace(v, early_rescale=True) if v.head_dim == 128 else
                dataclasses.replace(v, lazy_rescale=True) for v in ps if v.head_dim in (128, 256)]
        # and the dense varlen default's other options: head_dim 128 with both rescales, then
        # also the diagonal tile's half softmax and the stmatrix epilogue (head_dim 256 on the lazy one)
        out += [dataclasses.replace(v, early_rescale=True, lazy_rescale=True, **kw) for v in ps
                if v.head_dim == 128 for kw in ({}, {"diag_half": True, "o_stmatrix": True})]
        out += [dataclasses.replace(v, lazy_rescale=True, diag_half=True, o_stmatrix=True) for v in ps
                if v.head_dim in (128, 256)]
        # the 32-row boxes (pages of 32) on the page-box schedule too
        out += [dataclasses.replace(v, **box_schedule(v.head_dim, v.varlen)) for v in out
                if v.persistent and v.page_box == 32 and v.head_dim in (128, 256) and v.dtype == "bf16"]
    return [v for v in out if v.can_implement() is None]


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class FlashFwdSm90(layout.TmaViewsKernel):
    """Host side: ``dense`` builds the smem layouts, TMA atoms and tiled MMAs and launches
    ``kernel``; device side: ``kernel``, ``produce``, ``consume`` and their helpers."""

    # the key tiles' exponentials (AttentionSm90.ex2_fma / ex2_pairs; set after construction)
    ex2_fma = 0
    ex2_degree = 3
    ex2_pairs = False

    def __init__(self, *, dtype, head_dim: int, tile_m: int, tile_n: int, stages: int,
                 causal: bool, overlap: bool, pingpong: bool, early_rescale: bool = False,
                 persistent: bool = False, k_first: bool = False, page_box: int = 0,
                 gather: bool = False, local: bool = False, softcap: bool = False,
                 sinks: bool = False, wide_producer: bool = False, kv_dtype=None, fp8_stages: int = 1,
                 o_in_q: bool = False, lazy_rescale: bool = False, const_wg: bool = False,
                 kv_split: bool = False, store_defer: bool = False, dynamic: bool = False,
                 slot_coords: bool = False, o_stmatrix: bool = False, diag_half: bool = False,
                 kv_mcast: bool = False):
        super().__init__(dtype=dtype, head_dim=head_dim, causal=causal, local=local)
        # persistent, dense: a cluster of two CTAs on adjacent query tiles, K/V halves multicast
        # into both (AttentionSm90.kv_mcast)
        self.kv_mcast = persistent and kv_mcast
        # persistent: the next tile from a global counter (AttentionSm90.dynamic)
        self.dynamic = persistent and dynamic
        # dynamic: each tile's coordinates pass through the slot with its index (``take_tile``)
        self.slot_coords = self.dynamic and slot_coords
        # O into its smem slab by stmatrix (AttentionSm90.o_stmatrix)
        self.o_stmatrix = o_stmatrix
        # causal: the diagonal key tile's upper half skipped where a warpgroup sees none of it
        self.diag_half = diag_half
        # int32 words of the tile slots: two slots of the index (and the coordinates)
        self.slot_words = (8 if self.slot_coords else 2) if self.dynamic else 0
        # persistent, O's own slabs: the O store's read of its slab waited for before the next
        # tile's O is written there (AttentionSm90.store_defer)
        self.store_defer = store_defer
        # persistent: the consumer code once per consumer warpgroup (``consumer_tiles``)
        self.const_wg = const_wg
        # a cluster of two CTAs per 64-row query tile, each on half of its key tiles, merged in
        # rank 0 (AttentionSm90.kv_split)
        self.kv_split = kv_split
        # (with overlap) the mainloop's softmax.online_softmax_lazy; O rescaled by a warp only
        # when its reference max moved
        self.lazy_rescale = lazy_rescale
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.stages = stages
        self.overlap = overlap
        self.pingpong = pingpong
        self.early_rescale = early_rescale
        self.persistent = persistent
        self.k_first = k_first
        # persistent: O leaves through Q's slabs (no smem of its own); the producer loads the next
        # tile's Q once O's TMA store has read them
        self.o_in_q = persistent and o_in_q
        # KV cache (paged): K/V tiles arrive as tile_n / page_box TMA boxes of page_box rows, each
        # from the page the block table names; 0: the plain dense/varlen kernel.
        self.page_box = page_box
        self.box_shift = max(page_box, 1).bit_length() - 1  # log2(page_box): boxes are 16-128 rows
        # KV cache (paged, pages of any size): the producer warpgroup's 128 threads gather K/V
        # rows by cp.async, each row from its own page (``produce_gather``).
        self.gather = gather
        # KV cache switches: tanh softcap of the scores, a sink logit per q head (the window is
        # ``mask.local``)
        self.has_softcap = softcap
        self.has_sinks = sinks
        # KV cache of fp8 e4m3 (with ``gather``): the producer warpgroup's cp.async copies land in
        # e4m3 staging tiles, each thread converts the rows it copied into the dtype rings
        # (``produce_gather_fp8``); k_descale folds into the score scale, v_descale into O.
        self.kv_fp8 = kv_dtype is not None
        self.fp8_stages = fp8_stages  # e4m3 staging tiles per K and V (tiles in flight)
        self.kv_dtype = kv_dtype if kv_dtype is not None else dtype
        self.consumers = tile_m // WG_ROWS
        self.cta_rows = tile_m
        # O's element type (the fp8 subclass writes bf16) and whether O has its own smem slabs
        # (persistent: the next tile's Q lands while O leaves; another O type: Q's slab differs)
        self.out_dtype = dtype
        # V tiles K-major in smem ((D, keys) with keys contiguous: fp8 WGMMA's B operand)
        self.v_k_major = False
        # V arrives (keys, D) by TMA into staging slots and warps 1..transpose_warps of the
        # producer warpgroup write it K-major into the slots P·V reads (``transpose_tile``)
        self.v_transpose = False
        self.transpose_warps = 0
        # (v_transpose, one tile per CTA) O's slabs over the V staging slots: every staged V tile
        # has been transposed before the last P·V the epilogue waits for
        self.o_in_vs = False
        self.threads = 128 * (1 + self.consumers)
        self.producer_regs, self.consumer_regs = register_split(self.consumers, gather or wide_producer)
        if kv_dtype is not None and fp8_stages > 1 and self.consumers == 2:
            # two staging tiles' offsets and predicates: 10 instructions spilled at 40 registers
            self.producer_regs, self.consumer_regs = DEEP_FP8_PRODUCER_REGS, DEEP_FP8_CONSUMER_REGS

    # --- host ------------------------------------------------------------------------------------
    # (dense, packed: layout.TmaViewsKernel)
    def dense_grid(self, grid):
        if cutlass.const_expr(self.kv_mcast):
            # whole CTA pairs: the query tiles rounded up to even (``pair_tiles``)
            grid = (cutlass.min(self.pair_tiles(grid[0]) * grid[1] * grid[2], PERSISTENT_CTAS), 1, 1)
        elif cutlass.const_expr(self.persistent):
            grid = (cutlass.min(grid[0] * grid[1] * grid[2], PERSISTENT_CTAS), 1, 1)
        if cutlass.const_expr(self.kv_split):
            grid = (grid[0] * 2, grid[1], grid[2])  # a cluster of two CTAs per query tile
        return grid

    @cute.jit
    def dense_dynamic(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                      lse: cute.Tensor, tile_counters: cute.Tensor, softmax_scale: cutlass.Float32,
                      stream: cuda.CUstream):
        # ``dense`` with the tile counters (AttentionSm90.dynamic)
        mQ, mK, mVt, mO = layout.dense_views(q, k, v, o)
        grid = self.dense_grid((cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0]))
        self._launch(mQ, mK, mVt, mO, lse, None, None, softmax_scale, grid, stream, mTiles=tile_counters)

    @cute.jit
    def packed_dynamic(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                       lse: cute.Tensor, tile_counters: cute.Tensor, cu_seqlens_q: cute.Tensor,
                       cu_seqlens_k: cute.Tensor, softmax_scale: cutlass.Float32,
                       max_seqlen_q: cutlass.Int32, stream: cuda.CUstream):
        # ``packed`` with the tile counters (AttentionSm90.dynamic, varlen)
        mQ, mK, mVt, mO = layout.packed_views(q, k, v, o)
        grid = (cute.ceil_div(max_seqlen_q, self.cta_rows), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mVt, mO, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, grid, stream,
                     mTiles=tile_counters)

    @cute.jit
    def kvcache(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                sinks: cute.Tensor, kv_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                softcap: cutlass.Float32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                stream: cuda.CUstream):
        # The contract's kvcache signature, dense q.  Pages (P, PS, Hkv, D) -> (PS, D, Hkv, P) for
        # the TMA (V: (D, PS, Hkv, P)); q/o as in ``dense``.  Sinks, softcap and the window are
        # read where the variant has their switch; the descales are ignored (no fp8 caches).
        mQ, mK, mVt, mO = layout.dense_views(q, k_cache, v_cache, o)
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        self._launch(mQ, mK, mVt, mO, lse, None, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     None)

    @cute.jit
    def kvcache_packed(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                       o: cute.Tensor, lse: cute.Tensor, block_table: cute.Tensor,
                       cache_seqlens: cute.Tensor, cu_seqlens_q: cute.Tensor, sinks: cute.Tensor,
                       kv_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                       softcap: cutlass.Float32, window_left: cutlass.Int32,
                       window_right: cutlass.Int32, max_seqlen_q: cutlass.Int32,
                       stream: cuda.CUstream):
        # The packed-q form: q/o (Tq, Hq, D) as in ``packed``, pages as in ``kvcache``.
        mQ, _, _, mO = layout.packed_views(q, q, q, o)
        _, mK, mVt, _ = layout.dense_views(k_cache, k_cache, v_cache, k_cache)
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mVt, mO, lse, cu_seqlens_q, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     None)

    @cute.jit
    def kvcache_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor, o: cute.Tensor,
                   lse: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                   sinks: cute.Tensor, k_descale: cute.Tensor, v_descale: cute.Tensor,
                   softmax_scale: cutlass.Float32, softcap: cutlass.Float32, window_left: cutlass.Int32,
                   window_right: cutlass.Int32, stream: cuda.CUstream):
        # ``kvcache`` over e4m3 pages: the contract's k_descale and v_descale (Hkv,) as the pair
        # the consumers read (each with its own stride, 0 for one factor per tensor)
        mQ, mK, mVt, mO = layout.dense_views(q, k_cache, v_cache, o)
        grid = (cute.ceil_div(q.shape[1], self.tile_m), q.shape[2], q.shape[0])
        self._launch(mQ, mK, mVt, mO, lse, None, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     (k_descale, v_descale))

    @cute.jit
    def kvcache_packed_f8(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                          o: cute.Tensor, lse: cute.Tensor, block_table: cute.Tensor,
                          cache_seqlens: cute.Tensor, cu_seqlens_q: cute.Tensor, sinks: cute.Tensor,
                          k_descale: cute.Tensor, v_descale: cute.Tensor, softmax_scale: cutlass.Float32,
                          softcap: cutlass.Float32, window_left: cutlass.Int32,
                          window_right: cutlass.Int32, max_seqlen_q: cutlass.Int32,
                          stream: cuda.CUstream):
        # ``kvcache_packed`` over e4m3 pages (the descales as in ``kvcache_f8``)
        mQ, _, _, mO = layout.packed_views(q, q, q, o)
        _, mK, mVt, _ = layout.dense_views(k_cache, k_cache, v_cache, k_cache)
        grid = (cute.ceil_div(max_seqlen_q, self.tile_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mVt, mO, lse, cu_seqlens_q, None, softmax_scale, grid, stream,
                     block_table, cache_seqlens, (sinks, softcap, window_left, window_right),
                     (k_descale, v_descale))

    @cute.jit
    def _launch(self, mQ, mK, mVt, mO, lse, mCuQ, mCuK, softmax_scale, grid, stream,
                mTable=None, mSeqlens=None, switches=(None, None, None, None), mDescale=None, mTiles=None):
        D, BN, dt, ot = self.head_dim, self.tile_n, self.dtype, self.out_dtype
        v_major = OperandMajorMode.K if self.v_k_major else OperandMajorMode.MN
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
            tiler_mn=(WG_ROWS, BN))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, v_major, cutlass.Float32, (1, 1, 1),
            tiler_mn=(WG_ROWS, D), a_source=warpgroup.OperandSource.RMEM)

        # Q: one (64, D) slab per consumer warpgroup (O reuses it); K: (BN, D) per slot; V: (D, BN)
        # per slot, MN-major.  128-byte swizzles throughout.
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WG_ROWS, BN, D), dt,
                                                  self.consumers)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (WG_ROWS, BN, D), dt,
                                                  self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(
            LayoutEnum.ROW_MAJOR if self.v_k_major else LayoutEnum.COL_MAJOR, (WG_ROWS, D, BN), dt,
            self.stages)
        # O's slabs: Q's layout, or the same tiles in O's own element type
        own_o = ((self.persistent and not self.o_in_q) or ot is not dt) and not self.o_in_vs
        sO_layout = sQ_layout
        if cutlass.const_expr(ot is not dt):
            sO_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WG_ROWS, BN, D), ot,
                                                      self.consumers)
        tma_q, tQ = atoms.tma_load_atom(mQ, sQ_layout, (WG_ROWS, D))
        if cutlass.const_expr(self.page_box or self.gather):
            # one box: page_box rows of a page, landing in rows [i·box, (i+1)·box) of a slot (the
            # slot's layout restricted to its first box rows; the others differ by an offset).
            # gather: K/V come by cp.async from the tensors themselves; the (one-row) TMA atoms
            # are built only to keep the kernel's arguments and are never used.
            KB = self.page_box if self.page_box else 1
            k_box = cute.composition(cute.slice_(sK_layout, (None, None, 0)),
                                     cute.make_layout((KB, D), stride=(1, BN)))
            v_box = cute.composition(cute.slice_(sV_layout, (None, None, 0)),
                                     cute.make_layout((D, KB), stride=(1, D)))
            if cutlass.const_expr(self.kv_fp8):
                # (e4m3 tensors: plain one-row boxes, never used either)
                k_box = cute.make_layout((1, D), stride=(D, 1))
                v_box = cute.make_layout((D, 1), stride=(1, D))
            tma_k, tK = atoms.tma_load_box_atom(mK, k_box, (KB, D))
            if cutlass.const_expr(self.v_transpose):
                # V pages viewed as K's ((PS, D) rows) land in the (keys, D) staging slots
                tma_v, tV = atoms.tma_load_box_atom(mVt, k_box, (KB, D))
            else:
                tma_v, tV = atoms.tma_load_box_atom(mVt, v_box, (D, KB))
            if cutlass.const_expr(self.gather):
                tK, tV = mK, mVt
        elif cutlass.const_expr(self.kv_mcast):
            # each CTA of the pair loads half of a K/V tile and multicasts it into both
            tma_k, tK = atoms.tma_load_atom(mK, sK_layout, (BN, D), 2)
            tma_v, tV = atoms.tma_load_atom(mVt, sV_layout, (D, BN), 2)
        else:
            tma_k, tK = atoms.tma_load_atom(mK, sK_layout, (BN, D))
            if cutlass.const_expr(self.v_transpose):
                tma_v, tV = atoms.tma_load_atom(mVt, sK_layout, (BN, D))  # (keys, D) staging, as K
            else:
                tma_v, tV = atoms.tma_load_atom(mVt, sV_layout, (D, BN))
        tma_o, tO, s2g = None, mO, None
        if cutlass.const_expr(mCuQ is None):
            tma_o, tO = atoms.tma_store_atom(mO, sO_layout, (WG_ROWS, D))
        else:
            # 16-byte stores of a warpgroup's O slab, 8 threads per 64 columns, rows predicated.
            vec = 128 // ot.width
            s2g = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), ot, num_bits_per_copy=128),
                cute.make_layout((128 // 8, 8), stride=(8, 1)), cute.make_layout((1, vec)))

        @cute.struct
        class SharedStorage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.consumers]  # full, empty
            k_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            v_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            vs_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages if self.v_transpose else 0]
            # dynamic: the tile-index slots' barriers (full, full, empty, empty) and the slots
            tile_bars: cute.struct.MemRange[cutlass.Int64, 4 if self.dynamic else 0]
            # (slot_coords: index, query tile, q head, batch per slot)
            tile_slot: cute.struct.MemRange[cutlass.Int32, self.slot_words]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], _SMEM_ALIGN]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], _SMEM_ALIGN]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], _SMEM_ALIGN]
            # the V staging slots of ``v_transpose`` ((keys, D), K's layout)
            sVs: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout) if self.v_transpose else 0],
                                   _SMEM_ALIGN]
            # persistent: O's own slabs (the next tile's Q lands while O leaves); else O reuses Q's
            sO: cute.struct.Align[cute.struct.MemRange[ot, cute.cosize(sO_layout) if own_o else 0],
                                  _SMEM_ALIGN]
            # fp8 caches: the e4m3 staging tiles of K ((keys, D)) and V (the same bytes seen as (D, keys))
            sK8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, BN * D * self.fp8_stages if self.kv_fp8 else 0],
                                   _SMEM_ALIGN]
            sV8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, BN * D * self.fp8_stages if self.kv_fp8 else 0],
                                   _SMEM_ALIGN]
            # kv_split: rank 1's O fragments, row maxima and sums (received by rank 0), and the
            # mbarrier counting their bytes
            sM: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, merge_floats(D) if self.kv_split else 0],
                                  _SMEM_ALIGN]
            m_bar: cute.struct.MemRange[cutlass.Int64, 1 if self.kv_split else 0]

        self.shared_storage = SharedStorage
        # varlen, persistent: the grid (query tiles of the longest sequence, heads, sequences) is
        # the virtual grid the CTAs walk (tile_coords), its query tiles an argument
        varlen_tiles = ()
        if cutlass.const_expr(self.dynamic):
            varlen_tiles = (None, mTiles)
        if cutlass.const_expr(self.persistent and (mCuQ is not None or mSeqlens is not None)):
            # (a KV cache's virtual grid too: query tiles of q or of the longest sequence)
            varlen_tiles = (grid[0], mTiles) if self.dynamic else (grid[0],)
            grid = (cutlass.min(grid[0] * grid[1] * grid[2], PERSISTENT_CTAS), 1, 1)
        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tV, tma_o, tO, s2g, lse, mCuQ, mCuK,
            softmax_scale * LOG2_E, tiled_mma_qk, tiled_mma_pv, sQ_layout, sK_layout, sV_layout,
            sO_layout, mTable, mSeqlens, *switches, mDescale, *varlen_tiles,
        ).launch(grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream,
                 **({"cluster": (2, 1, 1)} if self.kv_split or self.kv_mcast else {}))

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mVt: cute.Tensor, tma_o, mO: cute.Tensor, s2g,
               mLSE: cute.Tensor, mCuQ, mCuK, scale_log2: cutlass.Float32,
               tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout, mTable, mSeqlens,
               mSinks, softcap, win_l, win_r, mDescale, n_m_varlen=None, mTiles=None):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            atoms.prefetch_tma_descriptors(tma_q, tma_k, tma_v, tma_o)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = sQ
        if cutlass.const_expr(self.o_in_vs):
            sO = storage.sVs.get_tensor(sO_layout.outer, swizzle=sO_layout.inner, dtype=self.out_dtype)
        elif cutlass.const_expr((self.persistent and not self.o_in_q) or self.out_dtype is not self.dtype):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        q_bars = storage.q_bars.data_ptr()

        # One arrive per consumer warp releases a K or V slot.
        if cutlass.const_expr(self.gather and self.kv_fp8):
            # filled by the producer warpgroup's converting stores (one arrive per thread, after
            # its stores and a proxy fence)
            kv_pipes = [
                pipeline.PipelineAsync.create(
                    barrier_storage=bars, num_stages=self.stages,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                    consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * self.consumers),
                    defer_sync=True)
                for bars in (storage.k_bars.data_ptr(), storage.v_bars.data_ptr())
            ]
        elif cutlass.const_expr(self.gather):
            # filled by the producer warpgroup's cp.async (one arrive per thread, on completion)
            kv_pipes = [
                pipeline.PipelineCpAsync.create(
                    barrier_storage=bars, num_stages=self.stages,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                    # (this pipeline's consumer release arrives from every consumer thread)
                    consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * self.consumers),
                    defer_sync=True)
                for bars in (storage.k_bars.data_ptr(), storage.v_bars.data_ptr())
            ]
        elif cutlass.const_expr(self.v_transpose):
            # K by TMA; V by TMA into the staging ring (released by the transposing warps), then by
            # the transposing warps' stores into the V ring (every consumer thread releases a slot)
            nt = self.transpose_warps
            kv_pipes = [
                atoms.tma_pipeline(storage.k_bars.data_ptr(), self.stages, atoms.stage_bytes(self.dtype, sK_layout),
                                   4 * self.consumers, cute.make_layout((1, 1, 1, 1))),
                pipeline.PipelineAsync.create(
                    barrier_storage=storage.v_bars.data_ptr(), num_stages=self.stages,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * nt),
                    consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * self.consumers),
                    defer_sync=True),
            ]
            vs_pipe = atoms.tma_pipeline(storage.vs_bars.data_ptr(), self.stages,
                                         atoms.stage_bytes(self.dtype, sK_layout), nt, cute.make_layout((1, 1, 1, 1)))
            load_pipes = [kv_pipes[0], vs_pipe]
            sV_load = storage.sVs.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        else:
            # (kv_mcast: each consumer warp releases a slot to both CTAs of the pair, whose
            # producers both write into it)
            pair = 2 if self.kv_mcast else 1
            kv_pipes = [
                atoms.tma_pipeline(bars, self.stages, atoms.stage_bytes(self.dtype, layout),
                                   pair * 4 * self.consumers, cute.make_layout((1, pair, 1, 1)))
                for bars, layout in ((storage.k_bars.data_ptr(), sK_layout),
                                     (storage.v_bars.data_ptr(), sV_layout))
            ]
        if cutlass.const_expr(not self.v_transpose):
            load_pipes = kv_pipes  # the pipes and V slots the producer fills
            sV_load = sV
        if warp_idx == 0:
            with cute.arch.elect_one():
                for w in cutlass.range_constexpr(self.consumers):
                    cute.arch.mbarrier_init(q_bars + w, 1)  # Q slab w landed (TMA bytes)
                    # Q slab w read by its warpgroup's last S GEMM (one arrive per warp); o_in_q:
                    # by the TMA store of the O written into it (one arrive)
                    cute.arch.mbarrier_init(q_bars + self.consumers + w, 1 if self.o_in_q else 4)
                if cutlass.const_expr(self.kv_split):
                    # rank 0 receives rank 1's partial: armed with its bytes before the cluster's
                    # first barrier (below), so that no byte can land before it
                    m_bar = storage.m_bar.data_ptr()
                    cute.arch.mbarrier_init(m_bar, 1)
                    if cute.arch.block_idx()[0] % 2 == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(m_bar, merge_floats(self.head_dim) * 4)
                if cutlass.const_expr(self.dynamic):
                    tile_bars = storage.tile_bars.data_ptr()
                    for i in cutlass.range_constexpr(2):
                        cute.arch.mbarrier_init(tile_bars + i, 1)  # slot i written (the producer warp)
                        cute.arch.mbarrier_init(tile_bars + 2 + i, 128 * self.consumers)  # read by all
        # (kv_split, kv_mcast: the barrier spans the cluster)
        cluster_mn = (2, 1) if self.kv_split or self.kv_mcast else (1, 1)
        pipeline.pipeline_init_arrive(cluster_shape_mn=cluster_mn, is_relaxed=True)

        pipeline.pipeline_init_wait(cluster_shape_mn=cluster_mn)
        warpgroup_idx = cute.arch.make_warp_uniform(tidx // 128)
        wg = warpgroup_idx - 1
        if cutlass.const_expr(not self.persistent):
            # One query tile per CTA (last first when causal), q head, batch.
            m_block, head, batch = cute.arch.block_idx()
            n_m_grid = cute.arch.grid_dim()[0]
            if cutlass.const_expr(self.kv_split):
                # (clusters along x: rank = block x mod 2; the pair shares the query tile)
                rank = m_block % 2
                m_block = m_block // 2
                n_m_grid = n_m_grid // 2
            if cutlass.const_expr(self.causal):
                m_block = n_m_grid - 1 - m_block
            if cutlass.const_expr(mSeqlens is not None):
                q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.cache_views(
                    mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens, head, batch)
            else:
                q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                    mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, head, batch)
                if cutlass.const_expr(self.v_transpose and mCuK is not None):
                    # V rows first ((tokens, D, heads), as K): the sequence's offset is on its rows
                    seqVt = cute.domain_offset((mCuK[batch], 0), mVt[None, None, head // (mQ.shape[2] // mK.shape[2])])
            # KV cache switches: the window's -1 sides through mask.window; softcap (runtime
            # value, <= 0: off) folds into the score scale; the q head's sink logit
            win = mask.window(self.mask, win_l, win_r, q_len, k_len)
            n_lo, n_hi, mask_lo, n_mask = self.key_range(m_block, q_len, k_len, win)
            my_lo, my_hi = n_lo, n_hi
            if cutlass.const_expr(self.kv_split):
                # rank 0: the upper ceil(half) of the key tiles [sp, n_hi), rank 1: [n_lo, sp)
                sp = n_hi - (n_hi - n_lo + 1) // 2
                my_lo = sp if rank == 0 else n_lo
                my_hi = n_hi if rank == 0 else sp
            cap = None
            sink = None
            if cutlass.const_expr(self.has_softcap):
                use_cap = softcap > 0.0
                cap_size = cutlass.max(softcap, 1e-30)
                cap = (scale_log2 / (cap_size * LOG2_E) if use_cap else 0.0, use_cap)
                scale_log2 = cap_size * LOG2_E if use_cap else scale_log2
            if cutlass.const_expr(self.has_sinks):
                sink = mSinks[head]
            scale_t, o_scale = self.problem_scales(scale_log2, mDescale, head, batch, mQ.shape[2], mK.shape[2])
            # Varlen: tiles past a sequence's end (the grid is sized by the longest) leave at once.
            if m_block * self.tile_m < q_len:
                if warpgroup_idx == 0:
                    cute.arch.setmaxregister_decrease(self.producer_regs)
                    if cutlass.const_expr(self.gather and self.kv_fp8):
                        BN, D = self.tile_n, self.head_dim
                        S8 = self.fp8_stages
                        sK8 = storage.sK8.get_tensor(cute.make_layout((BN, D, S8), stride=(D, 1, BN * D)))
                        sV8 = storage.sV8.get_tensor(cute.make_layout((D, BN, S8), stride=(1, D, BN * D)))
                        self.produce_gather_fp8(tma_q, seqQ, seqK, seqVt, sQ, sK, sV, sK8, sV8, q_bars,
                                                kv_pipes, m_block, n_lo, n_hi, self.kv_state(True), mTable,
                                                batch, k_len, warp_idx, tidx)
                    elif cutlass.const_expr(self.gather):
                        self.produce_gather(tma_q, seqQ, seqK, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                                            m_block, n_lo, n_hi, self.kv_state(True), mTable, batch,
                                            k_len, warp_idx, tidx)
                    elif warp_idx == 0:
                        if cutlass.const_expr(self.page_box):
                            self.produce_paged(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV_load,
                                               q_bars, load_pipes, m_block, n_lo, n_hi,
                                               self.kv_state(True), mTable, batch, k_len)
                        else:
                            self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV_load, q_bars,
                                         load_pipes, m_block, my_hi, self.kv_state(True), 0, n_lo=my_lo)
                    if cutlass.const_expr(self.page_box and not self.v_transpose):
                        if warp_idx == 1:  # V's page boxes (produce_paged)
                            self.produce_paged(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV_load,
                                               q_bars, load_pipes, m_block, n_lo, n_hi,
                                               self.kv_state(True), mTable, batch, k_len, 1)
                    if cutlass.const_expr(self.v_transpose):
                        if warp_idx >= 1 and warp_idx <= self.transpose_warps:
                            self.transpose_loop(storage.sVs.data_ptr(), storage.sV.data_ptr(), sK_layout,
                                                sV_layout, load_pipes[1], kv_pipes[1], n_hi,
                                                self.kv_state(False), self.kv_state(True), warp_idx - 1)
                else:
                    cute.arch.setmaxregister_increase(self.consumer_regs)
                    self.schedule_start(wg)
                    if cutlass.const_expr(self.kv_split):
                        sM = storage.sM.get_tensor(cute.make_layout(merge_floats(self.head_dim)))
                        self.consume(tiled_mma_qk, tiled_mma_pv, tma_o, seqO, s2g, seqL, sQ, sO, sK,
                                     sV, q_bars, kv_pipes, scale_t, m_block, q_len, k_len, my_hi,
                                     n_mask, wg, tidx % 128, self.kv_state(False), 0,
                                     n_lo=my_lo, mask_lo=mask_lo, win=win, cap=cap, sink=sink, o_scale=o_scale,
                                     split=(rank, sM, storage.m_bar.data_ptr()))
                    else:
                        self.consume(tiled_mma_qk, tiled_mma_pv, tma_o, seqO, s2g, seqL, sQ, sO, sK,
                                     sV, q_bars, kv_pipes, scale_t, m_block, q_len, k_len, n_hi,
                                     n_mask, wg, tidx % 128, self.kv_state(False), 0,
                                     n_lo=n_lo, mask_lo=mask_lo, win=win, cap=cap, sink=sink, o_scale=o_scale)
        elif cutlass.const_expr(mSeqlens is not None):
            self.kv_tiles(warpgroup_idx, warp_idx, tidx, n_m_varlen, mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens,
                          mTable, mSinks, softcap, win_l, win_r, mDescale, scale_log2, tma_q, tma_k, tma_v,
                          tma_o, s2g, tiled_mma_qk, tiled_mma_pv, sQ, sO, sK, sV_load, sV, q_bars, load_pipes,
                          kv_pipes)
        else:
            # Persistent: CTA c walks tiles c, c + grid, ... (``tile_coords``); the producer loads
            # the next tile's Q as soon as the consumers' last S GEMM of this one has read theirs
            # (the O epilogue has its own smem), K/V rings run on across tiles.
            if cutlass.const_expr(mCuQ is None):
                n_m = cute.ceil_div(mQ.shape[0], self.tile_m)
                if cutlass.const_expr(self.kv_mcast):
                    n_m = self.pair_tiles(n_m)
                n_batch = mQ.shape[3]
            else:
                # varlen: the virtual grid's slots past a sequence's last query tile are empty
                n_m = n_m_varlen
                n_batch = mCuQ.shape[0] - 1
            n_tiles = n_m * mQ.shape[2] * n_batch
            first, _, _ = cute.arch.block_idx()
            # the CTAs that take part: one per SM of this device at most
            stride = cutlass.min(cute.arch.grid_dim()[0], cute.arch.nsmid())
            n_slots = self.slots(n_tiles, stride)
            if cutlass.const_expr(self.kv_mcast):
                stride = stride - stride % 2  # (whole pairs: CTAs 2i and 2i + 1 take part or leave together)
                n_slots = 2 * self.slots(n_tiles // 2, stride // 2)  # (the schedule over pairs, ``pair_coords``)
            if first >= stride:
                n_slots = first  # (no slot: this CTA leaves)
            q_phase = cutlass.Int32(0)
            tile_bars, tile_slots = None, None
            if cutlass.const_expr(self.dynamic):
                tile_bars = storage.tile_bars.data_ptr()
                tile_slots = cute.make_tensor(storage.tile_slot.data_ptr(), cute.make_layout(self.slot_words))
            if warpgroup_idx == 0:
                cute.arch.setmaxregister_decrease(self.producer_regs)
                if cutlass.const_expr(self.dynamic):
                    if warp_idx == 0:
                        if cutlass.const_expr(mCuQ is None):
                            self.produce_dynamic(first, stride, n_tiles, n_m, n_batch, mQ, mK, mVt, mO, mLSE,
                                                 tma_q, tma_k, tma_v, sQ, sK, sV_load, q_bars, load_pipes,
                                                 tile_bars, tile_slots, mTiles)
                        else:
                            self.produce_dynamic_varlen(first, stride, n_tiles, n_m, n_batch, mQ, mK, mVt, mO,
                                                        mLSE, tma_q, tma_k, tma_v, sQ, sK, sV_load, q_bars,
                                                        load_pipes, tile_bars, tile_slots, mTiles, mCuQ, mCuK)
                else:
                    if warp_idx == 0:
                        state = self.kv_state(True)
                        rank = first % 2 if self.kv_mcast else 0
                        for t in cutlass.range(first, n_slots, stride, unroll=1):
                            if cutlass.const_expr(self.kv_mcast):
                                m_block, head, batch, real = self.pair_coords(t, stride, n_m, mQ.shape[2],
                                                                              n_batch, mK.shape[2])
                            else:
                                m_block, head, batch, real = self.tile_coords(t, stride, n_m, mQ.shape[2],
                                                                              n_batch, mK.shape[2], mCuQ)
                            if real:
                                q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                                    mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, head, batch)
                                _, n_hi, _, n_mask = self.key_range(m_block, q_len, k_len)
                                if cutlass.const_expr(self.kv_mcast):
                                    # K/V: the key tiles of the pair's upper query tile (both CTAs'
                                    # slots receive them); Q: only where this tile sees a key
                                    _, kv_hi, _, _ = self.key_range(m_block - rank + 1, q_len, k_len)
                                    state = self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK,
                                                         sV_load, q_bars, load_pipes, m_block, kv_hi, state,
                                                         q_phase, rank=rank, q_hi=n_hi)
                                else:
                                    state = self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK,
                                                         sV_load, q_bars, load_pipes, m_block, n_hi, state,
                                                         q_phase)
                                if cutlass.const_expr(self.o_in_q):
                                    if n_hi == 0:
                                        self.pass_q_slabs(q_bars, q_phase)
                                    q_phase = q_phase ^ 1
                                else:
                                    if n_hi > 0:
                                        q_phase = q_phase ^ 1
                        if cutlass.const_expr(self.kv_mcast):
                            # the peer multicasts into this CTA's slots and releases them here:
                            # stay until both CTAs' consumers have released every slot
                            load_pipes[0].producer_tail(state.clone())
                            load_pipes[1].producer_tail(state.clone())
                if cutlass.const_expr(self.v_transpose):
                    if warp_idx >= 1 and warp_idx <= self.transpose_warps:
                        t_read = self.kv_state(False)
                        t_write = self.kv_state(True)
                        for t in cutlass.range(first, n_slots, stride, unroll=1):
                            m_block, head, batch, real = self.tile_coords(t, stride, n_m, mQ.shape[2],
                                                                          n_batch, mK.shape[2], mCuQ)
                            if real:
                                q_len, k_len = mQ.shape[0], mK.shape[0]
                                _, n_hi, _, _ = self.key_range(m_block, q_len, k_len)
                                t_read, t_write = self.transpose_loop(
                                    storage.sVs.data_ptr(), storage.sV.data_ptr(), sK_layout, sV_layout,
                                    load_pipes[1], kv_pipes[1], n_hi, t_read, t_write, warp_idx - 1)
            else:
                cute.arch.setmaxregister_increase(self.consumer_regs)
                self.schedule_start(wg)
                if cutlass.const_expr(self.const_wg):
                    # one copy of the consumer code per warpgroup, its index a constant there
                    for c in cutlass.range_constexpr(self.consumers):
                        if wg == c:
                            self.consumer_tiles(c, first, n_slots, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE,
                                                mCuQ, mCuK, mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv,
                                                tma_o, s2g, sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase,
                                                tile_bars, tile_slots)
                else:
                    self.consumer_tiles(wg, first, n_slots, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ,
                                        mCuK, mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv, tma_o, s2g,
                                        sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase, tile_bars, tile_slots)

    @cute.jit
    def kv_tiles(self, warpgroup_idx, warp_idx, tidx, n_m, mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens, mTable,
                 mSinks, softcap, win_l, win_r, mDescale, scale_log2, tma_q, tma_k, tma_v, tma_o, s2g,
                 tiled_mma_qk, tiled_mma_pv, sQ, sO, sK, sV_load, sV, q_bars, load_pipes, kv_pipes):
        """Persistent over a paged cache: CTA c walks slots c, c + grid, ... of the virtual grid
        (``n_m`` query tiles of q or of the longest packed sequence, q heads, sequences;
        ``tile_coords``: causal, longest rows first).  Producer warp 0 loads each tile's Q (once
        its warpgroup has released the previous tile's slab) and K's page boxes, warp 1 V's
        (``produce_paged``); the K/V rings run on across tiles, so the next tile's Q and first
        K/V land while this one's last P·V and O store run."""
        if cutlass.const_expr(mCuQ is None):
            n_batch = mQ.shape[3]
        else:
            n_batch = mCuQ.shape[0] - 1
        n_heads, n_kv = mQ.shape[2], mK.shape[2]
        n_tiles = n_m * n_heads * n_batch
        first, _, _ = cute.arch.block_idx()
        # the CTAs that take part: one per SM of this device at most
        stride = cutlass.min(cute.arch.grid_dim()[0], cute.arch.nsmid())
        n_slots = self.slots(n_tiles, stride)
        if first >= stride:
            n_slots = first  # (no slot: this CTA leaves)
        q_phase = cutlass.Int32(0)
        if warpgroup_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx < 2:
                state = self.kv_state(True)
                for t in cutlass.range(first, n_slots, stride, unroll=1):
                    m_block, head, batch, real = self.tile_coords(t, stride, n_m, n_heads, n_batch, n_kv, mCuQ)
                    if real:
                        q_len, k_len, seqQ, seqK, seqVt, _, _ = layout.cache_views(
                            mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens, head, batch)
                        win = mask.window(self.mask, win_l, win_r, q_len, k_len)
                        n_lo, n_hi, _, _ = self.key_range(m_block, q_len, k_len, win)
                        state = self.produce_paged(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV_load,
                                                   q_bars, load_pipes, m_block, n_lo, n_hi, state, mTable,
                                                   batch, k_len, warp_idx, q_phase)
                        if cutlass.const_expr(self.o_in_q):
                            if n_hi <= n_lo:
                                if warp_idx == 0:
                                    self.pass_q_slabs(q_bars, q_phase)
                            q_phase = q_phase ^ 1
                        else:
                            if n_hi > n_lo:
                                q_phase = q_phase ^ 1
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            wg = warpgroup_idx - 1
            self.schedule_start(wg)
            # the softcap folds into the score scale (as one tile per CTA does)
            cap = None
            if cutlass.const_expr(self.has_softcap):
                use_cap = softcap > 0.0
                cap_size = cutlass.max(softcap, 1e-30)
                cap = (scale_log2 / (cap_size * LOG2_E) if use_cap else 0.0, use_cap)
                scale_log2 = cap_size * LOG2_E if use_cap else scale_log2
            read = self.kv_state(False)
            for t in cutlass.range(first, n_slots, stride, unroll=1):
                m_block, head, batch, real = self.tile_coords(t, stride, n_m, n_heads, n_batch, n_kv, mCuQ)
                if real:
                    q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.cache_views(
                        mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens, head, batch)
                    win = mask.window(self.mask, win_l, win_r, q_len, k_len)
                    n_lo, n_hi, mask_lo, n_mask = self.key_range(m_block, q_len, k_len, win)
                    sink = None
                    if cutlass.const_expr(self.has_sinks):
                        sink = mSinks[head]
                    scale_t, o_scale = self.problem_scales(scale_log2, mDescale, head, batch, n_heads, n_kv)
                    read = self.consume(tiled_mma_qk, tiled_mma_pv, tma_o, seqO, s2g, seqL, sQ, sO, sK,
                                        sV, q_bars, kv_pipes, scale_t, m_block, q_len, k_len, n_hi,
                                        n_mask, wg, tidx % 128, read, q_phase, n_lo=n_lo, mask_lo=mask_lo,
                                        win=win, cap=cap, sink=sink, o_scale=o_scale)
                    if cutlass.const_expr(self.o_in_q):
                        q_phase = q_phase ^ 1  # (every tile passes through Q's slabs)
                    else:
                        if n_hi > n_lo:
                            q_phase = q_phase ^ 1

    @cute.jit
    def consumer_tiles(self, wg, first, n_slots, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK,
                       mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv, tma_o, s2g, sQ, sO, sK, sV, q_bars,
                       kv_pipes, tidx, q_phase, tile_bars=None, tile_slots=None):
        """Persistent: consumer warpgroup ``wg`` walks its CTA's tiles ``first``, ``first +
        stride``, ... (``tile_coords``; dynamic: the tiles the producer warp passes through
        ``tile_slots``), each through :meth:`consume`."""
        read = self.kv_state(False)
        if cutlass.const_expr(self.slot_coords):
            n_tiles = n_m * mQ.shape[2] * n_batch
            k = cutlass.Int32(0)
            t, m_block, head, batch = self.take_tile_coords(k, tile_bars, tile_slots)
            k = k + 1
            while t < n_tiles:
                read, q_phase = self.consumer_tile(t, wg, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK,
                                                   mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv, tma_o, s2g,
                                                   sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase, read,
                                                   coords=(m_block, head, batch))
                t, m_block, head, batch = self.take_tile_coords(k, tile_bars, tile_slots)
                k = k + 1
        elif cutlass.const_expr(self.dynamic):
            n_tiles = n_m * mQ.shape[2] * n_batch
            k = cutlass.Int32(0)
            t = self.take_tile(k, tile_bars, tile_slots)
            k = k + 1
            while t < n_tiles:
                read, q_phase = self.consumer_tile(t, wg, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK,
                                                   mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv, tma_o, s2g,
                                                   sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase, read)
                t = self.take_tile(k, tile_bars, tile_slots)
                k = k + 1
        else:
            for t in cutlass.range(first, n_slots, stride, unroll=1):
                read, q_phase = self.consumer_tile(t, wg, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK,
                                                   mDescale, scale_log2, tiled_mma_qk, tiled_mma_pv, tma_o, s2g,
                                                   sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase, read)
        if cutlass.const_expr(self.store_defer):
            # the last O store has read its slab before the CTA's smem goes away
            if tidx % 128 < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def consumer_tile(self, t, wg, stride, n_m, n_batch, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, mDescale, scale_log2,
                      tiled_mma_qk, tiled_mma_pv, tma_o, s2g, sQ, sO, sK, sV, q_bars, kv_pipes, tidx, q_phase,
                      read, coords=None):
        """One tile of :meth:`consumer_tiles` (slot ``t``; ``coords``: its (query tile, q head,
        batch) as the producer passed them, a tile of the problem): returns the K/V ring state and
        Q's phase."""
        if cutlass.const_expr(coords is not None):
            m_block, head, batch = coords
            real = True
        elif cutlass.const_expr(self.kv_mcast):
            m_block, head, batch, real = self.pair_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
        else:
            m_block, head, batch, real = self.tile_coords(t, stride, n_m, mQ.shape[2],
                                                          n_batch, mK.shape[2], mCuQ)
        if real:
            q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, head, batch)
            _, n_hi, _, n_mask = self.key_range(m_block, q_len, k_len)
            if cutlass.const_expr(self.kv_mcast):
                # the pair's upper tile's top key tiles this one does not see (causal): each
                # waited for and released unused
                _, kv_hi, _, _ = self.key_range(m_block - m_block % 2 + 1, q_len, k_len)
                for _ in cutlass.range(kv_hi - n_hi, unroll=1):
                    for pipe in kv_pipes:
                        pipe.consumer_wait(read)
                        pipe.consumer_release(read)
                    read.advance()
            scale_t, o_scale = self.problem_scales(scale_log2, mDescale, head, batch,
                                                   mQ.shape[2], mK.shape[2])
            read = self.consume(tiled_mma_qk, tiled_mma_pv, tma_o, seqO, s2g, seqL,
                                sQ, sO, sK, sV, q_bars, kv_pipes, scale_t, m_block,
                                q_len, k_len, n_hi, n_mask, wg, tidx % 128, read,
                                q_phase, o_scale=o_scale)
            if cutlass.const_expr(self.o_in_q):
                q_phase = q_phase ^ 1  # (every tile passes through Q's slabs)
            else:
                if n_hi > 0:
                    q_phase = q_phase ^ 1
        return read, q_phase

    @cute.jit
    def produce_dynamic(self, first, stride, n_tiles, n_m, n_batch, mQ, mK, mVt, mO, mLSE, tma_q, tma_k, tma_v,
                        sQ, sK, sV, q_bars, kv_pipes, tile_bars, tile_slots, mTiles):
        """The TMA warp of a dynamic CTA: its first tile is ``first`` (a CTA past the device's SM
        count takes it from the counter), each next one ``stride`` + the tile counter's value
        before its atomic add, taken once this tile's loads are issued; every index (the last one
        past the tiles) goes to the consumers through ``tile_slots`` (:meth:`take_tile`).  Once
        its walk ends, the CTA adds 1 to the arrival counter (acq_rel, after its last add to the
        tile counter); the CTA that reads ``grid - 1`` back is the last: it sets both to 0 for the
        next launch."""
        lane = cute.arch.lane_idx()
        counter = mTiles.iterator
        t = cutlass.Int32(first)
        if first >= stride:
            t = stride + self.next_tile(counter, lane)
        state = self.kv_state(True)
        q_phase = cutlass.Int32(0)
        k = cutlass.Int32(0)
        if cutlass.const_expr(self.slot_coords):
            # each index goes out with its coordinates (computed once, here)
            m_block, head, batch, _ = self.tile_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
            self.publish_tile(t, k, tile_bars, tile_slots, lane, (m_block, head, batch))
            k = k + 1
            while t < n_tiles:
                q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                    mQ, mK, mVt, mO, mLSE, None, None, head, batch)
                _, n_hi, _, n_mask = self.key_range(m_block, q_len, k_len)
                state = self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                                     m_block, n_hi, state, q_phase)
                if cutlass.const_expr(self.o_in_q):
                    if n_hi == 0:
                        self.pass_q_slabs(q_bars, q_phase)
                    q_phase = q_phase ^ 1
                else:
                    if n_hi > 0:
                        q_phase = q_phase ^ 1
                t = stride + self.next_tile(counter, lane)
                m_block, head, batch, _ = self.tile_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
                self.publish_tile(t, k, tile_bars, tile_slots, lane, (m_block, head, batch))
                k = k + 1
        else:
            self.publish_tile(t, k, tile_bars, tile_slots, lane)
            k = k + 1
            while t < n_tiles:
                m_block, head, batch, _ = self.tile_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
                q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                    mQ, mK, mVt, mO, mLSE, None, None, head, batch)
                _, n_hi, _, n_mask = self.key_range(m_block, q_len, k_len)
                state = self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                                     m_block, n_hi, state, q_phase)
                if cutlass.const_expr(self.o_in_q):
                    if n_hi == 0:
                        self.pass_q_slabs(q_bars, q_phase)
                    q_phase = q_phase ^ 1
                else:
                    if n_hi > 0:
                        q_phase = q_phase ^ 1
                t = stride + self.next_tile(counter, lane)
                self.publish_tile(t, k, tile_bars, tile_slots, lane)
                k = k + 1
        if lane == 0:
            old = cute.arch.atomic_add(counter + 1, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            if old == cute.arch.grid_dim()[0] - 1:
                cute.arch.store(counter, cutlass.Int32(0))
                cute.arch.store(counter + 1, cutlass.Int32(0))

    @cute.jit
    def produce_dynamic_varlen(self, first, stride, n_tiles, n_m, n_batch, mQ, mK, mVt, mO, mLSE, tma_q, tma_k,
                               tma_v, sQ, sK, sV, q_bars, kv_pipes, tile_bars, tile_slots, mTiles, mCuQ, mCuK):
        """:meth:`produce_dynamic` of a packed (varlen) problem: an index whose slot lies past its
        sequence's last query tile is passed over (the next one taken from the counter,
        :meth:`filled_tile`), so the consumers see tiles of the problem only."""
        lane = cute.arch.lane_idx()
        counter = mTiles.iterator
        t = cutlass.Int32(first)
        if first >= stride:
            t = stride + self.next_tile(counter, lane)
        t, m_block, head, batch = self.filled_tile(t, counter, lane, stride, n_tiles, n_m, n_batch, mQ, mK, mCuQ)
        state = self.kv_state(True)
        q_phase = cutlass.Int32(0)
        k = cutlass.Int32(0)
        # (slot_coords: each index goes out with its coordinates, computed once, here)
        self.publish_tile(t, k, tile_bars, tile_slots, lane,
                          (m_block, head, batch) if cutlass.const_expr(self.slot_coords) else None)
        k = k + 1
        while t < n_tiles:
            q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
                mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, head, batch)
            _, n_hi, _, n_mask = self.key_range(m_block, q_len, k_len)
            state = self.produce(tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                                 m_block, n_hi, state, q_phase)
            if cutlass.const_expr(self.o_in_q):
                if n_hi == 0:
                    self.pass_q_slabs(q_bars, q_phase)
                q_phase = q_phase ^ 1
            else:
                if n_hi > 0:
                    q_phase = q_phase ^ 1
            t = stride + self.next_tile(counter, lane)
            t, m_block, head, batch = self.filled_tile(t, counter, lane, stride, n_tiles, n_m, n_batch, mQ, mK,
                                                       mCuQ)
            self.publish_tile(t, k, tile_bars, tile_slots, lane,
                              (m_block, head, batch) if cutlass.const_expr(self.slot_coords) else None)
            k = k + 1
        if lane == 0:
            old = cute.arch.atomic_add(counter + 1, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            if old == cute.arch.grid_dim()[0] - 1:
                cute.arch.store(counter, cutlass.Int32(0))
                cute.arch.store(counter + 1, cutlass.Int32(0))

    @cute.jit
    def filled_tile(self, t, counter, lane, stride, n_tiles, n_m, n_batch, mQ, mK, mCuQ):
        """(index, query tile, q head, batch) of dynamic slot ``t``; varlen: the first slot from
        ``t`` on (the next ones from the counter) that holds a tile of its sequence, or an index
        past the tiles."""
        m_block, head, batch, _ = self.tile_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
        if cutlass.const_expr(mCuQ is not None):
            b = cutlass.min(batch, n_batch - 1)
            while (t < n_tiles) & (m_block * self.tile_m >= mCuQ[b + 1] - mCuQ[b]):
                t = stride + self.next_tile(counter, lane)
                m_block, head, batch, _ = self.tile_coords(t, stride, n_m, mQ.shape[2], n_batch, mK.shape[2])
                b = cutlass.min(batch, n_batch - 1)
        return t, m_block, head, batch

    @cute.jit
    def next_tile(self, counter, lane):
        """The tile counter's value before lane 0's atomic add of 1, in every lane of the warp."""
        v = cutlass.Int32(0)
        if lane == 0:
            v = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="relaxed", scope="gpu")
        return cute.arch.shuffle_sync(v, 0)

    @cute.jit
    def publish_tile(self, t, k, tile_bars, tile_slots, lane, coords=None):
        """The producer warp: tile index ``t`` into slot ``k % 2`` once every consumer thread has
        read that slot's previous index (its "empty" barrier), then its "full" barrier.
        ``coords`` (slot_coords): the tile's (query tile, q head, batch) beside the index."""
        s = k % 2
        cute.arch.mbarrier_wait(tile_bars + 2 + s, ((k // 2) % 2) ^ 1)
        if lane == 0:
            if cutlass.const_expr(coords is not None):
                tile_slots[4 * s] = t
                for j in cutlass.range_constexpr(3):
                    tile_slots[4 * s + 1 + j] = coords[j]
            else:
                tile_slots[s] = t
            cute.arch.mbarrier_arrive(tile_bars + s)

    @cute.jit
    def take_tile(self, k, tile_bars, tile_slots):
        """A consumer thread: the ``k``-th tile index of its CTA (slot ``k % 2``), the slot then
        released (one arrive per thread)."""
        s = k % 2
        cute.arch.mbarrier_wait(tile_bars + s, (k // 2) % 2)
        t = tile_slots[s]
        cute.arch.mbarrier_arrive(tile_bars + 2 + s)
        return t

    @cute.jit
    def take_tile_coords(self, k, tile_bars, tile_slots):
        """:meth:`take_tile` of slot_coords: (index, query tile, q head, batch)."""
        s = k % 2
        cute.arch.mbarrier_wait(tile_bars + s, (k // 2) % 2)
        t = tile_slots[4 * s]
        m_block = tile_slots[4 * s + 1]
        head = tile_slots[4 * s + 2]
        batch = tile_slots[4 * s + 3]
        cute.arch.mbarrier_arrive(tile_bars + 2 + s)
        return t, m_block, head, batch

    @cute.jit
    def transpose_loop(self, vs_ptr, v_ptr, vs_layout, v_layout, vs_pipe, v_pipe, n_tiles, read, write,
                       warp):
        """A transposing warp (``v_transpose``): for each of the tile's ``n_tiles`` key tiles, the
        V staging slot -> ``transpose_tile`` -> the V slot P·V reads; the generic-proxy stores are
        fenced for the WGMMAs (async proxy) before the slot is committed.  The rings are given as
        their smem base pointers and (swizzled) staged layouts.  Returns both ring states."""
        lane = cute.arch.lane_idx()
        for _ in cutlass.range(n_tiles, unroll=1):
            vs_pipe.consumer_wait(read)
            v_pipe.producer_acquire(write)
            self.transpose_tile(vs_ptr, v_ptr, vs_layout, v_layout, read.index, write.index, lane, warp)
            cute.arch.fence_proxy("async.shared", space="cta")
            v_pipe.producer_commit(write)
            vs_pipe.consumer_release(read)
            read.advance()
            write.advance()
        return read, write

    def kv_state(self, producer: bool):
        return pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer if producer else pipeline.PipelineUserType.Consumer,
            self.stages)

    @cute.jit
    def tile_coords(self, t, grid, n_m, n_heads, n_batch, n_kv_heads, mCuQ=None):
        """(query tile, q head, batch) of the persistent schedule's slot ``t`` (CTA t % grid,
        round t // grid), and whether the slot has a tile.  Causal: the (head, batch) pairs in
        sections of at most ``grid / CAUSAL_CTAS_PER_KV_HEAD`` kv heads (their q heads), one
        section after the other; within one, tiles sorted longest rows first (query tiles last
        first, every head of the section before the next query tile); dealt to the CTAs in
        zigzag rounds (even rounds CTA 0 first, odd rounds CTA grid-1 first), so each CTA's sum
        of tile lengths stays near the mean (dealt round-robin, CTA 0 would get the longest tile
        of every round: B1 H16 S16384 +6 %).  The sections keep several CTAs in flight on each
        kv head, which walk its K/V together out of L2 (one section over all heads left ~1 CTA
        per head of B4 H32 S4096 in flight, each reading its K/V from DRAM: 0.73x cuDNN).  Not
        causal: every tile is as long; query tiles fastest (the CTAs in flight share one head's
        K/V in L2)."""
        n_tiles = n_m * n_heads * n_batch
        if cutlass.const_expr(self.causal):
            if cutlass.const_expr(self.dynamic):
                p = t  # (the counter's order: no deal to balance)
            else:
                r = t // grid
                c = t - r * grid
                if r % 2 == 1:
                    c = grid - 1 - c
                p = r * grid + c
            n_hb = n_heads * n_batch
            width = cutlass.min(n_hb, cutlass.max(grid // CAUSAL_CTAS_PER_KV_HEAD, 1) * (n_heads // n_kv_heads))
            base = (p // (width * n_m)) * width
            w = cutlass.max(cutlass.min(width, n_hb - base), 1)  # the last section may be narrower
            q = p - base * n_m
            hb = base + q % w
            m_block = n_m - 1 - q // w
        else:
            p = t
            m_block = t % n_m
            hb = t // n_m
        if cutlass.const_expr(mCuQ is not None):
            # varlen: n_m is the longest sequence's; slots past this sequence's last tile are empty
            b = cutlass.min(hb // n_heads, n_batch - 1)
            return m_block, hb % n_heads, hb // n_heads, (p < n_tiles) & (m_block * self.tile_m < mCuQ[b + 1] - mCuQ[b])
        return m_block, hb % n_heads, hb // n_heads, p < n_tiles

    @cute.jit
    def pair_coords(self, t, grid, n_m, n_heads, n_batch, n_kv_heads):
        """kv_mcast: (query tile, q head, batch, real) of slot ``t``: CTAs 2i and 2i + 1 take the
        two query tiles of unit t // 2 of the schedule (``tile_coords``) over pairs of adjacent
        query tiles (``n_m`` even: n_m / 2 pairs per head, grid / 2 pairs of CTAs), the lower tile
        to the even CTA."""
        m_pair, head, batch, real = self.tile_coords(t // 2, grid // 2, n_m // 2, n_heads, n_batch, n_kv_heads)
        return 2 * m_pair + t % 2, head, batch, real

    def pair_tiles(self, n_m):
        """kv_mcast: query tiles per (batch, head) rounded up to whole CTA pairs (a pair's second
        tile past the end loads Q as zeros and writes no row)."""
        return n_m + n_m % 2

    def slots(self, n_tiles, grid):
        """Slots the persistent loop walks: every tile (causal: whole zigzag rounds, some
        slots of the last one empty)."""
        if cutlass.const_expr(self.causal):
            return cute.ceil_div(n_tiles, grid) * grid
        return n_tiles

    def key_range(self, m_block, q_len, k_len, win=(None, None)):
        """(n_lo, n_hi, mask_lo, n_mask): key tiles [n_lo, n_hi) this query tile sees (n_lo 0
        without the window); tiles >= n_mask need the mask (the key tail, and with causal the
        tiles some row of the tile does not fully see), with the window those < mask_lo too."""
        m0 = m_block * self.tile_m
        return mask.key_tiles(self.mask, m0, m0 + self.tile_m, q_len, k_len, self.tile_n, win=win)

    @cute.jit
    def produce(self, tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                m_block, n_hi, state, q_phase, n_lo=0, rank=0, q_hi=None):
        """The TMA warp: Q slabs (persistent: each once its warpgroup has released the previous
        tile's), then K and V of tiles n_hi-1 down to 0.  ``k_first``: the first K before Q (a
        persistent CTA's next tile starts on it while the consumers still finish the last one),
        then each K one tile ahead of the V it pairs with (K(n) before V(n+1): the order the
        consumers use them in).  kv_split: the tiles n_hi-1 down to ``n_lo`` (this rank's).  kv_mcast:
        this CTA's half of each K/V tile (``rank``) into both CTAs' slots, Q only where ``q_hi`` (this
        tile's key tiles) > 0.  Returns the K/V ring state."""
        k_pipe, v_pipe = kv_pipes
        if n_hi > 0:
            W, D, BN = self.consumers, self.head_dim, self.tile_n
            gK = cute.local_tile(seqK, (BN, D), (None, 0))
            if cutlass.const_expr(self.v_transpose):
                gV = cute.local_tile(seqVt, (BN, D), (None, 0))  # (keys, D) tiles into staging
            else:
                gV = cute.local_tile(seqVt, (D, BN), (0, None))
            # (kv_mcast: this CTA's half of each tile, multicast into both CTAs of the pair)
            pair = 2 if self.kv_mcast else 1
            mc = {"mcast_mask": cutlass.Int16(3)} if self.kv_mcast else {}
            tKsK, tKgK = cpasync.tma_partition(tma_k, rank, cute.make_layout(pair),
                                               cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(tma_v, rank, cute.make_layout(pair),
                                               cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
            if cutlass.const_expr(self.k_first):
                k_pipe.producer_acquire(state)
                cute.copy(tma_k, tKgK[(None, n_hi - 1)], tKsK[(None, state.index)],
                          tma_bar_ptr=k_pipe.producer_get_barrier(state), **mc)
            gQ = cute.local_tile(seqQ, (WG_ROWS, D), (None, 0))
            tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1),
                                               cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
            slab_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ.layout, (None, None, 0)))
            if cutlass.const_expr(q_hi is not None):
                if q_hi > 0:
                    self.load_q(tma_q, seqQ, sQ, q_bars, m_block, q_phase)
            else:
                for w in cutlass.range_constexpr(W):
                    if cutlass.const_expr(self.persistent):
                        cute.arch.mbarrier_wait(q_bars + W + w, q_phase ^ 1)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(q_bars + w, slab_bytes)
                    cute.copy(tma_q, tQgQ[(None, m_block * W + w)], tQsQ[(None, w)],
                              tma_bar_ptr=q_bars + w)

            if cutlass.const_expr(self.k_first):
                state_v = state.clone()  # V(n + 1) goes where K(n + 1) went
                state.advance()
                for i in cutlass.range(1, n_hi, unroll=1):
                    n = n_hi - 1 - i
                    k_pipe.producer_acquire(state)
                    cute.copy(tma_k, tKgK[(None, n)], tKsK[(None, state.index)],
                              tma_bar_ptr=k_pipe.producer_get_barrier(state), **mc)
                    v_pipe.producer_acquire(state_v)
                    cute.copy(tma_v, tVgV[(None, n + 1)], tVsV[(None, state_v.index)],
                              tma_bar_ptr=v_pipe.producer_get_barrier(state_v), **mc)
                    state_v = state.clone()
                    state.advance()
                v_pipe.producer_acquire(state_v)
                cute.copy(tma_v, tVgV[(None, 0)], tVsV[(None, state_v.index)],
                          tma_bar_ptr=v_pipe.producer_get_barrier(state_v), **mc)
            else:
                count = n_hi
                if cutlass.const_expr(self.kv_split):
                    count = n_hi - n_lo
                for i in cutlass.range(count, unroll=1):
                    n = n_hi - 1 - i
                    k_pipe.producer_acquire(state)
                    cute.copy(tma_k, tKgK[(None, n)], tKsK[(None, state.index)],
                              tma_bar_ptr=k_pipe.producer_get_barrier(state), **mc)
                    v_pipe.producer_acquire(state)
                    cute.copy(tma_v, tVgV[(None, n)], tVsV[(None, state.index)],
                              tma_bar_ptr=v_pipe.producer_get_barrier(state), **mc)
                    state.advance()
        return state

    @cute.jit
    def pass_q_slabs(self, q_bars, q_phase):
        """``o_in_q``, a tile that sees no key: each Q slab handed to its warpgroup without a load
        once the previous tile's O has left it (the warpgroup writes this tile's O = 0 through
        it)."""
        W = self.consumers
        for w in cutlass.range_constexpr(W):
            cute.arch.mbarrier_wait(q_bars + W + w, q_phase ^ 1)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(q_bars + w)

    @cute.jit
    def load_q(self, tma_q, seqQ, sQ, q_bars, m_block, q_phase=None):
        """The paged producers' Q: one TMA slab per consumer warpgroup, each on its mbarrier (one
        warp issues it; persistent: once the warpgroup has released the previous tile's slab)."""
        W, D = self.consumers, self.head_dim
        gQ = cute.local_tile(seqQ, (WG_ROWS, D), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1),
                                           cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        slab_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ.layout, (None, None, 0)))
        for w in cutlass.range_constexpr(W):
            if cutlass.const_expr(self.persistent):
                cute.arch.mbarrier_wait(q_bars + W + w, q_phase ^ 1)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(q_bars + w, slab_bytes)
            cute.copy(tma_q, tQgQ[(None, m_block * W + w)], tQsQ[(None, w)], tma_bar_ptr=q_bars + w)

    @cute.jit
    def produce_paged(self, tma_q, seqQ, tma_k, seqK, tma_v, seqVt, sQ, sK, sV, q_bars, kv_pipes,
                      m_block, n_lo, n_hi, state, mTable, batch, k_len, warp_idx=0, q_phase=None):
        """The TMA warp over a paged cache: Q slabs, then K and V of tiles n_hi-1 down to n_lo, each
        tile as tile_n / page_box boxes: key j0 of a box lives in page block_table[b][j0 // PS],
        rows from j0 % PS.  Boxes past the sequence's last key reload its last page (those keys
        are masked; their V rows are zeroed by the consumers, ``zero_v_tail``), so every slot
        gets its full byte count and no table entry past the sequence is read.  Warp 0
        (``warp_idx``) loads Q and K's boxes, warp 1 V's (each reads the tile's table entries: a
        tile's issue chain halved, 8-16 boxes a tile for pages smaller than it).  ``v_transpose``
        (the fp8 subclass; its warps 1.. transpose V): warp 0 loads all, V boxes go, as K's, into
        the staging slots the transposing warps read (``sV``/``kv_pipes`` are then the staging
        ring and its pipes)."""
        k_pipe, v_pipe = kv_pipes
        lg, in_page, last_col = 0, 0, 0
        if cutlass.const_expr(self.persistent):
            # page sizes are powers of two (the manifest's page_sizes): a box's page and its
            # place in the page by shifts and masks instead of two integer divisions (8-16
            # boxes a tile); the page's index kept inside the table row for any other size
            lg = cutlass.Int32(cute.arch.bfind(seqK.shape[0]))
            in_page = (cutlass.Int32(1) << lg) - 1
            last_col = mTable.shape[1] - 1
        if n_hi > n_lo:
            D, BN, KB = self.head_dim, self.tile_n, self.page_box
            page_size = seqK.shape[0]
            do_k = do_v = True
            if cutlass.const_expr(not self.v_transpose):
                do_k = warp_idx == 0
                do_v = warp_idx == 1
            if do_k:
                self.load_q(tma_q, seqQ, sQ, q_bars, m_block, q_phase)
            for i in cutlass.range(n_hi - n_lo, unroll=1):
                n = n_hi - 1 - i
                # the tile's table entries, read once for K and V and before the slot wait (the
                # loads are in flight while the consumers free the slot)
                pages, boxes = [], []
                for b in cutlass.range_constexpr(BN // KB):
                    j0 = cutlass.min(n * BN + b * KB, k_len - 1)
                    if cutlass.const_expr(self.persistent):
                        pages.append(mTable[batch, cutlass.min(j0 >> lg, last_col)])
                        boxes.append((j0 & in_page) >> self.box_shift)
                    else:
                        pages.append(mTable[batch, j0 // page_size])
                        boxes.append((j0 % page_size) // KB)
                if do_k:
                    k_pipe.producer_acquire(state)
                    for b in cutlass.range_constexpr(BN // KB):
                        gK = cute.local_tile(seqK[None, None, pages[b]], (KB, D), (boxes[b], 0))
                        dK = cute.local_tile(sK[None, None, state.index], (KB, D), (b, 0))
                        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1),
                                                           cute.group_modes(dK, 0, 2), cute.group_modes(gK, 0, 2))
                        cute.copy(tma_k, tKgK, tKsK, tma_bar_ptr=k_pipe.producer_get_barrier(state))
                if do_v:
                    v_pipe.producer_acquire(state)
                    for b in cutlass.range_constexpr(BN // KB):
                        if cutlass.const_expr(self.v_transpose):
                            # (keys, D) boxes into the staging slot, as K's
                            gV = cute.local_tile(seqVt[None, None, pages[b]], (KB, D), (boxes[b], 0))
                            dV = cute.local_tile(sV[None, None, state.index], (KB, D), (b, 0))
                        else:
                            gV = cute.local_tile(seqVt[None, None, pages[b]], (D, KB), (0, boxes[b]))
                            dV = cute.local_tile(sV[None, None, state.index], (D, KB), (0, b))
                        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1),
                                                           cute.group_modes(dV, 0, 2), cute.group_modes(gV, 0, 2))
                        cute.copy(tma_v, tVgV, tVsV, tma_bar_ptr=v_pipe.producer_get_barrier(state))
                state.advance()
        return state

    @cute.jit
    def produce_gather(self, tma_q, seqQ, seqK, seqVt, sQ, sK, sV, q_bars, kv_pipes, m_block,
                       n_lo, n_hi, state, mTable, batch, k_len, warp_idx, tidx):
        """The producer warpgroup over a paged cache of any page size: warp 0 loads the Q slabs by
        TMA; all 128 threads gather K and V of tiles n_hi-1 down to n_lo by cp.async, 16 bytes at a
        time, key j from page block_table[b][j // PS], row j % PS; each thread arrives on the
        slot's barrier when its copies have landed.

        The block table is read once per thread per tile, one tile ahead: thread (warp w, lane l)
        reads the entry of key row 4w + l % 4 + 16 (l // 4) of the next tile while this tile's
        copies are issued; the copy of row 4w + l // 8 + 16 r (K and V) takes its page and row
        from lane l // 8 + 4 r by a shuffle, so no copy waits on a table load.  Rows past the
        sequence are not loaded (their scores are masked; their V rows are zeroed by the
        consumers, ``zero_v_tail``); the table reads clamp to the sequence's last key, so no
        entry past the sequence is read."""
        k_pipe, v_pipe = kv_pipes
        if n_hi > n_lo:
            D, BN = self.head_dim, self.tile_n
            if warp_idx == 0:
                self.load_q(tma_q, seqQ, sQ, q_bars, m_block)
            vec = 128 // self.dtype.width
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                       self.dtype, num_bits_per_copy=128)
            # K rows (keys, D): 8 threads per 64 columns; V as (D, keys): 8 threads per 64 of D.
            # Either way thread t's keys are t // 8 + 16 r.
            g2s_k = cute.make_tiled_copy_tv(atom, cute.make_layout((16, 8), stride=(8, 1)),
                                            cute.make_layout((1, vec)))
            g2s_v = cute.make_tiled_copy_tv(atom, cute.make_layout((8, 16), stride=(1, 8)),
                                            cute.make_layout((vec, 1)))
            thr_k = g2s_k.get_slice(tidx)
            thr_v = g2s_v.get_slice(tidx)
            # this thread's column offsets (row stride 0); each row adds its page's offset
            tKg = thr_k.partition_S(cute.make_tensor(seqK.iterator, cute.make_layout((BN, D), stride=(0, 1))))
            tVg = thr_v.partition_S(cute.make_tensor(seqVt.iterator, cute.make_layout((D, BN), stride=(1, 0))))
            page_size = seqK.shape[0]
            lane = tidx % 32
            warp = tidx // 32
            # the key row whose table entry this thread reads, and the first row it copies
            read_row = 4 * warp + lane % 4 + 16 * (lane // 4)
            copy_row = 4 * warp + lane // 8
            # table entry of the first (top) tile
            j = cutlass.min((n_hi - 1) * BN + read_row, k_len - 1)
            idx = j // page_size
            in_page = j - idx * page_size
            page = mTable[batch, idx]
            for i in cutlass.range(n_hi - n_lo, unroll=1):
                n = n_hi - 1 - i
                cur_page = page
                cur_in_page = in_page
                # the next tile's entry (tile n - 1; on the last trip a harmless re-read of key 0)
                j = cutlass.min(cutlass.max(n - 1, 0) * BN + read_row, k_len - 1)
                idx = j // page_size
                in_page = j - idx * page_size
                page = mTable[batch, idx]
                k_pipe.producer_acquire(state)
                # the element offset of this thread's table row in K (then V), passed around
                # the warp as two 32-bit halves; the strides keep it a multiple of 16 bytes
                off_k = cutlass.Int64(cur_page) * seqK.stride[2] + cutlass.Int64(cur_in_page) * seqK.stride[0]
                tKs = thr_k.partition_D(sK[None, None, state.index])
                for r in cutlass.range_constexpr(cute.size(tKs.shape[1])):
                    off = self.shuffle_offset(off_k, lane // 8 + 4 * r)
                    if n * BN + copy_row + 16 * r < k_len:
                        row = tKg[None, r, None]
                        cute.copy(g2s_k, cute.make_tensor(row.iterator + off, row.layout), tKs[None, r, None])
                k_pipe.producer_commit(state)
                v_pipe.producer_acquire(state)
                off_v = cutlass.Int64(cur_page) * seqVt.stride[2] + cutlass.Int64(cur_in_page) * seqVt.stride[1]
                tVs = thr_v.partition_D(sV[None, None, state.index])
                for c in cutlass.range_constexpr(cute.size(tVs.shape[2])):
                    off = self.shuffle_offset(off_v, lane // 8 + 4 * c)
                    if n * BN + copy_row + 16 * c < k_len:
                        col = tVg[None, None, c]
                        cute.copy(g2s_v, cute.make_tensor(col.iterator + off, col.layout), tVs[None, None, c])
                v_pipe.producer_commit(state)
                state.advance()
            # no thread leaves with copies (and their barrier arrives) in flight
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
        return state

    @cute.jit
    def produce_gather_fp8(self, tma_q, seqQ, seqK, seqVt, sQ, sK, sV, sK8, sV8, q_bars, kv_pipes,
                           m_block, n_lo, n_hi, state, mTable, batch, k_len, warp_idx, tidx):
        """``produce_gather`` over an e4m3 cache: warp 0 loads the Q slabs by TMA; all 128 threads
        copy K and V rows of tiles n_hi-1 down to n_lo by cp.async (16 bytes = 16 elements, the
        row mapping and offset shuffles of ``produce_gather``) into ``fp8_stages`` e4m3 staging
        tiles each for K (``sK8``) and V (``sV8``), tile n in staging slot (n_hi-1-n) % stages;
        once its own copies of a tile have landed (cp.async.wait_group: visible to the issuing
        thread, no barrier) each thread converts the 16 elements it copied to the dtype (exact)
        and stores them with two 16-byte stores into the swizzled K or V slot, fences them for
        the WGMMAs (async proxy) and arrives on the slot's barrier.  A staging slot is refilled
        (tile n - stages, its table entry read a tile ahead) as soon as it is converted, so
        ``stages`` tiles of copies are in flight while one converts."""
        k_pipe, v_pipe = kv_pipes
        if n_hi > n_lo:
            D, BN, kt, S8 = self.head_dim, self.tile_n, self.kv_dtype, self.fp8_stages
            if warp_idx == 0:
                self.load_q(tma_q, seqQ, sQ, q_bars, m_block)
            vec = 128 // kt.width
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                       kt, num_bits_per_copy=128)
            # K rows (keys, D): 8 threads per 128 columns; V as (D, keys): 8 threads per 128 of D.
            # Either way thread t's keys are t // 8 + 16 r (``produce_gather``'s mapping).
            k_thr = cute.make_layout((16, 8), stride=(8, 1))
            v_thr = cute.make_layout((8, 16), stride=(1, 8))
            g2s_k = cute.make_tiled_copy_tv(atom, k_thr, cute.make_layout((1, vec)))
            g2s_v = cute.make_tiled_copy_tv(atom, v_thr, cute.make_layout((vec, 1)))
            # the converting stores: the same threads and elements, 16-byte stores of the dtype
            st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
            s2s_k = cute.make_tiled_copy_tv(st, k_thr, cute.make_layout((1, vec)))
            s2s_v = cute.make_tiled_copy_tv(st, v_thr, cute.make_layout((vec, 1)))
            thr_k = g2s_k.get_slice(tidx)
            thr_v = g2s_v.get_slice(tidx)
            tKg = thr_k.partition_S(cute.make_tensor(seqK.iterator, cute.make_layout((BN, D), stride=(0, 1))))
            tVg = thr_v.partition_S(cute.make_tensor(seqVt.iterator, cute.make_layout((D, BN), stride=(1, 0))))
            st_k = s2s_k.get_slice(tidx)
            st_v = s2s_v.get_slice(tidx)
            page_size = seqK.shape[0]
            lane = tidx % 32
            warp = tidx // 32
            read_row = 4 * warp + lane % 4 + 16 * (lane // 4)
            copy_row = 4 * warp + lane // 8
            n_rows_k = cute.size(tKg.shape[1])
            n_rows_v = cute.size(tVg.shape[2])

            # the first ``stages`` tiles' K and V copies
            for s8 in cutlass.range_constexpr(S8):
                if n_hi - 1 - s8 >= n_lo:
                    j = cutlass.min((n_hi - 1 - s8) * BN + read_row, k_len - 1)
                    idx = j // page_size
                    page = mTable[batch, idx]
                    in_page = j - idx * page_size
                    off_k = cutlass.Int64(page) * seqK.stride[2] + cutlass.Int64(in_page) * seqK.stride[0]
                    off_v = cutlass.Int64(page) * seqVt.stride[2] + cutlass.Int64(in_page) * seqVt.stride[1]
                    self.issue_fp8_k(g2s_k, tKg, thr_k.partition_D(sK8[None, None, s8]), off_k, n_hi - 1 - s8,
                                     copy_row, lane, k_len, n_rows_k)
                    self.issue_fp8_v(g2s_v, tVg, thr_v.partition_D(sV8[None, None, s8]), off_v, n_hi - 1 - s8,
                                     copy_row, lane, k_len, n_rows_v)
            for i in cutlass.range(n_hi - n_lo, unroll=1):
                n = n_hi - 1 - i
                s8 = i % S8
                ahead = n - S8 >= n_lo  # tile n - stages refills this staging slot
                more = n - 1 >= n_lo    # (stages 2: tile n - 1's copies are in flight)
                # the table entry of tile n - stages (in flight while this tile converts)
                j = cutlass.min(cutlass.max(n - S8, 0) * BN + read_row, k_len - 1)
                idx = j // page_size
                page = mTable[batch, idx]
                in_page = j - idx * page_size
                # K(n) has landed: the groups after it are V(n) (and with 2 stages K, V(n - 1))
                if cutlass.const_expr(S8 == 2):
                    if more:
                        cute.arch.cp_async_wait_group(3)
                    else:
                        cute.arch.cp_async_wait_group(1)
                else:
                    cute.arch.cp_async_wait_group(1)
                k_pipe.producer_acquire(state)
                self.convert_fp8(thr_k.partition_D(sK8[None, None, s8]), st_k.partition_D(sK[None, None, state.index]),
                                 s2s_k, n_rows_k, True)
                cute.arch.fence_proxy("async.shared", space="cta")
                k_pipe.producer_commit(state)
                if ahead:
                    off_k = cutlass.Int64(page) * seqK.stride[2] + cutlass.Int64(in_page) * seqK.stride[0]
                    self.issue_fp8_k(g2s_k, tKg, thr_k.partition_D(sK8[None, None, s8]), off_k, n - S8, copy_row,
                                     lane, k_len, n_rows_k)
                # V(n) has landed: after it K, V(n - 1) (2 stages) and K(n - stages) if issued
                if cutlass.const_expr(S8 == 2):
                    if ahead:
                        cute.arch.cp_async_wait_group(3)
                    elif more:
                        cute.arch.cp_async_wait_group(2)
                    else:
                        cute.arch.cp_async_wait_group(0)
                else:
                    if ahead:
                        cute.arch.cp_async_wait_group(1)
                    else:
                        cute.arch.cp_async_wait_group(0)
                v_pipe.producer_acquire(state)
                self.convert_fp8(thr_v.partition_D(sV8[None, None, s8]), st_v.partition_D(sV[None, None, state.index]),
                                 s2s_v, n_rows_v, False)
                cute.arch.fence_proxy("async.shared", space="cta")
                v_pipe.producer_commit(state)
                if ahead:
                    off_v = cutlass.Int64(page) * seqVt.stride[2] + cutlass.Int64(in_page) * seqVt.stride[1]
                    self.issue_fp8_v(g2s_v, tVg, thr_v.partition_D(sV8[None, None, s8]), off_v, n - S8, copy_row,
                                     lane, k_len, n_rows_v)
                state.advance()
        return state

    @cute.jit
    def issue_fp8_k(self, g2s, tKg, tK8, off_k, n, copy_row, lane, k_len, n_rows: cutlass.Constexpr):
        """cp.async of this thread's K rows of key tile ``n`` (row offsets shuffled from the lanes
        that read them, rows past the sequence skipped) into the staging tile; one commit group."""
        for r in cutlass.range_constexpr(n_rows):
            off = self.shuffle_offset(off_k, lane // 8 + 4 * r, self.kv_dtype)
            if n * self.tile_n + copy_row + 16 * r < k_len:
                row = tKg[None, r, None]
                cute.copy(g2s, cute.make_tensor(row.iterator + off, row.layout), tK8[None, r, None])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def issue_fp8_v(self, g2s, tVg, tV8, off_v, n, copy_row, lane, k_len, n_rows: cutlass.Constexpr):
        """``issue_fp8_k`` for V ((D, keys) views)."""
        for c in cutlass.range_constexpr(n_rows):
            off = self.shuffle_offset(off_v, lane // 8 + 4 * c, self.kv_dtype)
            if n * self.tile_n + copy_row + 16 * c < k_len:
                col = tVg[None, None, c]
                cute.copy(g2s, cute.make_tensor(col.iterator + off, col.layout), tV8[None, None, c])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def convert_fp8(self, t8, dst, s2s, n_rows: cutlass.Constexpr, rows_mode1: cutlass.Constexpr):
        """This thread's staged e4m3 elements -> the dtype -> its places in a K or V slot
        (``dst``: the slot partitioned like the staging tile ``t8``), one key row at a time.  Rows
        past the sequence convert whatever the staging holds (masked scores; V rows zeroed by
        the consumers)."""
        for r in cutlass.range_constexpr(n_rows):
            src = t8[None, r, None] if rows_mode1 else t8[None, None, r]
            to = dst[None, r, None] if rows_mode1 else dst[None, None, r]
            r8 = cute.make_fragment_like(src)
            cute.autovec_copy(src, r8)
            rd = cute.make_fragment_like(to)
            rd.store(r8.load().to(self.dtype))
            cute.copy(s2s, rd, to)

    @cute.jit
    def shuffle_offset(self, off, src_lane, elem=None):
        """Lane ``src_lane``'s 64-bit element offset ``off`` (two 32-bit shuffles), declared a
        multiple of 16 bytes (it is: page and row strides of the cache are); ``elem``: the
        element type (default the dtype)."""
        lo = cute.arch.shuffle_sync(cutlass.Int32(off & 0xFFFFFFFF), src_lane)
        hi = cute.arch.shuffle_sync(cutlass.Int32(off >> 32), src_lane)
        got = (cutlass.Int64(hi) << 32) | (cutlass.Int64(lo) & 0xFFFFFFFF)
        width = self.dtype.width if cutlass.const_expr(elem is None) else elem.width
        return cute.assume(got, divby=128 // width)

    @cute.jit
    def kv_wait(self, pipe, state):
        """Wait for a K or V slot; slots filled by cp.async (``gather``) are generic-proxy writes,
        made visible to this thread's WGMMA (async proxy) by a proxy fence."""
        pipe.consumer_wait(state)
        if cutlass.const_expr(self.gather):
            cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def zero_v_tail(self, sV, slot, tile, k_len, ltid, wg):
        """Paged cache: the V rows of key tile ``tile`` past the sequence's last key hold whatever
        the page holds there (NaN stays NaN times P = 0); zero them in slot ``slot`` before this
        warpgroup's P·V reads it.  Only the sequence's last tile has such rows.  (Both consumer
        warpgroups write the same zeros; each fences its own writes for its WGMMA.)"""
        if cutlass.const_expr(self.page_box or self.gather):
            BN, D = self.tile_n, self.head_dim
            lim = k_len - tile * BN
            if lim < BN:
                # a key's row of the (D, keys) slot is D contiguous elements (16-byte chunks,
                # swizzled as wholes): one 16-byte store of zeros per chunk
                vec = 128 // self.dtype.width
                zeros = cute.make_rmem_tensor(vec, self.dtype)
                zeros.fill(0.0)
                chunks = cute.zipped_divide(sV[None, None, slot], (vec, 1))  # ((vec, 1), (D / vec, keys))
                per_key = D // vec
                for idx in cutlass.range(ltid + lim * per_key, BN * per_key, 128, unroll=1):
                    cute.autovec_copy(zeros, chunks[(None, 0), (idx % per_key, idx // per_key)])
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=int(_Bar.EPILOGUE) + wg, number_of_threads=128)

    @cute.jit
    def consume(self, tiled_mma_qk, tiled_mma_pv, tma_o, seqO, s2g, seqL, sQ, sO, sK, sV, q_bars,
                kv_pipes, scale_log2, m_block, q_len, k_len, n_hi, n_mask, wg, ltid, read,
                q_phase, n_lo=0, mask_lo=0, win=(None, None), cap=None, sink=None, o_scale=None, split=None):
        """One consumer warpgroup: its 64 query rows against every visible key tile (n_hi-1 down
        to n_lo), then its part of the epilogue (kv_split, ``split`` = (rank, receiving buffer,
        its mbarrier): rank 1 sends its partial to rank 0, which merges it and stores).  KV cache
        switches: the window ``win`` (mask.window; tiles < mask_lo masked too), ``cap`` (factor, on) for
        softmax.softcap_scores, ``sink`` (this q head's logit) for softmax.finalize.  Returns the
        K/V ring state ``read``.  ``o_scale``: a factor on O before it is stored (fp8: v_descale)."""
        k_pipe, v_pipe = kv_pipes
        BN, D = self.tile_n, self.head_dim
        thr_qk = tiled_mma_qk.get_slice(ltid)
        thr_pv = tiled_mma_pv.get_slice(ltid)
        tSrQ = tiled_mma_qk.make_fragment_A(thr_qk.partition_A(sQ))    # (MMA, 1, D/16, W)
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))    # (MMA, 1, D/16, S)
        tOrV = tiled_mma_pv.make_fragment_B(thr_pv.partition_B(sV))    # (MMA, 1, BN/16, S)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((WG_ROWS, D)), cutlass.Float32)
        s_shape = thr_qk.partition_shape_C((WG_ROWS, BN))
        tOrP = tiled_mma_pv.make_fragment_A(thr_pv.partition_shape_A((WG_ROWS, BN)))
        # (row, col) of each score within this warpgroup's 64 x BN block
        cS = atoms.acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((WG_ROWS, BN))))
        n_rows = cute.size(cS, mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        row0 = m_block * self.tile_m + wg * WG_ROWS  # first query row of this warpgroup

        n_tiles = n_hi - n_lo
        if n_tiles > 0:
            cute.arch.mbarrier_wait(q_bars + wg, q_phase)
            # ---- the first (top) key tile: S, mask, softmax -> P; O is not touched yet
            acc_S = cute.make_rmem_tensor(s_shape, cutlass.Float32)
            self.kv_wait(k_pipe, read)
            tiled_mma_qk = self.gemm_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, wg, read.index)
            warpgroup.wait_group(0)
            k_pipe.consumer_release(read)
            self.transform_scores(acc_S, cap)
            if cutlass.const_expr(self.diag_half):
                corr = cute.make_rmem_tensor(n_rows, cutlass.Float32)  # O's per-row rescale factor
                # this warpgroup's last row sees no key of the tile's upper half: the lower half
                # alone is masked and exponentiated, the upper half's P is 0
                if row0 + WG_ROWS - 1 + (k_len - q_len) < (n_hi - 1) * BN + BN // 2:
                    s_lo = self.lower_half(acc_S)
                    c_lo = self.lower_half(thr_qk.partition_C(cute.make_identity_tensor((WG_ROWS, BN))))
                    mask.apply_mask(self.mask, atoms.acc_mn_view(s_lo), atoms.acc_mn_view(c_lo), row0,
                                    (n_hi - 1) * BN, q_len, k_len)
                    self.softmax_tile(atoms.acc_mn_view(s_lo), row_max, row_sum, scale_log2, corr)
                    for i in cutlass.range_constexpr(cute.size(acc_S) // 2, cute.size(acc_S)):
                        acc_S[i] = 0.0
                else:
                    self.mask_tile(acc_S, cS, row0, n_hi - 1, q_len, k_len, n_mask, mask_lo, win)
                    self.softmax_tile(atoms.acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr)
            else:
                self.mask_tile(acc_S, cS, row0, n_hi - 1, q_len, k_len, n_mask, mask_lo, win)
                corr = cute.make_rmem_tensor(n_rows, cutlass.Float32)  # O's per-row rescale factor
                self.softmax_tile(atoms.acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr)
            tOrP_c = self.p_operand_view(acc_S, tOrP)
            self.store_p(acc_S, tOrP, tOrP_c, ltid)
            # P·V overwrites O on the first key tile and accumulates afterwards.
            tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, False)
            # ---- the other tiles: P·V of tile n + 1 and S of tile n.  Overlap: the tiles that
            # need the mask (causal: the diagonal ones, visited first) and those that do not run
            # in two loops, so no loop body holds a branch around the mask.
            if cutlass.const_expr(self.overlap):
                i_unmasked = 1
                # trips [i_low, n_tiles): the tiles below the window's mask_lo (masked again)
                i_low = n_tiles
                if cutlass.const_expr(self.causal):
                    i_unmasked = cutlass.max(1, n_hi - n_mask)
                    if cutlass.const_expr(self.mask.local):
                        i_unmasked = cutlass.min(i_unmasked, n_tiles)
                        i_low = cutlass.max(i_unmasked, cutlass.min(n_tiles, n_hi - mask_lo))
                    for i in cutlass.range(1, i_unmasked, unroll=1):
                        read, tiled_mma_qk, tiled_mma_pv = self.overlap_step(
                            True, n_hi - 1 - i, read, kv_pipes, tiled_mma_qk, tiled_mma_pv, acc_O, tOrP,
                            tOrP_c, tSrQ, tSrK, tOrV, s_shape, cS, row_max, row_sum, corr,
                            scale_log2, row0, q_len, k_len, wg, sV, ltid, win, cap)
                for i in cutlass.range(i_unmasked, i_low, unroll=1):
                    read, tiled_mma_qk, tiled_mma_pv = self.overlap_step(
                        False, n_hi - 1 - i, read, kv_pipes, tiled_mma_qk, tiled_mma_pv, acc_O, tOrP,
                        tOrP_c, tSrQ, tSrK, tOrV, s_shape, cS, row_max, row_sum, corr,
                        scale_log2, row0, q_len, k_len, wg, sV, ltid, win, cap)
                if cutlass.const_expr(self.mask.local):
                    for i in cutlass.range(i_low, n_tiles, unroll=1):
                        read, tiled_mma_qk, tiled_mma_pv = self.overlap_step(
                            True, n_hi - 1 - i, read, kv_pipes, tiled_mma_qk, tiled_mma_pv, acc_O, tOrP,
                            tOrP_c, tSrQ, tSrK, tOrV, s_shape, cS, row_max, row_sum, corr,
                            scale_log2, row0, q_len, k_len, wg, sV, ltid, win, cap)
            else:
                for i in cutlass.range(1, n_tiles, unroll=1):
                    # (no overlap: P·V of tile n + 1, then S of tile n)
                    n = n_hi - 1 - i
                    read_v = read.clone()
                    read.advance()
                    acc_S = cute.make_rmem_tensor(s_shape, cutlass.Float32)
                    self.kv_wait(v_pipe, read_v)
                    self.zero_v_tail(sV, read_v.index, n + 1, k_len, ltid, wg)
                    self.schedule_wait(wg)
                    tiled_mma_pv = self.gemm_pv(tiled_mma_pv, acc_O, tOrP, tOrV, read_v.index)
                    warpgroup.wait_group(0)
                    v_pipe.consumer_release(read_v)
                    self.kv_wait(k_pipe, read)
                    tiled_mma_qk = self.gemm_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, wg, read.index)
                    self.schedule_next(wg)
                    warpgroup.wait_group(0)
                    k_pipe.consumer_release(read)
                    self.transform_scores(acc_S, cap)
                    self.mask_tile(acc_S, cS, row0, n, q_len, k_len, n_mask, mask_lo, win)
                    self.softmax_tile(atoms.acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr)
                    softmax.rescale(atoms.acc_mn_view(acc_O), corr)
                    self.store_p(acc_S, tOrP, tOrP_c, ltid)
            if cutlass.const_expr(self.persistent and not self.o_in_q):
                # every S GEMM of this tile has completed: Q's slab may take the next tile's
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(q_bars + self.consumers + wg)
            # ---- P·V of the last tile
            if cutlass.const_expr(self.early_rescale):
                if n_tiles > 1:
                    softmax.rescale(atoms.acc_mn_view(acc_O), corr, skip_ones=self.lazy_rescale)
            self.kv_wait(v_pipe, read)
            self.zero_v_tail(sV, read.index, n_lo, k_len, ltid, wg)
            tiled_mma_pv = self.gemm_pv(tiled_mma_pv, acc_O, tOrP, tOrV, read.index)
            warpgroup.wait_group(0)
            v_pipe.consumer_release(read)
            read.advance()
        else:
            acc_O.fill(0.0)
            if cutlass.const_expr(self.o_in_q):
                cute.arch.mbarrier_wait(q_bars + wg, q_phase)  # the slab O leaves through is ours

        if cutlass.const_expr(self.kv_split):
            rank, sM, m_bar = split
            if rank == 1:
                self.send_half(acc_O, row_max, row_sum, sM, m_bar, ltid)
            else:
                self.merge_half(acc_O, row_max, row_sum, sM, m_bar, ltid, scale_log2)
                self.epilogue(tiled_mma_pv, tma_o, seqO, s2g, seqL, sO, q_bars, acc_O, cS, row_max, row_sum,
                              scale_log2, m_block, q_len, row0, wg, ltid, sink, o_scale)
        else:
            self.epilogue(tiled_mma_pv, tma_o, seqO, s2g, seqL, sO, q_bars, acc_O, cS, row_max, row_sum,
                          scale_log2, m_block, q_len, row0, wg, ltid, sink, o_scale)
        return read

    @cute.jit
    def epilogue(self, tiled_mma_pv, tma_o, seqO, s2g, seqL, sO, q_bars, acc_O, cS, row_max, row_sum,
                 scale_log2, m_block, q_len, row0, wg, ltid, sink, o_scale):
        """A consumer warpgroup's epilogue: O / rowsum and LSE, O -> its Q slab (or O's own) ->
        global (TMA store; varlen: 16-byte stores of the rows inside the sequence)."""
        D = self.head_dim
        softmax.finalize(atoms.acc_mn_view(acc_O), cS, row_max, row_sum, scale_log2, row0, q_len, seqL, ltid,
                         sink=sink)
        if cutlass.const_expr(o_scale is not None):
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                acc_O[i] = acc_O[i] * o_scale
        sO = sO[None, None, wg]
        rO = cute.make_rmem_tensor(acc_O.layout, self.out_dtype)
        if cutlass.const_expr(self.persistent and not self.o_in_q):
            if cutlass.const_expr(self.store_defer):
                # the issuing warp: the previous tile's O store has read this slab
                if ltid < 32:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            # the previous tile's TMA store has read this slab (its issuing warp waited)
            cute.arch.barrier(barrier_id=int(_Bar.EPILOGUE) + wg, number_of_threads=128)
        rO.store(acc_O.load().to(self.out_dtype))
        if cutlass.const_expr(self.o_stmatrix):
            st = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.out_dtype)
            r2s = cute.make_tiled_copy_C(st, tiled_mma_pv).get_slice(ltid)
            cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        else:
            r2s = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.out_dtype, num_bits_per_copy=32),
                tiled_mma_pv).get_slice(ltid)
            cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        # generic-proxy smem writes -> visible to the TMA (async proxy), then all 128 threads
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=int(_Bar.EPILOGUE) + wg, number_of_threads=128)
        gO = cute.local_tile(seqO, (WG_ROWS, D), (m_block * self.consumers + wg, 0))
        if cutlass.const_expr(tma_o is not None):
            if ltid < 32:
                tOsO, tOgO = cpasync.tma_partition(tma_o, 0, cute.make_layout(1),
                                                   cute.group_modes(sO, 0, 2),
                                                   cute.group_modes(gO, 0, 2))
                cute.copy(tma_o, tOsO, tOgO)
                cute.arch.cp_async_bulk_commit_group()
                if cutlass.const_expr(not self.store_defer):
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                if cutlass.const_expr(self.o_in_q):
                    # the store has read O out of Q's slab: the next tile's Q may land there
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive(q_bars + self.consumers + wg)
        else:
            thr = s2g.get_slice(ltid)
            tOsO = thr.partition_S(sO)
            tOgO = thr.partition_D(gO)
            tOcO = thr.partition_D(cute.make_identity_tensor((WG_ROWS, D)))
            tOrO = cute.make_fragment_like(tOsO, self.out_dtype)
            cute.copy(s2g, tOsO, tOrO)
            if cutlass.const_expr(self.o_in_q):
                # every thread has read its rows of O out of Q's slab: the next Q may land there
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=int(_Bar.EPILOGUE) + wg, number_of_threads=128)
                if ltid == 0:
                    cute.arch.mbarrier_arrive(q_bars + self.consumers + wg)
            for r in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                if row0 + tOcO[0, r, 0][0] < q_len:
                    cute.copy(s2g, tOrO[None, r, None], tOgO[None, r, None])

    @cute.jit
    def send_half(self, acc_O, row_max, row_sum, sM, m_bar, ltid):
        """kv_split, rank 1: this thread's O fragment, row maxima and row sums into rank 0's
        receiving buffer (thread-contiguous: ``merge_words`` words from ``ltid · merge_words``;
        the two ranks' threads hold the same (row, column) elements) by 16-byte st.async,
        counted by rank 0's mbarrier."""
        n_o = cute.size(acc_O)
        n_r = cute.size(row_max)
        nw = merge_words(self.head_dim)
        words = cute.make_rmem_tensor(nw, cutlass.Float32)
        for i in cutlass.range_constexpr(n_o):
            words[i] = acc_O[i]
        for r in cutlass.range_constexpr(n_r):
            words[n_o + r] = row_max[r]
            words[n_o + n_r + r] = row_sum[r]
        bits = cute.recast_tensor(words, cutlass.Int32)
        for j in cutlass.range_constexpr(nw // 4):
            dst = cute.local_tile(sM, (4,), (ltid * (nw // 4) + j,))
            cute.arch.store_async_dsmem(dst.iterator, (bits[4 * j], bits[4 * j + 1], bits[4 * j + 2], bits[4 * j + 3]),
                                        m_bar, 0)

    @cute.jit
    def merge_half(self, acc_O, row_max, row_sum, sM, m_bar, ltid, scale_log2):
        """kv_split, rank 0: once rank 1's bytes have landed, its partial merged into this
        thread's, as split-KV merges: m = max(m0, m1), O = O0·2^((m0-m)·s) + O1·2^((m1-m)·s), the
        sums likewise (a half with no key: max -inf, weight 0)."""
        n_o = cute.size(acc_O)
        n_r = cute.size(row_max)
        base = ltid * merge_words(self.head_dim)
        cute.arch.mbarrier_wait(m_bar, 0)
        c0 = cute.make_rmem_tensor(n_r, cutlass.Float32)
        c1 = cute.make_rmem_tensor(n_r, cutlass.Float32)
        for r in cutlass.range_constexpr(n_r):
            m1 = sM[base + n_o + r]
            m = cute.arch.fmax(row_max[r], m1)
            m_scaled = (0.0 if m == -cutlass.Float32.inf else m) * scale_log2
            c0[r] = cute.math.exp2(row_max[r] * scale_log2 - m_scaled, fastmath=True)
            c1[r] = cute.math.exp2(m1 * scale_log2 - m_scaled, fastmath=True)
            row_sum[r] = row_sum[r] * c0[r] + sM[base + n_o + n_r + r] * c1[r]
            row_max[r] = m
        o1 = cute.make_rmem_tensor(acc_O.layout, cutlass.Float32)
        for i in cutlass.range_constexpr(n_o):
            o1[i] = sM[base + i]
        softmax.rescale(atoms.acc_mn_view(acc_O), c0)
        softmax.rescale(atoms.acc_mn_view(o1), c1)
        for i in cutlass.range_constexpr(n_o):
            acc_O[i] = acc_O[i] + o1[i]

    @cute.jit
    def overlap_step(self, masked: cutlass.Constexpr, n, read, kv_pipes, tiled_mma_qk, tiled_mma_pv, acc_O,
                     tOrP, tOrP_c, tSrQ, tSrK, tOrV, s_shape, cS, row_max, row_sum, corr,
                     scale_log2, row0, q_len, k_len, wg, sV=None, ltid=None, win=(None, None),
                     cap=None):
        """One trip of the overlapped mainloop: S of key tile n is issued first, P·V of tile
        n + 1 queues behind it, and the softmax of tile n runs while P·V is on the tensor cores.
        Returns the advanced read state and the P·V MMA (accumulate flag set)."""
        k_pipe, v_pipe = kv_pipes
        read_v = read.clone()
        read.advance()
        acc_S = cute.make_rmem_tensor(s_shape, cutlass.Float32)
        self.kv_wait(k_pipe, read)
        self.schedule_wait(wg)
        tiled_mma_qk = self.gemm_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, wg, read.index)
        if cutlass.const_expr(self.early_rescale):
            # (on the first tile: garbage, overwritten)
            softmax.rescale(atoms.acc_mn_view(acc_O), corr, skip_ones=self.lazy_rescale)
        self.kv_wait(v_pipe, read_v)
        self.zero_v_tail(sV, read_v.index, n + 1, k_len, ltid, wg)
        tiled_mma_pv = self.gemm_pv(tiled_mma_pv, acc_O, tOrP, tOrV, read_v.index)
        self.schedule_next(wg)
        warpgroup.wait_group(1)
        k_pipe.consumer_release(read)
        self.transform_scores(acc_S, cap)
        if cutlass.const_expr(masked):
            mask.apply_mask(self.mask, atoms.acc_mn_view(acc_S), cS, row0, n * self.tile_n, q_len, k_len,
                            win=win)
        if cutlass.const_expr(self.lazy_rescale):
            softmax.online_softmax_lazy(atoms.acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr,
                                        LAZY_RESCALE_LOG2)
        else:
            self.softmax_tile(atoms.acc_mn_view(acc_S), row_max, row_sum, scale_log2, corr)
        warpgroup.wait_group(0)
        v_pipe.consumer_release(read_v)
        if cutlass.const_expr(not self.early_rescale):
            softmax.rescale(atoms.acc_mn_view(acc_O), corr, skip_ones=self.lazy_rescale)
        self.store_p(acc_S, tOrP, tOrP_c, ltid)
        return read, tiled_mma_qk, tiled_mma_pv

    def softmax_tile(self, s_mn, row_max, row_sum, scale_log2, corr):
        """One key tile's online softmax (P in place of S, O factors in ``corr``)."""
        if cutlass.const_expr(self.ex2_fma or self.ex2_pairs):
            softmax_ex2.online_softmax_ex2(s_mn, row_max, row_sum, scale_log2, corr, self.ex2_fma,
                                           self.ex2_degree, self.ex2_pairs)
        else:
            softmax.online_softmax(s_mn, row_max, row_sum, scale_log2, corr=corr)

    def lower_half(self, t):
        """A WGMMA accumulator partition ``((2, 2, V), 1, 1)`` (or an identity tensor partitioned
        like one) restricted to its first V/2 column groups: the tile's first half of columns
        (column 8·v + 2·(lane % 4) + b of value (b, ·, v))."""
        sh = t.layout.shape
        return cute.make_tensor(t.iterator, cute.composition(
            t.layout, cute.make_layout(((sh[0][0], sh[0][1], sh[0][2] // 2), sh[1], sh[2]))))

    def p_operand_view(self, acc_S, tOrP):
        """The view P is stored through (16-bit: the A fragment seen with S's layout)."""
        return atoms.acc_as_a_operand(acc_S.layout, tOrP)

    @cute.jit
    def store_p(self, acc_S, tOrP, tOrP_c, ltid):
        """P (the softmax of S, fp32 in S's accumulator registers) into the A fragment of P·V."""
        tOrP_c.store(acc_S.load().to(self.dtype))

    def problem_scales(self, scale_log2, mDescale, head, batch, n_heads, n_kv_heads):
        """(score scale in log2 units, factor on O) of one (q head, batch) problem: the launch's
        scale and no factor; the fp8 subclass folds its descales in, as does an fp8 KV cache
        (``mDescale`` the contract's (k_descale, v_descale): k_descale on the scores, v_descale on O)."""
        if cutlass.const_expr(self.kv_fp8):
            kv_head = head // (n_heads // n_kv_heads)
            return scale_log2 * mDescale[0][kv_head], mDescale[1][kv_head]
        return scale_log2, None

    @cute.jit
    def mask_tile(self, acc_S, cS, row0, n, q_len, k_len, n_mask, mask_lo, win):
        """The mask on key tile ``n`` where it needs one: n >= n_mask, and with the window n <
        mask_lo."""
        if cutlass.const_expr(self.mask.local):
            if n >= n_mask or n < mask_lo:
                mask.apply_mask(self.mask, atoms.acc_mn_view(acc_S), cS, row0, n * self.tile_n, q_len, k_len,
                                win=win)
        else:
            if n >= n_mask:
                mask.apply_mask(self.mask, atoms.acc_mn_view(acc_S), cS, row0, n * self.tile_n, q_len, k_len)

    @cute.jit
    def transform_scores(self, acc_S, cap):
        """The softcap switch: tanh-capped scores where the launch's softcap is on (``cap``:
        (factor, on)); nothing without the switch."""
        if cutlass.const_expr(cap is not None):
            softmax.softcap_scores(acc_S, cap[0], cap[1])

    @cute.jit
    def gemm_qk(self, tiled_mma_qk, acc_S, tSrQ, tSrK, wg, slot):
        """Issue S = Q·Kᵀ (overwriting acc_S) as one WGMMA group."""
        warpgroup.fence()
        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, False)
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(tiled_mma_qk, acc_S, tSrQ[None, None, kb, wg], tSrK[None, None, kb, slot],
                      acc_S)
            tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        return tiled_mma_qk

    @cute.jit
    def gemm_pv(self, tiled_mma_pv, acc_O, tOrP, tOrV, slot):
        """Issue O (+)= P·V as one WGMMA group; P from registers.  Returns ``tiled_mma_pv`` with
        its accumulate flag set (the DSL carries the flag through loops only as a rebound local)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(tiled_mma_pv, acc_O, tOrP[None, None, kb], tOrV[None, None, kb, slot], acc_O)
            tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        return tiled_mma_pv

    @cute.jit
    def schedule_start(self, wg):
        """Ping-pong: the first consumer warpgroup issues first (once per CTA: a persistent CTA's
        tiles continue the turn order, each warpgroup making the same number of turns)."""
        if cutlass.const_expr(self.pingpong):
            if wg == 0:
                cute.arch.barrier_arrive(barrier_id=int(_Bar.SCHEDULE), number_of_threads=256)

    @cute.jit
    def schedule_wait(self, wg):
        """Ping-pong: wait for this warpgroup's turn to issue GEMMs."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=int(_Bar.SCHEDULE) + wg, number_of_threads=256)

    @cute.jit
    def schedule_next(self, wg):
        """Ping-pong: hand the turn to the next consumer warpgroup."""
        if cutlass.const_expr(self.pingpong):
            nxt = wg + 1
            if nxt == self.consumers:
                nxt = 0
            cute.arch.barrier_arrive(barrier_id=int(_Bar.SCHEDULE) + nxt, number_of_threads=256)
