"""Blackwell datacenter (sm_100f) fp8 GEMM with DeepSeek-V3 block scales, on the tensor core's own
block-scale path.

The scales are the Hopper block form's (gemm/sm90.py ``scale_args("block")``, what
``fp8.quantize_blockwise`` writes): KB = ceil(K/128), NB = ceil(N/128); scale_a (M, KB) float32
M-major (one per row and 128 elements of K), scale_b (NB, KB) float32 (one per 128x128 block of
b); C[m, n] = Σ_kb sa[m, kb]·sb[n // 128, kb]·Σ_{k in block kb} A[m, k]·B[n, k].

Here they must be **powers of two** (UE8M0, the recipe DeepGEMM's SM100 kernels take;
``fp8.quantize_blockwise(..., pow2=True)`` writes them).  Then the problem is exactly an MXFP8 GEMM
(``tcgen05.mma.kind::mxf8f6f4.block_scale``, one e8m0 scale per 32 elements of K) whose 32-element
scales repeat each 128-element block scale four times, and whose scales of B repeat over each
block's 128 rows: the tensor core applies them inside the MMA, into the fp32 accumulator in TMEM,
so no k-block's partial sum is promoted in software (the Hopper form's two-level accumulation).
Taken instead of software promotion from TMEM (a second TMEM accumulator per k-block, read,
scaled and added by the epilogue warps while the next k-block runs): that costs a TMEM round trip
and 128 FMAs per thread per k-block beside MMAs that take ~256 clocks, and its TMEM (two
accumulator stages and two partials of 128 columns) fills all 512 columns.  The exponent of an
fp32 scale is its e8m0 code (bits 23-30); the mantissa is not read, so a scale that is not a
power of two is taken as the power of two below it (documented; the loader cannot check values
without a device synchronisation).

The kernel is the MXFP8 block-scaled one (gemm/sm100_blockscaled.py: warp roles, TMEM plan, the
scale factors' tcgen05.cp into TMEM and the MMA warp, the epilogue) with one change in the TMA
producer warp: instead of loading the scale-factor atoms by TMA it reads the tile's float32 scales
(4 rows of scale_a per lane and the tile's one scale_b, global loads issued before it waits for
the stage), turns each into the word of four equal e8m0 bytes, and writes the stage's 128x4
scale-factor atoms into shared memory itself (one 16-byte store per lane and operand: row 32j + i
of an atom is word 4i + j, PTX ISA's 128x4 layout, checked against the DSL's smem layout at trace
time), then fences them for the async proxy before its arrival on the stage's "full" barrier.

Nothing here has run: no Blackwell GPU is available to the project (proof ``sass-only``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import cpasync

from ..abi import ScalarArg, Signature
from ..atoms import sm100 as atoms
from ..atoms.targets import Target
from ..registry import register
from .common import GemmVariant
from .sm90 import BLOCK_SCALE_K, scale_args
from .sm100 import _SMEM_ALIGN, SASS_COMMON, sass_count, sass_tmem_alloc
from .sm100_blockscaled import (_ACC_STAGES, _EPI_STAGES, _EPILOGUE_WARPS, _MMA_WARP, _TMA_WARP, SASS_BS_MMA, THREADS,
                                GemmSm100BlockScaled, GemmSm100BlockScaledKernel, _Bar, sass_sf_copy)

# SASS of this form beside the block-scaled MMA and its tcgen05.cp: the e8m0 byte made a word of
# four (x 0x01010101), stored into shared memory (STS.128), fenced for the async proxy, then the
# producer's arrival on the stage's barrier -- in that order; and no TMA of scale-factor atoms (the
# MXFP8 kernel's 4-D TMA).
SASS_SF_STORE = (r"\b0x1010101\b[\s\S]*?\bSTS\.128\b[\s\S]*?\bFENCE\.VIEW\.ASYNC\.S\b[\s\S]*?"
                 r"\bSYNCS\.ARRIVE\.TRANS64\b")
SASS_NO_SF_TMA = r"\A(?![\s\S]*\bUTMALDG\.4D\b)"
# The scales' global loads: 4 of scale_a and 1 of scale_b per lane and k-tile.
SASS_SCALE_LOADS = 5


@dataclass(frozen=True, kw_only=True)
class GemmSm100Block128(GemmSm100BlockScaled):
    """A config of the form (module docstring): e4m3 operands (``fmt`` mxf8e4m3), bf16 or f16
    out, the 1-CTA 128x128x128 MMA tile (one 128-block of K per k-tile, tile N one block of B)."""

    op: ClassVar[str] = "gemm"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm100_block128.py", "gemm/sm100_blockscaled.py", "gemm/sm100.py",
                                          "gemm/sm90.py", "atoms/sm100.py", "abi.py")

    fmt: str = field(default="mxf8e4m3", metadata={"tag": ""})
    tile: tuple[int, int, int] = field(default=(128, 128, 128), metadata={"tag": "t"})
    # The scale form, in the name as on Hopper.
    block_scale: bool = field(default=True, metadata={"tag": "blksc"})

    def signature(self) -> Signature:
        base = _Dense(target=self.target, c=self.c).signature()
        args = tuple(a for a in base.args if a.name not in ("scale_a", "scale_b"))
        div = dict(base.divisibility)
        div["sSAk"] = 4
        return Signature(args + scale_args("block") + (ScalarArg("max_clusters", "i32"),),
                         tuple(sorted(div.items())))

    def sass_requirements(self) -> tuple[str, ...]:
        plan = self.plan()
        req = (SASS_BS_MMA["mxf8"], sass_sf_copy(plan.acc_cols), sass_sf_copy(plan.acc_cols + plan.sfa_cols),
               sass_tmem_alloc(plan.tmem_cols)) + SASS_COMMON
        req += (SASS_SF_STORE, SASS_NO_SF_TMA, sass_count(r"\bLDG\.E R\d+,", SASS_SCALE_LOADS))
        if self.pdl:
            req += (r"\bPREEXIT\b", r"\bACQBULK\b")
        return req

    def can_implement(self) -> str | None:
        if self.fmt != "mxf8e4m3" or not self.block_scale:
            return "the DeepSeek-form block scales take e4m3 operands (format mxf8e4m3)"
        if self.c not in ("bf16", "f16"):
            return "block-scaled fp8 writes bf16 or f16"
        if self.pair or self.cluster != (1, 1) or tuple(self.tile) != (128, 128, BLOCK_SCALE_K):
            return "the block form runs the 1-CTA 128x128x128 tile (one scale block of K and of N per tile)"
        return super().can_implement()

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        for k in ("format", "scales"):
            d.pop(k)
        d.update({
            "dtypes": {"a": "e4m3", "b": "e4m3", "c": self.c, "acc": "f32"},
            "scaled": True,
            "scale_mode": "block",
            # The hardware applies each scale's exponent: scales must be powers of two.
            "scale_pow2": True,
            "constraints": {**d["constraints"], "tails": ["M", "N", "K"]},
        })
        return d

    def make_kernel(self):
        plan = self.plan()
        kernel = GemmSm100Block128Kernel(
            mma_tile=self.tile, cluster=self.cluster, pair=False, ab_stages=plan.ab_stages,
            epi_tile=plan.epi_tile, tmem_cols=plan.tmem_cols, stage_bytes=plan.stage_bytes, pdl=self.pdl,
            smem_plan=plan.smem_bytes, sf_vec=self.format.vec, acc_cols=plan.acc_cols, sfa_cols=plan.sfa_cols,
            sf_bytes=(plan.sfa_bytes, plan.sfb_bytes))
        return kernel.scaled


@dataclass(frozen=True, kw_only=True)
class _Dense(GemmVariant):
    """The dense e4m3 GEMM's argument contract (a, b, c and their divisibility)."""

    ab: str = "e4m3"


class GemmSm100Block128Kernel(GemmSm100BlockScaledKernel):
    """Host side ``scaled`` (a, b, c, scale_a, scale_b, max_clusters, stream)."""

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor, scale_b: cute.Tensor,
               max_clusters: cutlass.Int32, stream: cuda.CUstream):
        ab_dtype, c_dtype = a.element_type, c.element_type
        sf_dtype = cutlass.Float8E8M0FNU
        c_layout = utils.LayoutEnum.from_tensor(c)
        mma = atoms.blockscaled_tiled_mma(ab_dtype, sf_dtype, self.sf_vec, False, self.mma_tiler[:2])
        vmnk = atoms.cluster_vmnk(self.cluster, mma)
        sA_layout, sB_layout = atoms.smem_layouts(mma, self.mma_tiler, ab_dtype, self.ab_stages)
        sSFA_layout, sSFB_layout = atoms.sf_smem_layouts(mma, self.mma_tiler, self.sf_vec, self.ab_stages)
        a_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sA_layout, (None, None, None, 0)))
        b_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sB_layout, (None, None, None, 0)))
        sfa_bytes = cute.size_in_bytes(sf_dtype, cute.slice_(sSFA_layout, (None, None, None, 0)))
        sfb_bytes = cute.size_in_bytes(sf_dtype, cute.slice_(sSFB_layout, (None, None, None, 0)))
        if cutlass.const_expr(a_bytes + b_bytes > self.stage_bytes or (sfa_bytes, sfb_bytes) != self.sf_bytes
                              or self.sf_bytes != (512, 512)):
            raise ValueError(f"smem stage holds {a_bytes} + {b_bytes} B data, {sfa_bytes} + {sfb_bytes} B "
                             f"scale factors; the plan {self.stage_bytes}, {self.sf_bytes}")
        # The producer writes row 32j + i, k-block s of a stage's atom at byte 16i + 4j + s: the
        # DSL's smem layout of the scale factors must be exactly that (stages 512 bytes apart).
        for lay in (sSFA_layout, sSFB_layout):
            want = "((((32,4),1),(32,1)),1,4,%d):((((16,4),0),(0,0)),0,1,512)" % self.ab_stages
            if cutlass.const_expr(str(lay) != want):
                raise ValueError(f"scale-factor smem layout {lay}, the producer writes {want}")
        # Only the data arrive by TMA; the scale factors are stored by the producer's threads.
        self.tx_bytes = a_bytes + b_bytes
        epi_tile = atoms.bw.compute_epilogue_tile_shape(self.cta_tile, False, c_layout, c_dtype)
        if cutlass.const_expr(tuple(cute.product_each(cute.shape(epi_tile))) != self.epi_tile_mn):
            raise ValueError(f"epilogue tile {cute.product_each(cute.shape(epi_tile))} differs from the plan")
        sC_layout = atoms.epilogue_smem_layout(c_dtype, c_layout, epi_tile, _EPI_STAGES)
        acc_fake = mma.make_fragment_C(cute.append(mma.partition_shape_C(self.mma_tiler[:2]), _ACC_STAGES))
        if cutlass.const_expr(atoms.tmem_columns_of(acc_fake) != self.acc_cols):
            raise ValueError(f"accumulators take {atoms.tmem_columns_of(acc_fake)} TMEM columns, "
                             f"the plan {self.acc_cols}")
        tma_a, gA = atoms.tma_load_a(a, sA_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_b, gB = atoms.tma_load_b(b, sB_layout, self.mma_tiler, mma, vmnk, self.cluster)
        tma_c, gC = atoms.tma_store(c, sC_layout, epi_tile)
        # The scales' bits: the e8m0 code of a power of two is its fp32 exponent field.
        sa_bits = cute.make_tensor(cute.recast_ptr(scale_a.iterator, dtype=cutlass.Uint32), scale_a.layout)
        sb_bits = cute.make_tensor(cute.recast_ptr(scale_b.iterator, dtype=cutlass.Uint32), scale_b.layout)

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
        self.kernel_b128(mma, tma_a, gA, tma_b, gB, tma_c, gC, sa_bits, sb_bits, vmnk, sA_layout, sB_layout,
                         sSFA_layout, sSFB_layout, sC_layout, epi_tile, sched).launch(
            grid=grid, block=[THREADS, 1, 1], cluster=(*self.cluster, 1), min_blocks_per_mp=1, stream=stream,
            use_pdl=self.pdl)

    @cute.kernel
    def kernel_b128(self, mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
                    mB: cute.Tensor, tma_c: cute.CopyAtom, mC: cute.Tensor, sa_bits: cute.Tensor,
                    sb_bits: cute.Tensor, vmnk: cute.Layout, sA_layout: cute.ComposedLayout,
                    sB_layout: cute.ComposedLayout, sSFA_layout: cute.Layout, sSFB_layout: cute.Layout,
                    sC_layout: cute.ComposedLayout, epi_tile: cute.Tile,
                    sched_params: utils.PersistentTileSchedulerParams):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == _TMA_WARP:
            for t in (tma_a, tma_b, tma_c):
                cpasync.prefetch_descriptor(t)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        sSFA = storage.sSFA.get_tensor(sSFA_layout)
        sSFB = storage.sSFB.get_tensor(sSFB_layout)

        ab_pipe = atoms.ab_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, vmnk, self.tx_bytes, 1)
        acc_pipe = atoms.acc_pipeline(storage.acc_barriers.data_ptr(), _ACC_STAGES, vmnk,
                                      len(_EPILOGUE_WARPS), False)
        tmem = atoms.tmem_allocator(storage.tmem_address, storage.tmem_dealloc_barrier,
                                    int(_Bar.TMEM_ALLOC), 32 * (len(_EPILOGUE_WARPS) + 1),
                                    _EPILOGUE_WARPS[0], False)
        pipeline.pipeline_init_arrive(cluster_shape_mn=vmnk, is_relaxed=True)

        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])
        thr_mma = mma.get_slice(0)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgC = thr_mma.partition_C(gC)
        acc_layout = mma.make_fragment_C(cute.append(mma.partition_shape_C(self.mma_tiler[:2]), _ACC_STAGES)).layout

        pipeline.pipeline_init_wait(cluster_shape_mn=vmnk)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()

        if warp_idx == _TMA_WARP:
            self.produce_b128(tma_a, tma_b, sA, sB, sSFA, sSFB, tCgA, tCgB, sa_bits, sb_bits, ab_pipe,
                              sched_params, k_tiles)
        if warp_idx == _MMA_WARP:
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            sf_dtype = sSFA.element_type
            tSFA, tSFB = atoms.sf_tmem_tensors(
                mma, self.mma_tiler, self.sf_vec, sSFA_layout, sSFB_layout,
                cute.recast_ptr(acc_ptr + self.acc_cols, dtype=sf_dtype),
                cute.recast_ptr(acc_ptr + self.acc_cols + self.sfa_cols, dtype=sf_dtype))
            self.mma_loop_bs(mma, sA, sB, sSFA, sSFB, acc, tSFA, tSFB, ab_pipe, acc_pipe, sched_params,
                             k_tiles, True)
        if warp_idx < _MMA_WARP:
            tmem.allocate(self.tmem_cols)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            self.epilogue(tidx, warp_idx, mma, tma_c, acc, sC, tCgC, epi_tile, acc_pipe, None, None,
                          sched_params)
            tmem.free(acc_ptr)

    @cute.jit
    def produce_b128(self, tma_a, tma_b, sA, sB, sSFA, sSFB, tCgA, tCgB, sa_bits, sb_bits, ab_pipe, sched_params,
                     k_tiles):
        """The TMA warp: per tile and k-tile, the scale words of the stage (stored by the 32 lanes:
        lane i the rows i, 32 + i, 64 + i, 96 + i of A's atom and the same rows of B's), then the
        TMA loads of A and B onto the stage's barrier."""
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 3),
                                           cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 3),
                                           cute.group_modes(tCgB, 0, 3))
        lane = cute.arch.lane_idx()
        # 32-bit words of the stages' atoms: [j, i, stage] holds row 32j + i's four k-block bytes.
        words = cute.make_layout((4, 32, self.ab_stages), stride=(1, 4, 128))
        wa = cute.make_tensor(cute.recast_ptr(sSFA.iterator, dtype=cutlass.Uint32), words)
        wb = cute.make_tensor(cute.recast_ptr(sSFB.iterator, dtype=cutlass.Uint32), words)
        ra = cute.make_rmem_tensor((4,), cutlass.Uint32)
        rb = cute.make_rmem_tensor((4,), cutlass.Uint32)
        last_m = cute.size(sa_bits, mode=[0]) - 1
        last_nb = cute.size(sb_bits, mode=[0]) - 1
        rows = self.mma_tiler[0]

        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            tAgA_t = tAgA[(None, m, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            nb = cutlass.min(n, last_nb)  # tile N = one 128-row block of B
            for k in cutlass.range(k_tiles, unroll=1):
                # e8m0 = the fp32 exponent field; four equal bytes = the four 32-element blocks.
                # (Rows past M read the last row's scale: finite, and their A rows are zero fill.)
                for j in cutlass.range_constexpr(4):
                    row = cutlass.min(m * rows + 32 * j + lane, last_m)
                    ra[j] = ((sa_bits[row, k] >> 23) & 0xFF) * 0x01010101
                eb = ((sb_bits[nb, k] >> 23) & 0xFF) * 0x01010101
                for j in cutlass.range_constexpr(4):
                    rb[j] = eb
                ab_pipe.sync_object_empty.wait(state.index, state.phase)
                cute.autovec_copy(ra, wa[(None, lane, state.index)])
                cute.autovec_copy(rb, wb[(None, lane, state.index)])
                # Generic-proxy stores, read by tcgen05.cp (async proxy) once the stage is full.
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                ab_pipe.producer_acquire(state, cutlass.Boolean(True))  # (the wait is done)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        ab_pipe.producer_tail(state)


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

# Test and full tiers (the default bundle's share for the Blackwell forms went to the row-scaled,
# silu_mul and grouped variants).
BLOCK128 = (dict(c="bf16"),)


@register("gemm")
def enumerate_sm100_block128(target: Target, tier: str) -> list[GemmSm100Block128]:
    if target.family != "sm100" or not target.tmem or tier == "default":
        return []
    out = []
    for s in BLOCK128:
        v = GemmSm100Block128(target=target.name, pdl=True, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out


__all__ = ["GemmSm100Block128", "GemmSm100Block128Kernel", "enumerate_sm100_block128"]
