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
  schedule, so one warpgroup's epilogue overlaps the other's mainloop (the in-order smem ring
  staggers them: the second tile's k-blocks arrive only as the first tile's stages free up).  Per k-block they wait on "full",
  issue WGMMAs on the smem descriptors, keep one WGMMA batch in flight and release the previous
  stage.  Then the epilogue: accumulators -> (scale) -> output dtype -> smem (stmatrix) -> TMA store,
  one ``epi_tile`` sub-tile at a time through ``epi_stages`` smem buffers, so the stores of one
  tile overlap the next tile's mainloop.

Tails in M, N, K and L need no code: TMA zero-fills out-of-bounds loads and clips stores; the tile
scheduler rounds the tile grid up to whole clusters so multicast peers always have a tile.

The persistent grid is sized for ``PERSISTENT_SMS`` SMs (an H100 SXM has 132): the exported
launcher cannot ask the device, so the count is fixed at build time and written to the manifest.
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

from ..abi import DTYPE_BYTES
from ..atoms.targets import Target
from ..registry import register
from .common import GemmVariant

# Persistent CTAs launched at most (one per SM of an H100 SXM).
PERSISTENT_SMS = 132
# Bytes the smem plan keeps for the pipeline mbarriers (2 x 8 B per stage, padded so that the
# swizzled buffers after them start 1024-aligned).
_BARRIER_BYTES = 1024
_SMEM_ALIGN = 1024
# Static smem the DSL puts into every kernel (seen in the cubins: .nv.shared.<kernel> is 1 KiB);
# it counts against the same per-CTA capacity as the dynamic part.
_STATIC_SMEM = 1024
# setmaxnreg budgets: the producer warpgroup keeps few registers, the consumers take the rest
# (3 warpgroups: 40*128 + 2*232*128 <= 64K registers; 2 warpgroups can afford 240).
_PRODUCER_REGS = 40
_CONSUMER_REGS = {1: 240, 2: 232}


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

    @property
    def smem_bytes(self) -> int:
        return _BARRIER_BYTES + self.ab_stages * self.stage_bytes + self.epi_bytes


@dataclass(frozen=True, kw_only=True)
class GemmSm90(GemmVariant):
    """One Hopper GEMM config.  ``tile`` is the CTA tile (M, N, K); its K must be one 128-byte
    swizzle row (64 for 16-bit inputs, 128 for fp8).  ``schedule``: ``coop`` = two consumer
    warpgroups split the tile along M (tile M 128 or 256); ``ws`` = one consumer warpgroup (tile M
    64 or 128); ``pp`` = ping-pong, two consumer warpgroups with a tile each (tile M 64 or 128).  ``raster`` orders tiles along M or N; ``swizzle`` groups that many clusters for L2
    reuse (1 = plain raster).

    ``swap_ab`` (for decode, M <= 64): the kernel computes Cᵀ = B·Aᵀ, so the large N runs along the
    WGMMA's 64-row M side and the small M along its N side (down to 16), and C is written
    M-contiguous-in-the-kernel, i.e. still row-major.  ``tile`` and ``cluster`` stay in the
    problem's (M, N) orientation; the kernel sees them transposed."""

    family: ClassVar[str] = "sm90"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm90.py", "gemm/common.py")

    tile: tuple[int, int, int] = field(default=(128, 128, 64), metadata={"tag": "t"})
    cluster: tuple[int, int] = field(default=(1, 1), metadata={"tag": "c"})
    schedule: str = field(default="coop", metadata={"tag": ""})
    raster: str = field(default="m", metadata={"tag": "r"})
    swizzle: int = field(default=1, metadata={"tag": "sw"})
    swap_ab: bool = field(default=False, metadata={"tag": "swap"})
    # fp8 only: accumulate straight in the WGMMA accumulators (faster, fewer registers) instead of
    # adding each k-tile's partial sum into fp32 registers.
    fast_accum: bool = field(default=False, metadata={"tag": "fastacc"})

    required_sass: ClassVar[tuple[str, ...]] = (r"\bHGMMA\.64x", r"\bUTMALDG\.3D", r"\bUTMASTG\.3D")

    def sass_requirements(self) -> tuple[str, ...]:
        # fp8 WGMMA disassembles as QGMMA; multicast clusters must show the multicast TMA load.
        mma = r"\bQGMMA\.64x\d+x32\.F32\.E4M3" if self.is_fp8 else r"\bHGMMA\.64x"
        req = (mma, r"\bUTMALDG\.3D", r"\bUTMASTG\.3D", r"\bSYNCS\.", r"\bUSETMAXREG\.")
        if self.cluster != (1, 1):
            req += (r"\bUTMALDG\.3D\.MULTICAST",)
        return req

    # --- validity --------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm90":
            return f"target {self.target} is not a Hopper (sm90) target"
        if self.ab not in ("bf16", "f16", "e4m3", "e5m2"):
            return f"input dtype {self.ab} not supported"
        if self.c not in ("bf16", "f16", "f32"):
            return f"output dtype {self.c} not supported"
        if self.is_fp8 and not tgt.fp8:
            return "fp8 needs a target with fp8"
        if self.is_fp8 and (self.a_major, self.b_major) != ("k", "k"):
            return "fp8 WGMMA reads only K-major operands"
        if self.a_major not in ("k", "m") or self.b_major not in ("k", "n"):
            return f"majorness a={self.a_major} b={self.b_major} not supported"
        tm, tn, tk = self.kernel_tile
        if tk * DTYPE_BYTES[self.ab] != 128:
            return f"tile K must be one 128-byte row ({128 // DTYPE_BYTES[self.ab]} for {self.ab})"
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
        plan = self.plan()
        acc_sets = 2 if self.promotes else 1
        if acc_sets * tm * tn // (plan.mma_warpgroups * 128) > 128:
            return "more than 128 fp32 accumulators per consumer thread would spill"
        cm, cn = self.kernel_cluster
        if not tgt.clusters and (cm, cn) != (1, 1):
            return "target has no clusters"
        if (cm, cn) not in ((1, 1), (2, 1), (1, 2), (2, 2)):
            return f"cluster {self.cluster} not supported"
        # Each CTA of a multicast group loads 1/size of the shared operand tile.
        if tm % (cn * 8) or tn % (cm * 8):
            return "tile not divisible among multicast peers"
        if self.raster not in ("m", "n"):
            return "raster must be 'm' or 'n'"
        if self.swizzle < 1:
            return "swizzle must be >= 1"
        if plan.ab_stages < 2:
            return f"only {plan.ab_stages} smem stage(s) fit"
        if plan.smem_bytes + _STATIC_SMEM > tgt.smem_per_cta:
            return f"needs {plan.smem_bytes} + {_STATIC_SMEM} B smem > {tgt.smem_per_cta}"
        return None

    # --- derived ---------------------------------------------------------------------------------
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
        epi_stages = 4 if cb <= 2 else 2
        # Ping-pong: each warpgroup has its own epilogue buffers.
        epi_bytes = (_round_up(epi_tile[0] * epi_tile[1] * cb, _SMEM_ALIGN) * epi_stages
                     * (n_consumer // mma_wgs))
        ab = DTYPE_BYTES[self.ab]
        stage_bytes = _round_up(tm * tk * ab, _SMEM_ALIGN) + _round_up(tn * tk * ab, _SMEM_ALIGN)
        budget = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - epi_bytes
        ab_stages = min(budget // stage_bytes, 8)
        return _Plan(self.kernel_tile, n_consumer, mma_wgs, epi_tile, ab_stages, epi_stages, stage_bytes, epi_bytes)

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
            "stages": plan.ab_stages,
            "smem_bytes": plan.smem_bytes,
            "threads": 128 * (1 + plan.n_consumer),
            "persistent_ctas": PERSISTENT_SMS,
            "scaled": self.is_fp8,
            "fp8_accumulation": ("fast" if self.fast_accum else "promoted") if self.is_fp8 else None,
            "constraints": {
                # Sizes need only the 16-byte divisibility of the signature; tails are handled.
                "divisibility": dict(sig.divisibility),
                "align_bytes": 16,
                "tails": ["M", "N", "K", "L"],
            },
        })
        return d

    def make_kernel(self):
        plan = self.plan()
        kernel = GemmSm90Kernel(
            tile=self.kernel_tile, cluster=self.kernel_cluster, n_consumer=plan.n_consumer,
            pingpong=self.schedule == "pp", promote=self.promotes,
            epi_tile=plan.epi_tile, ab_stages=plan.ab_stages, epi_stages=plan.epi_stages,
            raster_along_m=(self.raster == "m") != self.swap_ab, swizzle=self.swizzle,
            swap_ab=self.swap_ab, max_ctas=PERSISTENT_SMS,
        )
        if self.is_fp8:
            return kernel.scaled
        return kernel


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GemmSm90Kernel:
    """Host side: ``__call__`` (a, b, c, stream) and ``scaled`` (a, b, c, scale_a, scale_b, stream)
    build the TMA atoms, the smem layouts and the persistent grid, then launch ``kernel``.
    See the module docstring for the warp roles."""

    def __init__(self, *, tile, cluster, n_consumer, pingpong, promote, epi_tile, ab_stages,
                 epi_stages, raster_along_m, swizzle, swap_ab, max_ctas):
        self.tile = tuple(tile)
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
        self.swap_ab = swap_ab
        self.max_clusters = max_ctas // math.prod(self.cluster)
        self.threads = 128 * (1 + n_consumer)
        self.consumer_regs = _CONSUMER_REGS[n_consumer]
        # A is shared by the CTAs of a cluster row (same M, different N) and multicast along N;
        # B along M.
        self.mcast_a = self.cluster[1]
        self.mcast_b = self.cluster[0]
        # The first warp of each epilogue group issues its TMA stores.

    # --- host ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        self._launch(a, b, c, None, None, stream)

    @cute.jit
    def scaled(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
               scale_b: cute.Tensor, stream: cuda.CUstream):
        self._launch(a, b, c, scale_a, scale_b, stream)

    @cute.jit
    def _launch(self, a, b, c, scale_a, scale_b, stream):
        if cutlass.const_expr(self.swap_ab):
            # Cᵀ = B·Aᵀ: the same kernel on swapped operands and a transposed view of C.
            a, b = b, a
            c = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 0, 2]))
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

        tma_a, gA = self._tma_load(a, sA_layout, (self.tile[0], self.tile[2]), self.mcast_a)
        tma_b, gB = self._tma_load(b, sB_layout, (self.tile[1], self.tile[2]), self.mcast_b)
        tma_c, gC = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), c,
            cute.slice_(sC_layout, (None, None, 0)), self.epi_tile,
        )

        tiles_mnl = cute.zipped_divide(c, tiler=self.tile[:2])[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(
            tiles_mnl, (*self.cluster, 1), self.swizzle, self.raster_along_m
        )
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.max_clusters)

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

        self.shared_storage = SharedStorage
        self.ab_dtype = ab_dtype
        self.c_layout = c_layout
        self.kernel(
            tma_a, gA, tma_b, gB, tma_c, gC, scale_a, scale_b, tiled_mma,
            sA_layout, sB_layout, sC_layout, sched,
        ).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1),
            min_blocks_per_mp=1, stream=stream,
        )

    @staticmethod
    def _tma_load(t, smem_layout_staged, smem_tile, n_mcast):
        op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if n_mcast > 1
              else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        return cute.nvgpu.cpasync.make_tiled_tma_atom(
            op, t, cute.slice_(smem_layout_staged, (None, None, 0)), smem_tile,
            num_multicast=n_mcast,
        )

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor,
        scale_a, scale_b,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_c)

        cta_layout = cute.make_layout((*self.cluster, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout.get_flat_coord(cta_rank)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)

        # Mainloop pipeline.  Every consumer warp of the tile's owner releases a stage once to each
        # CTA that multicasts into it (its cluster row and column, itself counted once).
        stage_bytes = cute.size_in_bytes(
            self.ab_dtype, cute.slice_(sA_layout, (None, None, 0))
        ) + cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_layout, (None, None, 0)))
        mcast_peers = self.mcast_a + self.mcast_b - 1
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_barriers.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, mcast_peers * self.mma_wgs * 4
            ),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout.shape)),
            defer_sync=True,
        )
        order_bars = storage.order_barriers.data_ptr()
        if cutlass.const_expr(self.tile_owners > 1):
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(order_bars, 128)
                    cute.arch.mbarrier_init(order_bars + 1, 128)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster, is_relaxed=True)

        # (bM, bK, tiles_m, tiles_k, L) and friends.
        gA = cute.local_tile(mA, cute.slice_(self.tile, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, cute.slice_(self.tile, (None, None, 0)), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)

        warpgroup = cute.arch.make_warp_uniform(tidx // 128)
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(_PRODUCER_REGS)
            if warp_idx == 0:
                self.produce(tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                             sched_params, k_tiles)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            # Which tile owner (ping-pong warpgroup) this thread belongs to, and its index there.
            owner = (warpgroup - 1) // self.mma_wgs
            self.consume(tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, order_bars, scale_a, scale_b,
                         sched_params, k_tiles, (tidx - 128) % self.epi_threads, owner, warp_idx)

    @cute.jit
    def produce(self, tma_a, tma_b, sA, sB, gA, gB, ab_pipe, cta_layout, cluster_coord,
                sched_params, k_tiles):
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
        a_mask = None
        b_mask = None
        if cutlass.const_expr(self.mcast_a > 1):
            a_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=1)
        if cutlass.const_expr(self.mcast_b > 1):
            b_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0)

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            tAgA_t = tAgA[(None, m, None, l)]
            tBgB_t = tBgB[(None, n, None, l)]
            for k in range(k_tiles):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, state.index)],
                          tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)],
                          tma_bar_ptr=bar, mcast_mask=b_mask)
                ab_pipe.producer_commit(state)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        # Do not exit while a peer may still multicast into (or release to) this CTA.
        ab_pipe.producer_tail(state)

    @cute.jit
    def consume(self, tiled_mma, tma_c, sA, sB, sC, gC, ab_pipe, order_bars, scale_a, scale_b,
                sched_params, k_tiles, ctidx, owner, warp_idx):
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
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        part = None
        if cutlass.const_expr(self.promote):
            part = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        k_blocks = cute.size(tCrA, mode=[2])

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
        if cutlass.const_expr(scale_a is not None):
            scale = scale_a[0] * scale_b[0]

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
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
        while work.is_valid_tile:
            m, n, l = work.tile_idx
            if cutlass.const_expr(self.tile_owners > 1):
                cute.arch.mbarrier_wait(order_bars + owner, turn_phase)
                turn_phase = turn_phase ^ 1
            # ---- mainloop
            acc.fill(0.0)
            if cutlass.const_expr(not self.promote):
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            cute.nvgpu.warpgroup.fence()
            for k in range(k_tiles):
                ab_pipe.consumer_wait(read)
                if cutlass.const_expr(self.promote):
                    # fp8: the k-block's products go into a fresh partial sum, added to the
                    # fp32 accumulators once the WGMMAs retire (the tensor core keeps fewer
                    # accumulator bits for fp8 than fp32 has).
                    cute.nvgpu.warpgroup.fence()
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, part, tCrA[blk], tCrB[blk], part)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    cute.nvgpu.warpgroup.wait_group(0)
                    ab_pipe.consumer_release(read)
                    read.advance()
                    acc.store(acc.load() + part.load())
                else:
                    # One WGMMA batch in flight; a stage is released once its batch retired.
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, tCrA[blk], tCrB[blk], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    read.advance()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
            if cutlass.const_expr(self.tile_owners > 1):
                cute.arch.mbarrier_arrive(order_bars + (1 - owner))  # the other's turn
            if cutlass.const_expr(not self.promote):
                cute.nvgpu.warpgroup.wait_group(0)
                if k_tiles > 0:
                    ab_pipe.consumer_release(release)
                    release.advance()

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
                for v in cutlass.range_constexpr(frag_size):
                    tRS_rF[v] = tRS_acc[e * frag_size + v]
                vals = tRS_rF.load()
                if cutlass.const_expr(scale_a is not None):
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
        store_pipe.producer_tail()


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

_TEST = (
    dict(ab="bf16", c="bf16", tile=(128, 128, 64), cluster=(1, 1)),
    dict(ab="bf16", c="bf16", tile=(128, 256, 64), cluster=(2, 1)),
    # fp8 through the decode path: QGMMA, scales, swapped operands, transposed C store.
    dict(ab="e4m3", c="bf16", tile=(32, 64, 128), schedule="ws", swap_ab=True),
)


def _default() -> list[dict]:
    out = []
    # 16-bit in, every output dtype: the two workhorse tiles, with and without multicast.
    for ab, c in (("bf16", "bf16"), ("bf16", "f32"), ("f16", "f16"), ("f16", "f32")):
        out.append(dict(ab=ab, c=c, tile=(128, 128, 64), cluster=(1, 1)))
        out.append(dict(ab=ab, c=c, tile=(128, 256, 64), cluster=(2, 1)))
    out += [
        dict(ab="bf16", c="bf16", tile=(256, 128, 64), cluster=(1, 2)),
        dict(ab="bf16", c="bf16", tile=(128, 128, 64), cluster=(2, 1)),
        dict(ab="bf16", c="bf16", tile=(64, 128, 64), cluster=(1, 1), schedule="ws"),
        # Ping-pong: one warpgroup's epilogue under the other's mainloop.
        dict(ab="bf16", c="bf16", tile=(128, 128, 64), cluster=(1, 2), schedule="pp"),
        dict(ab="e4m3", c="bf16", tile=(64, 128, 128), cluster=(1, 1), schedule="pp"),
        # x @ W with W stored (K, N): B N-major, read transposed by the WGMMA from smem.
        dict(ab="bf16", c="bf16", tile=(128, 128, 64), cluster=(1, 1), b_major="n"),
        dict(ab="e4m3", c="bf16", tile=(128, 128, 128), cluster=(1, 1)),
        dict(ab="e4m3", c="bf16", tile=(128, 128, 128), cluster=(2, 1)),
        # The largest fp8 tile only fits in registers with fast accumulation.
        dict(ab="e4m3", c="bf16", tile=(128, 256, 128), cluster=(2, 1), fast_accum=True),
    ]
    # Decode (M <= 64): swap A and B so that N fills the WGMMA's 64-row side; one consumer
    # warpgroup and 64 N-rows per CTA give N/64 CTAs (64 for N = 4096).
    for tm in (16, 32, 64):
        out.append(dict(ab="bf16", c="bf16", tile=(tm, 64, 64), schedule="ws", swap_ab=True))
    out.append(dict(ab="e4m3", c="bf16", tile=(32, 64, 128), schedule="ws", swap_ab=True))
    return out


def _full() -> list[dict]:
    out = _default()
    tiles = ((128, 128), (128, 256), (256, 128), (64, 128), (64, 256), (128, 64))
    for ab, c, (tm, tn), cl, maj in itertools.product(
        ("bf16", "f16", "e4m3"), ("bf16", "f16", "f32"), tiles, ((1, 1), (2, 1), (1, 2)),
        (("k", "k"), ("m", "k"), ("k", "n"), ("m", "n")),
    ):
        tk = 128 // DTYPE_BYTES[ab]
        for sched, fast in itertools.product(("ws", "pp") if tm == 64 else ("coop", "pp"),
                                             (False, True) if ab == "e4m3" else (False,)):
            out.append(dict(ab=ab, c=c, tile=(tm, tn, tk), cluster=cl, schedule=sched,
                            a_major=maj[0], b_major=maj[1], fast_accum=fast))
    for ab, c, tm, tn in itertools.product(("bf16", "f16", "e4m3"), ("bf16", "f16", "f32"),
                                           (16, 32, 64), (64, 128)):
        tk = 128 // DTYPE_BYTES[ab]
        out.append(dict(ab=ab, c=c, tile=(tm, tn, tk), schedule="ws", swap_ab=True))
    return out


@register("gemm")
def enumerate_sm90(target: Target, tier: str) -> list[GemmSm90]:
    if target.family != "sm90":
        return []
    specs = {"test": list(_TEST), "default": _default(), "full": _full()}[tier]
    out = []
    for s in specs:
        v = GemmSm90(target=target.name, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out
