"""Blackwell datacenter (sm_100a) block-scaled GEMM: MXFP8 and NVFP4 operands, tcgen05.mma
``.block_scale`` with the scale factors in Tensor Memory.

C[m, n, l] = g · Σ_k (A[m, k, l]·SA[m, k // vec, l]) · (B[n, k, l]·SB[n, k // vec, l]),  fp32
accumulation, bf16 out; g = global_a · global_b for NVFP4 (per-tensor fp32 decode scales, device
tensors), 1 for MXFP8.

- MXFP8 (``mxf8e4m3``, ``mxf8e5m2``): e4m3 / e5m2 data, one e8m0 scale factor per 32 elements
  along K; ``tcgen05.mma.kind::mxf8f6f4.block_scale`` (K = 32 per instruction, scale_vec::1X).
- NVFP4 (``nvf4``): e2m1 data packed two to a byte, one e4m3 scale factor per 16 elements;
  ``tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X`` (K = 64 per instruction).

The structure is the dense family's (gemm/sm100.py: the same warp roles, persistent schedule,
clusters, CTA pairs, epilogue — which this class inherits): the TMA warp loads, per k-tile of 128
bytes of K, the stage's A and B data *and* their scale factors (``SF_LAYOUT`` atoms of 512 bytes:
128 rows × 4 scale factors, see factory/abi.py); the MMA warp copies the stage's scale factors
from smem into TMEM columns beside the accumulators (``tcgen05.cp .32x128b.warpx4``) and issues
the 4 block-scaled MMAs of the k-tile, which read A/B from smem and the scale factors from TMEM.
tcgen05.cp and tcgen05.mma issued by one thread execute in order, so one TMEM copy of the scale
factors serves every k-tile: the next tile's tcgen05.cp runs after the MMAs that read the last.

In a CTA pair (``cta_group::2``) each CTA loads its own 128 rows of A with their scale factors and
half of B's rows, but the scale factors of all N rows of B (multicast to both CTAs: each CTA's
TMEM must hold them for its half of the MMA).  TMEM per CTA: two fp32 accumulator stages of N
columns, then the scale factors of A (16 columns) and B (16 per 128 rows of N); N = 128 keeps
that within 512 columns (N = 256 would need a single, early-released accumulator stage).

Tails: M, N, L as the dense family (TMA zero fill, clipped stores); K must be a multiple of 32
(whole 16-byte rows of fp4 data, whole MXFP8 blocks), and the scale-factor buffers' padding
(rows past M/N, k-blocks past K) must be finite — the runtime's ``pack`` writes zeros there.

Nothing here has run: no Blackwell GPU is available to the project.  Each variant's proof is its
SASS (``sass_requirements``) and resources; see notes/gemm-sm100.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import cpasync, tcgen05

from ..abi import BLOCK_FORMATS, DTYPE_BITS, DTYPE_BYTES, SF_LAYOUT, SF_LAYOUT_SHAPE, ScalarArg, Signature, TensorArg
from ..atoms import sm100 as atoms
from ..registry import register
from ..variant import Variant
from .sm100 import (_ACC_STAGES, _BARRIER_BYTES, _EPI_STAGES, _EPILOGUE_WARPS, _MAX_AB_STAGES, _MMA_WARP,
                    _SMEM_ALIGN, _STATIC_SMEM, _TMA_WARP, SASS_COMMON, SASS_MULTICAST, SASS_PAIR, THREADS,
                    GemmSm100Kernel, _Bar, _round_up, sass_tmem_alloc)

# SASS of the block-scaled forms (nvdisasm spellings read from our own cubins, notes/gemm-sm100.md).
# tcgen05.mma.kind::mxf8f6f4.block_scale is UTCQMMA, as the dense kind::f8f6f4, but with a TMEM
# operand after the instruction descriptor (B's scale factors; A's come before it):
#   UTCQMMA gdesc[A], gdesc[B], tmem[D], tmem[SFA], idesc[..], tmem[SFB], UPn     (dense: idesc[..], URn, UPn)
# kind::mxf4nvf4 with scale_vec::4X is UTCOMMA.4X; the CTA-pair forms carry ".2CTA".  tcgen05.cp
# .32x128b.warpx4 (smem -> TMEM) is UTCCP.T.S[.2CTA].4x32dp128bit; its TMEM column offset is where the
# scale factors sit (after the accumulator stages).  The scale factors' TMA is 4-D (UTMALDG.4D).
_SF_OPERAND = r"[^;\n]*idesc\[UR\d+\], tmem\[UR\d+\]"
SASS_BS_MMA = {"mxf8": r"\bUTCQMMA(?:\.2CTA)? " + _SF_OPERAND, "nvf4": r"\bUTCOMMA(?:\.2CTA)?\.4X " + _SF_OPERAND}
SASS_BS_MMA_PAIR = {"mxf8": r"\bUTCQMMA\.2CTA " + _SF_OPERAND, "nvf4": r"\bUTCOMMA\.2CTA\.4X " + _SF_OPERAND}
SASS_SF_COPY_PAIR = r"\bUTCCP\.T\.S\.2CTA\.4x32dp128bit\b"
SASS_SF_TMA = r"\bUTMALDG\.4D\b"


def sass_sf_copy(column: int) -> str:
    """tcgen05.cp of scale factors into the TMEM column ``column`` (relative to the allocation)."""
    return rf"\bUTCCP\.T\.S\.(?:2CTA\.)?4x32dp128bit tmem\[UR\d+\+{hex(column)}\]"


_K_BLOCKS = 4  # MMA instructions per k-tile (128 bytes of K)


@dataclass(frozen=True)
class _Plan:
    cta_tile: tuple[int, int, int]
    epi_tile: tuple[int, int]
    ab_stages: int
    stage_bytes: int  # A and B data of one stage (each 1024-aligned)
    sfa_bytes: int  # scale factors of A, one stage
    sfb_bytes: int
    epi_bytes: int
    acc_cols: int  # the accumulator stages' columns
    sfa_cols: int
    sfb_cols: int
    tmem_cols: int  # allocated (a power of two)

    @property
    def smem_bytes(self) -> int:
        s = self.ab_stages
        return (_BARRIER_BYTES + s * self.stage_bytes + self.epi_bytes
                + _round_up(s * self.sfa_bytes, _SMEM_ALIGN) + _round_up(s * self.sfb_bytes, _SMEM_ALIGN))


@dataclass(frozen=True, kw_only=True)
class GemmSm100BlockScaled(Variant):
    """One block-scaled Blackwell GEMM config: ``fmt`` (``BLOCK_FORMATS``), output ``c``, the MMA
    ``tile`` (M, N, K in elements; K = 128 bytes of data: 128 fp8 or 256 fp4), a CTA ``pair``,
    ``cluster`` (cm, cn).  A and B are K-major (the only majorness NVFP4 has)."""

    op: ClassVar[str] = "gemm_blockscaled"
    family: ClassVar[str] = "sm100"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm100_blockscaled.py", "gemm/sm100.py", "atoms/sm100.py", "abi.py")

    fmt: str = field(default="nvf4", metadata={"tag": ""})
    c: str = field(default="bf16", metadata={"tag": "o"})
    pair: bool = field(default=False, metadata={"tag": "2cta"})
    tile: tuple[int, int, int] = field(default=(128, 128, 256), metadata={"tag": "t"})
    cluster: tuple[int, int] = field(default=(1, 1), metadata={"tag": "c"})
    pdl: bool = field(default=False, metadata={"tag": "pdl"})

    @property
    def format(self):
        return BLOCK_FORMATS[self.fmt]

    @property
    def kind(self) -> str:
        return "nvf4" if self.format.data == "e2m1" else "mxf8"

    # --- contract ---------------------------------------------------------------------------------
    def signature(self) -> Signature:
        f = self.format
        va = 128 // DTYPE_BITS[f.data]  # elements in 16 bytes
        vc = 16 // DTYPE_BYTES[self.c]
        args = [
            TensorArg("a", f.data, ("M", "K", "L"), ("sAm", 1, "sAl")),
            TensorArg("b", f.data, ("N", "K", "L"), ("sBn", 1, "sBl")),
            TensorArg("c", self.c, ("M", "N", "L"), ("sCm", 1, "sCl")),
            # The scale factors, flat: SF_LAYOUT (the kernel rebuilds the atoms' layout from A's
            # and B's sizes; the loader checks the byte count).
            TensorArg("sfa", f.scale, ("SFA",), (1,)),
            TensorArg("sfb", f.scale, ("SFB",), (1,)),
        ]
        if f.global_scale:
            args += [TensorArg("global_a", "f32", (1,), (1,), align=4),
                     TensorArg("global_b", "f32", (1,), (1,), align=4)]
        args.append(ScalarArg("max_clusters", "i32"))
        div = {s: va for s in ("sAm", "sAl", "sBn", "sBl")}
        div.update({"sCm": vc, "sCl": vc, "N": vc, "K": max(va, 32), "SFA": atoms.SF_ATOM_BYTES,
                    "SFB": atoms.SF_ATOM_BYTES})
        return Signature(tuple(args), tuple(sorted(div.items())))

    def sass_requirements(self) -> tuple[str, ...]:
        plan = self.plan()
        req = (SASS_BS_MMA[self.kind], sass_sf_copy(plan.acc_cols), sass_sf_copy(plan.acc_cols + plan.sfa_cols),
               SASS_SF_TMA, sass_tmem_alloc(plan.tmem_cols)) + SASS_COMMON
        if self.pair:
            req += (SASS_BS_MMA_PAIR[self.kind], SASS_SF_COPY_PAIR) + SASS_PAIR
        if self.mcast:
            req += SASS_MULTICAST
        if self.pdl:
            req += (r"\bPREEXIT\b", r"\bACQBULK\b")
        if self.format.global_scale:  # the per-tensor scales are read
            req += (r"\bLDG\.E\b",)
        return req

    def proof_level(self) -> str:
        return "sass-only"

    # --- validity ---------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm100" or not tgt.tmem:
            return f"target {self.target} is not a Blackwell datacenter (sm100) target"
        if self.fmt not in BLOCK_FORMATS:
            return f"format {self.fmt} unknown; known: {', '.join(BLOCK_FORMATS)}"
        if self.c not in ("bf16", "f16", "f32"):
            return f"output dtype {self.c} not supported"
        if self.pair and not tgt.cta_pairs:
            return "target has no CTA pairs"
        tm, tn, tk = self.tile
        if tk * DTYPE_BITS[self.format.data] != 8 * 128:
            return f"tile K must be one 128-byte row ({1024 // DTYPE_BITS[self.format.data]} elements)"
        # Block-scaled tcgen05.mma: M 128 (cta_group::1) or 256 (cta_group::2, 128 rows a CTA).
        # N = 128: a multiple of the 128-row scale-factor atom (N = 64 or 192 would need B's
        # scale factors shifted per tile) whose two accumulator stages and scale factors fit 512
        # TMEM columns (256 + 16 + 16 -> 512 allocated).
        if tm != (256 if self.pair else 128):
            return f"MMA tile M must be {256 if self.pair else 128}"
        if tn != 128:
            return "MMA tile N must be 128"
        cm, cn = self.cluster
        if cm < 1 or cn < 1 or cm & (cm - 1) or cn & (cn - 1) or cm * cn > 16 or max(cm, cn) > 4:
            return "cluster dims must be powers of two up to 4 (scale-factor multicast), at most 16 CTAs"
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

    # --- derived ----------------------------------------------------------------------------------
    @property
    def cta_tile(self) -> tuple[int, int, int]:
        tm, tn, tk = self.tile
        return (tm // 2 if self.pair else tm, tn, tk)

    @property
    def mcast(self) -> bool:
        cm, cn = self.cluster
        return cn > 1 or cm > (2 if self.pair else 1)

    def plan(self) -> _Plan:
        rows, tn, tk = self.cta_tile
        f = self.format
        row_bytes = tk * DTYPE_BITS[f.data] // 8  # 128
        b_rows = tn // 2 if self.pair else tn
        stage_bytes = _round_up(rows * row_bytes, _SMEM_ALIGN) + _round_up(b_rows * row_bytes, _SMEM_ALIGN)
        sf_k = tk // f.vec  # scale factors per row per k-tile
        sfb_rows = _round_up(tn, atoms.SF_ATOM_ROWS)
        sfa_bytes, sfb_bytes = rows * sf_k, sfb_rows * sf_k
        epi = atoms.epilogue_tile(rows, tn, self.pair, 8 * DTYPE_BYTES[self.c], False)
        epi_bytes = _round_up(epi[0] * epi[1] * DTYPE_BYTES[self.c], _SMEM_ALIGN) * _EPI_STAGES
        budget = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - epi_bytes
        stages = 0
        while stages < _MAX_AB_STAGES:
            s = stages + 1
            if s * stage_bytes + _round_up(s * sfa_bytes, _SMEM_ALIGN) + _round_up(s * sfb_bytes, _SMEM_ALIGN) > budget:
                break
            stages = s
        acc_cols = atoms.acc_columns(rows, tn, _ACC_STAGES)
        sfa_cols = atoms.sf_tmem_columns(rows, _K_BLOCKS)
        sfb_cols = atoms.sf_tmem_columns(sfb_rows, _K_BLOCKS)
        tmem = atoms.tmem_alloc_columns(acc_cols + sfa_cols + sfb_cols)
        return _Plan(self.cta_tile, epi, stages, stage_bytes, sfa_bytes, sfb_bytes, epi_bytes, acc_cols,
                     sfa_cols, sfb_cols, tmem)

    def smem_bytes(self) -> int:
        return self.plan().smem_bytes

    def describe(self) -> dict[str, Any]:
        f = self.format
        plan = self.plan()
        sig = self.signature()
        cm, cn = self.cluster

        def scales(rows: str) -> dict:
            return {"dtype": f.scale, "vec": f.vec, "layout": SF_LAYOUT, "shape": SF_LAYOUT_SHAPE.replace("R", rows),
                    "bytes": f"L * ceil({rows}/128) * ceil(ceil(K/{f.vec})/4) * 512", "padding": "zeros"}

        return {
            "dtypes": {"a": f.data, "b": f.data, "c": self.c, "acc": "f32"},
            "layout": {"a": "k", "b": "k", "c": "n"},
            "format": f.name,
            "scales": {"a": scales("M"), "b": scales("N"),
                       "global": "global_a * global_b (fp32 device tensors)" if f.global_scale else None},
            "tile": list(self.cta_tile),
            "mma_tile": list(self.tile),
            "cta_group": 2 if self.pair else 1,
            "cluster": list(self.cluster),
            "stages": plan.ab_stages,
            "acc_stages": _ACC_STAGES,
            "epi_tile": list(plan.epi_tile),
            "smem_bytes": plan.smem_bytes,
            "tmem_columns": plan.tmem_cols,
            "tmem_columns_used": {"acc": plan.acc_cols, "sfa": plan.sfa_cols, "sfb": plan.sfb_cols},
            "threads": THREADS,
            "persistent": {"arg": "max_clusters", "cluster_ctas": cm * cn},
            "constraints": {
                "divisibility": dict(sig.divisibility),
                "align_bytes": 16,
                "tails": ["M", "N", "L"],
            },
        }

    def make_kernel(self):
        plan = self.plan()
        kernel = GemmSm100BlockScaledKernel(
            mma_tile=self.tile, cluster=self.cluster, pair=self.pair, ab_stages=plan.ab_stages,
            epi_tile=plan.epi_tile, tmem_cols=plan.tmem_cols, stage_bytes=plan.stage_bytes, pdl=self.pdl,
            smem_plan=plan.smem_bytes, sf_vec=self.format.vec, acc_cols=plan.acc_cols, sfa_cols=plan.sfa_cols,
            sf_bytes=(plan.sfa_bytes, plan.sfb_bytes))
        return kernel.with_global if self.format.global_scale else kernel


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GemmSm100BlockScaledKernel(GemmSm100Kernel):
    """Host side: ``__call__`` (a, b, c, sfa, sfb, max_clusters, stream) and ``with_global`` (a, b,
    c, sfa, sfb, global_a, global_b, max_clusters, stream).  The epilogue is the dense family's
    (``GemmSm100Kernel.epilogue``, which scales by global_a · global_b when given)."""

    def __init__(self, *, sf_vec, acc_cols, sfa_cols, sf_bytes, **kw):
        super().__init__(**kw)
        self.sf_vec = sf_vec
        self.acc_cols = acc_cols
        self.sfa_cols = sfa_cols
        self.sf_bytes = tuple(sf_bytes)
        # B's scale factors cover all of N (rounded up to the 128-row atom) in every CTA.
        self.sfb_tiler = (self.mma_tiler[0] // self.v, _round_up(self.mma_tiler[1], atoms.SF_ATOM_ROWS),
                          self.mma_tiler[2])

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor,
                 max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch_bs(a, b, c, sfa, sfb, None, None, max_clusters, stream)

    @cute.jit
    def with_global(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor,
                    global_a: cute.Tensor, global_b: cute.Tensor, max_clusters: cutlass.Int32,
                    stream: cuda.CUstream):
        self._launch_bs(a, b, c, sfa, sfb, global_a, global_b, max_clusters, stream)

    @cute.jit
    def _launch_bs(self, a, b, c, sfa, sfb, global_a, global_b, max_clusters, stream):
        ab_dtype, sf_dtype, c_dtype = a.element_type, sfa.element_type, c.element_type
        c_layout = utils.LayoutEnum.from_tensor(c)
        mma = atoms.blockscaled_tiled_mma(ab_dtype, sf_dtype, self.sf_vec, self.pair, self.mma_tiler[:2])
        mma_sfb = atoms.blockscaled_tiled_mma(ab_dtype, sf_dtype, self.sf_vec, False, self.sfb_tiler[:2])
        if cutlass.const_expr(cute.size(mma.shape_mnk, mode=[2]) * _K_BLOCKS != self.mma_tiler[2]):
            raise ValueError(f"MMA K {cute.size(mma.shape_mnk, mode=[2])} x {_K_BLOCKS} != tile K {self.mma_tiler[2]}")
        vmnk = atoms.cluster_vmnk(self.cluster, mma)
        sfb_vmnk = atoms.cluster_vmnk(self.cluster, mma_sfb)
        sA_layout, sB_layout = atoms.smem_layouts(mma, self.mma_tiler, ab_dtype, self.ab_stages)
        sSFA_layout, sSFB_layout = atoms.sf_smem_layouts(mma, self.mma_tiler, self.sf_vec, self.ab_stages)
        a_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sA_layout, (None, None, None, 0)))
        b_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sB_layout, (None, None, None, 0)))
        sfa_bytes = cute.size_in_bytes(sf_dtype, cute.slice_(sSFA_layout, (None, None, None, 0)))
        sfb_bytes = cute.size_in_bytes(sf_dtype, cute.slice_(sSFB_layout, (None, None, None, 0)))
        # The plan (stage count, manifest) must be what the layouts hold.
        if cutlass.const_expr(a_bytes + b_bytes > self.stage_bytes or (sfa_bytes, sfb_bytes) != self.sf_bytes):
            raise ValueError(f"smem stage holds {a_bytes} + {b_bytes} B data, {sfa_bytes} + {sfb_bytes} B "
                             f"scale factors; the plan {self.stage_bytes}, {self.sf_bytes}")
        self.tx_bytes = (a_bytes + b_bytes + sfa_bytes + sfb_bytes) * self.v
        epi_tile = atoms.bw.compute_epilogue_tile_shape(self.cta_tile, self.pair, c_layout, c_dtype)
        if cutlass.const_expr(tuple(cute.product_each(cute.shape(epi_tile))) != self.epi_tile_mn):
            raise ValueError(f"epilogue tile {cute.product_each(cute.shape(epi_tile))} differs from the plan")
        sC_layout = atoms.epilogue_smem_layout(c_dtype, c_layout, epi_tile, _EPI_STAGES)
        acc_fake = mma.make_fragment_C(cute.append(mma.partition_shape_C(self.mma_tiler[:2]), _ACC_STAGES))
        if cutlass.const_expr(atoms.tmem_columns_of(acc_fake) != self.acc_cols):
            raise ValueError(f"accumulators take {atoms.tmem_columns_of(acc_fake)} TMEM columns, "
                             f"the plan {self.acc_cols}")

        tma_a, gA = atoms.tma_load_a(a, sA_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_b, gB = atoms.tma_load_b(b, sB_layout, self.mma_tiler, mma, vmnk, self.cluster)
        sfa_t = atoms.sf_global_tensor(sfa, a.shape, self.sf_vec)
        sfb_t = atoms.sf_global_tensor(sfb, b.shape, self.sf_vec)
        tma_sfa, gSFA = atoms.tma_load_sfa(sfa_t, sSFA_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_sfb, gSFB = atoms.tma_load_sfb(sfb_t, sSFB_layout, self.sfb_tiler, mma_sfb, sfb_vmnk, self.cluster,
                                           mma)
        tma_c, gC = atoms.tma_store(c, sC_layout, epi_tile)

        tiles_mnl = cute.zipped_divide(c, tiler=self.cta_tile[:2])[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(tiles_mnl, (*self.cluster, 1))
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, cutlass.max(max_clusters, cutlass.Int32(1)))

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            acc_barriers: cute.struct.MemRange[cutlass.Int64, _ACC_STAGES * 2]
            tmem_dealloc_barrier: cutlass.Int64
            tmem_address: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]
            sSFA: cute.struct.Align[cute.struct.MemRange[sf_dtype, cute.cosize(sSFA_layout)], _SMEM_ALIGN]
            sSFB: cute.struct.Align[cute.struct.MemRange[sf_dtype, cute.cosize(sSFB_layout)], _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        if cutlass.const_expr(SharedStorage.size_in_bytes() != self.smem_plan):
            raise ValueError(f"SharedStorage is {SharedStorage.size_in_bytes()} B, the plan {self.smem_plan}")
        self.c_layout = c_layout
        self.kernel_bs(
            mma, mma_sfb, tma_a, gA, tma_b, gB, tma_sfa, gSFA, tma_sfb, gSFB, tma_c, gC, global_a, global_b,
            vmnk, sfb_vmnk, sA_layout, sB_layout, sSFA_layout, sSFB_layout, sC_layout, epi_tile, sched,
        ).launch(
            grid=grid, block=[THREADS, 1, 1], cluster=(*self.cluster, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=self.pdl,
        )

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel_bs(
        self,
        mma: cute.TiledMma, mma_sfb: cute.TiledMma,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
        tma_sfb: cute.CopyAtom, mSFB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor,
        global_a, global_b,
        vmnk: cute.Layout, sfb_vmnk: cute.Layout,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sSFA_layout: cute.Layout, sSFB_layout: cute.Layout,
        sC_layout: cute.ComposedLayout,
        epi_tile: cute.Tile,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == _TMA_WARP:
            for t in (tma_a, tma_b, tma_sfa, tma_sfb, tma_c):
                cpasync.prefetch_descriptor(t)

        bidx, _, _ = cute.arch.block_idx()
        mma_v = bidx % self.v
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord_vmnk = vmnk.get_flat_coord(cta_rank)
        coord_sfb = sfb_vmnk.get_flat_coord(cta_rank)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        sSFA = storage.sSFA.get_tensor(sSFA_layout)
        sSFB = storage.sSFB.get_tensor(sSFB_layout)

        mcast_a = cute.size(vmnk.shape[2])
        mcast_b = cute.size(vmnk.shape[1])
        ab_pipe = atoms.ab_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, vmnk, self.tx_bytes,
                                    mcast_a + mcast_b - 1)
        acc_pipe = atoms.acc_pipeline(storage.acc_barriers.data_ptr(), _ACC_STAGES, vmnk,
                                      len(_EPILOGUE_WARPS), self.pair)
        tmem = atoms.tmem_allocator(storage.tmem_address, storage.tmem_dealloc_barrier,
                                    int(_Bar.TMEM_ALLOC), 32 * (len(_EPILOGUE_WARPS) + 1),
                                    _EPILOGUE_WARPS[0], self.pair)
        pipeline.pipeline_init_arrive(cluster_shape_mn=vmnk, is_relaxed=True)

        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA = cute.local_tile(mSFA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB = cute.local_tile(mSFB, cute.slice_(self.sfb_tiler, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])
        thr_mma = mma.get_slice(mma_v)
        thr_mma_sfb = mma_sfb.get_slice(mma_v)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgSFA = thr_mma.partition_A(gSFA)
        tCgSFB = thr_mma_sfb.partition_B(gSFB)
        tCgC = thr_mma.partition_C(gC)
        acc_shape = mma.partition_shape_C(self.mma_tiler[:2])
        acc_layout = mma.make_fragment_C(cute.append(acc_shape, _ACC_STAGES)).layout

        pipeline.pipeline_init_wait(cluster_shape_mn=vmnk)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()

        if warp_idx == _TMA_WARP:
            self.produce_bs(tma_a, tma_b, tma_sfa, tma_sfb, sA, sB, sSFA, sSFB, tCgA, tCgB, tCgSFA, tCgSFB,
                            ab_pipe, vmnk, coord_vmnk, sfb_vmnk, coord_sfb, sched_params, k_tiles)
        if warp_idx == _MMA_WARP:
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            sf_dtype = sSFA.element_type
            # TMEM: [accumulator stages | scale factors of A | scale factors of B]
            tSFA, tSFB = atoms.sf_tmem_tensors(
                mma, self.mma_tiler, self.sf_vec, sSFA_layout, sSFB_layout,
                cute.recast_ptr(acc_ptr + self.acc_cols, dtype=sf_dtype),
                cute.recast_ptr(acc_ptr + self.acc_cols + self.sfa_cols, dtype=sf_dtype))
            self.mma_loop_bs(mma, sA, sB, sSFA, sSFB, acc, tSFA, tSFB, ab_pipe, acc_pipe, sched_params,
                             k_tiles, mma_v == 0)
        if warp_idx < _MMA_WARP:
            tmem.allocate(self.tmem_cols)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            self.epilogue(tidx, warp_idx, mma, tma_c, acc, sC, tCgC, epi_tile, acc_pipe, global_a, global_b,
                          sched_params)
            tmem.free(acc_ptr)

    @cute.jit
    def produce_bs(self, tma_a, tma_b, tma_sfa, tma_sfb, sA, sB, sSFA, sSFB, tCgA, tCgB, tCgSFA, tCgSFB, ab_pipe,
                   vmnk, coord_vmnk, sfb_vmnk, coord_sfb, sched_params, k_tiles):
        """The TMA warp: per scheduled tile, per k-tile, A, B and their scale factors into the next
        free stage (all four complete on the stage's "full" barrier)."""
        a_peers = cute.make_layout(cute.slice_(vmnk, (0, 0, None, 0)).shape)
        b_peers = cute.make_layout(cute.slice_(vmnk, (0, None, 0, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(tma_a, coord_vmnk[2], a_peers, cute.group_modes(sA, 0, 3),
                                           cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_b, coord_vmnk[1], b_peers, cute.group_modes(sB, 0, 3),
                                           cute.group_modes(tCgB, 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_sfa, coord_vmnk[2], a_peers, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(tCgSFA, 0, 3))
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_sfb, coord_sfb[1], cute.make_layout(cute.slice_(sfb_vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sSFB, 0, 3), cute.group_modes(tCgSFB, 0, 3))
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)
        a_mask = None
        b_mask = None
        sfb_mask = None
        if cutlass.const_expr(cute.size(vmnk) > 1):
            a_mask = cpasync.create_tma_multicast_mask(vmnk, coord_vmnk, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(vmnk, coord_vmnk, mcast_mode=1)
            sfb_mask = cpasync.create_tma_multicast_mask(sfb_vmnk, coord_sfb, mcast_mode=1)

        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            tAgA_t = tAgA[(None, m // self.v, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            tAgSFA_t = tAgSFA[(None, m // self.v, None, l)]
            tBgSFB_t = tBgSFB[(None, n, None, l)]
            for k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                s = state.index
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, s)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, s)], tma_bar_ptr=bar, mcast_mask=b_mask)
                cute.copy(tma_sfa, tAgSFA_t[(None, k)], tAsSFA[(None, s)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_sfb, tBgSFB_t[(None, k)], tBsSFB[(None, s)], tma_bar_ptr=bar, mcast_mask=sfb_mask)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        ab_pipe.producer_tail(state)

    @cute.jit
    def mma_loop_bs(self, mma, sA, sB, sSFA, sSFB, acc, tSFA, tSFB, ab_pipe, acc_pipe, sched_params, k_tiles,
                    is_leader):
        """The MMA warp (a pair's leader CTA only): per k-tile, tcgen05.cp of the stage's scale
        factors into TMEM, then the k-tile's block-scaled tcgen05.mma instructions."""
        tCrA = mma.make_fragment_A(sA)
        tCrB = mma.make_fragment_B(sB)
        k_blocks = cute.size(tCrA, mode=[2])
        sf_dtype = sSFA.element_type
        cp_sfa, tCsSFA, tCtSFA = atoms.sf_s2t_copy(sf_dtype, self.pair, sSFA, tSFA)
        cp_sfb, tCsSFB, tCtSFB = atoms.sf_s2t_copy(sf_dtype, self.pair, sSFB, tSFB)
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, _ACC_STAGES)
        while work.is_valid_tile:
            if is_leader:
                acc_t = acc[(None, None, None, acc_state.index)]
                acc_pipe.producer_acquire(acc_state)
                mma.set(tcgen05.Field.ACCUMULATE, False)
                for _k in cutlass.range(k_tiles, unroll=1):
                    ab_pipe.consumer_wait(read)
                    stage = (None, None, None, None, read.index)
                    cute.copy(cp_sfa, tCsSFA[stage], tCtSFA)
                    cute.copy(cp_sfb, tCsSFB[stage], tCtSFB)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(mma, acc_t, [tCrA[blk], tSFA[(None, None, kb)]],
                                  [tCrB[blk], tSFB[(None, None, kb)]], acc_t)
                        mma.set(tcgen05.Field.ACCUMULATE, True)
                    ab_pipe.consumer_release(read)
                    read.advance()
                acc_pipe.producer_commit(acc_state)
            acc_state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        acc_pipe.producer_tail(acc_state)


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

_TEST = (
    # The CPU suite: an NVFP4 CTA pair (2CTA block-scaled MMA and tcgen05.cp, multicast scale
    # factors, the global scales) and a 1-CTA MXFP8 variant (the other MMA kind).
    dict(fmt="nvf4", pair=True, tile=(256, 128, 256), cluster=(2, 1)),
    dict(fmt="mxf8e4m3", tile=(128, 128, 128)),
)


def _default() -> list[dict]:
    return [
        dict(fmt="nvf4", pair=True, tile=(256, 128, 256), cluster=(2, 1)),
        dict(fmt="nvf4", tile=(128, 128, 256)),
        dict(fmt="mxf8e4m3", pair=True, tile=(256, 128, 128), cluster=(2, 1)),
        dict(fmt="mxf8e4m3", tile=(128, 128, 128)),
        dict(fmt="mxf8e5m2", tile=(128, 128, 128)),
    ]


@register("gemm_blockscaled")
def enumerate_sm100_blockscaled(target, tier: str) -> list[GemmSm100BlockScaled]:
    if target.family != "sm100":
        return []
    specs = list(_TEST) if tier == "test" else _default()
    out = []
    for s in specs:
        v = GemmSm100BlockScaled(target=target.name, pdl=True, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out
