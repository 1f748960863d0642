"""Blackwell datacenter (sm_100f) grouped GEMM for mixture-of-experts layers: one persistent launch
over all groups, tcgen05.mma into Tensor Memory.

The problem, the layouts and the argument contract are the Hopper grouped GEMM's
(gemm/sm90_grouped.py, whose docstring describes them): ``b`` (E, N, K) stacked weights, K
contiguous; ``contig``: a (M_total, K) tokens sorted by group with ``offs`` (E,) int32 end rows on
the device; ``masked``: a (E, max_m, K) with ``masked_m`` (E,) int32 counts on the device.  bf16 or
f16 operands and output, fp32 accumulation.

How the groups are walked is the Hopper kernel's too (its ``_build_table`` / ``_locate``, inherited):
one warp turns the device counts into a table of each group's first tile in shared memory (a
warp-shuffle prefix sum), then every persistent CTA takes tiles ``cta, cta + grid, ...`` of the
linear walk over all groups' (m-tile, n-tile) pairs, finding its group by a binary search.  No
host synchronisation, no per-group launch, no workspace, no per-group tensor maps: A is read
through one TMA descriptor over the whole tensor at the group's row offset (the rows of the next
group that enter a group's last m-tile are computed but never stored).

Warp roles are the dense Blackwell kernel's (gemm/sm100.py): warp 5 the TMA producer, warp 4 the
MMA issuer (one tcgen05.mma tile of 128 rows per CTA, two accumulator stages in TMEM), warps 0-3
the epilogue (tcgen05.ld -> registers -> bf16 -> smem).  Each of the three roles walks the same
tiles.  Whole tiles leave through the TMA store; the last, partial m-tile of a group is stored by
the epilogue threads element by element from the same staged smem sub-tile, each row checked
against the group's end and each column against N (after the TMA stores still reading the
buffers have completed).

Nothing here has run: no Blackwell GPU is available to the project.  The proof is the SASS
(``sass_requirements``) and the resources; see notes/gemm-grouped.md.
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

from ..abi import DTYPE_BYTES
from ..atoms import sm100 as atoms
from ..atoms.targets import Target
from ..registry import register
from ..variant import Variant
from . import sm100 as dense
from .sm90_grouped import LAYOUTS, MAX_GROUPS, GemmGroupedSm90, GroupedGemmSm90Kernel

_BARRIER_BYTES = dense._BARRIER_BYTES
_SMEM_ALIGN = dense._SMEM_ALIGN
_STATIC_SMEM = dense._STATIC_SMEM
_ACC_STAGES = dense._ACC_STAGES
_EPI_STAGES = dense._EPI_STAGES
_MAX_AB_STAGES = dense._MAX_AB_STAGES
_EPILOGUE_WARPS = dense._EPILOGUE_WARPS
_MMA_WARP = dense._MMA_WARP
_TMA_WARP = dense._TMA_WARP
THREADS = dense.THREADS
THREADS_EPI = 32 * len(dense._EPILOGUE_WARPS)
_round_up = dense._round_up

# The partial last m-tile of a group: element-wise 16-bit stores of the output.
SASS_MASKED_STORE = r"\bSTG\.E\.U16\b"
# The device-side tile table: the prefix sum of the groups' tile counts.
SASS_TABLE = r"\bSHFL\.UP\b"


@dataclass(frozen=True, kw_only=True)
class GemmGroupedSm100(Variant):
    """One grouped-GEMM config.  ``tile`` (M, N, K): the MMA tile of one CTA (M 128; K one 128-byte
    row, 64 bf16); ``swizzle``: m-tiles per band of the walk inside a group (as the Hopper kernel)."""

    op: ClassVar[str] = "gemm_grouped"
    family: ClassVar[str] = "sm100_grouped"
    sources: ClassVar[tuple[str, ...]] = ("gemm/sm100_grouped.py", "gemm/sm90_grouped.py", "gemm/sm100.py",
                                          "atoms/sm100.py", "abi.py")

    ab: str = field(default="bf16", metadata={"tag": ""})
    c: str = field(default="bf16", metadata={"tag": "o"})
    layout: str = field(default="contig", metadata={"tag": ""})
    tile: tuple[int, int, int] = field(default=(128, 256, 64), metadata={"tag": "t"})
    swizzle: int = field(default=8, metadata={"tag": "sw"})
    # e4m3 operands (bf16 out) with the Hopper kernel's row scales: scale_a one per row of a
    # (contiguous (M,), masked (M, E)), scale_b one per group and output column (N, E), applied to
    # each accumulator element after the tcgen05.ld.
    row_scale: bool = field(default=False, metadata={"tag": "rowsc"})

    # The Hopper kernel's block-scaled form is not built here (its signature reads this).
    block_scale: ClassVar[bool] = False

    @property
    def is_fp8(self) -> bool:
        return self.ab == "e4m3"

    @property
    def scale_mode(self) -> str | None:
        return "row" if self.row_scale else None

    # The same arguments as the Hopper grouped GEMM: a, b, c, offs | masked_m, max_clusters.
    signature = GemmGroupedSm90.signature
    scale_args = GemmGroupedSm90.scale_args

    def sass_requirements(self) -> tuple[str, ...]:
        # (The contiguous layout's A and C have no L mode: 2-D TMA.)
        common = tuple(r for r in dense.SASS_COMMON if "UTMA" not in r)
        req = (dense.SASS_MMA["f8" if self.is_fp8 else "f16"], dense.sass_tmem_alloc(self.plan()["tmem_cols"]))
        req += common + (r"\bUTMALDG\.[23]D\b", r"\bUTMASTG\.[23]D\b", SASS_TABLE, SASS_MASKED_STORE)
        if self.row_scale:  # scale_b per output column (scale_a once per thread: one row)
            em, en = self.plan()["epi_tile"]
            req += (dense.sass_count(dense.SASS_LOAD_F32, em * en // THREADS_EPI),)
        return req

    def proof_level(self) -> str:
        return "sass-only"

    # --- validity ---------------------------------------------------------------------------------
    def can_implement(self) -> str | None:
        tgt = self.tgt
        if tgt.family != "sm100" or not tgt.tmem:
            return f"target {self.target} is not a Blackwell datacenter (sm100) target"
        if self.is_fp8:
            if self.c != "bf16" or not self.row_scale:
                return "e4m3 grouped GEMM takes row scales and writes bf16"
        elif self.ab not in ("bf16", "f16") or self.c != self.ab or self.row_scale:
            return "grouped GEMM takes bf16/f16 operands and the same output dtype (row scales: e4m3)"
        if self.layout not in LAYOUTS:
            return f"layout must be one of {LAYOUTS}"
        tm, tn, tk = self.tile
        if tk != 128 // DTYPE_BYTES[self.ab]:
            return "tile K must be one 128-byte row"
        if tm != 128:
            return "tile M must be 128 (one 1-CTA tcgen05.mma, a TMEM lane per row)"
        if not 32 <= tn <= 256 or tn % 32:
            return "tile N must be a multiple of 32 up to 256"
        if self.swizzle < 1:
            return "swizzle must be >= 1"
        plan = self.plan()
        if plan["tmem_cols"] > atoms.TMEM_COLUMNS:
            return f"needs {plan['tmem_cols']} TMEM columns > {atoms.TMEM_COLUMNS}"
        if plan["ab_stages"] < 3:
            return f"only {plan['ab_stages']} smem stage(s) fit"
        return None

    # --- derived ----------------------------------------------------------------------------------
    def plan(self) -> dict:
        """Shared memory (barriers, the group table, A/B stages, epilogue buffers) and TMEM columns;
        checked against the traced kernel at compile time."""
        tm, tn, tk = self.tile
        ab, cb = DTYPE_BYTES[self.ab], DTYPE_BYTES[self.c]
        stage = _round_up(tm * tk * ab, _SMEM_ALIGN) + _round_up(tn * tk * ab, _SMEM_ALIGN)
        epi_tile = atoms.epilogue_tile(tm, tn, False, 8 * cb, False)
        epi = _round_up(epi_tile[0] * epi_tile[1] * cb, _SMEM_ALIGN) * _EPI_STAGES
        table = _round_up(4 * (MAX_GROUPS + 1), _SMEM_ALIGN)
        free = self.tgt.smem_per_cta - _STATIC_SMEM - _BARRIER_BYTES - table - epi
        stages = min(free // stage, _MAX_AB_STAGES)
        return dict(epi_tile=tuple(epi_tile), ab_stages=stages, stage_bytes=stage,
                    smem_bytes=_BARRIER_BYTES + table + stages * stage + epi,
                    tmem_cols=atoms.tmem_alloc_columns(atoms.acc_columns(tm, tn, _ACC_STAGES)))

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
            "mma_tile": list(self.tile),
            "cta_group": 1,
            "cluster": [1, 1],
            "swizzle": self.swizzle,
            "stages": plan["ab_stages"],
            "acc_stages": _ACC_STAGES,
            "epi_tile": list(plan["epi_tile"]),
            "smem_bytes": plan["smem_bytes"],
            "tmem_columns": plan["tmem_cols"],
            "threads": THREADS,
            "persistent": {"arg": "max_clusters", "cluster_ctas": 1},
            "constraints": {"divisibility": dict(sig.divisibility), "align_bytes": 16,
                            "tails": ["M", "N", "K"]},
        }

    def make_kernel(self):
        plan = self.plan()
        kernel = GroupedGemmSm100Kernel(tile=self.tile, ab_stages=plan["ab_stages"], epi_tile=plan["epi_tile"],
                                        tmem_cols=plan["tmem_cols"], stage_bytes=plan["stage_bytes"],
                                        masked=self.layout == "masked", swizzle=self.swizzle,
                                        smem_plan=plan["smem_bytes"])
        return kernel.scaled if self.row_scale else kernel


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


class GroupedGemmSm100Kernel(GroupedGemmSm90Kernel):
    """Host side ``__call__(a, b, c, groups, max_clusters, stream)``; device side ``kernel``.  The
    group table and the walk (``_group_rows``, ``_build_table``, ``_locate``) are the Hopper
    kernel's; the rest is the dense Blackwell kernel's roles over that walk."""

    def __init__(self, *, tile, ab_stages, epi_tile, tmem_cols, stage_bytes, masked, swizzle, smem_plan):
        self.tile = tuple(tile)
        self.ab_stages = ab_stages
        self.epi_tile_mn = tuple(epi_tile)
        self.tmem_cols = tmem_cols
        self.stage_bytes = stage_bytes
        self.masked = masked
        self.swizzle = swizzle
        self.smem_plan = smem_plan
        self.cluster_m = 1  # (the walk's step: one m-tile)
        self.step_m = tile[0]

    # --- the group table ------------------------------------------------------------------------
    @cute.jit
    def _build_table(self, groups, table, m_rows, n_tiles, lane):
        """One warp: table[g] = first tile of group g in the walk, table[E] = all tiles.  The
        Hopper kernel's prefix sum, in a loop over the chunks of 32 groups the call has (not
        unrolled over all MAX_GROUPS // 32): about 1300 fewer instructions in the cubin."""
        n_groups = groups.shape[0]
        carry = cutlass.Int32(0)
        for chunk in cutlass.range((n_groups + 31) // 32, unroll=1):
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
        c_layout = utils.LayoutEnum.from_tensor(c)
        mma = atoms.tiled_mma(ab_dtype, utils.LayoutEnum.from_tensor(a).mma_major_mode(),
                              utils.LayoutEnum.from_tensor(b).mma_major_mode(), False, self.tile[:2])
        vmnk = atoms.cluster_vmnk((1, 1), mma)
        sA_layout, sB_layout = atoms.smem_layouts(mma, self.tile, ab_dtype, self.ab_stages)
        a_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sA_layout, (None, None, None, 0)))
        b_bytes = cute.size_in_bytes(ab_dtype, cute.slice_(sB_layout, (None, None, None, 0)))
        if cutlass.const_expr(a_bytes + b_bytes > self.stage_bytes):
            raise ValueError(f"smem stage holds {a_bytes} + {b_bytes} B, the plan {self.stage_bytes}")
        self.tx_bytes = a_bytes + b_bytes
        epi_tile = atoms.bw.compute_epilogue_tile_shape(self.tile, False, c_layout, c_dtype)
        if cutlass.const_expr(tuple(cute.product_each(cute.shape(epi_tile))) != self.epi_tile_mn):
            raise ValueError(f"epilogue tile {cute.product_each(cute.shape(epi_tile))} differs from the plan")
        sC_layout = atoms.epilogue_smem_layout(c_dtype, c_layout, epi_tile, _EPI_STAGES)
        acc_fake = mma.make_fragment_C(cute.append(mma.partition_shape_C(self.tile[:2]), _ACC_STAGES))
        if cutlass.const_expr(atoms.tmem_columns_of(acc_fake) != self.tmem_cols):
            raise ValueError(f"accumulators take {atoms.tmem_columns_of(acc_fake)} TMEM columns, "
                             f"the plan {self.tmem_cols}")
        tma_a, gA = atoms.tma_load_a(a, sA_layout, self.tile, mma, vmnk, (1, 1))
        tma_b, gB = atoms.tma_load_b(b, sB_layout, self.tile, mma, vmnk, (1, 1))
        tma_c, gC = atoms.tma_store(c, sC_layout, epi_tile)

        # Persistent grid: at most max_clusters CTAs and at most the tiles any routing can make
        # (contiguous: each group adds at most one partial m-tile).
        tm, tn = self.tile[0], self.tile[1]
        n_groups = groups.shape[0]
        n_tiles = (c.shape[1] + tn - 1) // tn
        m_tiles = (a.shape[0] + tm - 1) // tm
        bound = n_tiles * (m_tiles * n_groups if cutlass.const_expr(self.masked) else m_tiles + n_groups)
        ctas = cutlass.max(cutlass.min(max_clusters, bound), cutlass.Int32(1))

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            acc_barriers: cute.struct.MemRange[cutlass.Int64, _ACC_STAGES * 2]
            tmem_dealloc_barrier: cutlass.Int64
            tmem_address: cutlass.Int32
            tile_start: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, MAX_GROUPS + 1], _SMEM_ALIGN]
            sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], _SMEM_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], _SMEM_ALIGN]
            sC: cute.struct.Align[cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        if cutlass.const_expr(SharedStorage.size_in_bytes() != self.smem_plan):
            raise ValueError(f"SharedStorage is {SharedStorage.size_in_bytes()} B, the plan {self.smem_plan}")
        self.c_layout = c_layout
        self.kernel(mma, tma_a, gA, tma_b, gB, tma_c, gC, c, groups, scale_a, scale_b, vmnk, sA_layout, sB_layout,
                    sC_layout, epi_tile).launch(grid=(ctas, 1, 1), block=[THREADS, 1, 1], cluster=(1, 1, 1),
                                     min_blocks_per_mp=1, stream=stream)

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
               mB: cute.Tensor, tma_c: cute.CopyAtom, mC: cute.Tensor, c: cute.Tensor, groups: cute.Tensor,
               scale_a, scale_b, vmnk: cute.Layout, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sC_layout: cute.ComposedLayout, epi_tile: cute.Tile):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == _TMA_WARP:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        table = storage.tile_start.get_tensor(cute.make_layout(MAX_GROUPS + 1))

        ab_pipe = atoms.ab_pipeline(storage.ab_barriers.data_ptr(), self.ab_stages, vmnk, self.tx_bytes, 1)
        acc_pipe = atoms.acc_pipeline(storage.acc_barriers.data_ptr(), _ACC_STAGES, vmnk,
                                      len(_EPILOGUE_WARPS), False)
        tmem = atoms.tmem_allocator(storage.tmem_address, storage.tmem_dealloc_barrier,
                                    int(dense._Bar.TMEM_ALLOC), 32 * (len(_EPILOGUE_WARPS) + 1),
                                    _EPILOGUE_WARPS[0], False)
        pipeline.pipeline_init_arrive(cluster_shape_mn=vmnk, is_relaxed=True)

        m_rows = c.shape[0]
        n_tiles = (c.shape[1] + self.tile[1] - 1) // self.tile[1]
        thr_mma = mma.get_slice(0)
        # B: (bN, bK, tiles_n, tiles_k, E) in MMA tiles, then the MMA's view of it.
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        k_tiles = cute.size(gB, mode=[3])
        tCgB = thr_mma.partition_B(gB)
        acc_shape = mma.partition_shape_C(self.tile[:2])
        acc_layout = mma.make_fragment_C(cute.append(acc_shape, _ACC_STAGES)).layout

        if warp_idx == _MMA_WARP:
            self._build_table(groups, table, m_rows, n_tiles, cute.arch.lane_idx())
        pipeline.pipeline_init_wait(cluster_shape_mn=vmnk)
        cute.arch.sync_threads()  # the table is complete

        if warp_idx == _TMA_WARP:
            self.produce(tma_a, tma_b, sA, sB, mA, tCgB, thr_mma, ab_pipe, table, groups, m_rows, n_tiles,
                         k_tiles)
        if warp_idx == _MMA_WARP:
            tmem.wait_for_alloc()
            acc = cute.make_tensor(tmem.retrieve_ptr(cutlass.Float32), acc_layout)
            self.mma_loop(mma, sA, sB, acc, ab_pipe, acc_pipe, table, groups, k_tiles)
        if warp_idx < _MMA_WARP:
            tmem.allocate(self.tmem_cols)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            acc = cute.make_tensor(acc_ptr, acc_layout)
            self.epilogue(tidx, warp_idx, thr_mma, tma_c, acc, sC, mC, c, epi_tile, acc_pipe, table, groups,
                          m_rows, n_tiles, scale_a, scale_b)
            tmem.free(acc_ptr)

    @cute.jit
    def produce(self, tma_a, tma_b, sA, sB, mA, tCgB, thr_mma, ab_pipe, table, groups, m_rows, n_tiles, k_tiles):
        """The TMA warp: every k-block of every tile this CTA takes into the next free stage; A at
        the group's first row of the tile (one descriptor over the whole tensor), B of the group."""
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 3),
                                           cute.group_modes(tCgB, 0, 3))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
        total = table[groups.shape[0]]
        t = cute.arch.block_idx()[0]
        step = cute.arch.grid_dim()[0]
        while t < total:
            g, n, row, _ = self._locate(t, table, groups, m_rows, n_tiles)
            a_l = g if cutlass.const_expr(self.masked) else 0
            mA_g = cute.domain_offset((row, 0), mA[(None, None, a_l)])
            tCgA = thr_mma.partition_A(cute.local_tile(mA_g, (self.tile[0], self.tile[2]), (0, None)))
            tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 3),
                                               cute.group_modes(tCgA, 0, 3))
            tBgB_t = tBgB[(None, n, None, g)]
            for k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar)
                state.advance()
            t = t + step
        ab_pipe.producer_tail(state)

    @cute.jit
    def mma_loop(self, mma, sA, sB, acc, ab_pipe, acc_pipe, table, groups, k_tiles):
        """The MMA warp: per tile of the walk, every k-block's tcgen05.mma into the next TMEM
        accumulator stage (it needs only the walk's length, not the groups)."""
        tCrA = mma.make_fragment_A(sA)
        tCrB = mma.make_fragment_B(sB)
        k_blocks = cute.size(tCrA, mode=[2])
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, _ACC_STAGES)
        total = table[groups.shape[0]]
        t = cute.arch.block_idx()[0]
        step = cute.arch.grid_dim()[0]
        while t < total:
            acc_t = acc[(None, None, None, acc_state.index)]
            acc_pipe.producer_acquire(acc_state)
            mma.set(tcgen05.Field.ACCUMULATE, False)
            for _k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.consumer_wait(read)
                for kb in cutlass.range_constexpr(k_blocks):
                    blk = (None, None, kb, read.index)
                    cute.gemm(mma, acc_t, tCrA[blk], tCrB[blk], acc_t)
                    mma.set(tcgen05.Field.ACCUMULATE, True)
                ab_pipe.consumer_release(read)
                read.advance()
            acc_pipe.producer_commit(acc_state)
            acc_state.advance()
            t = t + step
        acc_pipe.producer_tail(acc_state)

    @cute.jit
    def epilogue(self, tidx, warp_idx, thr_mma, tma_c, acc, sC, mC, c, epi_tile, acc_pipe, table, groups,
                 m_rows, n_tiles, scale_a=None, scale_b=None):
        """The epilogue warps: per tile, per sub-tile: TMEM -> registers -> output dtype -> smem ->
        TMA store (whole tiles) or element-wise masked stores (a group's partial last m-tile)."""
        c_dtype = sC.element_type
        acc_epi = cute.flat_divide(acc[((None, None), 0, 0, None)], epi_tile)
        t2r = atoms.tmem_load(self.tile, self.c_layout, c_dtype, epi_tile, False, acc_epi[(None, None, 0, 0, 0)])
        thr_t2r = t2r.get_slice(tidx)
        tTR_tAcc = thr_t2r.partition_S(acc_epi)
        # Register shapes from the first tile of C (every tile's are the same).
        gC0 = cute.local_tile(mC[(None, None, 0)], self.tile[:2], (0, 0))
        gC0_epi = cute.flat_divide(thr_mma.partition_C(gC0)[((None, None), 0, 0)], epi_tile)
        tTR_gC0 = thr_t2r.partition_D(gC0_epi)
        tTR_rAcc = cute.make_rmem_tensor(tTR_gC0[(None, None, None, 0, 0)].shape, cutlass.Float32)
        tTR_cT = None
        if cutlass.const_expr(scale_a is not None):  # (row, col) in the tile of each register element
            cT = thr_mma.partition_C(cute.make_identity_tensor(self.tile[:2]))
            tTR_cT = cute.group_modes(thr_t2r.partition_D(cute.flat_divide(cT[((None, None), 0, 0)], epi_tile)), 3, 5)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, c_dtype)
        r2s = atoms.smem_store(self.c_layout, c_dtype, t2r)
        tRS_sC = r2s.get_slice(tidx).partition_D(sC)
        tRS_rC = r2s.retile(tTR_rC)

        threads = 32 * len(_EPILOGUE_WARPS)
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=_EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads))
        epi_bar = pipeline.NamedBarrier(barrier_id=int(dense._Bar.EPILOGUE), num_threads=threads)
        em, en = self.epi_tile_mn
        n_epi_m = self.tile[0] // em
        per_thread = em * en // threads
        n_cols = c.shape[1]

        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, _ACC_STAGES)
        total = table[groups.shape[0]]
        t = cute.arch.block_idx()[0]
        step = cute.arch.grid_dim()[0]
        done = cutlass.Int32(0)
        while t < total:
            g, n, row, row_end = self._locate(t, table, groups, m_rows, n_tiles)
            a_l = g if cutlass.const_expr(self.masked) else 0
            whole = row_end - row >= self.tile[0]
            mC_t = cute.domain_offset((row, n * self.tile[1]), mC[(None, None, a_l)])
            gC_epi = cute.flat_divide(
                thr_mma.partition_C(cute.local_tile(mC_t, self.tile[:2], (0, 0)))[((None, None), 0, 0)], epi_tile)
            bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                                   cute.group_modes(gC_epi, 0, 2))
            bSG_gC_t = cute.group_modes(bSG_gC, 1, 3)
            c_g = c[(None, None, a_l)]
            tTR_tAcc_t = cute.group_modes(tTR_tAcc[(None, None, None, None, None, acc_state.index)], 3, 5)
            acc_pipe.consumer_wait(acc_state)
            if not whole:
                # The TMA stores of earlier tiles may still read the buffers this tile writes.
                if warp_idx == _EPILOGUE_WARPS[0]:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                epi_bar.arrive_and_wait()
            n_sub = cute.size(tTR_tAcc_t.shape, mode=[3])
            for s in cutlass.range(n_sub):
                cute.copy(t2r, tTR_tAcc_t[(None, None, None, s)], tTR_rAcc)
                if s == n_sub - 1:
                    # The stage's last tcgen05.ld: wait for it, then hand the stage back.
                    cute.arch.fence_view_async_tmem_load()
                    with cute.arch.elect_one():
                        acc_pipe.consumer_release(acc_state)
                if cutlass.const_expr(scale_a is not None):
                    self.row_scales(tTR_rAcc, tTR_cT[(None, None, None, s)], scale_a, scale_b, g, row,
                                    n * self.tile[1])
                tTR_rC.store(tTR_rAcc.load().to(c_dtype))
                buf = (done + s) % _EPI_STAGES
                cute.copy(r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_bar.arrive_and_wait()
                if whole:
                    if warp_idx == _EPILOGUE_WARPS[0]:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC_t[(None, s)])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                else:
                    # Sub-tile s is (s % n_epi_m, s // n_epi_m) of the tile's (epi_m, epi_n).
                    sC_e = sC[(None, None, buf)]
                    r_base = row + (s % n_epi_m) * em
                    c_base = n * self.tile[1] + (s // n_epi_m) * en
                    for i in cutlass.range(per_thread, unroll=4):  # (one partial tile a group)
                        idx = tidx + i * threads
                        r = idx // en
                        col = idx - r * en
                        if r_base + r < row_end and c_base + col < n_cols:
                            c_g[(r_base + r, c_base + col)] = sC_e[(r, col)]
                epi_bar.arrive_and_wait()
            done = done + n_sub
            acc_state.advance()
            t = t + step
        store_pipe.producer_tail()


    @cute.jit
    def row_scales(self, acc, coords, scale_a, scale_b, g, row0, col0):
        """``acc *= scale_a[row]·scale_b[col, g]`` per element at its tile coordinates (rows past the
        group or the tensor read a clamped scale: those outputs are not stored)."""
        sa = scale_a[(None, g)] if cutlass.const_expr(self.masked) else scale_a
        sb = scale_b[(None, g)]
        last_r = cute.size(sa) - 1
        last_c = cute.size(sb) - 1
        for i in cutlass.range_constexpr(cute.size(acc)):
            crd = coords[i]
            r = cutlass.min(row0 + crd[0], last_r)
            col = cutlass.min(col0 + crd[1], last_c)
            acc[i] = acc[i] * (sa[r] * sb[col])


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

_BF16 = dict(ab="bf16", c="bf16")
# One 128x128 tile per layout in the test tier (compiled and SASS-checked; unmeasured), the
# contiguous one in the default tier (~0.14 MB with its share of the host library); the masked
# layout, 128x256 and f16 in the full tier.
GROUPED_SM100_TEST = tuple(dict(**_BF16, layout=lay, tile=(128, 128, 64)) for lay in LAYOUTS)
GROUPED_SM100_DEFAULT = GROUPED_SM100_TEST[:1]
# e4m3 with row scales, each layout (test and full tiers).
GROUPED_SM100_FP8 = tuple(dict(ab="e4m3", c="bf16", layout=lay, tile=(128, 128, 128), row_scale=True) for lay in LAYOUTS)
GROUPED_SM100_FULL = GROUPED_SM100_TEST + GROUPED_SM100_FP8 + tuple(
    dict(**_BF16, layout=lay, tile=(128, 256, 64)) for lay in LAYOUTS) + tuple(
    dict(ab="f16", c="f16", layout=lay, tile=(128, 128, 64)) for lay in LAYOUTS)


@register("gemm_grouped")
def enumerate_sm100_grouped(target: Target, tier: str) -> list[GemmGroupedSm100]:
    if target.family != "sm100" or not target.tmem:
        return []
    specs = {"test": GROUPED_SM100_TEST + GROUPED_SM100_FP8[:1], "default": GROUPED_SM100_DEFAULT,
             "full": GROUPED_SM100_FULL}[tier]
    out = []
    for s in specs:
        v = GemmGroupedSm100(target=target.name, **s)
        if v.can_implement() is None and v not in out:
            out.append(v)
    return out


__all__ = ["GemmGroupedSm100", "GroupedGemmSm100Kernel", "enumerate_sm100_grouped"]
