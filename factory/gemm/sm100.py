"""Blackwell datacenter (sm_100a) GEMM: TMA -> swizzled smem -> tcgen05.mma -> Tensor Memory,
warp-specialized and persistent, one CTA or a CTA pair per MMA.

C[m, n, l] = Σ_k A[m, k, l]·B[n, k, l]  (times scale_a·scale_b for fp8), fp32 accumulators.

Warp roles (one CTA, 6 warps):

* warp 5 — the **TMA producer**: walks the persistent tile schedule and issues TMA loads of A and
  B k-blocks into a ring of ``ab_stages`` smem stages (``PipelineTmaUmma``).  In a cluster, A is
  multicast to the CTAs along the cluster's N that share its rows, B along its M; in a CTA pair
  each CTA loads its own half of A's rows and of B's rows (the ``.2CTA`` TMA form completes on the
  leader CTA's "full" barrier, armed there with the whole pair's bytes).
* warp 4 — the **MMA issuer**: the leader CTA's MMA warp waits on "full", issues the
  stage's tcgen05.mma instructions into a TMEM accumulator stage and releases the smem stage with
  ``tcgen05.commit`` (multicast to every CTA that loaded into it).  After a tile's last k-block it
  commits the accumulator stage to the epilogue (``PipelineUmmaAsync``: both CTAs of a pair).  Two
  accumulator stages in TMEM let the next tile's MMAs run under this tile's epilogue.  The other
  CTA of a pair runs no MMA: its warp 4 only follows the schedule.
* warps 0-3 — the **epilogue**: warp 0 allocates the TMEM columns (``tcgen05.alloc``; both CTAs'
  TMEM for a pair) and frees them at the end; each warp owns 32 (or 16) TMEM lanes = output rows.
  Per ``epi_tile`` sub-tile: tcgen05.ld -> registers -> (scale) -> output dtype -> smem
  (``_EPI_STAGES`` buffers) -> one TMA store issued by warp 0.  The accumulator stage goes back to
  the MMA warp as soon as its last sub-tile is in registers.

Tails in M, N, K and L need no code: TMA zero-fills out-of-bounds loads and clips stores; the tile
scheduler rounds the tile grid up to whole clusters so multicast peers always have a tile.

The persistent grid is sized at launch as for the Hopper family (gemm/sm90.py): the argument
before the stream, ``max_clusters`` (i32), caps the grid at that many clusters (the loader passes
the clusters the device holds at once).

Nothing here has run: no Blackwell GPU is available to the project.  Each variant's proof is its
SASS (``sass_requirements``) and resources; see notes/gemm-sm100.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import cpasync, tcgen05

from ..abi import DTYPE_BYTES, ScalarArg, Signature
from ..atoms import sm100 as atoms
from ..atoms.targets import Target
from ..registry import register
from . import tiles
from .common import GemmVariant
from .sm90 import FP8_GROUP, FP8_MAX, FP8_MIN_SCALE, GATE_UP_BLOCK, epilogue_args, scale_args

# Bytes the smem plan keeps for the mbarriers and the TMEM address (padded so the swizzled buffers
# after them start 1024-aligned).
_BARRIER_BYTES = 1024
_SMEM_ALIGN = 1024
# Static smem the DSL puts into every kernel (.nv.shared.<kernel>, read back from the cubin by the
# compile test); it counts against the same per-CTA capacity as the dynamic part.
_STATIC_SMEM = 1024
_ACC_STAGES = 2  # TMEM accumulator stages: the MMA of tile i+1 under the epilogue of tile i
_EPI_STAGES = 2  # smem buffers of the epilogue's TMA stores
_MAX_AB_STAGES = 12
_LOG2_E = 1.4426950408889634

_EPILOGUE_WARPS = (0, 1, 2, 3)
_MMA_WARP = 4
_TMA_WARP = 5
THREADS = 32 * 6


class _Bar(enum.IntEnum):
    """Named hardware barriers (id 0 is __syncthreads)."""

    EPILOGUE = 1  # the 4 epilogue warps, around each sub-tile's smem writes and TMA store
    TMEM_ALLOC = 2  # the epilogue warps and the MMA warp: the TMEM address is published


# SASS that proves a cubin is this family's (nvdisasm spellings read from our own cubins; see
# notes/gemm-sm100.md).  tcgen05.mma is UTCHMMA for 16-bit operands, UTCQMMA for fp8; the CTA pair
# form carries ".2CTA".  tcgen05.alloc is UTCATOMSWS.FIND_AND_SET (in a retry loop), tcgen05.dealloc
# UTCATOMSWS.AND, tcgen05.ld LDTM, tcgen05.commit UTCBAR.
SASS_MMA = {"f16": r"\bUTCHMMA\b", "f8": r"\bUTCQMMA\b"}
SASS_MMA_PAIR = {"f16": r"\bUTCHMMA\.2CTA\b", "f8": r"\bUTCQMMA\.2CTA\b"}
SASS_COMMON = (r"\bUTCATOMSWS\.AND\b", r"\bLDTM\.",
               r"\bUTCBAR\b", r"\bUTMALDG\.3D\b", r"\bUTMASTG\.3D\b", r"\bSYNCS\.")
SASS_PAIR = (r"\bUTMALDG\.3D[\w.]*\.2CTA\b", r"\bUTCATOMSWS\.2CTA\.FIND_AND_SET\b", r"\bUTCBAR\.2CTA\b")
SASS_MULTICAST = (r"\bUTMALDG\.[\w.]*MULTICAST\b",)


def sass_tmem_alloc(columns: int) -> str:
    """tcgen05.alloc of exactly ``columns`` TMEM columns: ptxas loads the count in 32-column units
    into a uniform register (UMOV URn, cols/32) that the UTCATOMSWS.FIND_AND_SET then takes (with no
    other UMOV into that register between them)."""
    return (rf"UMOV (UR\d+), {hex(columns // 32)} ;(?:(?!UMOV \1,)[\s\S])*?"
            rf"\bUTCATOMSWS\.(?:2CTA\.)?FIND_AND_SET\.ALIGN(?= UP\d, \1, \1)")


def sass_count(pattern: str, count: int) -> str:
    """At least ``count`` matches of ``pattern`` in the disassembly.  Anchored at its start, and each
    repetition takes the text up to the next match only (no character of it starts a match), so
    the split is unique and a failing search is linear, not a search over ways of choosing."""
    return rf"\A(?:(?:(?!{pattern})[\s\S])*{pattern}){{{count}}}"


# The per-element epilogue's loads, one per accumulator element of a thread and field (ptxas keeps
# one load of the row's scale_a, which every element of a thread shares in the 32-lane layouts):
# scale_b as 32-bit loads, bias and residual as 16-bit loads of the output dtype.  Per-tensor fp8
# reads 2 scales; a kernel without epilogue fields reads nothing with LDG.
SASS_LOAD_F32 = r"\bLDG\.E R\d+,"
SASS_LOAD_U16 = r"\bLDG\.E\.U16 R\d+,"


@dataclass(frozen=True)
class _Plan:
    """Shared and tensor memory of one CTA, in plain Python (checked against the traced layouts at
    compile time)."""

    cta_tile: tuple[int, int, int]
    epi_tile: tuple[int, int]
    ab_stages: int
    stage_bytes: int
    epi_bytes: int
    tmem_cols: int  # columns allocated (a power of two)

    @property
    def smem_bytes(self) -> int:
        return _BARRIER_BYTES + self.ab_stages * self.stage_bytes + self.epi_bytes


@dataclass(frozen=True, kw_only=True)
class GemmSm100(GemmVariant):
    """One Blackwell GEMM config.  ``tile`` is the MMA tile (M, N, K): with ``pair`` its M spans
    the two CTAs of a pair (each CTA computes M/2 rows); K is one 128-byte swizzle row (64 for
    16-bit inputs, 128 for fp8).  ``cluster`` (cm, cn) in CTAs; a pair needs cm even."""

    family: ClassVar[str] = "sm100"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm100.py", "gemm/common.py", "atoms/sm100.py", "abi.py",
                                          "gemm/sm90.py")

    # Declared first so that a pair variant's name ("..._2cta_t256...") sorts before the 1-CTA
    # variant with the same CTA tile: the loader's tile heuristic keeps the first of equals.
    pair: bool = field(default=False, metadata={"tag": "2cta"})
    tile: tuple[int, int, int] = field(default=(128, 128, 64), metadata={"tag": "t"})
    cluster: tuple[int, int] = field(default=(1, 1), metadata={"tag": "c"})
    # Programmatic dependent launch, as in the Hopper family.
    pdl: bool = field(default=False, metadata={"tag": "pdl"})
    # fp8 with a scale per row of A and per row of B (torch ``_scaled_mm`` row-wise: scale_a (M,),
    # scale_b (N,)), applied to the fp32 accumulators in the epilogue; the argument contract is the
    # Hopper family's (gemm/sm90.py ``scale_args``).  Off: one scale per tensor.
    row_scale: bool = field(default=False, metadata={"tag": "rowsc"})
    # Epilogue fields, as the Hopper family's (gemm/sm90.py ``epilogue_args``: the same arguments,
    # manifest fields and order): after the fp8 scales, ``+ bias[col]`` (bias (N,), the output
    # dtype), then ``+ residual[row, col]`` (residual (M, N, L), the output dtype; may be ``c``
    # itself).  Each off by default: a variant without them compiles the kernel it did before.
    bias: bool = field(default=False, metadata={"tag": "bias"})
    # SiLU(gate)·up (the Hopper family's form): B's rows hold gate and up rows in blocks of
    # GATE_UP_BLOCK, the 128-column tile one gate block and its up block; the output has N / 2
    # columns, out[:, j] = silu(gate_j)·up_j (then the residual, over the output's columns).
    silu_mul: bool = field(default=False, metadata={"tag": "silumul"})
    residual: bool = field(default=False, metadata={"tag": "res"})
    # The output in e4m3 with one float32 scale per row and 128 columns (the Hopper family's
    # ``fp8_groups``: scale = max(amax / 448, FP8_MIN_SCALE), out = e4m3(x / scale), the scales
    # written to ``scale_out`` (M, ceil(N / 128)) M-major).  Each epilogue thread holds one row of
    # the 128-row tile: its amax needs no exchange (a first pass of tcgen05.ld over the tile).
    fp8_groups: bool = field(default=False, metadata={"tag": "q128"})

    @property
    def scale_mode(self) -> str:
        """fp8 scales: "tensor" (one each) or "row" (scale_a (M,), scale_b (N,))."""
        return "row" if self.row_scale else "tensor"

    @property
    def has_epilogue(self) -> bool:
        return self.bias or self.silu_mul or self.residual or self.fp8_groups

    @property
    def epilogue(self) -> list[str]:
        """The epilogue fields that are on, in the order they apply."""
        return [f for f in ("bias", "silu_mul", "residual", "fp8_groups") if getattr(self, f)]

    def signature(self) -> Signature:
        sig = super().signature()
        args, div = sig.args, sig.divisibility
        if self.row_scale:
            args = tuple(a for a in args if a.name not in ("scale_a", "scale_b")) + scale_args("row")
        if self.has_epilogue:
            args, div = epilogue_args(self, args, div)
        return Signature(args + (ScalarArg("max_clusters", "i32"),), div)

    def sass_requirements(self) -> tuple[str, ...]:
        kind = "f8" if self.is_fp8 else "f16"
        req = (SASS_MMA[kind], sass_tmem_alloc(self.plan().tmem_cols)) + SASS_COMMON
        if self.pair:
            req += (SASS_MMA_PAIR[kind],) + SASS_PAIR
        if self.mcast:
            req += SASS_MULTICAST
        if self.pdl:  # griddepcontrol.launch_dependents and .wait
            req += (r"\bPREEXIT\b", r"\bACQBULK\b")
        if self.is_fp8:  # the per-tensor scales are read
            req += (r"\bLDG\.E\b",)
        per_thread = self.epi_elements_per_thread
        # A thread's elements of a sub-tile: one row (128-row tiles, tcgen05.ld 32x32b) or two
        # (64 rows a CTA, 16 lanes a warp); ptxas loads a column's scale_b or bias once.
        cols = per_thread // (2 if self.cta_tile[0] == 64 else 1)
        if self.row_scale:  # scale_b per output column
            req += (sass_count(SASS_LOAD_F32, cols),)
        u16 = (cols if self.bias else 0) + (per_thread if self.residual else 0)
        if u16:  # bias per column, residual per element
            req += (sass_count(SASS_LOAD_U16, u16),)
        if self.silu_mul:  # the gate and the up sub-tile (two tcgen05.ld), an exp2 per output
            req += (sass_count(r"\bLDTM\.", 2), sass_count(r"\bMUFU\.EX2\b", per_thread))
        if self.fp8_groups:  # the amax pass and the store pass (two tcgen05.ld), e4m3 pairs, the scales
            req += (sass_count(r"\bLDTM\.", 2), r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB", r"\bSTG\.E\b")
        return req

    @property
    def epi_elements_per_thread(self) -> int:
        """Accumulator elements one epilogue thread holds per sub-tile (4 warps share it)."""
        em, en = self.plan().epi_tile
        return em * en // (32 * len(_EPILOGUE_WARPS))

    def proof_level(self) -> str:
        return "sass-only"

    # --- validity --------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm100" or not tgt.tmem:
            return f"target {self.target} is not a Blackwell datacenter (sm100) target"
        if self.ab not in ("bf16", "f16", "e4m3"):
            return f"input dtype {self.ab} not supported"
        if self.c not in ("bf16", "f16", "f32") and not (self.c == "e4m3" and self.fp8_groups):
            return f"output dtype {self.c} not supported (e4m3 only with fp8_groups)"
        if self.is_fp8 and (self.a_major, self.b_major) != ("k", "k"):
            return "fp8 variants take K-major operands only"
        if self.a_major not in ("k", "m") or self.b_major not in ("k", "n"):
            return f"majorness a={self.a_major} b={self.b_major} not supported"
        if self.row_scale and not self.is_fp8:
            return "row scales apply to fp8 only"
        if self.fp8_groups:
            if self.c != "e4m3" or self.is_fp8 or self.epilogue != ["fp8_groups"]:
                return "fp8_groups writes e4m3 from 16-bit inputs, without other epilogue fields"
            if self.pair or self.tile[:2] != (128, FP8_GROUP):
                return f"fp8_groups runs the 1-CTA 128x{FP8_GROUP} tile (a thread's row is one scale group)"
        elif (self.row_scale or self.has_epilogue) and self.c not in ("bf16", "f16"):
            return "row scales and epilogue fields write bf16 or f16"
        if self.silu_mul:
            # One gate block and its up block per 128-column tile of one CTA, the sub-tiles of the
            # epilogue spanning the tile's rows (gate sub-tile s, up sub-tile s + half).
            if self.is_fp8 or self.bias or self.pair or self.tile[1] != 2 * GATE_UP_BLOCK:
                return (f"silu_mul runs 16-bit inputs without bias on a 1-CTA tile {2 * GATE_UP_BLOCK} "
                        "columns wide")
        if self.pair and not tgt.cta_pairs:
            return "target has no CTA pairs"
        tm, tn, tk = self.tile
        if tk != 128 // DTYPE_BYTES[self.ab]:
            return f"tile K must be one 128-byte row ({128 // DTYPE_BYTES[self.ab]} for {self.ab})"
        # tcgen05.mma shapes (PTX ISA, kind::f16 / kind::f8f6f4, dense): cta_group::1 M 64 or 128,
        # cta_group::2 M 128 or 256; N a multiple of 16 (M 128/256) or 8 (M 64) up to 256.  The
        # epilogue's TMA store needs sub-tiles of at least 32 columns here (16-byte rows).
        if tm not in ((128, 256) if self.pair else (64, 128)):
            return f"MMA tile M must be {'128 or 256' if self.pair else '64 or 128'}"
        if not 32 <= tn <= 256 or tn % 32:
            return "MMA tile N must be a multiple of 32 from 32 to 256"
        cm, cn = self.cluster
        if cm < 1 or cn < 1 or cm & (cm - 1) or cn & (cn - 1) or cm * cn > 16:
            return "cluster dims must be powers of two, at most 16 CTAs"
        if self.pair and cm % 2:
            return "a CTA pair needs an even cluster M"
        if (cm, cn) != (1, 1) and not tgt.clusters:
            return "target has no clusters"
        plan = self.plan()
        if plan.tmem_cols > atoms.TMEM_COLUMNS:
            return f"needs {plan.tmem_cols} TMEM columns > {atoms.TMEM_COLUMNS}"
        if plan.ab_stages < 3:
            return f"only {plan.ab_stages} smem stage(s) fit"
        if plan.smem_bytes + _STATIC_SMEM > tgt.smem_per_cta:
            return f"needs {plan.smem_bytes} + {_STATIC_SMEM} B smem > {tgt.smem_per_cta}"
        return None

    # --- derived ---------------------------------------------------------------------------------
    @property
    def cta_tile(self) -> tuple[int, int, int]:
        tm, tn, tk = self.tile
        return (tm // 2 if self.pair else tm, tn, tk)

    @property
    def mcast(self) -> bool:
        """TMA multicast: another MMA tile of the cluster shares this one's A or B rows."""
        cm, cn = self.cluster
        return cn > 1 or cm > (2 if self.pair else 1)

    def plan(self) -> _Plan:
        cm_rows, tn, tk = self.cta_tile
        ab = DTYPE_BYTES[self.ab]
        # This CTA's A rows and its share of B: a pair splits B's N rows between its two CTAs.
        b_rows = tn // 2 if self.pair else tn
        stage_bytes = _round_up(cm_rows * tk * ab, _SMEM_ALIGN) + _round_up(b_rows * tk * ab, _SMEM_ALIGN)
        epi = atoms.epilogue_tile(cm_rows, tn, self.pair, 8 * DTYPE_BYTES[self.c], False)
        epi_bytes = _round_up(epi[0] * epi[1] * DTYPE_BYTES[self.c], _SMEM_ALIGN) * _EPI_STAGES
        budget = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - epi_bytes
        ab_stages = min(budget // stage_bytes, _MAX_AB_STAGES)
        tmem_cols = atoms.tmem_alloc_columns(atoms.acc_columns(cm_rows, tn, _ACC_STAGES))
        return _Plan(self.cta_tile, epi, ab_stages, stage_bytes, epi_bytes, tmem_cols)

    def smem_bytes(self) -> int:
        return self.plan().smem_bytes

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        plan = self.plan()
        sig = self.signature()
        cm, cn = self.cluster
        d.update({
            # The output tile of one CTA (what the loader counts CTAs with); the MMA tile spans a
            # pair's two CTAs.
            "tile": list(self.cta_tile),
            "mma_tile": list(self.tile),
            "cta_group": 2 if self.pair else 1,
            "cluster": list(self.cluster),
            "stages": plan.ab_stages,
            "acc_stages": _ACC_STAGES,
            "epi_tile": list(plan.epi_tile),
            "smem_bytes": plan.smem_bytes,
            "tmem_columns": plan.tmem_cols,
            "threads": THREADS,
            "persistent": {"arg": "max_clusters", "cluster_ctas": cm * cn},
            "scaled": self.is_fp8,
            "scale_mode": self.scale_mode if self.is_fp8 else None,
            "constraints": {
                "divisibility": dict(sig.divisibility),
                "align_bytes": 16,
                "tails": ["M", "N", "K", "L"],
            },
        })
        if self.has_epilogue:
            d["epilogue"] = self.epilogue  # fused epilogue fields in the order they apply
            if self.silu_mul:
                d["gate_up_block"] = GATE_UP_BLOCK
            if self.fp8_groups:
                d["fp8_group"] = FP8_GROUP
        return d

    def make_kernel(self):
        plan = self.plan()
        kernel = GemmSm100Kernel(mma_tile=self.tile, cluster=self.cluster, pair=self.pair,
                                 ab_stages=plan.ab_stages, epi_tile=plan.epi_tile,
                                 tmem_cols=plan.tmem_cols, stage_bytes=plan.stage_bytes,
                                 pdl=self.pdl, smem_plan=plan.smem_bytes,
                                 row_scale=self.row_scale, epilogue=tuple(self.epilogue))
        return kernel.entry(self.is_fp8)


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GemmSm100Kernel:
    """Host side: ``__call__`` (a, b, c, max_clusters, stream) and ``scaled`` (a, b, c, scale_a,
    scale_b, max_clusters, stream) build the MMA, the TMA atoms, the smem layouts and the persistent
    grid, then launch ``kernel``.  See the module docstring for the warp roles."""

    def __init__(self, *, mma_tile, cluster, pair, ab_stages, epi_tile, tmem_cols, stage_bytes,
                 pdl, smem_plan, row_scale=False, epilogue=()):
        self.mma_tiler = tuple(mma_tile)
        self.cluster = tuple(cluster)
        self.pair = pair
        self.v = 2 if pair else 1  # CTAs per MMA
        self.cta_tile = (mma_tile[0] // self.v, mma_tile[1], mma_tile[2])
        self.ab_stages = ab_stages
        self.epi_tile_mn = tuple(epi_tile)
        self.tmem_cols = tmem_cols
        self.stage_bytes = stage_bytes
        self.pdl = pdl
        self.smem_plan = smem_plan
        # Epilogue math beyond the per-tensor scale: each output element needs its coordinates.
        self.row_scale = row_scale
        self.epi_fields = tuple(epilogue)
        # The output tile of one CTA (silu_mul: half the MMA tile's columns).
        self.c_tile = (self.cta_tile[0], self.cta_tile[1] // (2 if "silu_mul" in self.epi_fields else 1))
        self.silu = "silu_mul" in self.epi_fields
        self.q128 = "fp8_groups" in self.epi_fields
        self.per_element = row_scale or "bias" in self.epi_fields or "residual" in self.epi_fields
        self.coords = self.per_element or self.q128  # output coordinates per register element

    def entry(self, fp8: bool):
        """The host entry whose arguments follow the variant's signature: a, b, c, then the fp8
        scales, then bias and residual where those fields are on, then max_clusters and stream."""
        if self.q128:
            return self.with_q
        key = ("bias" in self.epi_fields, "residual" in self.epi_fields)
        if fp8:
            return {(False, False): self.scaled, (True, False): self.scaled_bias,
                    (False, True): self.scaled_res, (True, True): self.scaled_bias_res}[key]
        return {(False, False): self.__call__, (True, False): self.with_bias,
                (False, True): self.with_res, (True, True): self.with_bias_res}[key]

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, max_clusters: cutlass.Int32,
                 stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream)

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
               scale_b: cute.Tensor, max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, max_clusters, stream)

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
    def with_q(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_out: cute.Tensor,
               max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, max_clusters, stream, None, None, scale_out)

    @cute.jit
    def _launch(self, a, b, c, scale_a, scale_b, max_clusters, stream, bias=None, residual=None,
                scale_out=None):
        ab_dtype, c_dtype = a.element_type, c.element_type
        c_layout = utils.LayoutEnum.from_tensor(c)
        mma = atoms.tiled_mma(ab_dtype, utils.LayoutEnum.from_tensor(a).mma_major_mode(),
                              utils.LayoutEnum.from_tensor(b).mma_major_mode(), self.pair,
                              self.mma_tiler[:2])
        vmnk = atoms.cluster_vmnk(self.cluster, mma)
        sA_layout, sB_layout = atoms.smem_layouts(mma, self.mma_tiler, ab_dtype, self.ab_stages)
        # The plan's bytes per stage (which sized the stage count) must be what the layouts hold.
        a_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sA_layout, (None, None, None, 0)))
        b_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sB_layout, (None, None, None, 0)))
        if cutlass.const_expr(a_bytes + b_bytes > self.stage_bytes):
            raise ValueError(f"smem stage holds {a_bytes} + {b_bytes} B, the plan {self.stage_bytes}")
        # Bytes the TMA delivers per stage onto the leader's "full" barrier (both CTAs of a pair).
        self.tx_bytes = (a_bytes + b_bytes) * self.v
        epi_tile = atoms.bw.compute_epilogue_tile_shape(self.cta_tile, self.pair, c_layout, c_dtype)
        if cutlass.const_expr(tuple(cute.product_each(cute.shape(epi_tile))) != self.epi_tile_mn):
            raise ValueError(f"epilogue tile {cute.product_each(cute.shape(epi_tile))} differs from the plan")
        if cutlass.const_expr(self.silu and self.epi_tile_mn[0] != self.cta_tile[0]):
            # silu_mul pairs sub-tile s with s + half: the sub-tiles must go along N only.
            raise ValueError(f"silu_mul needs an epilogue tile spanning the tile's {self.cta_tile[0]} rows")
        sC_layout = atoms.epilogue_smem_layout(c_dtype, c_layout, epi_tile, _EPI_STAGES)
        # And the TMEM columns the plan reports must be what the accumulator stages take.
        acc_fake = mma.make_fragment_C(
            cute.append(mma.partition_shape_C(self.mma_tiler[:2]), _ACC_STAGES))
        if cutlass.const_expr(atoms.tmem_columns_of(acc_fake) != self.tmem_cols):
            raise ValueError(f"accumulators take {atoms.tmem_columns_of(acc_fake)} TMEM columns, "
                             f"the plan {self.tmem_cols}")

        tma_a, gA = atoms.tma_load_a(a, sA_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_b, gB = atoms.tma_load_b(b, sB_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_c, gC = atoms.tma_store(c, sC_layout, epi_tile)

        tiles_mnl = cute.zipped_divide(c, tiler=self.c_tile)[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(tiles_mnl, (*self.cluster, 1))
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(
            sched, cutlass.max(max_clusters, cutlass.Int32(1)))

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            acc_barriers: cute.struct.MemRange[cutlass.Int64, _ACC_STAGES * 2]
            tmem_dealloc_barrier: cutlass.Int64
            tmem_address: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        # The smem plan (the manifest's figure, the loader's occupancy query) is what the kernel
        # allocates.
        if cutlass.const_expr(SharedStorage.size_in_bytes() != self.smem_plan):
            raise ValueError(f"SharedStorage is {SharedStorage.size_in_bytes()} B, the plan {self.smem_plan}")
        self.c_layout = c_layout
        self.kernel(
            mma, tma_a, gA, tma_b, gB, tma_c, gC, scale_a, scale_b, bias, residual, scale_out, vmnk,
            sA_layout, sB_layout, sC_layout, epi_tile, sched,
        ).launch(
            grid=grid, block=[THREADS, 1, 1], cluster=(*self.cluster, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=self.pdl,
        )

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mma: cute.TiledMma,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor,
        scale_a, scale_b, bias, residual, scale_out,
        vmnk: cute.Layout,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        epi_tile: cute.Tile,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == _TMA_WARP:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        bidx, _, _ = cute.arch.block_idx()
        mma_v = bidx % self.v  # this CTA's half of a pair's MMA tile (0: the leader)
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord_vmnk = vmnk.get_flat_coord(cta_rank)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)

        mcast_a = cute.size(vmnk.shape[2])  # CTAs (MMA tiles) along N that share A's rows
        mcast_b = cute.size(vmnk.shape[1])
        ab_pipe = atoms.ab_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, vmnk, self.tx_bytes,
                                    mcast_a + mcast_b - 1)
        acc_pipe = atoms.acc_pipeline(storage.acc_barriers.data_ptr(), _ACC_STAGES, vmnk,
                                      len(_EPILOGUE_WARPS), self.pair)
        tmem = atoms.tmem_allocator(storage.tmem_address, storage.tmem_dealloc_barrier,
                                    int(_Bar.TMEM_ALLOC), 32 * (len(_EPILOGUE_WARPS) + 1),
                                    _EPILOGUE_WARPS[0], self.pair)
        pipeline.pipeline_init_arrive(cluster_shape_mn=vmnk, is_relaxed=True)

        # (bM, bK, tiles_m, tiles_k, L) etc. in MMA tiles, then this CTA's part of them.
        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])
        thr_mma = mma.get_slice(mma_v)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        # The (m, n, l) coordinates of the output elements, partitioned like C (per-element
        # epilogue math: row scales, bias, residual).
        tCcC = None
        if cutlass.const_expr(self.silu):
            # C's tiles are half as wide as the MMA's (1-CTA: the CTA's tile, unpartitioned).
            tCgC = cute.local_tile(mC, self.c_tile, (None, None, None))
            if cutlass.const_expr(self.per_element):
                tCcC = cute.local_tile(cute.make_identity_tensor(mC.shape), self.c_tile, (None, None, None))
        else:
            gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
            tCgC = thr_mma.partition_C(gC)
            if cutlass.const_expr(self.coords):
                cC = cute.local_tile(cute.make_identity_tensor(mC.shape),
                                     cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
                tCcC = thr_mma.partition_C(cC)
        # The accumulator stages' TMEM layout (its address is known once allocated).
        acc_shape = mma.partition_shape_C(self.mma_tiler[:2])
        acc_layout = mma.make_fragment_C(cute.append(acc_shape, _ACC_STAGES)).layout

        pipeline.pipeline_init_wait(cluster_shape_mn=vmnk)
        if cutlass.const_expr(self.pdl):
            # Every CTA of this persistent grid is resident (the grid is capped at what the device
            # holds): the next kernel may be scheduled now.  Nothing above touched global memory.
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()

        if warp_idx == _TMA_WARP:
            self.produce(tma_a, tma_b, sA, sB, tCgA, tCgB, ab_pipe, vmnk, coord_vmnk, sched_params,
                         k_tiles)
        if warp_idx == _MMA_WARP:
            tmem.wait_for_alloc()
            acc = cute.make_tensor(tmem.retrieve_ptr(cutlass.Float32), acc_layout)
            self.mma_loop(mma, sA, sB, acc, ab_pipe, acc_pipe, sched_params, k_tiles, mma_v == 0)
        if warp_idx < _MMA_WARP:
            tmem.allocate(self.tmem_cols)
            tmem.relinquish_alloc_permit()  # this CTA allocates nothing more
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            self.epilogue(tidx, warp_idx, mma, tma_c, acc, sC, tCgC, epi_tile, acc_pipe, scale_a,
                          scale_b, sched_params, tCcC, bias, residual, scale_out)
            tmem.free(acc_ptr)

    @cute.jit
    def produce(self, tma_a, tma_b, sA, sB, tCgA, tCgB, ab_pipe, vmnk, coord_vmnk, sched_params,
                k_tiles):
        """The TMA warp: for every scheduled tile, every k-block into the next free stage."""
        # This CTA's slice of the tile it shares with its multicast peers, and the peers.
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, coord_vmnk[2], cute.make_layout(cute.slice_(vmnk, (0, 0, None, 0)).shape),
            cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, coord_vmnk[1], cute.make_layout(cute.slice_(vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        a_mask = None
        b_mask = None
        if cutlass.const_expr(cute.size(vmnk) > 1):
            a_mask = cpasync.create_tma_multicast_mask(vmnk, coord_vmnk, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(vmnk, coord_vmnk, mcast_mode=1)

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            tAgA_t = tAgA[(None, m // self.v, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            for k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar,
                          mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar,
                          mcast_mask=b_mask)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        # Do not exit while a peer may still multicast into (or release to) this CTA.
        ab_pipe.producer_tail(state)

    @cute.jit
    def mma_loop(self, mma, sA, sB, acc, ab_pipe, acc_pipe, sched_params, k_tiles, is_leader):
        """The MMA warp: per tile, every k-block's tcgen05.mma into the next TMEM accumulator
        stage; only a pair's leader CTA issues them (the instruction covers both CTAs)."""
        tCrA = mma.make_fragment_A(sA)
        tCrB = mma.make_fragment_B(sB)
        k_blocks = cute.size(tCrA, mode=[2])
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, _ACC_STAGES)
        while work.is_valid_tile:
            if is_leader:
                acc_t = acc[(None, None, None, acc_state.index)]
                acc_pipe.producer_acquire(acc_state)
                # The first k-block overwrites the stage (it holds the tile before last).
                mma.set(tcgen05.Field.ACCUMULATE, False)
                for _k in cutlass.range(k_tiles, unroll=1):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(mma, acc_t, tCrA[blk], tCrB[blk], acc_t)
                        mma.set(tcgen05.Field.ACCUMULATE, True)
                    # tcgen05.commit: the stage is free once these MMAs have read it.
                    ab_pipe.consumer_release(read)
                    read.advance()
                acc_pipe.producer_commit(acc_state)
            acc_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        # Do not exit (and let the TMEM go) while the epilogue may still read an accumulator.
        acc_pipe.producer_tail(acc_state)

    @cute.jit
    def epilogue(self, tidx, warp_idx, mma, tma_c, acc, sC, tCgC, epi_tile, acc_pipe, scale_a,
                 scale_b, sched_params, tCcC=None, bias=None, residual=None, scale_out=None):
        """The epilogue warps: per tile, per sub-tile: TMEM -> registers (tcgen05.ld) -> scale, bias,
        residual -> convert -> smem -> TMA store; then the accumulator stage goes back to the MMA
        warp."""
        c_dtype = sC.element_type
        # (EPI_M, EPI_N, epi_m, epi_n, STAGE) views of the accumulator, tiles of C likewise.
        acc_epi = cute.flat_divide(acc[((None, None), 0, 0, None)], epi_tile)
        t2r = atoms.tmem_load(self.cta_tile, self.c_layout, c_dtype, epi_tile, self.pair,
                              acc_epi[(None, None, 0, 0, 0)])
        thr_t2r = t2r.get_slice(tidx)
        tTR_tAcc = thr_t2r.partition_S(acc_epi)
        if cutlass.const_expr(self.silu):
            gC_epi = cute.flat_divide(tCgC, epi_tile)
        else:
            gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        tTR_gC = thr_t2r.partition_D(gC_epi)
        tTR_cC = None
        if cutlass.const_expr(self.coords):  # coordinates of the registers' elements
            if cutlass.const_expr(self.silu):
                tTR_cC = thr_t2r.partition_D(cute.flat_divide(tCcC, epi_tile))
            else:
                tTR_cC = thr_t2r.partition_D(
                    cute.flat_divide(tCcC[((None, None), 0, 0, None, None, None)], epi_tile))
        tTR_rAcc = cute.make_rmem_tensor(tTR_gC[(None, None, None, 0, 0, 0, 0, 0)].shape,
                                         cutlass.Float32)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, c_dtype)
        tTR_rUp = None
        if cutlass.const_expr(self.silu):  # the up sub-tile beside the gate sub-tile
            tTR_rUp = cute.make_rmem_tensor(tTR_rAcc.shape, cutlass.Float32)
        r2s = atoms.smem_store(self.c_layout, c_dtype, t2r)
        tRS_sC = r2s.get_slice(tidx).partition_D(sC)
        tRS_rC = r2s.retile(tTR_rC)
        bSG_sC, bSG_gC = cpasync.tma_partition(
            tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2))

        threads = 32 * len(_EPILOGUE_WARPS)
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=_EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads))
        epi_bar = pipeline.NamedBarrier(barrier_id=int(_Bar.EPILOGUE), num_threads=threads)

        scale = cutlass.Float32(1.0)
        if cutlass.const_expr(scale_a is not None and not self.row_scale):
            scale = scale_a[0] * scale_b[0]

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, _ACC_STAGES)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            bSG_gC_t = cute.group_modes(bSG_gC[(None, None, None, m // self.v, n, l)], 1, 3)
            tTR_tAcc_t = cute.group_modes(
                tTR_tAcc[(None, None, None, None, None, acc_state.index)], 3, 5)
            acc_pipe.consumer_wait(acc_state)
            tTR_cC_t = None
            if cutlass.const_expr(self.coords):
                tTR_cC_t = cute.group_modes(tTR_cC[(None, None, None, None, None, m // self.v, n, l)], 3, 5)
            n_sub = cute.size(tTR_tAcc_t.shape, mode=[3])
            if cutlass.const_expr(self.silu):
                # Output sub-tile s: the gate sub-tile s and the up sub-tile s + n_sub / 2 of
                # the accumulator (the epilogue tile spans the tile's rows: sub-tiles go along N).
                n_sub = n_sub // 2
            done = sched.num_tiles_executed * n_sub
            inv = cutlass.Float32(1.0)
            if cutlass.const_expr(self.q128):
                inv = self.row_group_scale(t2r, tTR_tAcc_t, tTR_rAcc, tTR_cC_t, scale_out, n, n_sub)
            for s in cutlass.range(n_sub):
                cute.copy(t2r, tTR_tAcc_t[(None, None, None, s)], tTR_rAcc)
                if cutlass.const_expr(self.silu):
                    cute.copy(t2r, tTR_tAcc_t[(None, None, None, s + n_sub)], tTR_rUp)
                if s == n_sub - 1:
                    # The stage's last tcgen05.ld has been issued: wait for it (tcgen05.wait::ld)
                    # and give the stage back to the MMA warp, one arrival per warp, so the next
                    # tile's MMAs may overwrite it while this sub-tile is stored.
                    cute.arch.fence_view_async_tmem_load()
                    with cute.arch.elect_one():
                        acc_pipe.consumer_release(acc_state)
                if cutlass.const_expr(self.silu):
                    for i in cutlass.range_constexpr(cute.size(tTR_rAcc)):
                        g = tTR_rAcc[i]
                        sig = cute.arch.rcp_approx(1.0 + cute.math.exp2(-g * _LOG2_E, fastmath=True))
                        tTR_rAcc[i] = g * sig * tTR_rUp[i]
                if cutlass.const_expr(self.per_element):
                    self.apply_epilogue(tTR_rAcc, tTR_cC_t[(None, None, None, s)], scale_a, scale_b,
                                        bias, residual)
                vals = tTR_rAcc.load()
                if cutlass.const_expr(scale_a is not None and not self.row_scale):
                    vals = vals * scale
                if cutlass.const_expr(self.q128):
                    vals = vals * inv
                tTR_rC.store(vals.to(c_dtype))
                buf = (done + s) % _EPI_STAGES
                cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                # Make the generic-proxy smem writes visible to the TMA (async proxy).
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_bar.arrive_and_wait()
                if warp_idx == _EPILOGUE_WARPS[0]:
                    cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC_t[(None, s)])
                    store_pipe.producer_commit()
                    store_pipe.producer_acquire()
                epi_bar.arrive_and_wait()
            acc_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        store_pipe.producer_tail()

    @cute.jit
    def row_group_scale(self, t2r, tTR_tAcc_t, rAcc, tTR_cC_t, scale_out, group, n_sub):
        """fp8_groups, first pass over the tile's accumulator (tcgen05.ld of every sub-tile): the
        amax of this thread's row (one TMEM lane, all of the tile's columns), its scale written to
        ``scale_out[row, group]`` (rows past M write nothing); returns 1 / scale."""
        amax = cutlass.Float32(0.0)
        for s in cutlass.range(n_sub):
            cute.copy(t2r, tTR_tAcc_t[(None, None, None, s)], rAcc)
            for i in cutlass.range_constexpr(cute.size(rAcc)):
                x = rAcc[i]
                amax = cute.arch.fmax(amax, cute.arch.fmax(x, -x))
        scale = cute.arch.fmax(amax / cutlass.Float32(FP8_MAX), cutlass.Float32(FP8_MIN_SCALE))
        row = tTR_cC_t[(None, None, None, 0)][0][0]
        if row < cute.size(scale_out, mode=[0]):
            scale_out[row, group] = scale
        return cutlass.Float32(1.0) / scale

    @cute.jit
    def apply_epilogue(self, acc, coords, scale_a, scale_b, bias, residual):
        """Per accumulator element of this thread (fp32 registers after tcgen05.ld), at its output
        coordinates (m, n, l): ``x *= scale_a[m]·scale_b[n]`` (row scales), ``x += bias[n]``,
        ``x += residual[m, n, l]``.  Coordinates past the end read the last element (those
        outputs are clipped by the TMA store), so no load needs a predicate.  The residual of a
        sub-tile is read before that sub-tile is stored: ``residual`` may be ``c`` itself."""
        for i in cutlass.range_constexpr(cute.size(acc)):
            crd = coords[i]
            x = acc[i]
            if cutlass.const_expr(self.row_scale):
                row = cutlass.min(crd[0], cute.size(scale_a) - 1)
                col = cutlass.min(crd[1], cute.size(scale_b) - 1)
                x = x * (scale_a[row] * scale_b[col])
            if cutlass.const_expr(bias is not None):
                x = x + bias[cutlass.min(crd[1], cute.size(bias) - 1)].to(cutlass.Float32)
            if cutlass.const_expr(residual is not None):
                rr = cutlass.min(crd[0], cute.size(residual, mode=[0]) - 1)
                rc = cutlass.min(crd[1], cute.size(residual, mode=[1]) - 1)
                x = x + residual[rr, rc, crd[2]].to(cutlass.Float32)
            acc[i] = x


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

def _variants(target: Target, specs) -> list[GemmSm100]:
    out = []
    for s in specs:
        v = GemmSm100(target=target.name, pdl=True, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out


@register("gemm")
def enumerate_sm100(target: Target, tier: str) -> list[GemmSm100]:
    if target.family != "sm100":
        return []
    return _variants(target, tiles.SM100_TEST if tier == "test" else tiles.SM100_DEFAULT)


@register("gemm")
def enumerate_sm100_forms(target: Target, tier: str) -> list[GemmSm100]:
    """Row-wise fp8 scales and the fused epilogue fields on this family (tiles.SM100_FORMS_*)."""
    if target.family != "sm100":
        return []
    return _variants(target, {"test": tiles.SM100_FORMS_TEST,
                              "default": tiles.SM100_FORMS_DEFAULT}.get(tier, tiles.SM100_FORMS_FULL))
