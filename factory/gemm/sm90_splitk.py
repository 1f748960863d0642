"""Hopper (sm_90a) GEMM split along K over the persistent grid, with a deterministic fix-up.

For problems whose output tiles are too few for the SMs (mid-size M and N, long K), each output
tile is cut into ``splits`` parts along K; the persistent scheduler walks (tile, part) work units,
the parts of one tile adjacent in the raster so that they run at the same time on neighbouring
CTAs.  The mainloop is the one of ``sm90.py`` (TMA -> swizzled smem -> WGMMA, producer warp and
consumer warpgroups); only the k-blocks of the part are loaded.

**Fix-up (in the kernel, fixed reducer, fixed order).**  The last part of a tile reduces it.  The
other parts store their fp32 partial tile into the workspace (16-byte vectors, the threads'
vectors interleaved so that a warp's stores are contiguous), fence at GPU scope, and one thread
adds 1 to the tile's semaphore (a reduction: nothing is waited for).  The last part, once its own
mainloop is done, waits until the semaphore reads ``splits - 1``, sets it back to 0 and sums
((part 0 + part 1) + ...) + its own accumulators, the same additions in the same order on every
run, then writes the tile through the usual epilogue (bf16 via smem and TMA store).  A part with
no k-block (more parts than k-blocks) stores nothing and is skipped by the reducer, which computes
which parts own k-blocks.

Progress: the parts of a tile are consecutive work units, the reducer the highest, and a CTA walks
its units in increasing order, so a reducer waits only on units of lower index; the grid never
exceeds what the device holds at once (``max_clusters``, as in sm90.py), so every unit of lower
index is running or done, and the lowest unfinished unit never waits.  (With PDL, the next kernel
is released only once every CTA of this one has started.)

**Workspace** (one float32 tensor of ``workspace_words(...)`` elements, ``W``): first the
semaphores, one int32 per output tile (tiles_m * tiles_n * L, rounded up to 32), then the partial
tiles, ``tile_m * tile_n`` floats per (tile, part).  The semaphores must be zero when the kernel
starts; every launch leaves them zero.  The runtime zeroes the semaphore words before each launch
on the launch's stream (runtime/gemm.py, the host library's ``fx_gemm``), so a workspace from the
stream-ordered allocator (or a CUDA graph's pool) is safe on any stream; two launches that run at
the same time (two streams) must not share one workspace.

Why this form (notes/gemm-sm90.md, "Split-K over the grid with an in-kernel fix-up"): a separate reduction
kernel moves every partial through memory twice and adds a launch; the cluster (DSMEM) split of
``sm90.py`` holds the partials in shared memory, which caps it at 64 accumulators per thread and at
the split counts whose clusters the device co-schedules (2-CTA clusters: 66 of 66; 4-CTA: 30).  A
first form where every part stored its partial and the last to arrive (an atomic's returned
value) reduced made every part wait for the atomic's round trip: 5-10 % slower on an H100.

Measured (H100, beside the unsplit tiles in one sweep): the fix-up costs ~5-12 us per wave of
units, so a split tile beat the best unsplit one on 3 of 195 problems (by 2-9 %); the selection's
cost model (``wsplit_us``) picks it rarely, and no such variant is in the default tier.

**The tail split** (``tail=True``, :class:`GemmSm90TailKernel`): whole tiles first, then only the
last, partial round of tiles split along K over the clusters that round would leave idle, one
fix-up round (reduce-scatter: each part sums a slice of the tile).  Its workspace form is "tail"
(``tail_workspace_words``).  Measured (H100): 2048x2112x7168 92.5 us against 98-106 for the best
unsplit tile, 2048x5376x21504 706 against 751-778; ~6 us of fixed cost per launch, so the selection
(fx_select.c ``tail_plan``) lets it compete only from one whole round up.  The fp8 (e4m3) form
stores unscaled partials and applies the row or per-tensor scales after the sum (row-scaled
128x192 at 2048x2112x7168 on an H100: 52.9 us against 61.2 for the ping-pong tile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils

from ..abi import Signature, TensorArg
from ..atoms import sm90 as atoms
from ..atoms.smem import SMEM_ALIGN as _SMEM_ALIGN
from ..atoms.targets import Target
from ..registry import register
from . import tiles
from .sm90 import GemmSm90, GemmSm90Kernel, _Bar

SEM_ALIGN = 32  # semaphore words, rounded up to this many (128 bytes)
MAX_SPLITS = 8
# The tail split (``tail=True``): at most this many parts per tail tile, each part at least
# TAIL_MIN_K k-tiles, and at most TAIL_SLOTS partial tiles in the workspace (one per part and tail
# tile; the parts of one round fit the resident CTAs, so a device of up to TAIL_SLOTS SMs is never
# limited by it; a larger one splits its tail into fewer parts).
TAIL_MAX_SPLITS = 16
TAIL_MIN_K = 4
TAIL_SLOTS = 144


def tile_count(M: int, N: int, L: int, tile_m: int, tile_n: int) -> int:
    """Output tiles of a problem (the semaphores)."""
    return -(-M // tile_m) * -(-N // tile_n) * L


def workspace_words(M: int, N: int, L: int, tile_m: int, tile_n: int, splits: int) -> int:
    """float32 elements of the workspace: the semaphore words (rounded up to SEM_ALIGN), then one
    partial tile per (tile, part).  The host library computes the same (fx_select.c)."""
    t = tile_count(M, N, L, tile_m, tile_n)
    return -(-t // SEM_ALIGN) * SEM_ALIGN + t * splits * tile_m * tile_n


def tail_workspace_words(M: int, N: int, L: int, tile_m: int, tile_n: int, splits: int) -> int:
    """float32 elements of a tail split's workspace: the semaphore words (one per output tile,
    rounded up to SEM_ALIGN), then at most TAIL_SLOTS partial tiles (fewer when the problem has
    fewer tiles x ``splits``).  The host library computes the same (fx_select.c)."""
    t = tile_count(M, N, L, tile_m, tile_n)
    return -(-t // SEM_ALIGN) * SEM_ALIGN + min(t * splits, TAIL_SLOTS) * tile_m * tile_n


@dataclass(frozen=True, kw_only=True)
class GemmSm90SplitK(GemmSm90):
    """A ``GemmSm90`` tile (bf16 / f16, unswapped, coop or ws, cluster 1x1 or 1x2 along N) whose
    output tiles are split ``splits`` ways along K over the persistent grid (see the module
    docstring); with ``tail`` only the last partial round's tiles, into at most ``splits`` parts
    (coop, any cluster; also e4m3 with fast accumulation and per-tensor or row scales, applied to
    the summed tile).  Takes one more argument, the float32 ``workspace``."""

    sources: ClassVar[tuple[str, ...]] = GemmSm90.sources + ("gemm/sm90_splitk.py",)

    splits: int = field(default=2, metadata={"tag": "skw"})
    # Split only the last, partial round of output tiles (``splits``: the most parts per tile).
    tail: bool = field(default=False, metadata={"tag": "tail"})

    required_sass: ClassVar[tuple[str, ...]] = GemmSm90.required_sass + (r"\bREDG\.E\.ADD",)

    def signature(self) -> Signature:
        sig = super().signature()
        args = sig.args[:-1] + (TensorArg("workspace", "f32", ("W",), (1,)),) + sig.args[-1:]
        return Signature(args, sig.divisibility)

    def sass_requirements(self) -> tuple[str, ...]:
        # the arrival (a reduction, no returned value), the release fence before it, the reducer's
        # acquire loads of the semaphore, and the partial tiles in 16-byte vectors
        return super().sass_requirements() + (r"\bREDG\.E\.ADD", r"\bMEMBAR\.ALL\.GPU", r"\bLDG\.E\.STRONG\.GPU",
                                               r"\bSTG\.E\.128", r"\bLDG\.E\.128")

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why is not None:
            return why
        if self.c == "e4m3":
            return "the workspace split writes bf16 / f16 / f32 outputs"
        if self.is_fp8 and not (self.tail and self.fast_accum and self.scale_mode in ("tensor", "row")):
            # (the tail kernel's main loop is the one-batch-in-flight loop: fast accumulation; the
            # scales are applied after the parts' sum, so per-tensor and row scales only)
            return "fp8 splits only the tail, with fast accumulation and per-tensor or row scales"
        if self.swap_ab or self.split_k != 1 or self.has_epilogue or self.early_b:
            return "the workspace split runs unswapped, without the cluster split, epilogue fields or early_b"
        if self.schedule not in ("coop", "ws"):
            return "the workspace split runs the coop and ws schedules"
        if self.tail:
            if not 2 <= self.splits <= TAIL_MAX_SPLITS:
                return f"the tail split takes 2..{TAIL_MAX_SPLITS} parts"
            if self.swizzle != 1:
                return "the tail split walks its own raster (swizzle 1)"
            return None
        if tuple(self.cluster) not in ((1, 1), (1, 2)):
            # A cluster along M would pair two parts of one tile (other k-blocks): no multicast.
            return "the workspace split runs clusters 1x1 and 1x2 (along N)"
        if self.raster != "m":
            return "the workspace split rasters along M (a tile's parts run side by side)"
        if not 2 <= self.splits <= MAX_SPLITS:
            return f"splits must be 2..{MAX_SPLITS}"
        return None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        tm, tn, _ = self.kernel_tile
        d.update({
            # The cost model and the wave rule read split_k (work units per output tile).
            "split_k": self.splits,
            "workspace": {"dtype": "f32", "form": "tail" if self.tail else "tiles", "tile": [tm, tn],
                          "splits": self.splits, "sem_align": SEM_ALIGN,
                          **({"slots": TAIL_SLOTS} if self.tail else {})},
            "persistent": {"arg": "max_clusters", "cluster_ctas": math.prod(self.kernel_cluster)},
        })
        return d

    def make_kernel(self):
        plan = self.plan()
        kernel = (GemmSm90TailKernel if self.tail else GemmSm90SplitKernel)(
            tile=self.kernel_tile, cluster=self.kernel_cluster, n_consumer=plan.n_consumer,
            pingpong=False, promote=False, epi_tile=plan.epi_tile, ab_stages=plan.ab_stages,
            epi_stages=plan.epi_stages, raster_along_m=True, swizzle=self.swizzle, swap_ab=False,
            split_k=1, pdl=self.pdl, splits=self.splits,
            **({"scale_mode": self.scale_mode} if self.is_fp8 else {}),
        )
        if self.is_fp8:
            return kernel.scaled
        return kernel


class GemmSm90SplitKernel(GemmSm90Kernel):
    """``GemmSm90Kernel`` with the scheduler's M index = tile * splits + part, the part's k-blocks
    and the fix-up instead of every tile's store."""

    def __init__(self, *, splits: int, **kw):
        super().__init__(**kw)
        self.splits = splits

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, workspace: cute.Tensor,
                 max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch_split(a, b, c, workspace, max_clusters, stream)

    @cute.jit
    def _host_operands(self, a, b, c):
        """The host side both kernels share: the MMA, the smem layouts, the TMA atoms, and the shared
        storage (``self.shared_storage``, with the dtypes the device side reads)."""
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
        sC_layout = sm90_utils.make_smem_layout_epi(c_dtype, c_layout, self.epi_tile, self.epi_stages)
        tma_a, gA = atoms.tma_load_atom(a, sA_layout, (self.tile[0], self.tile[2]), self.mcast_a)
        tma_b, gB = atoms.tma_load_atom(b, sB_layout, (self.tile[1], self.tile[2]), self.mcast_b)
        tma_c, gC = atoms.tma_store_atom(c, sC_layout, self.epi_tile)

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[
                cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[
                cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        self.ab_dtype = ab_dtype
        self.c_layout = c_layout
        return tiled_mma, sA_layout, sB_layout, sC_layout, tma_a, gA, tma_b, gB, tma_c, gC

    def _consumer_operands(self, tiled_mma, sA, sB, sC, gC, ctidx):
        """The consumer side both kernels share: the MMA fragments and accumulators, the epilogue's
        register -> smem copy and its buffers, the TMA store pipeline and the epilogue barrier."""
        thr_mma = tiled_mma.get_slice(ctidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_C(gC).shape[:3]
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        n_acc = cute.size(acc)
        k_blocks = cute.size(tCrA, mode=[2])

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
        epi_bar = pipeline.NamedBarrier(barrier_id=int(_Bar.EPILOGUE), num_threads=self.epi_threads)
        return (tCrA, tCrB, acc, n_acc, k_blocks, r2s, tRS_sC, tRS_acc, tRS_rF, tRS_rC, frag_size, store_pipe,
                epi_bar)

    @cute.jit
    def _prologue(self, tma_a, tma_b, tma_c, mA, mB, mC, sA_layout, sB_layout, sC_layout):
        """The device side both kernels start with: descriptor prefetch, the cluster coordinates,
        the shared storage, the A/B stage pipeline (initialised across the cluster), the tiled
        global views and the k-tile count."""
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            atoms.prefetch_tma_descriptors(tma_a, tma_b, tma_c)
        cta_layout = cute.make_layout((*self.cluster, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout.get_flat_coord(cta_rank)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)

        stage_bytes = (atoms.stage_bytes(self.ab_dtype, sA_layout)
                       + atoms.stage_bytes(self.ab_dtype, sB_layout))
        mcast_peers = self.mcast_a + self.mcast_b - 1
        ab_pipe = atoms.tma_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, stage_bytes,
                                     mcast_peers * self.mma_wgs * 4,
                                     cute.make_layout((1, *cta_layout.shape)))
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster, is_relaxed=True)

        gA = cute.local_tile(mA, cute.slice_(self.tile, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, self.c_tile, (None, None, None))
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)
        return (tidx, warp_idx, cta_layout, cta_rank, cluster_coord, sA, sB, sC, ab_pipe, gA, gB, gC,
                k_tiles)

    @cute.jit
    def _k_range(self, m, k_tiles):
        """(output tile M index, first k-tile, end k-tile) of a work unit: part p of
        ``splits`` takes the p-th slice of ceil(k_tiles / splits) k-tiles (possibly none)."""
        part = m % self.splits
        m = m // self.splits
        per = (k_tiles + self.splits - 1) // self.splits
        k_begin = part * per
        k_end = cutlass.min(k_tiles, k_begin + per)
        return m, k_begin, k_end

    @cute.jit
    def _launch_split(self, a, b, c, workspace, max_clusters, stream):
        tiled_mma, sA_layout, sB_layout, sC_layout, tma_a, gA, tma_b, gB, tma_c, gC = self._host_operands(a, b, c)

        tiles_mnl = cute.zipped_divide(c, tiler=self.c_tile)[(0, (None, None, None))].shape
        tiles_mnl = (tiles_mnl[0] * self.splits, tiles_mnl[1], tiles_mnl[2])
        sched, grid = atoms.persistent_schedule(tiles_mnl, self.cluster, self.swizzle, True, max_clusters)
        self.split_kernel(
            tma_a, gA, tma_b, gB, tma_c, gC, workspace, tiled_mma, sA_layout, sB_layout, sC_layout, sched,
        ).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=self.pdl,
        )

    @cute.kernel
    def split_kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
                     tma_c: cute.CopyAtom, mC: cute.Tensor, workspace: cute.Tensor, tiled_mma: cute.TiledMma,
                     sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
                     sC_layout: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams):
        (tidx, warp_idx, cta_layout, cta_rank, cluster_coord, sA, sB, sC, ab_pipe, gA, gB, gC,
         k_tiles) = self._prologue(tma_a, tma_b, tma_c, mA, mB, mC, sA_layout, sB_layout, sC_layout)
        if cutlass.const_expr(self.pdl):
            # As sm90.py: the grid is resident, so the next kernel may be scheduled now; wait for
            # the previous one before touching global memory (the workspace included).
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()

        warpgroup = cute.arch.make_warp_uniform(tidx // 128)
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(atoms.GEMM_PRODUCER_REGS)
            if warp_idx == 0:
                self.produce(tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                             sched_params, k_tiles)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume_split(tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, sched_params, k_tiles,
                               tidx - 128, warp_idx, workspace)

    def _tail_setup(self, gC, workspace, frag_size, n_acc):
        """The tail consumers' fixed values: the grid's tiles, the semaphore words and a partial
        tile's words, the cluster size, the semaphores, the 16-byte copy atom and its staging
        fragments, the epilogue's sub-tiles per tile."""
        tiles_m = cute.size(gC, mode=[2])
        tiles_n = cute.size(gC, mode=[3])
        n_tiles = tiles_m * tiles_n * cute.size(gC, mode=[4])
        sem_words = (n_tiles + SEM_ALIGN - 1) // SEM_ALIGN * SEM_ALIGN
        tile_words = self.tile[0] * self.tile[1]
        cluster_ctas = self.cluster[0] * self.cluster[1]
        sems = cute.recast_ptr(workspace.iterator, dtype=cutlass.Int32)
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
        t4 = cute.make_rmem_tensor((4, 1), cutlass.Float32)
        pbuf = cute.make_rmem_tensor((4, self.splits), cutlass.Float32)  # one vector of every part
        n_epi_all = cute.size(cute.zipped_divide(gC[(None, None, 0, 0, 0)], self.epi_tile), mode=[1])
        assert frag_size % 4 == 0 and n_acc == n_epi_all * frag_size, (frag_size, n_acc, n_epi_all)
        return tiles_m, tiles_n, sem_words, tile_words, cluster_ctas, sems, vec, t4, pbuf, n_epi_all

    @cute.jit
    def _slot(self, workspace, base, n_acc: cutlass.Constexpr):
        """This thread's view of one partial tile in the workspace: n_acc floats in 16-byte
        vectors, the epilogue threads' vectors interleaved (a warp's vector stores contiguous)."""
        addr = workspace.iterator.toint() + cutlass.Int64(base) * 4
        ptr = cute.make_ptr(cutlass.Float32, addr, cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout((4, n_acc // 4), stride=(1, 4 * self.epi_threads)))

    @cute.jit
    def _store_part(self, workspace, base, acc, vec, n_acc: cutlass.Constexpr):
        """This thread's accumulators into one partial tile, 4 at a time.  (Through a small
        staging fragment: a tensor view of the accumulators themselves moved them to local memory
        and made ptxas serialise the WGMMAs.)"""
        t4 = cute.make_rmem_tensor((4, 1), cutlass.Float32)
        dst = self._slot(workspace, base, n_acc)
        for j in cutlass.range_constexpr(n_acc // 4):
            for e in cutlass.range_constexpr(4):
                t4[e] = acc[4 * j + e]
            cute.copy(vec, t4, cute.local_tile(dst, (4, 1), (0, j)))

    @cute.jit
    def _sum_parts(self, workspace, tile_base, tile_words, busy, own, acc, vec, n_acc: cutlass.Constexpr):
        """acc = ((p0 + p1) + ... + p_{splits-2}) + acc (acc only where ``own``: the reducing part
        owns k-blocks), the contributing parts read from the workspace, in part order, 4 values
        at a time; parts >= ``busy`` own no k-block and are skipped."""
        t4 = cute.make_rmem_tensor((4, 1), cutlass.Float32)
        u4 = cute.make_rmem_tensor((4, 1), cutlass.Float32)
        for j in cutlass.range_constexpr(n_acc // 4):
            cute.copy(vec, cute.local_tile(self._slot(workspace, tile_base, n_acc), (4, 1), (0, j)), t4)
            for p in cutlass.range_constexpr(1, self.splits - 1):
                if p < busy:
                    cute.copy(vec, cute.local_tile(self._slot(workspace, tile_base + p * tile_words, n_acc),
                                                   (4, 1), (0, j)), u4)
                    for e in cutlass.range_constexpr(4):
                        t4[e] = t4[e] + u4[e]
            if own:
                for e in cutlass.range_constexpr(4):
                    acc[4 * j + e] = t4[e] + acc[4 * j + e]
            else:
                for e in cutlass.range_constexpr(4):
                    acc[4 * j + e] = t4[e]

    @cute.jit
    def consume_split(self, tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, sched_params, k_tiles, ctidx,
                      warp_idx, workspace):
        """The consumer warpgroups: per work unit the part's mainloop, the partial tile into the
        workspace and the semaphore; the last part of a tile sums the partials in part order and
        runs the epilogue."""
        (tCrA, tCrB, acc, n_acc, k_blocks, r2s, tRS_sC, tRS_acc, tRS_rF, tRS_rC, frag_size, store_pipe,
         epi_bar) = self._consumer_operands(tiled_mma, sA, sB, sC, gC, ctidx)
        c_dtype = sC.element_type
        store_warp = 4

        tiles_m = cute.size(gC, mode=[2])
        tiles_n = cute.size(gC, mode=[3])
        n_tiles = tiles_m * tiles_n * cute.size(gC, mode=[4])
        sem_words = (n_tiles + 31) // 32 * 32
        tile_words = self.tile[0] * self.tile[1]
        per = (k_tiles + self.splits - 1) // self.splits
        sems = cute.recast_ptr(workspace.iterator, dtype=cutlass.Int32)
        # The partial tiles: this thread's accumulators as 16-byte vectors.
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)

        sched = atoms.tile_scheduler(sched_params)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        stored = cutlass.Int32(0)  # epilogue sub-tiles stored by this CTA (the smem buffer ring)
        work = sched.get_current_work()
        while work.is_valid_tile:
            mu, n, l = work.tile_idx
            part = mu % self.splits
            m, k_begin, k_end = self._k_range(mu, k_tiles)
            # ---- mainloop (as sm90.py's bf16 loop: one WGMMA batch in flight)
            cute.nvgpu.warpgroup.fence()
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
            cute.nvgpu.warpgroup.wait_group(0)
            if k_end > k_begin:
                ab_pipe.consumer_release(release)
                release.advance()

            # ---- fix-up.  Padding units of the scheduler (clusters rounded up along N) have no
            # output tile: they neither store nor arrive.
            last = cutlass.Boolean(False)
            if n < tiles_n:
                tile_id = m + tiles_m * (n + tiles_n * l)
                tile_base = sem_words + tile_id * self.splits * tile_words + ctidx * 4
                if part < self.splits - 1:
                    # A contributing part: its partial tile (unless it owns no k-block), released
                    # at GPU scope by every thread, then one arrival; it does not wait.
                    if k_end > k_begin:
                        self._store_part(workspace, tile_base + part * tile_words, acc, vec, n_acc)
                    cute.arch.fence_acq_rel_gpu()
                    epi_bar.arrive_and_wait()
                    if ctidx == 0:
                        cute.arch.red(sems + tile_id, cutlass.Int32(1), op="add", dtype="s32", sem="release",
                                      scope="gpu")
                else:
                    # The reducing (last) part: wait for the others' arrivals, set the semaphore
                    # back to 0, then sum in part order: ((p0 + p1) + ...) + own.
                    last = cutlass.Boolean(True)
                    if ctidx == 0:
                        got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                        while got < self.splits - 1:
                            got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                        cute.arch.store(sems + tile_id, cutlass.Int32(0))
                    epi_bar.arrive_and_wait()
                    cute.arch.fence_acq_rel_gpu()
                    # parts 0 .. busy - 1 own k-blocks (part 0 always does)
                    busy = (k_tiles + per - 1) // per
                    self._sum_parts(workspace, tile_base, tile_words, busy, k_end > k_begin, acc, vec, n_acc)

            if last:
                # ---- epilogue (as sm90.py): sub-tiles -> smem (stmatrix) -> TMA store
                gC_t = cute.zipped_divide(gC[(None, None, m, n, l)], self.epi_tile)
                bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
                    tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_t,
                )
                epi_shape = gC_t.shape[1]
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                n_epi = cute.size(gC_t, mode=[1])
                for e in cutlass.range_constexpr(n_epi):
                    for v in cutlass.range_constexpr(frag_size):
                        tRS_rF[v] = tRS_acc[e * frag_size + v]
                    tRS_rC.store(tRS_rF.load().to(c_dtype))
                    buf = (stored + e) % self.epi_stages
                    cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_bar.arrive_and_wait()
                    if warp_idx == store_warp:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                    epi_bar.arrive_and_wait()
                stored = stored + n_epi
            sched.advance_to_next_work()
            work = sched.get_current_work()
        store_pipe.producer_tail()


class GemmSm90TailKernel(GemmSm90SplitKernel):
    """The tail split: whole output tiles first, then the last, partial round of tiles split
    along K over the CTAs that round would leave idle, with a reduce-scatter fix-up.

    Work units, walked by the persistent clusters in order (cluster ``c`` takes ``c``, ``c + G``,
    ...; G = the clusters the device holds, ``max_clusters``): with T cluster tiles (cluster-sized
    groups of output tiles, raster along M), ``R = T mod G`` and ``D = T - R``, units ``0..D-1``
    are whole tiles, then ``R x S`` units are (tile, part) pairs, ``S = min(G // R, splits,
    k_tiles // TAIL_MIN_K)`` (and the slots bound), part p taking k-tiles ``[p K / S, (p+1) K / S)``.
    The split units all fall in the last round, so every part of a tile is resident at once.
    Fix-up: every part stores its fp32 partial (the epilogue's register order, 16-byte vectors
    interleaved over the threads), fences and arrives on the tile's semaphore; once all S have
    arrived, part p sums the epilogue sub-tiles ``[p n / S, (p+1) n / S)`` of all parts in part
    order and stores them through the usual epilogue; then a second arrival, and the last of those
    sets the semaphore back to 0.  The semaphores must be zero at launch (the runtime zeroes them, as
    the "tiles" workspace's; the kernel leaves them zero)."""

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, workspace: cute.Tensor,
                 max_clusters: cutlass.Int32, stream: cuda.CUstream):
        self._launch_tail(a, b, c, workspace, max_clusters, stream)

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
               scale_b: cute.Tensor, workspace: cute.Tensor, max_clusters: cutlass.Int32,
               stream: cuda.CUstream):
        """fp8: the scales (per tensor or per row, ``scale_mode``) applied to the summed tile."""
        self._launch_tail(a, b, c, workspace, max_clusters, stream, scale_a, scale_b)

    @cute.jit
    def _launch_tail(self, a, b, c, workspace, max_clusters, stream, scale_a=None, scale_b=None):
        tiled_mma, sA_layout, sB_layout, sC_layout, tma_a, gA, tma_b, gB, tma_c, gC = self._host_operands(a, b, c)

        # The unit plan (see the class docstring), from the problem and the resident clusters.
        cm, cn = self.cluster
        tiles_m = (c.shape[0] + self.tile[0] - 1) // self.tile[0]
        tiles_n = (c.shape[1] + self.tile[1] - 1) // self.tile[1]
        k_tiles = (a.shape[1] + self.tile[2] - 1) // self.tile[2]
        ct_m = (tiles_m + cm - 1) // cm
        ct_n = (tiles_n + cn - 1) // cn
        n_ct = ct_m * ct_n * c.shape[2]
        g = cutlass.max(max_clusters, cutlass.Int32(1))
        rest = n_ct % g
        s = cutlass.min(g // cutlass.max(rest, cutlass.Int32(1)), cutlass.Int32(TAIL_MAX_SPLITS))
        s = cutlass.min(s, cutlass.Int32(self.splits))
        s = cutlass.min(s, k_tiles // TAIL_MIN_K)
        s = cutlass.min(s, TAIL_SLOTS // cutlass.max(rest * cm * cn, cutlass.Int32(1)))
        s = cutlass.max(s, cutlass.Int32(1))
        whole = n_ct - rest
        units = whole + rest * s
        grid_z = cutlass.max(cutlass.min(g, units), cutlass.Int32(1))
        self.tail_kernel(
            tma_a, gA, tma_b, gB, tma_c, gC, workspace, tiled_mma, sA_layout, sB_layout, sC_layout,
            ct_m, ct_n, whole, units, s, scale_a, scale_b,
        ).launch(
            grid=[cm, cn, grid_z], block=[self.threads, 1, 1], cluster=(*self.cluster, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=self.pdl,
        )

    @cute.jit
    def _unit(self, u, whole, s, ct_m, ct_n, k_tiles, cluster_coord):
        """(m, n, l, first k-tile, end k-tile, part, parts, tail index) of work unit ``u``."""
        t = u
        part = cutlass.Int32(0)
        parts = cutlass.Int32(1)
        r = cutlass.Int32(0)
        if u >= whole:
            j = u - whole
            r = j // s
            part = j - r * s
            parts = s
            t = whole + r
        k_begin = part * k_tiles // parts
        k_end = (part + 1) * k_tiles // parts
        m_ct = t % ct_m
        q = t // ct_m
        n_ct = q % ct_n
        l = q // ct_n
        m = m_ct * self.cluster[0] + cluster_coord[0]
        n = n_ct * self.cluster[1] + cluster_coord[1]
        return m, n, l, k_begin, k_end, part, parts, r

    @cute.kernel
    def tail_kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
                    tma_c: cute.CopyAtom, mC: cute.Tensor, workspace: cute.Tensor, tiled_mma: cute.TiledMma,
                    sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
                    sC_layout: cute.ComposedLayout, ct_m: cutlass.Int32, ct_n: cutlass.Int32,
                    whole: cutlass.Int32, units: cutlass.Int32, s: cutlass.Int32, scale_a=None, scale_b=None):
        (tidx, warp_idx, cta_layout, cta_rank, cluster_coord, sA, sB, sC, ab_pipe, gA, gB, gC,
         k_tiles) = self._prologue(tma_a, tma_b, tma_c, mA, mB, mC, sA_layout, sB_layout, sC_layout)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()

        _, _, cluster_idx = cute.arch.block_idx()
        _, _, n_clusters = cute.arch.grid_dim()
        plan = (whole, units, s, ct_m, ct_n, cluster_idx, n_clusters)
        warpgroup = cute.arch.make_warp_uniform(tidx // 128)
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(atoms.GEMM_PRODUCER_REGS)
            if warp_idx == 0:
                self.produce_tail(tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                                  k_tiles, plan)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            if cutlass.const_expr(scale_a is None):
                self.consume_tail(tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, k_tiles, tidx - 128, warp_idx,
                                  workspace, cluster_coord, cta_rank, plan)
            else:
                self.consume_tail_scaled(tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, k_tiles, tidx - 128,
                                         warp_idx, workspace, cluster_coord, cta_rank, plan, scale_a, scale_b)

    @cute.jit
    def produce_tail(self, tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord, k_tiles, plan):
        """The TMA warp: every k-tile of this cluster's units into the next free stage."""
        whole, units, s, ct_m, ct_n, cluster_idx, n_clusters = plan
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, cluster_coord[1], cute.make_layout(self.cluster[1]),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, cluster_coord[0], cute.make_layout(self.cluster[0]),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )
        a_mask = None
        b_mask = None
        if cutlass.const_expr(self.mcast_a > 1):
            a_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=1)
        if cutlass.const_expr(self.mcast_b > 1):
            b_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        u = cluster_idx
        while u < units:
            m, n, l, k_begin, k_end, _part, _parts, _r = self._unit(u, whole, s, ct_m, ct_n, k_tiles,
                                                                   cluster_coord)
            tAgA_t = tAgA[(None, m, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            for k in range(k_begin, k_end):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                ab_pipe.producer_commit(state)
                state.advance()
            u = u + n_clusters
        ab_pipe.producer_tail(state)

    @cute.jit
    def consume_tail(self, tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, k_tiles, ctidx, warp_idx, workspace,
                     cluster_coord, cta_rank, plan):
        """The consumer warpgroups: per unit the mainloop; a whole tile's epilogue, or a part's
        partial out, the wait for its tile's other parts, and this part's share of the sum."""
        whole, units, s, ct_m, ct_n, cluster_idx, n_clusters = plan
        (tCrA, tCrB, acc, n_acc, k_blocks, r2s, tRS_sC, tRS_acc, tRS_rF, tRS_rC, frag_size, store_pipe,
         epi_bar) = self._consumer_operands(tiled_mma, sA, sB, sC, gC, ctidx)
        c_dtype = sC.element_type
        store_warp = 4

        (tiles_m, tiles_n, sem_words, tile_words, cluster_ctas, sems, vec, t4, pbuf,
         n_epi_all) = self._tail_setup(gC, workspace, frag_size, n_acc)

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        stored = cutlass.Int32(0)  # epilogue sub-tiles stored by this CTA (the smem buffer ring)
        u = cluster_idx
        while u < units:
            m, n, l, k_begin, k_end, part, parts, r = self._unit(u, whole, s, ct_m, ct_n, k_tiles, cluster_coord)
            # ---- mainloop (as sm90.py's bf16 loop: one WGMMA batch in flight)
            cute.nvgpu.warpgroup.fence()
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
            cute.nvgpu.warpgroup.wait_group(0)
            if k_end > k_begin:
                ab_pipe.consumer_release(release)
                release.advance()

            # Padding tiles of a cluster past the grid's edge store nothing (and are never split
            # apart from their cluster's real tiles, whose parts they mirror).
            e_begin = cutlass.Int32(0)
            e_end = cutlass.Int32(0)
            slot0 = cutlass.Int32(0)
            tile_id = cutlass.Int32(0)
            valid = cutlass.Int32(0)
            if m < tiles_m:
                if n < tiles_n:
                    valid = cutlass.Int32(1)
            if valid > 0:
                e_begin = part * n_epi_all // parts
                e_end = (part + 1) * n_epi_all // parts
                if parts > 1:
                    # Every part: its partial (in the epilogue's register order) out, released at
                    # GPU scope, one arrival; then wait for all the tile's parts.
                    tile_id = m + tiles_m * (n + tiles_n * l)
                    slot0 = (r * cluster_ctas + cta_rank) * parts
                    base = sem_words + (slot0 + part) * tile_words + ctidx * 4
                    dst = self._slot(workspace, base, n_acc)
                    for j in cutlass.range_constexpr(n_acc // 4):
                        for e in cutlass.range_constexpr(4):
                            t4[e] = tRS_acc[4 * j + e]
                        cute.copy(vec, t4, cute.local_tile(dst, (4, 1), (0, j)))
                    # The CTA's stores are ordered before one thread's release by the barrier
                    # (the release is cumulative); after the acquire, the barrier orders the
                    # CTA's loads after it: one fence per CTA, not one per thread.
                    epi_bar.arrive_and_wait()
                    if ctidx == 0:
                        cute.arch.fence_acq_rel_gpu()
                        cute.arch.red(sems + tile_id, cutlass.Int32(1), op="add", dtype="s32", sem="release",
                                      scope="gpu")
                        got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                        while got < parts:
                            got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                    epi_bar.arrive_and_wait()

            if e_end > e_begin:
                # ---- epilogue (as sm90.py) over this part's sub-tiles: -> smem (stmatrix) -> TMA
                gC_t = cute.zipped_divide(gC[(None, None, m, n, l)], self.epi_tile)
                bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
                    tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_t,
                )
                epi_shape = gC_t.shape[1]
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                n_epi = cute.size(gC_t, mode=[1])
                for e in cutlass.range_constexpr(n_epi):
                    mine = cutlass.Int32(0)
                    if e >= e_begin:
                        if e < e_end:
                            mine = cutlass.Int32(1)
                    if mine > 0:
                        if parts > 1:
                            # this sub-tile summed over the parts in part order: every part's
                            # vectors loaded first (up to `splits` loads in flight), then added
                            for j in cutlass.range_constexpr(frag_size // 4):
                                jj = e * (frag_size // 4) + j
                                for p in cutlass.range_constexpr(self.splits):
                                    if p < parts:
                                        src = self._slot(workspace, sem_words + (slot0 + p) * tile_words + ctidx * 4,
                                                         n_acc)
                                        cute.copy(vec, cute.local_tile(src, (4, 1), (0, jj)),
                                                  cute.local_tile(pbuf, (4, 1), (0, p)))
                                for x in cutlass.range_constexpr(4):
                                    tRS_rF[4 * j + x] = pbuf[x, 0]
                                for p in cutlass.range_constexpr(1, self.splits):
                                    if p < parts:
                                        for x in cutlass.range_constexpr(4):
                                            tRS_rF[4 * j + x] = tRS_rF[4 * j + x] + pbuf[x, p]
                        else:
                            for v in cutlass.range_constexpr(frag_size):
                                tRS_rF[v] = tRS_acc[e * frag_size + v]
                        tRS_rC.store(tRS_rF.load().to(c_dtype))
                        buf = stored % self.epi_stages
                        cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        epi_bar.arrive_and_wait()
                        if warp_idx == store_warp:
                            cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                            store_pipe.producer_commit()
                            store_pipe.producer_acquire()
                        epi_bar.arrive_and_wait()
                        stored = stored + 1
            if parts > 1:
                if valid > 0:
                    if ctidx == 0:
                        # A second arrival once past the wait: the last of the 2 x parts sets the
                        # semaphore back to 0 (every part has seen it full), for the next launch.
                        old = cute.arch.atomic_add(sems + tile_id, cutlass.Int32(1), sem="relaxed", scope="gpu")
                        if old == 2 * parts - 1:
                            cute.arch.store(sems + tile_id, cutlass.Int32(0))
            u = u + n_clusters
        store_pipe.producer_tail()

    @cute.jit
    def consume_tail_scaled(self, tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, k_tiles, ctidx, warp_idx,
                            workspace, cluster_coord, cta_rank, plan, scale_a, scale_b):
        """fp8 (fast accumulation) form of :meth:`consume_tail`: a split tile's parts store their
        unscaled fp32 partials; each part sums its sub-tiles over all parts in part order back into
        the accumulators, then the scales are applied as the unsplit fp8 kernel applies them (row
        form: ``atoms.apply_row_col_scales`` on the accumulators; per tensor: the product of the two
        at the conversion), then the epilogue stores this part's sub-tiles."""
        whole, units, s, ct_m, ct_n, cluster_idx, n_clusters = plan
        (tCrA, tCrB, acc, n_acc, k_blocks, r2s, tRS_sC, tRS_acc, tRS_rF, tRS_rC, frag_size, store_pipe,
         epi_bar) = self._consumer_operands(tiled_mma, sA, sB, sC, gC, ctidx)
        c_dtype = sC.element_type
        store_warp = 4

        (tiles_m, tiles_n, sem_words, tile_words, cluster_ctas, sems, vec, t4, pbuf,
         n_epi_all) = self._tail_setup(gC, workspace, frag_size, n_acc)
        row_form = self.scale_mode == "row"
        cC = None
        scale = cutlass.Float32(1.0)
        if cutlass.const_expr(row_form):
            cC = tiled_mma.get_slice(ctidx).partition_C(cute.make_identity_tensor((self.tile[0], self.tile[1])))
        else:
            scale = scale_a[0] * scale_b[0]

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        stored = cutlass.Int32(0)  # epilogue sub-tiles stored by this CTA (the smem buffer ring)
        u = cluster_idx
        while u < units:
            m, n, l, k_begin, k_end, part, parts, r = self._unit(u, whole, s, ct_m, ct_n, k_tiles, cluster_coord)
            # ---- mainloop (fp8 fast accumulation: one WGMMA batch in flight, as the bf16 loop)
            cute.nvgpu.warpgroup.fence()
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
            cute.nvgpu.warpgroup.wait_group(0)
            if k_end > k_begin:
                ab_pipe.consumer_release(release)
                release.advance()

            # Padding tiles past the grid's edge store nothing (as consume_tail).
            e_begin = cutlass.Int32(0)
            e_end = cutlass.Int32(0)
            slot0 = cutlass.Int32(0)
            tile_id = cutlass.Int32(0)
            valid = cutlass.Int32(0)
            if m < tiles_m:
                if n < tiles_n:
                    valid = cutlass.Int32(1)
            if valid > 0:
                e_begin = part * n_epi_all // parts
                e_end = (part + 1) * n_epi_all // parts
                if parts > 1:
                    # Every part: its unscaled partial out, one release and arrival per CTA, then
                    # the wait for all the tile's parts (as consume_tail).
                    tile_id = m + tiles_m * (n + tiles_n * l)
                    slot0 = (r * cluster_ctas + cta_rank) * parts
                    base = sem_words + (slot0 + part) * tile_words + ctidx * 4
                    dst = self._slot(workspace, base, n_acc)
                    for j in cutlass.range_constexpr(n_acc // 4):
                        for e in cutlass.range_constexpr(4):
                            t4[e] = tRS_acc[4 * j + e]
                        cute.copy(vec, t4, cute.local_tile(dst, (4, 1), (0, j)))
                    epi_bar.arrive_and_wait()
                    if ctidx == 0:
                        cute.arch.fence_acq_rel_gpu()
                        cute.arch.red(sems + tile_id, cutlass.Int32(1), op="add", dtype="s32", sem="release",
                                      scope="gpu")
                        got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                        while got < parts:
                            got = cute.arch.load(sems + tile_id, cutlass.Int32, sem="acquire", scope="gpu")
                    epi_bar.arrive_and_wait()

            if e_end > e_begin:
                if parts > 1:
                    # This part's sub-tiles summed over the parts in part order into the
                    # accumulators (every part's vector loaded first, then the adds).
                    for e in cutlass.range_constexpr(n_epi_all):
                        mine = cutlass.Int32(0)
                        if e >= e_begin:
                            if e < e_end:
                                mine = cutlass.Int32(1)
                        if mine > 0:
                            for j in cutlass.range_constexpr(frag_size // 4):
                                jj = e * (frag_size // 4) + j
                                for p in cutlass.range_constexpr(self.splits):
                                    if p < parts:
                                        src = self._slot(workspace, sem_words + (slot0 + p) * tile_words + ctidx * 4,
                                                         n_acc)
                                        cute.copy(vec, cute.local_tile(src, (4, 1), (0, jj)),
                                                  cute.local_tile(pbuf, (4, 1), (0, p)))
                                for x in cutlass.range_constexpr(4):
                                    t4[x] = pbuf[x, 0]
                                for p in cutlass.range_constexpr(1, self.splits):
                                    if p < parts:
                                        for x in cutlass.range_constexpr(4):
                                            t4[x] = t4[x] + pbuf[x, p]
                                for x in cutlass.range_constexpr(4):
                                    tRS_acc[4 * jj + x] = t4[x]
                if cutlass.const_expr(row_form):
                    atoms.apply_row_col_scales(acc, cC, scale_a, scale_b, m * self.tile[0], n * self.tile[1])
                # ---- epilogue (as sm90.py) over this part's sub-tiles: -> smem (stmatrix) -> TMA
                gC_t = cute.zipped_divide(gC[(None, None, m, n, l)], self.epi_tile)
                bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
                    tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_t,
                )
                epi_shape = gC_t.shape[1]
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                n_epi = cute.size(gC_t, mode=[1])
                for e in cutlass.range_constexpr(n_epi):
                    mine = cutlass.Int32(0)
                    if e >= e_begin:
                        if e < e_end:
                            mine = cutlass.Int32(1)
                    if mine > 0:
                        for v in cutlass.range_constexpr(frag_size):
                            tRS_rF[v] = tRS_acc[e * frag_size + v]
                        vals = tRS_rF.load()
                        if cutlass.const_expr(not row_form):
                            vals = vals * scale
                        tRS_rC.store(vals.to(c_dtype))
                        buf = stored % self.epi_stages
                        cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        epi_bar.arrive_and_wait()
                        if warp_idx == store_warp:
                            cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                            store_pipe.producer_commit()
                            store_pipe.producer_acquire()
                        epi_bar.arrive_and_wait()
                        stored = stored + 1
            if parts > 1:
                if valid > 0:
                    if ctidx == 0:
                        old = cute.arch.atomic_add(sems + tile_id, cutlass.Int32(1), sem="relaxed", scope="gpu")
                        if old == 2 * parts - 1:
                            cute.arch.store(sems + tile_id, cutlass.Int32(0))
            u = u + n_clusters
        store_pipe.producer_tail()


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

@register("gemm")
def enumerate_sm90_splitk(target: Target, tier: str) -> list[GemmSm90SplitK]:
    if target.family != "sm90" or not target.clusters:
        return []
    default = tiles.SM90_SPLITK_DEFAULT + tiles.SM90_TAIL_DEFAULT + tiles.SM90_TAIL_FP8_DEFAULT
    specs = {"test": tiles.SM90_SPLITK_TEST + tiles.SM90_TAIL_TEST, "default": default,
             "full": default + tiles.SM90_SPLITK_FULL + tiles.SM90_TAIL_FULL + tiles.SM90_TAIL_FP8_FULL}[tier]
    out = []
    for s in specs:
        v = GemmSm90SplitK(target=target.name, pdl=True, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out
