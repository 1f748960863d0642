"""Hopper (sm_90a) GEMM: TMA -> swizzled smem -> WGMMA, warp-specialized and persistent.

C[m, n, l] = Σ_k A[m, k, l]·B[n, k, l]  (times scale_a·scale_b for fp8), fp32 accumulators.

Warp roles (one CTA, ``1 + n_consumer`` warpgroups of 128 threads):

* warpgroup 0, warp 0 — the **producer**: walks the persistent tile schedule and issues TMA loads
  of A and B k-blocks into a ring of ``ab_stages`` smem stages (``PipelineTmaAsync``: a "full"
  mbarrier per stage that the TMA completes with a byte count, an "empty" mbarrier per stage that
  the consumers arrive on).  With a cluster, each CTA loads a slice of the tile its cluster peers
  share and multicasts it: A along the cluster's N direction, B along its M direction.  The other
  three warps of warpgroup 0 give their registers back (setmaxnreg) and leave.
* warpgroups 1.. — the **consumers**.  ``coop``: the tiled MMA spreads the CTA tile over two
  warpgroups along M (each a 64-row slab per 128 rows); ``ws``: one warpgroup owns the tile;
  ``pp`` (ping-pong): each of two warpgroups owns a whole tile, taking every other tile of the
  schedule and the mainloop in turns, so one warpgroup's epilogue runs under the other's
  mainloop.  Per k-block a consumer waits on "full", issues WGMMAs on the smem descriptors, keeps
  one WGMMA batch in flight and releases the previous stage (fp8 by default instead adds each
  k-block's partial sum into fp32 registers once it retires).  Then the epilogue: accumulators
  -> (scale) -> output dtype -> smem (stmatrix) -> TMA store, one ``epi_tile`` sub-tile at a time
  through ``epi_stages`` smem buffers, so the stores of one tile overlap the next tile's mainloop.
* ``swap_ab`` (decode shapes) runs the same kernel on Cᵀ = B·Aᵀ.

Tails in M, N, K and L need no code: TMA zero-fills out-of-bounds loads and clips stores; the tile
scheduler rounds the tile grid up to whole clusters so multicast peers always have a tile.

The persistent grid is sized at launch: the last argument before the stream, ``max_clusters``
(i32), caps the grid at that many clusters.  The loader passes the clusters the device holds at
once: the driver's ``cuOccupancyMaxActiveClusters`` for this kernel, at most SMs ÷ CTAs per
cluster (runtime/occupancy.py; 66 2-CTA clusters on a 132-SM H100 SXM).  The exported launcher
cannot ask the device itself; a grid fixed at build time would run a second wave of CTAs on any
part with fewer SMs than it was built for.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils

from ..abi import DTYPE_BYTES, ScalarArg, Signature, TensorArg
from ..atoms import epilogue_sm90 as epi
from ..atoms import sm90 as atoms
from ..atoms.smem import BARRIER_BYTES as _BARRIER_BYTES
from ..atoms.smem import SMEM_ALIGN as _SMEM_ALIGN
from ..atoms.smem import STATIC_SMEM as _STATIC_SMEM
from ..atoms.smem import round_up as _round_up
from ..atoms.targets import Target
from ..registry import register
from . import tiles
from .common import GemmVariant

BLOCK_SCALE_K = atoms.BLOCK_SCALE_K
# ``silu_mul``: the rows of B (the weight) hold gate and up rows in blocks of this many, [gate block
# 0; up block 0; gate block 1; up block 1; ...], so one 128-column tile holds 64 gate columns and
# the matching 64 up columns (runtime/epilogue.py ``pack_gate_up`` rearranges a [gate; up] weight).
GATE_UP_BLOCK = 64
# ``fp8_groups``: the output in e4m3 with one float32 scale per row and 128 columns (one output tile
# wide), ``scale = max(amax / FP8_MAX, FP8_MIN_SCALE)``, ``out = e4m3(x / scale)`` (saturating):
# DeepSeek-V3's activation form, the block-scaled GEMM's ``scale_a`` for a K of these columns.
FP8_GROUP = 128
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)


def epilogue_args(v, args: tuple, div: tuple) -> tuple[tuple, tuple]:
    """A variant's arguments with its epilogue fields: ``c`` (M, NO, L) with NO = N / 2 columns
    for ``silu_mul``; then ``bias`` (N,) and ``residual`` (M, NO or N, L), in the output dtype,
    after the scales.  The residual is read two adjacent columns per load: its base is aligned to
    two elements and its strides are even (its column count is, like c's)."""
    div = dict(div)
    n_out = "N"
    if v.silu_mul:
        n_out = "NO"
        args = tuple(TensorArg("c", v.c, ("M", "NO", "L"), ("sCm", 1, "sCl")) if a.name == "c" else a
                     for a in args)
        div["NO"] = v.vector(v.c)
    eb = DTYPE_BYTES[v.c]
    if v.bias:
        args += (TensorArg("bias", v.c, ("N",), (1,), align=eb),)
    if v.residual:
        args += (TensorArg("residual", v.c, ("M", n_out, "L"), ("sRm", 1, "sRl"), align=2 * eb),)
        div.update({"sRm": 2, "sRl": 2})
    if v.fp8_groups:
        # (M, ceil(N_out / 128)) float32, M-major (stride (1, sSOg), sSOg >= M, a multiple of 4,
        # 16-byte aligned): the form the block-scaled GEMM reads as scale_a.
        args += (TensorArg("scale_out", "f32", ("M", "NG"), (1, "sSOg"), align=16),)
        div["sSOg"] = 4
    return args, tuple(sorted(div.items()))


def scale_args(mode: str) -> tuple:
    """The two float32 scale arguments of an fp8 variant with row or block scales (4-byte
    aligned; per-tensor scales are common.py's (1,) and (1,)):

    - ``"row"`` (torch ``_scaled_mm`` row-wise): scale_a (M,), scale_b (N,), unit stride:
      C[m, n] = sa[m]·sb[n]·Σ_k A[m, k]·B[n, k].
    - ``"block"`` (DeepSeek-V3): scale_a (M, KB) M-major (stride (1, sSAk), sSAk >= M and a
      multiple of 4, 16-byte aligned: DeepGEMM's TMA-aligned form, loaded by TMA), scale_b (NB, KB) K-contiguous
      (stride (sSBn, 1), sSBn >= KB), KB = ceil(K/128), NB = ceil(N/128):
      C[m, n] = Σ_kb sa[m, kb]·sb[n // 128, kb]·Σ_{k in block kb} A[m, k]·B[n, k].
    KB, NB and the sizes' relations are checked by the loader (runtime/fp8.py) and the host library.
    """
    if mode == "row":
        return (TensorArg("scale_a", "f32", ("M",), (1,), align=4),
                TensorArg("scale_b", "f32", ("N",), (1,), align=4))
    return (TensorArg("scale_a", "f32", ("M", "KB"), (1, "sSAk"), align=16),
            TensorArg("scale_b", "f32", ("NB", "KB"), ("sSBn", 1), align=4))

# Smem plan constants and setmaxnreg budgets: factory/atoms/smem.py and factory/atoms/sm90.py.


class _Bar(enum.IntEnum):
    """Named hardware barriers (id 0 is __syncthreads)."""

    EPILOGUE = 1  # the threads of one epilogue (all consumers; in ping-pong, one warpgroup: 1 + wg)


@dataclass(frozen=True)
class _Plan:
    """Everything about shared memory, derived in plain Python (no DSL) so that the factory can
    check capacity and write the manifest without tracing the kernel."""

    tile: tuple[int, int, int]
    n_consumer: int  # consumer warpgroups
    mma_warpgroups: int  # warpgroups that share one tile's MMA (1 for ws and pp)
    epi_tile: tuple[int, int]
    ab_stages: int
    epi_stages: int
    stage_bytes: int
    epi_bytes: int
    red_bytes: int

    @property
    def smem_bytes(self) -> int:
        return _BARRIER_BYTES + self.ab_stages * self.stage_bytes + self.epi_bytes + self.red_bytes


# In SASS order, a TMA load and later a griddepcontrol.wait (ACQBULK): the early_b producer.
EARLY_LOAD_SASS = r"(?s)\bUTMALDG\.3D\b.*?\bACQBULK\b"


@dataclass(frozen=True, kw_only=True)
class GemmSm90(GemmVariant):
    """One Hopper GEMM config.  ``tile`` is the CTA tile (M, N, K); its K must be one 128-byte
    swizzle row (64 for 16-bit inputs, 128 for fp8).  ``schedule``: ``coop`` = two consumer
    warpgroups split the tile along M (tile M 128 or 256); ``ws`` = one consumer warpgroup (tile M
    64 or 128); ``pp`` = ping-pong, two consumer warpgroups with a tile each (tile M 64 or 128).
    ``raster`` orders tiles along M or N; ``swizzle`` groups that many clusters for L2 reuse
    (1 = plain raster).

    ``swap_ab`` (for decode, M <= 64): the kernel computes Cᵀ = B·Aᵀ, so the large N runs along the
    WGMMA's 64-row M side and the small M along its N side (down to 16), and C is written
    M-contiguous-in-the-kernel, i.e. still row-major.  ``tile`` and ``cluster`` stay in the
    problem's (M, N) orientation; the kernel sees them transposed."""

    family: ClassVar[str] = "sm90"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm90.py", "gemm/common.py", "atoms/sm90.py", "atoms/epilogue_sm90.py")

    tile: tuple[int, int, int] = field(default=(128, 128, 64), metadata={"tag": "t"})
    cluster: tuple[int, int] = field(default=(1, 1), metadata={"tag": "c"})
    schedule: str = field(default="coop", metadata={"tag": ""})
    raster: str = field(default="m", metadata={"tag": "r"})
    swizzle: int = field(default=1, metadata={"tag": "sw"})
    # With ``swizzle`` > 1: the last group of clusters along N is as wide as the clusters left
    # (the library scheduler rounds the clusters along N up to a multiple of ``swizzle`` and runs
    # the padding tiles: 14 % more tiles at N = 7168 with 128x128 c1x2 sw8, 28 -> 32 clusters).
    swizzle_exact: bool = field(default=False, metadata={"tag": "swx"})
    swap_ab: bool = field(default=False, metadata={"tag": "swap"})
    # fp8 only: accumulate straight in the WGMMA accumulators (faster, fewer registers) instead of
    # adding each k-tile's partial sum into fp32 registers.
    fast_accum: bool = field(default=False, metadata={"tag": "fastacc"})
    # Split K over a cluster of this many CTAs (decode: more CTAs than output tiles); the partial
    # sums meet in the first CTA's shared memory (DSMEM), which runs the epilogue.
    split_k: int = field(default=1, metadata={"tag": "sk"})
    # Up to 16 shared-memory stages instead of 8.
    deep: bool = field(default=False, metadata={"tag": "deep"})
    # Programmatic dependent launch: the next PDL kernel in the stream may be scheduled while this
    # one runs, and this one does its prologue before waiting for the previous kernel to finish.
    pdl: bool = field(default=False, metadata={"tag": "pdl"})
    # With ``pdl``: the producer issues the first stages' loads of B (the weights: N x K) before
    # waiting for the previous kernel, so they stream while it finishes.  Correct only when no
    # kernel that may still be running writes B (model weights); the loader picks such a variant
    # only when the caller says so (``b_constant=True``).
    early_b: bool = field(default=False, metadata={"tag": "eb"})
    # fp8 scale forms besides one scale per tensor (see ``scale_mode``): a scale per row of A and
    # per row of B applied in the epilogue, or DeepSeek-V3 block scales applied to each k-block's
    # partial sum as it is promoted into the fp32 accumulators.
    row_scale: bool = field(default=False, metadata={"tag": "rowsc"})
    block_scale: bool = field(default=False, metadata={"tag": "blksc"})
    # Block scales: each k-block's partial sum is promoted while the next k-block's WGMMAs run,
    # the loop draining once per atoms.PROMOTE_AHEAD_UNROLL k-blocks instead of every two.
    promote_ahead: bool = field(default=False, metadata={"tag": "pa"})
    # Block scales: one partial sum per warpgroup, each k-block waited for and promoted before the
    # next is issued; the two warpgroups of a coop tile keep the tensor core busy in turn.
    promote_serial: bool = field(default=False, metadata={"tag": "ps"})
    # Block scales: scale_b's value for each k-block travels in the k-block's stage (one 4-byte
    # cp.async by the producer warp, tracked by the stage's full mbarrier), so the consumers read
    # no global memory inside the k-loop.
    scale_b_stage: bool = field(default=False, metadata={"tag": "sbst"})
    # Block scales, coop tiles: the second warpgroup promotes in pairs of k-blocks offset by one
    # from the first's, so while one warpgroup drains its pair and promotes, the other's queued
    # WGMMAs keep the tensor core busy.
    stagger: bool = field(default=False, metadata={"tag": "stg"})
    # Block scales: the built cubin's promotion FFMAs may all yield the scheduler to another warp
    # (compiler/sass_patch.yield_ffma: ptxas holds the warp on every FFMA that reuses the scale
    # register), so the other warpgroup's WGMMA issue is not held up behind a run of 64 FFMAs.
    ffma_yield: bool = field(default=False, metadata={"tag": "fy"})
    # Epilogue fields (composable; each off by default, so a variant without them compiles the
    # same kernel as before they existed).  Applied to the fp32 accumulators in this order, after
    # the fp8 scales: ``+ bias[col]`` (bias (N,), the output dtype), ``silu_mul`` (the kernel's N
    # holds gate and up rows in blocks of tile N / 2, see GATE_UP_BLOCK: out[:, j] =
    # silu(gate_j)·up_j, output N / 2 columns), ``+ residual[row, col]`` (residual (M, N_out, L),
    # the output dtype; may be ``c`` itself for an in-place add).
    bias: bool = field(default=False, metadata={"tag": "bias"})
    silu_mul: bool = field(default=False, metadata={"tag": "silumul"})
    residual: bool = field(default=False, metadata={"tag": "res"})
    # Last: the output (c = e4m3) quantised per row and 128 columns (FP8_GROUP, one output tile),
    # the scales written to ``scale_out`` (M, ceil(N_out / 128)) M-major.
    fp8_groups: bool = field(default=False, metadata={"tag": "q128"})

    required_sass: ClassVar[tuple[str, ...]] = (r"\bHGMMA\.64x", r"\bUTMALDG\.3D", r"\bUTMASTG\.3D")

    def signature(self) -> Signature:
        sig = super().signature()
        args = sig.args
        div = sig.divisibility
        if self.scale_mode != "tensor":
            args = tuple(a for a in args if a.name not in ("scale_a", "scale_b")) + scale_args(self.scale_mode)
        if self.scale_mode == "block":  # scale_a's k-block rows are TMA rows: 16-byte strides
            div = tuple(sorted((*div, ("sSAk", 4))))
        if self.has_epilogue:
            args, div = epilogue_args(self, args, div)
        return Signature(args + (ScalarArg("max_clusters", "i32"),), div)

    def sass_requirements(self) -> tuple[str, ...]:
        # fp8 WGMMA disassembles as QGMMA; multicast clusters must show the multicast TMA load.
        mma = r"\bQGMMA\.64x\d+x32\.F32\.E4M3" if self.is_fp8 else r"\bHGMMA\.64x"
        # The mainloop keeps a WGMMA group in flight while it waits for the one before (bf16:
        # wait_group(1) per k-block; promoted fp8: two k-blocks per step).  Where ptxas serialises
        # the WGMMAs instead, every wait becomes "DEPBAR.LE gsb0, 0x0".
        req = (mma, r"\bUTMALDG\.3D", r"\bUTMASTG\.3D", r"\bSYNCS\.", r"\bUSETMAXREG\.")
        if not self.promote_serial:  # (promote_serial waits for every k-block by design)
            req += (r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1",)
        if self.cluster != (1, 1):
            req += (r"\bUTMALDG\.3D\.MULTICAST",)
        if self.split_k > 1:  # partial sums stored into the first CTA's smem
            req += (r"\bSTAS\b",)
        if self.pdl:  # griddepcontrol.launch_dependents and .wait
            req += (r"\bPREEXIT\b", r"\bACQBULK\b")
        if self.scale_b_stage:  # scale_b's 4-byte cp.async per stage, tracked by its full mbarrier
            req += (r"\bLDGSTS\b", r"\bARRIVES\.LDGSTSBAR\b")
        if self.early_b:  # a TMA load issued before a wait (without it, every wait comes first)
            req += (EARLY_LOAD_SASS,)
        return req

    # --- validity --------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm90":
            return f"target {self.target} is not a Hopper (sm90) target"
        if self.ab not in ("bf16", "f16", "e4m3", "e5m2"):
            return f"input dtype {self.ab} not supported"
        if self.c not in ("bf16", "f16", "f32") and not (self.c == "e4m3" and self.fp8_groups):
            return f"output dtype {self.c} not supported (e4m3 only with fp8_groups)"
        if self.is_fp8 and not tgt.fp8:
            return "fp8 needs a target with fp8"
        if self.is_fp8 and (self.a_major, self.b_major) != ("k", "k"):
            return "fp8 WGMMA reads only K-major operands"
        if self.a_major not in ("k", "m") or self.b_major not in ("k", "n"):
            return f"majorness a={self.a_major} b={self.b_major} not supported"
        tm, tn, tk = self.kernel_tile
        row = 128 // DTYPE_BYTES[self.ab]
        if tk != row and not (tk == 2 * row and self.swap_ab and self.schedule == "ws"):
            # Two 128-byte rows per stage (two TMA boxes along K) run on the swap decode tiles
            # (tested there); elsewhere one row.
            return f"tile K must be one 128-byte row ({row} for {self.ab}; {2 * row} on ws swap tiles)"
        if self.schedule == "coop":
            if tm not in (128, 256):
                return "coop needs tile M 128 or 256"
        elif self.schedule in ("ws", "pp"):
            if tm not in (64, 128):
                return f"{self.schedule} needs tile M 64 or 128"
        else:
            return f"unknown schedule {self.schedule!r}"
        # WGMMA N is a multiple of 8 up to 256; the epilogue works in 32-column sub-tiles.
        if not 16 <= tn <= 256 or tn % 16 or (tn > 32 and tn % 32):
            return "kernel tile N must be 16, 32 or a multiple of 32 up to 256"
        if self.fast_accum and not self.is_fp8:
            return "fast_accum applies to fp8 only"
        if (self.row_scale or self.block_scale) and not self.is_fp8:
            return "row and block scales apply to fp8 only"
        if self.row_scale and self.block_scale:
            return "one scale form per variant"
        if self.block_scale:
            if self.swap_ab or self.split_k > 1 or self.fast_accum:
                return "block scales run unswapped, unsplit and promoted (not fast_accum)"
            if tk != BLOCK_SCALE_K or BLOCK_SCALE_K % tn:
                return f"block scales need tile K {BLOCK_SCALE_K} and a tile N dividing {BLOCK_SCALE_K}"
            if self.stagger and (self.schedule != "coop" or self.promote_ahead or self.promote_serial):
                return "stagger offsets the pair loop of the two warpgroups of a coop tile"
            if self.scale_b_stage and (self.promote_serial or self.early_b):
                return "scale_b_stage runs with the pair loop or promote_ahead (not early_b)"
        elif self.promote_ahead or self.promote_serial or self.scale_b_stage or self.stagger or self.ffma_yield:
            return "promote_ahead / promote_serial / scale_b_stage / stagger / ffma_yield apply to block scales"
        if self.promote_ahead and self.promote_serial:
            return "promote_ahead and promote_serial are two forms of the main loop: one of them"
        if self.has_epilogue:
            # The residual also runs on the decode tiles (swapped, split over a cluster along K:
            # the first CTA adds it after the reduction); bias and silu_mul need the unswapped
            # accumulator layout.
            if (self.bias or self.silu_mul or self.fp8_groups) and (self.swap_ab or self.split_k > 1):
                return "bias, silu_mul and fp8_groups run unswapped and unsplit"
            if self.silu_mul and tn != 2 * GATE_UP_BLOCK and not (tn == 4 * GATE_UP_BLOCK and not self.residual):
                return (f"silu_mul needs tile N {2 * GATE_UP_BLOCK} (gate and up blocks of {GATE_UP_BLOCK} rows), "
                        f"or {4 * GATE_UP_BLOCK} without residual")
            if self.fp8_groups:
                if self.c != "e4m3" or self.bias or self.residual:
                    return "fp8_groups writes e4m3 (no bias or residual in that dtype)"
                if tn // (2 if self.silu_mul else 1) != FP8_GROUP:
                    return f"fp8_groups needs an output tile {FP8_GROUP} columns wide (one scale group)"
        plan = self.plan()
        acc_sets = 2 if self.promotes else 1
        if acc_sets * tm * tn // (plan.mma_warpgroups * 128) > 128:
            return "more than 128 fp32 accumulators per consumer thread would spill"
        cm, cn = self.kernel_cluster
        if not tgt.clusters and (cm, cn) != (1, 1):
            return "target has no clusters"
        if (cm, cn) not in ((1, 1), (2, 1), (1, 2), (2, 2)):
            return f"cluster {self.cluster} not supported"
        if self.split_k not in (1, 2, 4):
            return "split_k must be 1, 2 or 4"
        if self.split_k > 1 and ((cm, cn) != (1, 1) or self.schedule != "ws"):
            return "split_k runs with cluster (1, 1) and the ws schedule (the cluster is along K)"
        live = acc_sets * tm * tn // (plan.mma_warpgroups * 128)
        if self.split_k > 1 and live > 64:
            # The DSMEM reduction's staging spills past that (ptxas, sm_90a: 128 live
            # accumulators -> 522 spill instructions; 64 -> 0 to 22 by tile shape).
            return "split-K with more than 64 live accumulators per consumer thread spills"
        # Each CTA of a multicast group loads 1/size of the shared operand tile.
        if tm % (cn * 8) or tn % (cm * 8):
            return "tile not divisible among multicast peers"
        if self.raster not in ("m", "n"):
            return "raster must be 'm' or 'n'"
        if self.swizzle < 1:
            return "swizzle must be >= 1"
        if self.swizzle_exact and (self.swizzle < 2 or self.raster != "m" or self.swap_ab or self.split_k > 1):
            return "swizzle_exact needs swizzle > 1, raster m, unswapped and unsplit"
        if self.early_b and not self.pdl:
            return "early_b loads B before the PDL wait: it needs pdl"
        if plan.ab_stages < 2:
            return f"only {plan.ab_stages} smem stage(s) fit"
        if plan.smem_bytes + _STATIC_SMEM > tgt.smem_per_cta:
            return f"needs {plan.smem_bytes} + {_STATIC_SMEM} B smem > {tgt.smem_per_cta}"
        return None

    @property
    def cubin_edits(self) -> tuple[str, ...]:
        """Edits the build applies to the compiled cubin before it ships (compiler/sass_patch.py
        EDITS): ``ffma_yield`` lets every promotion FFMA yield the scheduler."""
        return ("yield_ffma",) if self.ffma_yield else ()

    # --- derived ---------------------------------------------------------------------------------
    @property
    def scale_mode(self) -> str:
        """fp8 scales: "tensor" (one each), "row" (scale_a (M,), scale_b (N,)) or "block"
        (scale_a per 1x128 of A, scale_b per 128x128 of B); see common.py."""
        return "row" if self.row_scale else "block" if self.block_scale else "tensor"

    @property
    def has_epilogue(self) -> bool:
        return self.bias or self.silu_mul or self.residual or self.fp8_groups

    @property
    def epilogue(self) -> list[str]:
        """The epilogue fields that are on, in the order they apply."""
        return [f for f in ("bias", "silu_mul", "residual", "fp8_groups") if getattr(self, f)]

    @property
    def promotes(self) -> bool:
        """fp8 k-tile partial sums are added into separate fp32 accumulators."""
        return self.is_fp8 and not self.fast_accum

    @property
    def kernel_tile(self) -> tuple[int, int, int]:
        tm, tn, tk = self.tile
        return (tn, tm, tk) if self.swap_ab else (tm, tn, tk)

    @property
    def kernel_cluster(self) -> tuple[int, int]:
        return tuple(reversed(self.cluster)) if self.swap_ab else tuple(self.cluster)

    def plan(self) -> _Plan:
        tm, tn, tk = self.kernel_tile
        n_consumer = 1 if self.schedule == "ws" else 2
        mma_wgs = 2 if self.schedule == "coop" else 1
        # One epilogue sub-tile spans the 64-row slabs of the warpgroups sharing the tile (so the
        # accumulator order matches the sub-tile order) and 32 columns.
        epi_tile = (min(tm, 64 * mma_wgs), min(tn, 32))
        cb = DTYPE_BYTES[self.c]
        # (Block scales: two epilogue buffers keep the sixth k-block stage that the scale_a
        # columns would otherwise push out of the 128x128 tile's shared memory.)
        epi_stages = 4 if cb <= 2 and not self.block_scale else 2
        # Ping-pong: each warpgroup has its own epilogue buffers.
        epi_bytes = (_round_up(epi_tile[0] * epi_tile[1] * cb, _SMEM_ALIGN) * epi_stages
                     * (n_consumer // mma_wgs))
        ab = DTYPE_BYTES[self.ab]
        stage_bytes = _round_up(tm * tk * ab, _SMEM_ALIGN) + _round_up(tn * tk * ab, _SMEM_ALIGN)
        if self.block_scale:  # the k-block's scale_a column for the tile's rows, by TMA
            stage_bytes += _round_up(tm * 4 + (4 if self.scale_b_stage else 0), _SMEM_ALIGN)
        # Split-K: the first CTA of the cluster receives the others' fp32 partial tiles.
        red_bytes = _round_up((self.split_k - 1) * tm * tn * 4, _SMEM_ALIGN)
        budget = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - epi_bytes - red_bytes
        ab_stages = min(budget // stage_bytes, 16 if self.deep else 8)
        return _Plan(self.kernel_tile, n_consumer, mma_wgs, epi_tile, ab_stages, epi_stages,
                     stage_bytes, epi_bytes, red_bytes)

    def smem_bytes(self) -> int:
        return self.plan().smem_bytes

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        plan = self.plan()
        sig = self.signature()
        d.update({
            "tile": list(self.tile),
            "cluster": list(self.cluster),
            "schedule": self.schedule,
            "raster": self.raster,
            "swizzle": self.swizzle,
            "swap_ab": self.swap_ab,
            # CTAs per output tile: the grid has ceil(M/tm)*ceil(N/tn)*L*split_k CTAs.
            "split_k": self.split_k,
            "stages": plan.ab_stages,
            "smem_bytes": plan.smem_bytes,
            "threads": 128 * (1 + plan.n_consumer),
            # Persistent grid: min(tile clusters, max_clusters) clusters of cluster_ctas CTAs,
            # max_clusters passed at launch (resident clusters, see the module docstring).
            "persistent": {"arg": "max_clusters", "cluster_ctas": math.prod(
                (self.split_k, 1) if self.split_k > 1 else self.kernel_cluster)},
            "scaled": self.is_fp8,
            "scale_mode": self.scale_mode if self.is_fp8 else None,
            "fp8_accumulation": ("fast" if self.fast_accum else "promoted") if self.is_fp8 else None,
            "constraints": {
                # Sizes need only the 16-byte divisibility of the signature; tails are handled.
                "divisibility": dict(sig.divisibility),
                "align_bytes": 16,
                "tails": ["M", "N", "K", "L"],
            },
        })
        if self.swizzle_exact:  # (the selection's cost model: no padding tiles)
            d["swizzle_exact"] = True
        if self.has_epilogue:
            # Fused epilogue fields (bias, silu_mul, residual) in the order they apply; see the
            # fields.  silu_mul writes N / 2 columns from gate/up rows in blocks.
            d["epilogue"] = self.epilogue
            if self.silu_mul:
                d["gate_up_block"] = GATE_UP_BLOCK
            if self.fp8_groups:
                d["fp8_group"] = FP8_GROUP
        return d

    def make_kernel(self):
        plan = self.plan()
        kernel = GemmSm90Kernel(
            tile=self.kernel_tile, cluster=self.kernel_cluster, n_consumer=plan.n_consumer,
            pingpong=self.schedule == "pp", promote=self.promotes,
            epi_tile=plan.epi_tile, ab_stages=plan.ab_stages, epi_stages=plan.epi_stages,
            raster_along_m=(self.raster == "m") != self.swap_ab, swizzle=self.swizzle,
            swizzle_exact=self.swizzle_exact,
            swap_ab=self.swap_ab, split_k=self.split_k, pdl=self.pdl, early_b=self.early_b,
            scale_mode=self.scale_mode,
            epilogue=tuple(self.epilogue), promote_ahead=self.promote_ahead,
            promote_serial=self.promote_serial, scale_b_stage=self.scale_b_stage, stagger=self.stagger,
        )
        if self.has_epilogue:
            return kernel.epilogue_entry(self.is_fp8)
        if self.is_fp8:
            return kernel.scaled
        return kernel


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GemmSm90Kernel:
    """Host side: ``__call__`` (a, b, c, stream) and ``scaled`` (a, b, c, scale_a, scale_b, stream)
    build the TMA atoms, the smem layouts and the persistent grid, then launch ``kernel``.
    See the module docstring for the warp roles."""

    def __init__(self, *, tile, cluster, n_consumer, pingpong, promote, epi_tile, ab_stages,
                 epi_stages, raster_along_m, swizzle, swap_ab, split_k, pdl=False, early_b=False,
                 swizzle_exact=False,
                 scale_mode="tensor", epilogue=(), promote_ahead=False, promote_serial=False,
                 scale_b_stage=False, stagger=False):
        self.tile = tuple(tile)
        self.scale_b_stage = scale_b_stage
        self.stagger = stagger
        self.promote_ahead = promote_ahead
        self.promote_serial = promote_serial
        # Fused epilogue: the fields that are on (GemmSm90), and the output tile (silu_mul: half
        # the kernel tile's columns).
        self.epilogue = tuple(epilogue)
        self.silu_mul = "silu_mul" in self.epilogue
        self.c_tile = (self.tile[0], self.tile[1] // 2) if self.silu_mul else self.tile[:2]
        self.cluster = tuple(cluster)
        self.n_consumer = n_consumer
        self.pingpong = pingpong
        self.promote = promote
        # Warpgroups that share one tile's MMA, and the threads of one epilogue.
        self.mma_wgs = 1 if pingpong else n_consumer
        self.epi_threads = 128 * self.mma_wgs
        # Consumer warpgroups with their own tile (ping-pong) and their own epilogue buffers.
        self.tile_owners = n_consumer // self.mma_wgs
        self.epi_tile = tuple(epi_tile)
        self.ab_stages = ab_stages
        self.epi_stages = epi_stages
        self.raster_along_m = raster_along_m
        self.swizzle = swizzle
        self.swizzle_exact = swizzle_exact
        self.swap_ab = swap_ab
        self.split_k = split_k
        self.pdl = pdl
        self.early_b = early_b
        self.scale_mode = scale_mode
        # The launched cluster: the multicast cluster, or the split-K group along K.
        self.launch_cluster = (split_k, 1) if split_k > 1 else self.cluster
        self.red_elems = (split_k - 1) * self.tile[0] * self.tile[1]
        # Block scales: each stage's scale_a column (tile M floats), then (scale_b_stage) one
        # scale_b value per stage after all of them.
        self.sSA_elems = (self.tile[0] * ab_stages + (ab_stages if scale_b_stage else 0)
                          if scale_mode == "block" else 1)
        self.threads = 128 * (1 + n_consumer)
        self.consumer_regs = atoms.GEMM_CONSUMER_REGS[n_consumer]
        # A is shared by the CTAs of a cluster row (same M, different N) and multicast along N;
        # B along M.
        self.mcast_a = self.cluster[1]
        self.mcast_b = self.cluster[0]
        # The first warp of each epilogue group issues its TMA stores.

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, max_clusters: cutlass.Int32,
                 stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream)

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
               scale_b: cute.Tensor, max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream)

    def epilogue_entry(self, fp8: bool):
        """The host entry of an epilogue variant: its arguments follow the signature (scales for
        fp8, then bias and residual where those fields are on)."""
        if "fp8_groups" in self.epilogue:
            return self.scaled_q if fp8 else self.with_q
        key = ("bias" in self.epilogue, "residual" in self.epilogue)
        if fp8:
            return {(False, False): self.scaled, (True, False): self.scaled_bias,
                    (False, True): self.scaled_res, (True, True): self.scaled_bias_res}[key]
        return {(False, False): self.__call__, (True, False): self.with_bias,
                (False, True): self.with_res, (True, True): self.with_bias_res}[key]

    @cute.jit
    def with_q(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_out: cute.Tensor,
               max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream, None, None, scale_out)

    @cute.jit
    def scaled_q(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
                 scale_b: cute.Tensor, scale_out: cute.Tensor, max_clusters: cutlass.Int32,
                 stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream, None, None, scale_out)

    @cute.jit
    def with_bias(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, bias: cute.Tensor,
                  max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream, bias, None)

    @cute.jit
    def with_res(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, residual: cute.Tensor,
                 max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream, None, residual)

    @cute.jit
    def with_bias_res(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, bias: cute.Tensor,
                      residual: cute.Tensor, max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream, bias, residual)

    @cute.jit
    def scaled_bias(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
                    scale_b: cute.Tensor, bias: cute.Tensor, max_clusters: cutlass.Int32,
                    stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream, bias, None)

    @cute.jit
    def scaled_res(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
                   scale_b: cute.Tensor, residual: cute.Tensor, max_clusters: cutlass.Int32,
                   stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream, None, residual)

    @cute.jit
    def scaled_bias_res(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
                        scale_b: cute.Tensor, bias: cute.Tensor, residual: cute.Tensor,
                        max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream, bias, residual)

    @cute.jit
    def _launch(self, a, b, c, scale_a, scale_b, max_clusters, stream, bias=None, residual=None,
                scale_out=None):
        if cutlass.const_expr(self.swap_ab):
            # Cᵀ = B·Aᵀ: the same kernel on swapped operands and a transposed view of C.
            a, b = b, a
            c = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 0, 2]))
            # The kernel's rows are the problem's columns: per-row scales swap too.
            scale_a, scale_b = scale_b, scale_a
            if cutlass.const_expr(residual is not None):  # read in the kernel's orientation, like c
                residual = cute.make_tensor(residual.iterator, cute.select(residual.layout, mode=[1, 0, 2]))
        ab_dtype, c_dtype = a.element_type, c.element_type
        a_layout = utils.LayoutEnum.from_tensor(a)
        b_layout = utils.LayoutEnum.from_tensor(b)
        c_layout = utils.LayoutEnum.from_tensor(c)

        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab_dtype, b.element_type, a_layout.sm90_mma_major_mode(),
            b_layout.sm90_mma_major_mode(), cutlass.Float32, (self.mma_wgs, 1, 1),
            tiler_mn=(64, self.tile[1]),
        )
        sA_layout = sm90_utils.make_smem_layout_a(a_layout, self.tile, ab_dtype, self.ab_stages)
        sB_layout = sm90_utils.make_smem_layout_b(b_layout, self.tile, ab_dtype, self.ab_stages)
        sC_layout = sm90_utils.make_smem_layout_epi(
            c_dtype, c_layout, self.epi_tile, self.epi_stages * self.tile_owners)

        tma_a, gA = atoms.tma_load_atom(a, sA_layout, (self.tile[0], self.tile[2]), self.mcast_a)
        tma_b, gB = atoms.tma_load_atom(b, sB_layout, (self.tile[1], self.tile[2]), self.mcast_b)
        tma_c, gC = atoms.tma_store_atom(c, sC_layout, self.epi_tile)
        # Block scales: each stage also holds scale_a[tile rows, kb] (a (tile M, 1) box of the
        # M-major (M, KB) scales; rows past M are TMA zero fill).
        sSA_layout = cute.make_layout((self.tile[0], 1, self.ab_stages))
        tma_sa = mSA = None
        if cutlass.const_expr(self.scale_mode == "block"):
            tma_sa, mSA = atoms.tma_load_atom(scale_a, sSA_layout, (self.tile[0], 1))

        tiles_mnl = cute.zipped_divide(c, tiler=self.c_tile)[(0, (None, None, None))].shape
        if cutlass.const_expr(self.split_k > 1):
            # Scheduler "M tiles" are (tile, k-part) pairs; a cluster of split_k CTAs along that
            # mode shares one output tile.
            tiles_mnl = (tiles_mnl[0] * self.split_k, tiles_mnl[1], tiles_mnl[2])
        # (swizzle_exact: the library's plain raster, each work tile remapped by _tile_of)
        sched, grid = atoms.persistent_schedule(tiles_mnl, self.launch_cluster,
                                                1 if self.swizzle_exact else self.swizzle,
                                                self.raster_along_m, max_clusters)

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            # Ping-pong: one mbarrier per consumer warpgroup, "your turn for the mainloop".
            order_barriers: cute.struct.MemRange[cutlass.Int64, 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[
                cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[
                cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]
            sSA: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, self.sSA_elems], _SMEM_ALIGN]
            # Split-K: partial tiles from the other CTAs of the cluster; "full" / "empty" barriers.
            red: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, max(1, self.red_elems)], _SMEM_ALIGN]
            red_barriers: cute.struct.MemRange[cutlass.Int64, 2]

        self.shared_storage = SharedStorage
        self.ab_dtype = ab_dtype
        self.c_layout = c_layout
        self.kernel(
            tma_a, gA, tma_b, gB, tma_c, gC, scale_a, scale_b, tma_sa, mSA, tiled_mma,
            sA_layout, sB_layout, sC_layout, sSA_layout, sched, bias, residual, scale_out,
        ).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.launch_cluster, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=self.pdl,
        )

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor,
        scale_a, scale_b, tma_sa, mSA,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout, sSA_layout: cute.Layout,
        sched_params: utils.PersistentTileSchedulerParams,
        bias=None, residual=None, scale_out=None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            atoms.prefetch_tma_descriptors(tma_a, tma_b, tma_c, tma_sa)

        cta_layout = cute.make_layout((*self.cluster, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        if cutlass.const_expr(self.split_k > 1):
            cluster_coord = cta_layout.get_flat_coord(0)  # no multicast peers along K
        else:
            cluster_coord = cta_layout.get_flat_coord(cta_rank)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        sSA = None
        sSB = None
        if cutlass.const_expr(self.scale_mode == "block"):
            sSA = storage.sSA.get_tensor(sSA_layout)
            if cutlass.const_expr(self.scale_b_stage):
                sSB = cute.make_tensor(storage.sSA.data_ptr() + self.tile[0] * self.ab_stages,
                                       cute.make_layout(self.ab_stages))

        # Mainloop pipeline.  Every consumer warp of the tile's owner releases a stage once to each
        # CTA that multicasts into it (its cluster row and column, itself counted once).
        stage_bytes = (atoms.stage_bytes(self.ab_dtype, sA_layout)
                       + atoms.stage_bytes(self.ab_dtype, sB_layout))
        if cutlass.const_expr(self.scale_mode == "block"):
            stage_bytes += atoms.stage_bytes(cutlass.Float32, sSA_layout)
        mcast_peers = self.mcast_a + self.mcast_b - 1
        ab_pipe = atoms.tma_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, stage_bytes,
                                     mcast_peers * self.mma_wgs * 4,
                                     cute.make_layout((1, *cta_layout.shape)))
        order_bars = storage.order_barriers.data_ptr()
        red_bars = storage.red_barriers.data_ptr()
        if cutlass.const_expr(self.tile_owners > 1):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(order_bars, 128)
                    cute.arch.mbarrier_init(order_bars + 1, 128)
        if cutlass.const_expr(self.split_k > 1):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    # [0] "full" (first CTA): armed with the partial tiles' byte count.
                    # [1] "empty" (other CTAs): the first CTA's consumer threads arrive.
                    cute.arch.mbarrier_init(red_bars, 1)
                    cute.arch.mbarrier_init(red_bars + 1, self.epi_threads)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.launch_cluster, is_relaxed=True)

        # (bM, bK, tiles_m, tiles_k, L) and friends.
        gA = cute.local_tile(mA, cute.slice_(self.tile, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, self.c_tile, (None, None, None))
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.launch_cluster)
        if cutlass.const_expr(self.pdl):
            # Every CTA of this persistent grid is resident (the grid is capped at what the
            # device holds), so the next kernel may be scheduled now: it cannot delay ours.  Then
            # wait for the previous kernel to finish: nothing above read or wrote global memory.
            # With ``early_b`` the TMA warp waits in ``produce``, after its first loads of B.
            cute.arch.griddepcontrol_launch_dependents()
            if cutlass.const_expr(not self.early_b):
                cute.arch.griddepcontrol_wait()
            else:
                if warp_idx != 0:
                    cute.arch.griddepcontrol_wait()

        warpgroup = cute.arch.make_warp_uniform(tidx // 128)
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(atoms.GEMM_PRODUCER_REGS)
            if warp_idx == 0:
                self.produce(tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                             sched_params, k_tiles, tma_sa, mSA, sSA, scale_b, sSB)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            # Which tile owner (ping-pong warpgroup) this thread belongs to, and its index there.
            owner = (warpgroup - 1) // self.mma_wgs
            red = storage.red.get_tensor(cute.make_layout(max(1, self.red_elems)))
            self.consume(tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, order_bars, red, red_bars,
                         scale_a, scale_b, sched_params, k_tiles,
                         (tidx - 128) % self.epi_threads, owner, warp_idx, cta_rank, sSA,
                         bias, residual, scale_out, sSB)

    @cute.jit
    def produce(self, tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                sched_params, k_tiles, tma_sa=None, mSA=None, sSA=None, scale_b=None, sSB=None):
        """The TMA warp: for every scheduled tile, every k-block into the next free stage."""
        # Slice of the shared tile this CTA loads, and which peers receive it.
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, cluster_coord[1], cute.make_layout(self.cluster[1]),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, cluster_coord[0], cute.make_layout(self.cluster[0]),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )
        tSs = tSg = None
        if cutlass.const_expr(self.scale_mode == "block"):
            # This CTA's own scale_a box per k-block (not multicast): (tile M, 1, m tiles, KB).
            gSA = cute.local_tile(mSA, (self.tile[0], 1), (None, None))
            tSs, tSg = cute.nvgpu.cpasync.tma_partition(
                tma_sa, 0, cute.make_layout(1), cute.group_modes(sSA, 0, 2), cute.group_modes(gSA, 0, 2),
            )
        a_mask = None
        b_mask = None
        if cutlass.const_expr(self.mcast_a > 1):
            a_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=1)
        if cutlass.const_expr(self.mcast_b > 1):
            b_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0)

        sched = atoms.tile_scheduler(sched_params)
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        # k-blocks of the first tile already issued (``early_b``).
        skip = cutlass.Int32(0)
        if cutlass.const_expr(self.early_b):
            # The user's B (the weights) is the kernel's A on swap tiles.  Fill the first stages
            # with it (each stage armed for both operands' bytes), wait for the previous kernel,
            # then add the other operand, which that kernel may have written, to those stages.
            tWsW, tWgW, tma_w, w_mask = (tAsA, tAgA, tma_a, a_mask) if self.swap_ab else (
                tBsB, tBgB, tma_b, b_mask)
            tXsX, tXgX, tma_x, x_mask = (tBsB, tBgB, tma_b, b_mask) if self.swap_ab else (
                tAsA, tAgA, tma_a, a_mask)
            if work.is_valid_tile:
                m, n, l = self._tile_of(work, sched_params)
                m, k_begin, k_end = self._k_range(m, k_tiles)
                skip = cutlass.max(cutlass.min(k_end - k_begin, self.ab_stages), 0)
                w_t = tWgW[(None, m if self.swap_ab else n, None, l)]
                for k in range(k_begin, k_begin + skip):
                    ab_pipe.producer_acquire(state)
                    cute.copy(tma_w, w_t[(None, k)], tWsW[(None, state.index)],
                              tma_bar_ptr=ab_pipe.producer_get_barrier(state), mcast_mask=w_mask)
                    state.advance()
            cute.arch.griddepcontrol_wait()
            if work.is_valid_tile:
                m, n, l = self._tile_of(work, sched_params)
                m, k_begin, k_end = self._k_range(m, k_tiles)
                x_t = tXgX[(None, n if self.swap_ab else m, None, l)]
                early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.ab_stages)
                for k in range(k_begin, k_begin + skip):
                    cute.copy(tma_x, x_t[(None, k)], tXsX[(None, early.index)],
                              tma_bar_ptr=ab_pipe.producer_get_barrier(early), mcast_mask=x_mask)
                    early.advance()
        while work.is_valid_tile:
            m, n, l = self._tile_of(work, sched_params)
            m, k_begin, k_end = self._k_range(m, k_tiles)
            tAgA_t = tAgA[(None, m, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            for k in range(k_begin + skip, k_end):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                if cutlass.const_expr(self.scale_b_stage):  # before the TMA loads (see the atom)
                    atoms.stage_scale_b(scale_b, n * self.tile[1] // atoms.BLOCK_SCALE_K, k, sSB, state.index, bar)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)],
                          tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)],
                          tma_bar_ptr=bar, mcast_mask=b_mask)
                if cutlass.const_expr(self.scale_mode == "block"):
                    cute.copy(tma_sa, tSg[(None, m, k)], tSs[(None, state.index)], tma_bar_ptr=bar)
                ab_pipe.producer_commit(state)
                state.advance()
            skip = cutlass.Int32(0)
            sched.advance_to_next_work()
            work = sched.get_current_work()
        # Do not exit while a peer may still multicast into (or release to) this CTA.
        ab_pipe.producer_tail(state)

    @cute.jit
    def _issue_k_block(self, tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks):
        """Wait for the stage at ``read``, start its WGMMAs into ``part`` (overwritten) and
        commit them as one group.  Returns ``tiled_mma``: its accumulate flag changes here, and
        the DSL threads it through the caller's loops only as a rebound local."""
        ab_pipe.consumer_wait(read)
        cute.nvgpu.warpgroup.fence()
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
        for kb in cutlass.range_constexpr(k_blocks):
            blk = (None, None, kb, read.index)
            cute.gemm(tiled_mma, part, tCrA[blk], tCrB[blk], part)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()
        return tiled_mma

    @cute.jit
    def _fused_epilogue(self, acc, cC, scale, scale_first: cutlass.Constexpr, bias, residual, m, n, l,
                        scale_out=None):
        """The epilogue fields on one tile's fp32 accumulators, before the conversion to the
        output dtype: (fp8 per-tensor scale,) + bias, silu·mul, + residual, fp8 group scales."""
        if cutlass.const_expr(scale_first):
            atoms.scale_acc(acc, scale)
        if cutlass.const_expr(bias is not None):
            atoms.add_col_vector(acc, cC, bias, n * self.tile[1])
        cols = cute.size(atoms.acc_mn_view(acc), mode=[1])
        if cutlass.const_expr(self.silu_mul):
            epi.silu_mul_blocks(acc, GATE_UP_BLOCK)
            cols = cols // 2
        if cutlass.const_expr(residual is not None):
            # Unswapped, a thread's columns come in adjacent pairs (one 4-byte load each);
            # swapped, the residual's contiguous columns are the kernel's rows.
            epi.add_residual(acc, cC, residual, m * self.tile[0], n * self.c_tile[1], l, cols,
                               not self.swap_ab)
        if cutlass.const_expr(scale_out is not None):
            # One output tile is one group: its column index is the tile's.
            epi.quantize_row_groups(acc, cC, scale_out, m * self.tile[0], n, FP8_MAX, FP8_MIN_SCALE,
                                      GATE_UP_BLOCK if self.silu_mul else 0)

    @cute.jit
    def _tile_of(self, work, sched_params):
        """The (m, n, l) tile of a work unit: the scheduler's, or with ``swizzle_exact`` its
        plain raster position remapped into groups of ``swizzle`` clusters along N."""
        if cutlass.const_expr(self.swizzle_exact):
            return atoms.swizzle_groups_exact(work.tile_idx, sched_params, self.launch_cluster, self.swizzle)
        return work.tile_idx

    def _k_range(self, m, k_tiles):
        """(output tile M index, first k-tile, end k-tile) of a scheduler tile: with split-K the
        scheduler's M index is tile * split_k + part, and part p takes the p-th slice of K."""
        k_begin = cutlass.Int32(0)
        k_end = k_tiles
        if cutlass.const_expr(self.split_k > 1):
            part = m % self.split_k
            m = m // self.split_k
            per = (k_tiles + self.split_k - 1) // self.split_k
            k_begin = part * per
            k_end = cutlass.min(k_tiles, k_begin + per)
        return m, k_begin, k_end

    @cute.jit
    def _reduce_split_k(self, acc, red, red_bars, red_phase, cta_rank, ctidx):
        """Sum the cluster's partial accumulators into the first CTA's (rank 0's) registers.

        Ranks > 0 wait until their slot in rank 0's ``red`` buffer is free (their own "empty"
        barrier), then ``st.async`` their fp32 fragment there (each thread its own contiguous
        values); the stores complete bytes on rank 0's "full" barrier, which rank 0 armed with
        the expected byte count.  Rank 0 waits on "full", adds the slots into its accumulators and
        arrives on every other rank's "empty" barrier, which also keeps those CTAs alive until
        rank 0 is done with their data."""
        n_acc = cute.size(acc)
        slot = n_acc * self.epi_threads
        if cta_rank == 0:
            if ctidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(red_bars, (self.split_k - 1) * slot * 4)
            cute.arch.mbarrier_wait(red_bars, red_phase)
            for r in cutlass.range_constexpr(self.split_k - 1):
                for v in cutlass.range_constexpr(n_acc):
                    acc[v] = acc[v] + red[r * slot + ctidx * n_acc + v]
            for r in cutlass.range_constexpr(1, self.split_k):
                cute.arch.mbarrier_arrive(red_bars + 1, peer_cta_rank_in_cluster=r)
        else:
            # The first wait passes on the fresh barrier (parity 1).
            cute.arch.mbarrier_wait(red_bars + 1, red_phase ^ 1)
            bits = cute.recast_tensor(acc, cutlass.Int32)
            base = red.iterator + (cta_rank - 1) * slot + ctidx * n_acc
            for v in cutlass.range_constexpr(n_acc):
                cute.arch.store_async_dsmem(base + v, bits[v], red_bars, 0)

    @cute.jit
    def consume(self, tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, order_bars, red, red_bars,
                scale_a, scale_b, sched_params, k_tiles, ctidx, owner, warp_idx, cta_rank, sSA=None,
                bias=None, residual=None, scale_out=None, sSB=None):
        """The MMA warpgroups: mainloop then epilogue, tile after tile.  ``owner`` is the
        ping-pong warpgroup (0 otherwise): it takes tiles owner, owner + 2, ... of this CTA's
        schedule and skips the other warpgroup's k-blocks in the smem ring.

        The two ping-pong warpgroups take turns at the mainloop (order barriers).  Beyond overlap,
        this is what keeps the ring's parity waits sound: a warpgroup starts waiting on its
        k-blocks only once the other has waited on all of its own, so no "full" barrier is ever
        more than one phase behind its waiter."""
        thr_mma = tiled_mma.get_slice(ctidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_C(gC).shape[:3]
        if cutlass.const_expr(self.silu_mul):  # gC tiles are half the kernel tile's columns
            acc_shape = thr_mma.partition_C(cute.make_identity_tensor(self.tile[:2])).shape[:3]
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        part = None
        part2 = None
        if cutlass.const_expr(self.promote):
            part = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
            part2 = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        k_blocks = cute.size(tCrA, mode=[2])
        # Tile coordinates (row, col) of this thread's accumulators (row and block scales).
        cC = None
        if cutlass.const_expr(self.scale_mode != "tensor" or len(self.epilogue) > 0):
            cC = thr_mma.partition_C(cute.make_identity_tensor((self.tile[0], self.tile[1])))

        # Epilogue copies: registers -> smem with stmatrix (16-bit outputs) laid out like the
        # accumulators, smem -> global with one TMA store per sub-tile.
        c_dtype = sC.element_type
        r2s_atom = sm90_utils.get_smem_store_op(self.c_layout, c_dtype, cutlass.Float32)
        r2s = cute.make_tiled_copy_S(
            r2s_atom,
            cute.make_tiled_copy_C_atom(
                cute.make_copy_atom(
                    cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_layout.is_m_major_c(), 4), c_dtype
                ),
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
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.epi_threads),
        )
        epi_bar = pipeline.NamedBarrier(barrier_id=int(_Bar.EPILOGUE) + owner,
                                        num_threads=self.epi_threads)
        store_warp = 4 + owner * 4 * self.mma_wgs

        scale = cutlass.Float32(1.0)
        tensor_scale = scale_a is not None and self.scale_mode == "tensor"
        # With an epilogue the per-tensor scale is applied before it adds anything.
        scale_in_epilogue = tensor_scale and len(self.epilogue) > 0
        if cutlass.const_expr(scale_in_epilogue):
            tensor_scale = False
        if cutlass.const_expr(tensor_scale or scale_in_epilogue):
            scale = scale_a[0] * scale_b[0]

        sched = atoms.tile_scheduler(sched_params)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        # Warpgroup 0 passes its first turn (parity 1 of a fresh mbarrier counts as completed).
        turn_phase = cutlass.Int32(1) - owner
        if cutlass.const_expr(self.tile_owners > 1):
            # Warpgroup 1 starts at the CTA's second tile, after warpgroup 0's k-blocks.
            sched.advance_to_next_work(advance_count=owner)
            read.advance(cutlass.Int32(owner * k_tiles))
            release.advance(cutlass.Int32(owner * k_tiles))
        work = sched.get_current_work()
        red_phase = cutlass.Int32(0)
        while work.is_valid_tile:
            m, n, l = self._tile_of(work, sched_params)
            m, k_begin, k_end = self._k_range(m, k_tiles)
            if cutlass.const_expr(self.tile_owners > 1):
                cute.arch.mbarrier_wait(order_bars + owner, turn_phase)
                turn_phase = turn_phase ^ 1
            # ---- mainloop
            cute.nvgpu.warpgroup.fence()
            if cutlass.const_expr(self.promote):
                acc.fill(0.0)
                # fp8, two k-blocks per step into two partial sums: the second block's WGMMAs
                # queue right behind the first's and run while the first partial is added into
                # the fp32 accumulators, so each pair of k-blocks waits once on the tensor core
                # instead of twice.  No WGMMA is in flight across the loop's back edge: the
                # DSL carries register tensors through loops as values, and ptxas serialises
                # every WGMMA when such a copy reads an accumulator in flight.
                n_k = k_end - k_begin
                if cutlass.const_expr(self.scale_mode == "block"):
                    # Each k-block's partial sum times scale_a[row, kb]·scale_b[n-block, kb].
                    # scale_a comes with the k-block's stage (TMA, as far ahead as the ring), read
                    # from shared memory once the stage is full; scale_b is one value per CTA and
                    # k-block (consecutive k-blocks share a cache line).  (Global loads of
                    # scale_a with the block's own WGMMAs came back too late under the TMA
                    # traffic: 35-45 % slower than per-tensor scales on an H100; one pair ahead
                    # still 15 %: notes/gemm-fp8.md.)
                    n_blk = n * self.tile[1] // atoms.BLOCK_SCALE_K
                    s0 = atoms.block_scale_regs(cC)
                    s1 = atoms.block_scale_regs(cC)
                    scales = (s0, s1, cC, sSA, scale_b, n_blk)
                    if cutlass.const_expr(self.scale_b_stage):  # scale_b from the stage
                        scales = (s0, s1, cC, sSA, sSB, None)
                    if cutlass.const_expr(self.promote_ahead):
                        tiled_mma = atoms.promoted_mainloop_ahead(
                            tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, k_begin,
                            k_end, scales)
                    elif cutlass.const_expr(self.stagger):
                        # The tile's second warpgroup takes its first k-block alone, then pairs:
                        # its drains fall between the first warpgroup's.
                        split = cutlass.min(k_begin + ctidx // 128, k_end)
                        tiled_mma = atoms.promoted_mainloop(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read,
                                                            release, k_blocks, k_begin, split, scales)
                        tiled_mma = atoms.promoted_mainloop(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read,
                                                            release, k_blocks, split, k_end, scales)
                    elif cutlass.const_expr(self.scale_b_stage):
                        tiled_mma = atoms.promoted_mainloop(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read,
                                                            release, k_blocks, k_begin, k_end, scales)
                    elif cutlass.const_expr(self.promote_serial):
                        tiled_mma = atoms.promoted_mainloop_serial(
                            tiled_mma, acc, part, tCrA, tCrB, ab_pipe, read, release, k_blocks, k_begin, k_end,
                            (s0, s1, cC, sSA, scale_b, n_blk))
                    else:
                        for pair in range(n_k // 2):
                            kb = k_begin + 2 * pair
                            tiled_mma = self._issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
                            atoms.block_scales_from_smem(s0, cC, sSA, read.index, scale_b, n_blk, kb)
                            read.advance()
                            tiled_mma = self._issue_k_block(tiled_mma, part2, tCrA, tCrB, ab_pipe, read, k_blocks)
                            atoms.block_scales_from_smem(s1, cC, sSA, read.index, scale_b, n_blk, kb + 1)
                            read.advance()
                            cute.nvgpu.warpgroup.wait_group(1)
                            atoms.promote_scaled(acc, part, s0)
                            ab_pipe.consumer_release(release)
                            release.advance()
                            cute.nvgpu.warpgroup.wait_group(0)
                            atoms.promote_scaled(acc, part2, s1)
                            ab_pipe.consumer_release(release)
                            release.advance()
                        if n_k % 2 == 1:
                            tiled_mma = self._issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
                            atoms.block_scales_from_smem(s0, cC, sSA, read.index, scale_b, n_blk, k_end - 1)
                            read.advance()
                            cute.nvgpu.warpgroup.wait_group(0)
                            atoms.promote_scaled(acc, part, s0)
                            ab_pipe.consumer_release(release)
                            release.advance()
                else:
                    for _pair in range(n_k // 2):
                        tiled_mma = self._issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
                        read.advance()
                        tiled_mma = self._issue_k_block(tiled_mma, part2, tCrA, tCrB, ab_pipe, read, k_blocks)
                        read.advance()
                        cute.nvgpu.warpgroup.wait_group(1)
                        acc.store(acc.load() + part.load())
                        ab_pipe.consumer_release(release)
                        release.advance()
                        cute.nvgpu.warpgroup.wait_group(0)
                        acc.store(acc.load() + part2.load())
                        ab_pipe.consumer_release(release)
                        release.advance()
                    if n_k % 2 == 1:
                        tiled_mma = self._issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
                        read.advance()
                        cute.nvgpu.warpgroup.wait_group(0)
                        acc.store(acc.load() + part.load())
                        ab_pipe.consumer_release(release)
                        release.advance()
            else:
                # One WGMMA batch in flight; a stage is released once its batch retired.  The
                # first k-block overwrites the accumulators instead of adding to zeros: a zero
                # fill before the loop became register copies that ptxas saw reading in-flight
                # accumulators, and it then serialised every WGMMA (16- and 32-wide swap tiles).
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for k in range(k_begin, k_end):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, tCrA[blk], tCrB[blk], acc)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    read.advance()
                    if k > k_begin:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
            if cutlass.const_expr(self.tile_owners > 1):
                cute.arch.mbarrier_arrive(order_bars + (1 - owner))  # the other's turn
            if cutlass.const_expr(not self.promote):
                cute.nvgpu.warpgroup.wait_group(0)
                if k_end > k_begin:
                    ab_pipe.consumer_release(release)
                    release.advance()
                if cutlass.const_expr(self.split_k > 1):
                    # A split-K part can own no k-block (fewer k-blocks than parts): its partial
                    # sum is zero.  (Only here: in the 128-accumulator tiles this branch made
                    # ptxas spill.)
                    if k_end <= k_begin:
                        acc.fill(0.0)

            is_leader = True
            if cutlass.const_expr(self.split_k > 1):
                is_leader = cta_rank == 0
                self._reduce_split_k(acc, red, red_bars, red_phase, cta_rank, ctidx)
                red_phase = red_phase ^ 1

            if is_leader:  # with split-K only the first CTA of the cluster stores
                if cutlass.const_expr(self.scale_mode == "row"):
                    atoms.apply_row_col_scales(acc, cC, scale_a, scale_b, m * self.tile[0], n * self.tile[1])
                if cutlass.const_expr(len(self.epilogue) > 0):
                    self._fused_epilogue(acc, cC, scale, scale_in_epilogue, bias, residual, m, n, l,
                                         scale_out)
                # ---- epilogue
                gC_t = cute.zipped_divide(gC[(None, None, m, n, l)], self.epi_tile)
                bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
                    tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_t,
                )
                epi_shape = gC_t.shape[1]
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                n_epi = cute.size(gC_t, mode=[1])
                done = sched.num_tiles_executed * n_epi
                for e in cutlass.range_constexpr(n_epi):
                    src = e
                    if cutlass.const_expr(self.silu_mul):
                        # Output sub-tile (i, j) comes from a tile twice as wide whose gate blocks
                        # hold the results: block j // b (b sub-tiles per GATE_UP_BLOCK) sits at
                        # twice its offset (with tile N 128, the first half).
                        per_row = self.c_tile[1] // self.epi_tile[1]
                        blk = GATE_UP_BLOCK // self.epi_tile[1]
                        j = e % per_row
                        src = (e // per_row) * 2 * per_row + (j // blk) * 2 * blk + j % blk
                    for v in cutlass.range_constexpr(frag_size):
                        tRS_rF[v] = tRS_acc[src * frag_size + v]
                    vals = tRS_rF.load()
                    if cutlass.const_expr(tensor_scale):
                        vals = vals * scale
                    tRS_rC.store(vals.to(c_dtype))
                    buf = (done + e) % self.epi_stages + owner * self.epi_stages
                    cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                    # Make the generic-proxy smem writes visible to the TMA (async proxy).
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_bar.arrive_and_wait()
                    if warp_idx == store_warp:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                    epi_bar.arrive_and_wait()
            if cutlass.const_expr(self.tile_owners > 1):
                # Skip the tile (and the k-blocks) of the other warpgroup.
                sched.advance_to_next_work(advance_count=self.tile_owners)
                read.advance(cutlass.Int32(k_tiles))
                release.advance(cutlass.Int32(k_tiles))
            else:
                sched.advance_to_next_work()
            work = sched.get_current_work()
        if cutlass.const_expr(self.split_k > 1):
            if cta_rank != 0:  # rank 0 has read the last partial tile: safe to exit
                cute.arch.mbarrier_wait(red_bars + 1, red_phase ^ 1)
        store_pipe.producer_tail()


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

def _default() -> list[dict]:
    # Every tile launches with programmatic dependent launch; each swap tile also as a twin that
    # streams its first stages of weights before the PDL wait (``early_b``, picked only for
    # callers whose B is constant: ``bundle.gemm(..., b_constant=True)``).
    out = [dict(d, pdl=True) for d in (*tiles.SM90_DEFAULT, *tiles.SM90_SCALED_DEFAULT)]
    out += [dict(d, early_b=True) for d in out if d.get("swap_ab")]
    out += [dict(d, pdl=True, early_b=True) for d in tiles.SM90_EARLY_B_ONLY]
    out += [dict(d, pdl=True) for d in (*tiles.SM90_EPILOGUE_DEFAULT, *tiles.SM90_EPILOGUE_FP8_GROUPS_DEFAULT)]
    return out


def _full() -> list[dict]:
    out = _default()
    for (ab, c), (tm, tn), cl, maj in itertools.product(tiles.SM90_FULL_DTYPES, tiles.SM90_FULL_TILES,
                                                         tiles.SM90_FULL_CLUSTERS, tiles.SM90_FULL_MAJORS):
        tk = 128 // DTYPE_BYTES[ab]
        for sched, fast in itertools.product(("ws", "pp") if tm == 64 else ("coop", "pp"),
                                             (False, True) if ab == "e4m3" else (False,)):
            out.append(dict(ab=ab, c=c, tile=(tm, tn, tk), cluster=cl, schedule=sched,
                            a_major=maj[0], b_major=maj[1], fast_accum=fast))
    out += [dict(d, pdl=True) for d in tiles.SM90_SCALED_FULL]
    swap = tiles.SM90_FULL_SWAP
    for (ab, c), tm, tn, sk in itertools.product(tiles.SM90_FULL_DTYPES, swap["tile_m"], swap["tile_n"],
                                                 swap["split_k"]):
        tk = 128 // DTYPE_BYTES[ab]
        out.append(dict(ab=ab, c=c, tile=(tm, tn, tk), schedule="ws", swap_ab=True, split_k=sk))
    for d, (bias, silu, res) in itertools.product(tiles.SM90_EPILOGUE_FULL_TILES,
                                                  itertools.product((False, True), repeat=3)):
        if bias or silu or res:
            out.append(dict(d, pdl=True, bias=bias, silu_mul=silu, residual=res))
    out += [dict(d, pdl=True) for d in (*tiles.SM90_EPILOGUE_RESIDUAL_FULL, *tiles.SM90_EPILOGUE_FP8_GROUPS_FULL)]
    return out


@register("gemm")
def enumerate_sm90(target: Target, tier: str) -> list[GemmSm90]:
    if target.family != "sm90":
        return []
    specs = {"test": list(tiles.SM90_TEST) + [dict(d, pdl=True) for d in tiles.SM90_EPILOGUE_TEST],
             "default": _default(), "full": _full()}[tier]
    out = []
    for s in specs:
        v = GemmSm90(target=target.name, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out
