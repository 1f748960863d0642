"""Hopper (sm_90a) grouped GEMM for mixture-of-experts layers: one persistent launch over all groups.

``out[rows of group g] = a[rows of group g] · b[g]ᵀ`` with the weights of E groups (experts) stacked
as b (E, N, K) (K contiguous) and bf16 tokens, in one of two layouts:

* ``contig`` (torch ``_grouped_mm`` / DeepGEMM "m-grouped contiguous"): a (M_total, K) holds the
  tokens sorted by group; ``offs`` (E,) int32 on the device holds each group's end row (cumulative),
  group g owning rows [offs[g-1], offs[g]) (offs[-1] = 0); out (M_total, N).
* ``masked`` (DeepGEMM "m-grouped masked", decode under CUDA graphs): a (E, max_m, K), ``masked_m``
  (E,) int32 on the device: group g owns its first masked_m[g] rows; out (E, max_m, N), rows past a
  group's count neither computed nor stored.

Nothing about the groups is known on the host.  Each CTA first turns the device counts into a
table in shared memory (one warp, a warp-shuffle prefix sum): ``tile_start[g]``, the first tile of
group g in one linear walk over every group's (m-tile, n-tile) pairs, so group g holds
``ceil(rows_g / tile_m) · ceil(N / tile_n)`` tiles and empty groups none.  The persistent CTAs
then take tiles ``t = cta, cta + grid, ...`` while ``t < tile_start[E]``, each finding its group
by a binary search of the table and its (m, n) inside the group in bands of ``swizzle`` m-tiles
(the CTAs running at once share a band's B columns and A rows in L2).  No host synchronisation, no
per-group launch, no workspace.

Bounds.  A is read through one TMA descriptor over the whole (M, K, L) tensor, at the group's row
offset: rows of the next group (or past the tensor, zero-filled) enter the last m-tile of a group
but only its own rows are stored.  Whole tiles leave through the TMA store; the last, partial
m-tile of a group is stored by the epilogue threads element by element from the same staged smem
sub-tile, each row checked against the group's end and each column against N.  (Per-group
descriptors would need a tensor-map workspace rewritten on the device per group; one descriptor
and a masked store of the one partial tile per group cost nothing on the whole tiles.)  Rows are
clamped to the tensor: offsets past M_total, decreasing offsets or counts past max_m read and
write nothing outside a and out.

fp8 (e4m3 a and b, bf16 out; ``row_scale`` / ``block_scale``), accumulated in two levels (each
k-block's partial sum added into fp32 registers, ``atoms.promoted_mainloop``):

* row scales: scale_a one per row of a (contiguous (M,), masked (E, max_m)), scale_b one per group
  and output column (E, N); out[m, n] = sa[m]·sb[g, n]·Σ_k a[m, k]·b[g, n, k], applied to the
  accumulators before the epilogue (``atoms.apply_row_col_scales`` on the group's views).
* block scales (DeepSeek-V3): KB = ceil(K/128), NB = ceil(N/128); scale_a one per row and k-block,
  M-major (contiguous (M, KB) strides (1, s); masked (E, max_m, KB) strides (s_e, 1, s)), s a
  multiple of 4; scale_b (E, NB, KB) K-contiguous; each k-block's partial sum is multiplied per
  row by scale_a[row, kb]·scale_b[g, n // 128, kb] as it is added.  The producer loads the tile
  rows' scale_a column of each k-block by TMA into the k-block's stage, at the group's row
  offset like A (rows of the next group or the zero fill enter only rows that are not stored);
  contiguous layout: from that row rounded down to a multiple of 4, with 4 more rows, since a TMA
  box must start 16-byte aligned in its innermost mode (M here) and groups start anywhere.

Warp roles are those of gemm/sm90.py (a TMA producer warp; one or two consumer warpgroups, ``coop``
splitting a 128- or 256-row tile along M, ``ws`` one warpgroup on a 64-row tile).  ``pair``: clusters
of two CTAs on vertically adjacent m-tiles of one group and n-tile, the walk stepping over pairs of
m-tiles, each CTA loading half of the B tile and multicasting it to both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils

from ..abi import DTYPE_BYTES, ScalarArg, Signature, TensorArg
from ..atoms import sm90 as atoms
from ..atoms.smem import BARRIER_BYTES as _BARRIER_BYTES
from ..atoms.smem import SMEM_ALIGN as _SMEM_ALIGN
from ..atoms.smem import STATIC_SMEM as _STATIC_SMEM
from ..atoms.smem import round_up as _round_up
from ..atoms.targets import Target
from ..registry import register
from ..variant import Variant

# Most groups one launch takes: the shared-memory tile table holds MAX_GROUPS + 1 entries.
MAX_GROUPS = 1024
LAYOUTS = ("contig", "masked")
_EPILOGUE_BAR = 1
_BLOCK_K = atoms.BLOCK_SCALE_K
# Block scale_a rows per 16 bytes: a TMA box's start in the innermost mode must be 16-byte aligned
# (an unaligned start stops the kernel with an illegal instruction on the H100).
SCALE_ROW_ALIGN = 4


def scale_box_rows(tile_m: int, masked: bool) -> int:
    """Rows of the block scale_a box a stage holds: the tile's (masked: m-tiles start on tile
    multiples) or SCALE_ROW_ALIGN more (contiguous: the box starts at the tile's first row rounded
    down to a multiple of SCALE_ROW_ALIGN)."""
    return tile_m if masked else tile_m + SCALE_ROW_ALIGN


@dataclass(frozen=True, kw_only=True)
class GemmGroupedSm90(Variant):
    """One grouped-GEMM config (module docstring).  ``tile`` (M, N, K): K is one 128-byte row (64
    bf16); ``schedule`` ``coop`` (tile M 128, two consumer warpgroups) or ``ws`` (tile M 64, one);
    ``swizzle``: m-tiles per band of the walk inside a group."""

    op: ClassVar[str] = "gemm_grouped"
    family: ClassVar[str] = "sm90_grouped"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm90_grouped.py", "atoms/sm90.py")
    required_sass: ClassVar[tuple[str, ...]] = (r"\bHGMMA\.64x", r"\bUTMALDG\.[23]D", r"\bUTMASTG\.[23]D",
                                                r"\bSHFL\.UP\b", r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1")

    ab: str = field(default="bf16", metadata={"tag": ""})
    c: str = field(default="bf16", metadata={"tag": "o"})
    layout: str = field(default="contig", metadata={"tag": ""})
    tile: tuple[int, int, int] = field(default=(128, 256, 64), metadata={"tag": "t"})
    schedule: str = field(default="coop", metadata={"tag": ""})
    swizzle: int = field(default=8, metadata={"tag": "sw"})
    # Clusters of two CTAs on vertically adjacent m-tiles of one group and one n-tile, each
    # loading half of the shared B tile and multicasting it to both.
    pair: bool = field(default=False, metadata={"tag": "pair"})
    # coop tiles: a tile whose rows of the group fit the first warpgroup's 64 (a group's last,
    # partial m-tile) leaves the tensor cores to that warpgroup: the second one skips its WGMMAs
    # and releases each stage as it arrives (its rows are never stored).
    tail_half: bool = field(default=False, metadata={"tag": "th"})
    # tail_half with the second warpgroup out of the ring: on such a tile it neither waits for nor
    # releases the stages (its pipeline states skip them); the first warpgroup's warps release each
    # stage for both (mbarrier arrive count 2).
    tail_solo: bool = field(default=False, metadata={"tag": "ts"})
    # fp8 scale forms (module docstring); e4m3 operands take exactly one.
    row_scale: bool = field(default=False, metadata={"tag": "rowsc"})
    block_scale: bool = field(default=False, metadata={"tag": "blksc"})
    # fp8: each k-block's partial sum is promoted while the next k-block's WGMMAs run, the loop
    # draining once per atoms.PROMOTE_AHEAD_UNROLL k-blocks instead of every two.
    promote_ahead: bool = field(default=False, metadata={"tag": "pa"})
    # fp8: one partial sum per warpgroup, each k-block promoted before the next is issued (the two
    # coop warpgroups keep the tensor core busy in turn); atoms.promoted_mainloop_serial.
    promote_serial: bool = field(default=False, metadata={"tag": "ps"})
    # Block scales: scale_b's value for each k-block travels in the k-block's stage (one 4-byte
    # cp.async by the producer warp, tracked by the stage's full mbarrier; atoms.stage_scale_b).
    scale_b_stage: bool = field(default=False, metadata={"tag": "sbst"})
    # Block scales, coop tiles: the second warpgroup's pair loop is offset by one k-block from the
    # first's, so one warpgroup's WGMMAs run while the other drains and promotes.
    stagger: bool = field(default=False, metadata={"tag": "stg"})
    # Block scales: every promotion FFMA may yield the scheduler (see gemm/sm90.py's field).
    ffma_yield: bool = field(default=False, metadata={"tag": "fy"})

    @property
    def is_fp8(self) -> bool:
        return self.ab == "e4m3"

    @property
    def scale_mode(self) -> str | None:
        """None (bf16/f16), "row" or "block"."""
        return "row" if self.row_scale else "block" if self.block_scale else None

    @property
    def cluster_m(self) -> int:
        return 2 if self.pair else 1

    # --- contract ---------------------------------------------------------------------------------
    def signature(self) -> Signature:
        va, vc = 16 // DTYPE_BYTES[self.ab], 16 // DTYPE_BYTES[self.c]
        if self.layout == "contig":
            a = TensorArg("a", self.ab, ("M", "K", 1), ("sAm", 1, 0))
            c = TensorArg("c", self.c, ("M", "N", 1), ("sCm", 1, 0))
            groups = TensorArg("offs", "i32", ("E",), (1,), align=4)
        else:
            a = TensorArg("a", self.ab, ("M", "K", "E"), ("sAm", 1, "sAl"))
            c = TensorArg("c", self.c, ("M", "N", "E"), ("sCm", 1, "sCl"))
            groups = TensorArg("masked_m", "i32", ("E",), (1,), align=4)
        b = TensorArg("b", self.ab, ("N", "K", "E"), ("sBn", 1, "sBe"))
        div = {"K": va, "N": vc, "sAm": va, "sAl": va, "sBn": va, "sBe": va, "sCm": vc, "sCl": vc}
        sig_args = (a, b, c, groups, *self.scale_args(), ScalarArg("max_clusters", "i32"))
        if self.block_scale:  # scale_a's k-block columns (and masked groups) are TMA rows: 16-byte strides
            div.update(sSAk=4, sSAe=4)
        syms = {d for t in sig_args if isinstance(t, TensorArg) for d in (*t.shape, *t.stride) if isinstance(d, str)}
        return Signature(sig_args, tuple(sorted((k, v) for k, v in div.items() if k in syms)))

    def scale_args(self) -> tuple:
        """The fp8 forms' two float32 scale arguments (after the routing tensor); none for bf16/f16.
        Sizes' relations (KB = ceil(K/128), NB = ceil(N/128)) are checked by runtime/fp8.py and the
        host library."""
        masked = self.layout == "masked"
        if self.row_scale:
            sa = (TensorArg("scale_a", "f32", ("M", "E"), (1, "sSAe"), align=4) if masked
                  else TensorArg("scale_a", "f32", ("M",), (1,), align=4))
            return sa, TensorArg("scale_b", "f32", ("N", "E"), (1, "sSBe"), align=4)
        if self.block_scale:
            sa = (TensorArg("scale_a", "f32", ("M", "KB", "E"), (1, "sSAk", "sSAe"), align=16) if masked
                  else TensorArg("scale_a", "f32", ("M", "KB"), (1, "sSAk"), align=16))
            return sa, TensorArg("scale_b", "f32", ("NB", "KB", "E"), ("sSBn", 1, "sSBe"), align=4)
        return ()

    def sass_requirements(self) -> tuple[str, ...]:
        req = self.required_sass
        if self.is_fp8:  # fp8 WGMMA disassembles as QGMMA
            req = (r"\bQGMMA\.64x\d+x32\.F32\.E4M3",) + req[1:]
        if self.promote_serial:  # every k-block is waited for (wait_group(0)) by design
            req = tuple(r for r in req if "DEPBAR" not in r)
        if self.scale_b_stage:  # scale_b's 4-byte cp.async per stage, tracked by its full mbarrier
            req += (r"\bLDGSTS\b", r"\bARRIVES\.LDGSTSBAR\b")
        return req + ((r"\bUTMALDG\.3D\.MULTICAST",) if self.cluster_m > 1 else ())

    # --- validity ---------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm90":
            return f"target {self.target} is not a Hopper (sm90) target"
        if self.is_fp8:
            if self.c != "bf16":
                return "fp8 grouped GEMM writes bf16"
            if self.row_scale == self.block_scale:
                return "e4m3 operands take row or block scales (one form)"
            if self.pair or self.tail_half or self.tail_solo:
                return "fp8 forms run without the 2-CTA cluster and the tail forms"
            if self.promote_ahead and self.promote_serial:
                return "promote_ahead and promote_serial are two forms of the main loop: one of them"
            if (self.scale_b_stage or self.stagger or self.ffma_yield) and not self.block_scale:
                return "scale_b_stage / stagger / ffma_yield apply to block scales"
            if self.scale_b_stage and self.promote_serial:
                return "scale_b_stage runs with the pair loop or promote_ahead"
            if self.stagger and (self.schedule != "coop" or self.promote_ahead or self.promote_serial):
                return "stagger offsets the pair loop of the two warpgroups of a coop tile"
            if self.block_scale and _BLOCK_K % self.tile[1]:
                return f"block scales need a tile N dividing {_BLOCK_K}"
            if 3 * self.tile[0] * self.tile[1] // (self.mma_wgs * 128) > 192:
                return "more than 192 fp32 accumulator registers (three sets) per consumer thread"
        elif (self.tail_half or self.tail_solo) and (self.schedule != "coop" or self.tile[0] != 128 or self.pair):
            return "tail_half / tail_solo apply to the 128-row coop tiles (two 64-row warpgroups) without a cluster"
        elif self.tail_half and self.tail_solo:
            return "tail_half and tail_solo are two forms of one idea: one of them"
        elif self.promote_ahead or self.promote_serial or self.scale_b_stage or self.stagger or self.ffma_yield:
            return "promote_ahead / promote_serial / scale_b_stage / stagger apply to the fp8 forms"
        elif self.ab not in ("bf16", "f16") or self.c not in ("bf16", "f16"):
            return "grouped GEMM takes bf16/f16 operands and output (or e4m3 with row or block scales)"
        elif self.row_scale or self.block_scale:
            return "row and block scales apply to e4m3 only"
        if self.layout not in LAYOUTS:
            return f"layout must be one of {LAYOUTS}"
        tm, tn, tk = self.tile
        if tk != 128 // DTYPE_BYTES[self.ab]:
            return "tile K must be one 128-byte row"
        if (self.schedule, tm) not in (("coop", 128), ("coop", 256), ("ws", 64)):
            return "coop takes tile M 128 or 256, ws tile M 64"
        if not 32 <= tn <= 256 or tn % 32:
            return "tile N must be a multiple of 32 up to 256"
        if self.swizzle < 1:
            return "swizzle must be >= 1"
        if tn % (8 * self.cluster_m):
            return "the B tile must divide among the cluster's CTAs"
        plan = self.plan()
        if plan["ab_stages"] < 2:
            return f"only {plan['ab_stages']} smem stage(s) fit"
        return None

    @property
    def cubin_edits(self) -> tuple[str, ...]:
        """Edits the build applies to the compiled cubin before it ships (compiler/sass_patch.py
        EDITS): ``ffma_yield`` lets every promotion FFMA yield the scheduler."""
        return ("yield_ffma",) if self.ffma_yield else ()

    # --- derived ----------------------------------------------------------------------------------
    @property
    def mma_wgs(self) -> int:
        return 2 if self.schedule == "coop" else 1

    def plan(self) -> dict:
        tm, tn, tk = self.tile
        ab, cb = DTYPE_BYTES[self.ab], DTYPE_BYTES[self.c]
        epi_tile = (min(tm, 64 * self.mma_wgs), min(tn, 32))
        stage = _round_up(tm * tk * ab, _SMEM_ALIGN) + _round_up(tn * tk * ab, _SMEM_ALIGN)
        if self.block_scale:  # the k-block's scale_a column for the tile's rows, by TMA
            stage += _round_up(4 * scale_box_rows(tm, self.layout == "masked") + (4 if self.scale_b_stage else 0),
                               _SMEM_ALIGN)
        table = _round_up(4 * (MAX_GROUPS + 1), _SMEM_ALIGN)
        best = None
        for epi_stages in (4, 2):  # fewer epilogue buffers where that frees a mainloop stage
            epi = _round_up(epi_tile[0] * epi_tile[1] * cb, _SMEM_ALIGN) * epi_stages
            free = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - epi - table
            stages = min(free // stage, 8)
            if best is None or stages > best["ab_stages"]:
                best = dict(epi_tile=epi_tile, epi_stages=epi_stages, ab_stages=stages,
                            smem_bytes=_BARRIER_BYTES + stages * stage + epi + table)
        return best

    def smem_bytes(self) -> int:
        return self.plan()["smem_bytes"]

    def describe(self) -> dict[str, Any]:
        plan = self.plan()
        sig = self.signature()
        return {
            "dtypes": {"a": self.ab, "b": self.ab, "c": self.c, "acc": "f32"},
            "layout": {"a": "k", "b": "k", "c": "n"},
            "grouped": self.layout,
            "scaled": self.is_fp8,
            "scale_mode": self.scale_mode,
            "fp8_accumulation": "promoted" if self.is_fp8 else None,
            "max_groups": MAX_GROUPS,
            "tile": list(self.tile),
            "cluster": [self.cluster_m, 1],
            "schedule": self.schedule,
            "swizzle": self.swizzle,
            "stages": plan["ab_stages"],
            "smem_bytes": plan["smem_bytes"],
            "threads": 128 * (1 + self.mma_wgs),
            "persistent": {"arg": "max_clusters", "cluster_ctas": self.cluster_m},
            "constraints": {"divisibility": dict(sig.divisibility), "align_bytes": 16,
                            "tails": ["M", "N", "K"]},
        }

    def make_kernel(self):
        plan = self.plan()
        kernel = GroupedGemmSm90Kernel(tile=self.tile, mma_wgs=self.mma_wgs, epi_tile=plan["epi_tile"],
                                       ab_stages=plan["ab_stages"], epi_stages=plan["epi_stages"],
                                       masked=self.layout == "masked", swizzle=self.swizzle,
                                       cluster_m=self.cluster_m, scale_mode=self.scale_mode,
                                       promote_ahead=self.promote_ahead, promote_serial=self.promote_serial,
                                       scale_b_stage=self.scale_b_stage, stagger=self.stagger,
                                       tail_half=self.tail_half, tail_solo=self.tail_solo)
        return kernel.scaled if self.is_fp8 else kernel


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GroupedGemmSm90Kernel:
    """Host side ``__call__(a, b, c, groups, max_clusters, stream)``; device side ``kernel``."""

    def __init__(self, *, tile, mma_wgs, epi_tile, ab_stages, epi_stages, masked, swizzle, cluster_m=1,
                 scale_mode=None, promote_ahead=False, promote_serial=False, scale_b_stage=False, stagger=False,
                 tail_half=False, tail_solo=False):
        self.tail_half = tail_half
        self.tail_solo = tail_solo
        self.scale_b_stage = scale_b_stage
        self.stagger = stagger
        self.sSB_elems = ab_stages if scale_b_stage else 0  # staged scale_b: one value per stage
        self.promote_ahead = promote_ahead
        self.promote_serial = promote_serial
        self.tile = tuple(tile)
        self.mma_wgs = mma_wgs
        self.epi_threads = 128 * mma_wgs
        self.threads = 128 * (1 + mma_wgs)
        self.epi_tile = tuple(epi_tile)
        self.ab_stages = ab_stages
        self.epi_stages = epi_stages
        self.masked = masked
        self.swizzle = swizzle
        self.consumer_regs = atoms.GEMM_CONSUMER_REGS[mma_wgs]
        # Rows of one walk step: a cluster's m-tiles (one per CTA, rank r taking the r-th).
        self.cluster_m = cluster_m
        self.step_m = tile[0] * cluster_m
        self.scale_mode = scale_mode
        self.block = scale_mode == "block"

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, groups: cute.Tensor,
                 max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, groups, None, None, max_clusters, stream)

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, groups: cute.Tensor, scale_a: cute.Tensor,
               scale_b: cute.Tensor, max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, groups, scale_a, scale_b, max_clusters, stream)

    @cute.jit
    def _launch(self, a, b, c, groups, scale_a, scale_b, max_clusters, stream):
        ab_dtype, c_dtype = a.element_type, c.element_type
        a_layout = utils.LayoutEnum.from_tensor(a)
        b_layout = utils.LayoutEnum.from_tensor(b)
        c_layout = utils.LayoutEnum.from_tensor(c)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab_dtype, b.element_type, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            cutlass.Float32, (self.mma_wgs, 1, 1), tiler_mn=(64, self.tile[1]),
        )
        sA_layout = sm90_utils.make_smem_layout_a(a_layout, self.tile, ab_dtype, self.ab_stages)
        sB_layout = sm90_utils.make_smem_layout_b(b_layout, self.tile, ab_dtype, self.ab_stages)
        sC_layout = sm90_utils.make_smem_layout_epi(c_dtype, c_layout, self.epi_tile, self.epi_stages)
        tma_a, gA = atoms.tma_load_atom(a, sA_layout, (self.tile[0], self.tile[2]))
        tma_b, gB = atoms.tma_load_atom(b, sB_layout, (self.tile[1], self.tile[2]), self.cluster_m)
        tma_c, gC = atoms.tma_store_atom(c, sC_layout, self.epi_tile)
        # Block scales: each stage also holds scale_a[tile rows, kb], a (tile M, 1) box of the
        # M-major scales (rows past the tensor: TMA zero fill).
        # Contiguous layout: a group's rows start anywhere, and a TMA box must start on a 16-byte
        # boundary of the innermost (M) mode, so the box starts at the tile's first row rounded
        # down to a multiple of 4 and holds SCALE_ROW_ALIGN more rows; each stage's slot is padded
        # to 128 bytes (TMA destinations).
        box_rows = scale_box_rows(self.tile[0], self.masked)
        if cutlass.const_expr(self.masked):
            sSA_layout = cute.make_layout((self.tile[0], 1, self.ab_stages))
        else:
            slot = _round_up(box_rows, 32)
            sSA_layout = cute.make_layout((box_rows, 1, self.ab_stages), stride=(1, slot, slot))
        tma_sa = mSA = None
        if cutlass.const_expr(self.block):
            tma_sa, mSA = atoms.tma_load_atom(scale_a, sSA_layout, (box_rows, 1))

        # Persistent grid: at most max_clusters CTAs and at most the tiles any routing can make
        # (contiguous: each group adds at most one partial m-tile).
        tm, tn = self.tile[0], self.tile[1]
        n_groups = groups.shape[0]
        n_tiles = (c.shape[1] + tn - 1) // tn
        m_tiles = (a.shape[0] + self.step_m - 1) // self.step_m
        bound = n_tiles * (m_tiles * n_groups if cutlass.const_expr(self.masked) else m_tiles + n_groups)
        ctas = cutlass.max(cutlass.min(max_clusters, bound), cutlass.Int32(1)) * self.cluster_m

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            tile_start: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, MAX_GROUPS + 1], _SMEM_ALIGN]
            sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]
            sSA: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, cute.cosize(sSA_layout) + self.sSB_elems if self.block else 1],
                _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        self.ab_dtype = ab_dtype
        self.c_layout = c_layout
        launch = self.kernel(tma_a, gA, tma_b, gB, tma_c, gC, c, groups, scale_a, scale_b, tma_sa, mSA, tiled_mma,
                             sA_layout, sB_layout, sC_layout, sSA_layout)
        if cutlass.const_expr(self.cluster_m > 1):
            launch.launch(grid=(ctas, 1, 1), block=[self.threads, 1, 1], cluster=(self.cluster_m, 1, 1),
                          min_blocks_per_mp=1, stream=stream)
        else:
            # (No cluster attribute: a cluster launch of one CTA ran every tile 1.3-2x slower on
            # an H100 in compute-bound problems.)
            launch.launch(grid=(ctas, 1, 1), block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # --- device ----------------------------------------------------------------------------------
    @cute.jit
    def _group_rows(self, groups, g, m_rows):
        """(first row, end row) of group g in A's M mode, clamped to [0, m_rows]."""
        if cutlass.const_expr(self.masked):
            r0 = cutlass.Int32(0)
            r1 = cutlass.min(cutlass.max(groups[g], 0), m_rows)
        else:
            r0 = cutlass.Int32(0)
            if g > 0:
                r0 = cutlass.min(cutlass.max(groups[g - 1], 0), m_rows)
            r1 = cutlass.min(cutlass.max(groups[g], r0), m_rows)
        return r0, r1

    @cute.jit
    def _build_table(self, groups, table, m_rows, n_tiles, lane):
        """One warp: table[g] = first tile of group g in the walk, table[E] = all tiles."""
        n_groups = groups.shape[0]
        carry = cutlass.Int32(0)
        for chunk in cutlass.range_constexpr(MAX_GROUPS // 32):
            g = chunk * 32 + lane
            v = cutlass.Int32(0)
            if g < n_groups:
                r0, r1 = self._group_rows(groups, g, m_rows)
                v = (r1 - r0 + self.step_m - 1) // self.step_m * n_tiles
            for d in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(v, 1 << d)
                if lane >= (1 << d):
                    v = v + up
            if g < n_groups:
                table[g + 1] = carry + v
            carry = carry + cute.arch.shuffle_sync(v, 31)
        if lane == 0:
            table[0] = cutlass.Int32(0)

    @cute.jit
    def _locate(self, t, table, groups, m_rows, n_tiles):
        """Tile t of the walk -> (group, n-tile, first row, end row of the group)."""
        lo = cutlass.Int32(0)
        hi = groups.shape[0]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if table[mid] <= t:
                lo = mid
            else:
                hi = mid
        g = lo
        r0, r1 = self._group_rows(groups, g, m_rows)
        tm = self.step_m
        m_tiles = (r1 - r0 + tm - 1) // tm
        local = t - table[g]
        band_tiles = self.swizzle * n_tiles
        first_m = local // band_tiles * self.swizzle
        rows_in_band = cutlass.min(m_tiles - first_m, self.swizzle)
        in_band = local - local // band_tiles * band_tiles
        m = first_m + in_band % rows_in_band
        n = in_band // rows_in_band
        row = r0 + m * tm
        if cutlass.const_expr(self.cluster_m > 1):
            row = row + cute.arch.block_idx_in_cluster() * self.tile[0]
        return g, n, row, r1

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_c: cute.CopyAtom, mC: cute.Tensor, c: cute.Tensor, groups: cute.Tensor, scale_a, scale_b,
               tma_sa, mSA, tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout, sC_layout: cute.ComposedLayout, sSA_layout: cute.Layout):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            atoms.prefetch_tma_descriptors(tma_a, tma_b, tma_c, tma_sa)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        table = storage.tile_start.get_tensor(cute.make_layout(MAX_GROUPS + 1))
        sSA = None
        sSB = None
        if cutlass.const_expr(self.block):
            sSA = storage.sSA.get_tensor(sSA_layout)
            if cutlass.const_expr(self.scale_b_stage):  # one scale_b value per stage, after sSA
                sSB = cute.make_tensor(storage.sSA.data_ptr() + cute.cosize(sSA_layout),
                                       cute.make_layout(self.ab_stages))

        stage_bytes = (atoms.stage_bytes(self.ab_dtype, sA_layout) + atoms.stage_bytes(self.ab_dtype, sB_layout))
        if cutlass.const_expr(self.block):
            stage_bytes += atoms.stage_bytes(cutlass.Float32, sSA_layout)
        # Each stage of a CTA is written by its own A load and by both peers' halves of B: a
        # consumer warp releases it to every CTA that writes into it.
        cta_layout = cute.make_layout((self.cluster_m, 1, 1))
        ab_pipe = atoms.tma_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, stage_bytes,
                                     self.cluster_m * self.mma_wgs * 4, cute.make_layout((1, *cta_layout.shape)))
        pipeline.pipeline_init_arrive(cluster_shape_mn=(self.cluster_m, 1), is_relaxed=True)

        m_rows = c.shape[0]
        n_tiles = (c.shape[1] + self.tile[1] - 1) // self.tile[1]
        # (bN, bK, tiles_n, tiles_k, E)
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        k_tiles = cute.size(gB, mode=[3])
        if warp_idx == 1:
            self._build_table(groups, table, m_rows, n_tiles, cute.arch.lane_idx())
        pipeline.pipeline_init_wait(cluster_shape_mn=(self.cluster_m, 1))
        cute.arch.sync_threads()  # the table is complete

        warpgroup = cute.arch.make_warp_uniform(tidx // 128)
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(atoms.GEMM_PRODUCER_REGS)
            if warp_idx == 0:
                self.produce(tma_a, tma_b, sA, sB, mA, gB, ab_pipe, table, groups, m_rows, n_tiles, k_tiles,
                             cta_layout, tma_sa, mSA, sSA, scale_b, sSB)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume(tiled_mma, tma_c, sA, sB, sC, mC, c, ab_pipe, table, groups, m_rows, n_tiles,
                         k_tiles, tidx - 128, warp_idx, scale_a, scale_b, sSA, sSB)

    @cute.jit
    def produce(self, tma_a, tma_b, sA, sB, mA, gB, ab_pipe, table, groups, m_rows, n_tiles, k_tiles, cta_layout,
                tma_sa=None, mSA=None, sSA=None, scale_b=None, sSB=None):
        """The TMA warp: every k-block of every tile this CTA takes into the next free stage (with
        a cluster: its own A tile, and its half of the B tile multicast to both peers)."""
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, rank, cute.make_layout(self.cluster_m), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        b_mask = None
        if cutlass.const_expr(self.cluster_m > 1):
            b_mask = cute.make_layout_image_mask(cta_layout, cta_layout.get_flat_coord(rank), mode=0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        total = table[groups.shape[0]]
        t = cute.arch.block_idx()[0] // self.cluster_m
        step = cute.arch.grid_dim()[0] // self.cluster_m
        while t < total:
            g, n, row, _ = self._locate(t, table, groups, m_rows, n_tiles)
            a_l = g if cutlass.const_expr(self.masked) else 0
            mA_g = cute.domain_offset((row, 0), mA[(None, None, a_l)])
            gA = cute.local_tile(mA_g, (self.tile[0], self.tile[2]), (0, None))
            tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
                tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
            tBgB_t = tBgB[(None, n, None, g)]
            tSs = tSg = None
            if cutlass.const_expr(self.block):
                # The tile rows' scale_a column of each k-block (tile M, 1, KB), at the group's row.
                # Contiguous: from the row rounded down to a multiple of 4 (16-byte TMA start).
                mSA_l = mSA[(None, None, a_l)] if cutlass.const_expr(self.masked) else mSA  # contig: 2-D
                row_sa = row if cutlass.const_expr(self.masked) else row - row % SCALE_ROW_ALIGN
                mSA_g = cute.domain_offset((row_sa, 0), mSA_l)
                gSA = cute.local_tile(mSA_g, (scale_box_rows(self.tile[0], self.masked), 1), (0, None))
                tSs, tSg = cute.nvgpu.cpasync.tma_partition(
                    tma_sa, 0, cute.make_layout(1), cute.group_modes(sSA, 0, 2), cute.group_modes(gSA, 0, 2))
            for k in range(k_tiles):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                if cutlass.const_expr(self.scale_b_stage):  # before the TMA loads (see the atom)
                    atoms.stage_scale_b(scale_b[(None, None, g)], n * self.tile[1] // _BLOCK_K, k, sSB, state.index, bar)
                cute.copy(tma_a, tAgA[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                if cutlass.const_expr(self.block):
                    cute.copy(tma_sa, tSg[(None, k)], tSs[(None, state.index)], tma_bar_ptr=bar)
                ab_pipe.producer_commit(state)
                state.advance()
            t = t + step
        ab_pipe.producer_tail(state)

    @cute.jit
    def _release(self, ab_pipe, state, count):
        """``ab_pipe.consumer_release(state)`` with ``count`` arrivals from this warp's signalling
        thread instead of one (tail_solo: the first warpgroup's warps arrive for the second's)."""
        if ab_pipe.is_signaling_thread:
            cute.arch.mbarrier_arrive(ab_pipe.sync_object_empty.get_barrier(state.index), ab_pipe.consumer_mask,
                                      arrive_count=count)

    @cute.jit
    def consume(self, tiled_mma, tma_c, sA, sB, sC, mC, c, ab_pipe, table, groups, m_rows, n_tiles, k_tiles,
                ctidx, warp_idx, scale_a=None, scale_b=None, sSA=None, sSB=None):
        """The MMA warpgroups: mainloop then epilogue, tile after tile."""
        thr_mma = tiled_mma.get_slice(ctidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tile_mn = cute.make_layout((self.tile[0], self.tile[1]))
        acc_shape = thr_mma.partition_C(cute.make_identity_tensor(tile_mn.shape)).shape[:3]
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        k_blocks = cute.size(tCrA, mode=[2])
        fp8 = self.scale_mode is not None
        part = part2 = cC = s0 = s1 = None
        if cutlass.const_expr(fp8):
            part = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
            part2 = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
            # Tile coordinates (row, col) of this thread's accumulators.
            cC = thr_mma.partition_C(cute.make_identity_tensor((self.tile[0], self.tile[1])))
            if cutlass.const_expr(self.block):
                s0 = atoms.block_scale_regs(cC)
                s1 = atoms.block_scale_regs(cC)

        c_dtype = sC.element_type
        r2s_atom = sm90_utils.get_smem_store_op(self.c_layout, c_dtype, cutlass.Float32)
        r2s = cute.make_tiled_copy_S(
            r2s_atom,
            cute.make_tiled_copy_C_atom(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_layout.is_m_major_c(), 4), c_dtype),
                tiled_mma,
            ),
        )
        thr_r2s = r2s.get_slice(ctidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc)
        frag_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        tRS_rF = cute.make_rmem_tensor(frag_shape, cutlass.Float32)
        tRS_rC = cute.make_rmem_tensor(frag_shape, c_dtype)
        frag_size = cute.size(tRS_rF)
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=self.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.epi_threads))
        epi_bar = pipeline.NamedBarrier(barrier_id=_EPILOGUE_BAR, num_threads=self.epi_threads)
        store_warp = 4
        em, en = self.epi_tile
        n_epi_n = self.tile[1] // en
        n_epi = (self.tile[0] // em) * n_epi_n
        per_thread = em * en // self.epi_threads
        n_cols = c.shape[1]

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        total = table[groups.shape[0]]
        t = cute.arch.block_idx()[0] // self.cluster_m
        step = cute.arch.grid_dim()[0] // self.cluster_m
        done = cutlass.Int32(0)
        while t < total:
            g, n, row, row_end = self._locate(t, table, groups, m_rows, n_tiles)
            if cutlass.const_expr(fp8):
                # ---- fp8 mainloop: two-level accumulation (block scales applied per k-block)
                cute.nvgpu.warpgroup.fence()
                acc.fill(0.0)
                scales = None
                if cutlass.const_expr(self.block):
                    sSA_t = sSA
                    if cutlass.const_expr(not self.masked):  # the tile's rows sit row % 4 into the box
                        sSA_t = cute.domain_offset((row % SCALE_ROW_ALIGN, 0, 0), sSA)
                    scales = (s0, s1, cC, sSA_t, scale_b[(None, None, g)], n * self.tile[1] // _BLOCK_K)
                    if cutlass.const_expr(self.scale_b_stage):  # scale_b from the stage
                        scales = (s0, s1, cC, sSA_t, sSB, None)
                if cutlass.const_expr(self.promote_ahead):
                    atoms.promoted_mainloop_ahead(
                        tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, cutlass.Int32(0),
                        k_tiles, scales)
                elif cutlass.const_expr(self.promote_serial):
                    atoms.promoted_mainloop_serial(
                        tiled_mma, acc, part, tCrA, tCrB, ab_pipe, read, release, k_blocks, cutlass.Int32(0),
                        k_tiles, scales)
                elif cutlass.const_expr(self.stagger):
                    # The tile's second warpgroup takes its first k-block alone, then pairs.
                    split = cutlass.min(ctidx // 128, k_tiles)
                    atoms.promoted_mainloop(
                        tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, cutlass.Int32(0),
                        split, scales)
                    atoms.promoted_mainloop(
                        tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, split, k_tiles,
                        scales)
                else:
                    atoms.promoted_mainloop(
                        tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, cutlass.Int32(0),
                        k_tiles, scales)
                if cutlass.const_expr(not self.block):
                    sa_g = scale_a[(None, g)] if cutlass.const_expr(self.masked) else scale_a
                    atoms.apply_row_col_scales(acc, cC, sa_g, scale_b[(None, g)], row, n * self.tile[1])
            elif cutlass.const_expr(self.tail_half):
                # The second warpgroup of a tile whose rows fit the first runs no WGMMA (k_mma =
                # 0): it releases each stage as it arrives (the first still reads it).
                k_mma = k_tiles
                if row_end - row <= 64:
                    if warp_idx >= 8:  # the second consumer warpgroup (warps 8-11)
                        k_mma = cutlass.Int32(0)
                # (Uniform per warp: where ptxas cannot see that, it serialises every WGMMA.)
                k_mma = cute.arch.make_warp_uniform(k_mma)
                for k in range(k_tiles - k_mma):
                    ab_pipe.consumer_wait(read)
                    read.advance()
                    ab_pipe.consumer_release(release)
                    release.advance()
                cute.nvgpu.warpgroup.fence()
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for k in range(k_mma):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, tCrA[blk], tCrB[blk], acc)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    read.advance()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                if k_mma > 0:
                    ab_pipe.consumer_release(release)
                    release.advance()
            elif cutlass.const_expr(self.tail_solo):
                # A tile whose rows fit the first warpgroup: the second skips its stages (no wait,
                # no WGMMA, no release); the first releases each stage for both (count 2).
                solo = cutlass.Int32(0)
                if row_end - row <= 64:
                    solo = cutlass.Int32(1)
                solo = cute.arch.make_warp_uniform(solo)
                k_mma = k_tiles
                if solo == 1:
                    if warp_idx >= 8:  # the second consumer warpgroup (warps 8-11)
                        k_mma = cutlass.Int32(0)
                k_mma = cute.arch.make_warp_uniform(k_mma)
                for k in range(k_tiles - k_mma):
                    read.advance()
                    release.advance()
                cute.nvgpu.warpgroup.fence()
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for k in range(k_mma):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, tCrA[blk], tCrB[blk], acc)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    read.advance()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        self._release(ab_pipe, release, 1 + solo)
                        release.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                if k_mma > 0:
                    self._release(ab_pipe, release, 1 + solo)
                    release.advance()
            else:
                # ---- mainloop: one WGMMA batch in flight, a stage released once its batch retired
                cute.nvgpu.warpgroup.fence()
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for k in range(k_tiles):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, tCrA[blk], tCrB[blk], acc)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    read.advance()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
                # (K >= 1: the runtime launches nothing for K = 0.)
                cute.nvgpu.warpgroup.wait_group(0)
                ab_pipe.consumer_release(release)
                release.advance()

            # ---- epilogue: whole tiles through the TMA store, a group's partial last tile masked
            a_l = g if cutlass.const_expr(self.masked) else 0
            whole = row_end - row >= self.tile[0]
            mC_t = cute.domain_offset((row, n * self.tile[1]), mC[(None, None, a_l)])
            gC_t = cute.zipped_divide(cute.local_tile(mC_t, self.tile[:2], (0, 0)), self.epi_tile)
            bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
                tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_t)
            c_g = c[(None, None, a_l)]
            if not whole:
                # Stores of earlier sub-tiles may still read the buffers this tile overwrites.
                if warp_idx == store_warp:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                epi_bar.arrive_and_wait()
            for e in cutlass.range_constexpr(n_epi):
                for v in cutlass.range_constexpr(frag_size):
                    tRS_rF[v] = tRS_acc[e * frag_size + v]
                tRS_rC.store(tRS_rF.load().to(c_dtype))
                buf = (done + e) % self.epi_stages
                cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_bar.arrive_and_wait()
                if whole:
                    if warp_idx == store_warp:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (e // n_epi_n, e % n_epi_n))])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                else:
                    sC_e = sC[(None, None, buf)]
                    r_base = row + (e // n_epi_n) * em
                    c_base = n * self.tile[1] + (e % n_epi_n) * en
                    for i in cutlass.range_constexpr(per_thread):
                        idx = ctidx + i * self.epi_threads
                        r = idx // en
                        col = idx - r * en
                        if r_base + r < row_end and c_base + col < n_cols:
                            c_g[(r_base + r, c_base + col)] = sC_e[(r, col)]
                epi_bar.arrive_and_wait()
            done = done + n_epi
            t = t + step
        store_pipe.producer_tail()


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

BF16 = dict(ab="bf16", c="bf16")
# default: the prefill tiles of each layout (128 x 256 for many rows per group, 128 x 128 for
# fewer) and a 64-row tile for groups of a few rows (decode).  The 2-CTA cluster form ran up to 27 %
# behind the lone 128 x 256 tile on the H100 and ahead by 3 % at most (notes/gemm-grouped.md): full tier.
GROUPED_DEFAULT = tuple(
    dict(**BF16, layout=lay, tile=t, schedule=s, pair=p)
    for lay in LAYOUTS
    for t, s, p in (((128, 256, 64), "coop", False), ((128, 128, 64), "coop", False), ((64, 128, 64), "ws", False))
)
# fp8 (e4m3 a and b, bf16 out): 128 x 128 for prefill, 64 x 128 for decode, each scale form and
# layout.  Contiguous block scales promote under the next k-block's WGMMAs (promote_ahead: 1151 vs
# 1007 TFLOP/s at 8 x 8192 x 4096 x 7168 on an H100, notes/gemm-fp8.md), every promotion FFMA free
# to yield the scheduler (ffma_yield: 1141-1157 vs 1109-1111 in the same passes, notes/gemm-grouped.md).
FP8 = dict(ab="e4m3", c="bf16")
# default: DeepSeek-V3's block-scaled experts, prefill (contiguous) and decode (masked); each ran
# against float32 on an H100 (evidence/runs).
GROUPED_FP8_DEFAULT = (
    dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, promote_ahead=True,
         ffma_yield=True),
    dict(**FP8, layout="masked", tile=(64, 128, 128), schedule="ws", block_scale=True))
GROUPED_FP8_TEST = (dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True,
                         promote_ahead=True),
                    dict(**FP8, layout="masked", tile=(64, 128, 128), schedule="ws", block_scale=True),
                    dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", row_scale=True),
                    dict(**FP8, layout="masked", tile=(64, 128, 128), schedule="ws", row_scale=True))
GROUPED_FP8_FULL = GROUPED_FP8_TEST + tuple(
    dict(**FP8, layout=lay, tile=t, schedule=s, **{form: True})
    for lay in LAYOUTS for form in ("block_scale", "row_scale")
    for t, s in (((128, 128, 128), "coop"), ((64, 128, 128), "ws"), ((128, 64, 128), "coop"))
) + tuple(
    dict(**FP8, layout=lay, tile=t, schedule=s, block_scale=True, promote_ahead=True)
    for lay in LAYOUTS for t, s in (((128, 128, 128), "coop"), ((64, 128, 128), "ws"))
) + (dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, promote_serial=True),
        # scale_b staged with each k-block (atoms.stage_scale_b), with promote_ahead or the pair
        # loop of the two warpgroups offset by one k-block (stagger).
        dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, promote_ahead=True,
             scale_b_stage=True),
        dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, scale_b_stage=True,
             stagger=True),
        dict(**FP8, layout="masked", tile=(64, 128, 128), schedule="ws", block_scale=True, scale_b_stage=True),
        # The promotion FFMAs' scheduling hints edited to let every one yield (ffma_yield).
        dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, promote_ahead=True,
             ffma_yield=True),
        dict(**FP8, layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, promote_serial=True,
             ffma_yield=True))
GROUPED_TEST = (dict(**BF16, layout="contig", tile=(128, 128, 64), schedule="coop"),
                dict(**BF16, layout="masked", tile=(64, 128, 64), schedule="ws")) + GROUPED_FP8_TEST
GROUPED_FULL = GROUPED_DEFAULT + tuple(
    dict(**BF16, layout=lay, tile=t, schedule=s, swizzle=sw)
    for lay in LAYOUTS
    for t, s, sw in (((128, 256, 64), "coop", 4), ((128, 256, 64), "coop", 16), ((256, 128, 64), "coop", 8),
                     ((128, 192, 64), "coop", 8), ((64, 256, 64), "ws", 8), ((64, 64, 64), "ws", 8))
) + tuple(
    dict(**BF16, layout=lay, tile=t, schedule="coop", pair=True) for lay in LAYOUTS for t in ((128, 256, 64), (128, 128, 64))
) + tuple(
    # a group's last m-tile of <= 64 rows computed by the first warpgroup alone: H100, same passes,
    # 0.90x the plain tile's time on DeepSeek-V3 down at 64 k routed rows, 0.97x Qwen3 gate_up 64 k,
    # but 1.10-1.32x on Mixtral down 64 k and DeepSeek gate_up 64 k (notes/gemm-grouped.md): full tier
    dict(**BF16, layout="contig", tile=t, schedule="coop", **f) for t in ((128, 256, 64), (128, 128, 64))
    for f in (dict(tail_half=True), dict(tail_solo=True))
) + tuple(dict(ab="f16", c="f16", layout=lay, tile=(128, 256, 64), schedule="coop") for lay in LAYOUTS
) + GROUPED_FP8_FULL


@register("gemm_grouped")
def enumerate_sm90_grouped(target: Target, tier: str) -> list[GemmGroupedSm90]:
    if target.family != "sm90" or not target.name.endswith("a"):
        return []
    specs = {"test": GROUPED_TEST, "default": GROUPED_DEFAULT + GROUPED_FP8_DEFAULT, "full": GROUPED_FULL}[tier]
    out = []
    for s in specs:
        v = GemmGroupedSm90(target=target.name, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out


__all__ = ["GemmGroupedSm90", "GroupedGemmSm90Kernel", "LAYOUTS", "MAX_GROUPS", "enumerate_sm90_grouped"]
