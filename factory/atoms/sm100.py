"""Blackwell datacenter (sm_100a) atoms: tcgen05 MMA with its accumulator in Tensor Memory (TMEM),
TMEM allocation and tcgen05.ld copies, TMA loads for one CTA or a CTA pair (``cta_group::2``)
with cluster multicast, the shared-memory layouts the MMA's descriptors read, and the mbarrier
pipelines that connect the TMA warp, the MMA warp and the epilogue warps.

The plain-Python part (no MLIR context: :func:`tmem_alloc_columns`, :func:`epilogue_tile`) is what
a variant's smem/TMEM plan is computed from before anything is traced; the rest is trace-time code
that a kernel's ``@cute.jit`` host side or ``@cute.kernel`` calls.

A CTA pair (``pair=True``): one tcgen05.mma instruction, issued by the pair's even ("leader") CTA,
computes an (M, N) tile with M = 2 x the rows each CTA holds.  Each CTA loads its own M/2 rows of
A and N/2 rows of B into its own shared memory; the MMA reads both CTAs' halves and writes each
CTA's M/2 x N accumulator into that CTA's TMEM.  TMA loads of a pair complete on the leader's
mbarrier (the ``.2CTA`` TMA form), and the leader's ``tcgen05.commit`` arrives on both CTAs'
barriers (multicast).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.memory import TmemAllocator, get_num_tmem_alloc_cols
from cutlass.utils import blackwell_helpers as bw

TMEM_COLUMNS = 512  # 128 lanes x 512 columns of 32 bits per SM
TMEM_MIN_ALLOC = 32  # tcgen05.alloc takes a power of two >= 32 columns


# --- plain Python (no MLIR context) ---------------------------------------------------------------
def tmem_alloc_columns(used: int) -> int:
    """Columns ``tcgen05.alloc`` must be asked for to hold ``used`` columns."""
    cols = TMEM_MIN_ALLOC
    while cols < used:
        cols *= 2
    return cols


def acc_columns(cta_m: int, mma_n: int, stages: int) -> int:
    """TMEM columns of ``stages`` fp32 accumulator stages of a CTA's (cta_m, mma_n) tile.  Rows are
    TMEM lanes: a 128-row tile takes all 128 lanes and one 32-bit column per output column, per
    stage.  A 64-row tile (cta_group::1, M = 64) takes 16 lanes of each 32-lane subpartition, so
    the DSL puts a second stage in the other 16 lanes of the same columns (its fragment layout:
    stage stride = lane 16)."""
    if cta_m == 64:
        return mma_n * -(-stages // 2)
    return mma_n * stages


def epilogue_tile(cta_m: int, cta_n: int, pair: bool, c_bits: int, c_m_major: bool) -> tuple[int, int]:
    """(rows, cols) of one epilogue sub-tile: TMEM -> registers -> smem -> one TMA store.  The DSL's
    own choice (4 epilogue warps; each reads 16 or 32 TMEM lanes per tcgen05.ld)."""
    return bw.compute_epilogue_tile_size(cta_m, cta_n, pair, c_bits, None, c_m_major, True)


# --- trace time -----------------------------------------------------------------------------------
def cta_group(pair: bool):
    return tcgen05.CtaGroup.TWO if pair else tcgen05.CtaGroup.ONE


def tmem_columns_of(acc) -> int:
    """Columns ``tcgen05.alloc`` needs for this (fake) TMEM accumulator tensor, per the DSL."""
    return get_num_tmem_alloc_cols(acc)


def tiled_mma(ab_dtype, a_major, b_major, pair: bool, mma_mn: tuple[int, int]):
    """One tcgen05.mma atom covering the whole (M, N) MMA tile (kind::f16 for 16-bit operands, K = 16
    per instruction; kind::f8f6f4 for fp8, K = 32), fp32 accumulator in TMEM."""
    return bw.make_trivial_tiled_mma(ab_dtype, ab_dtype, a_major, b_major, cutlass.Float32,
                                     cta_group(pair), mma_mn)


def cluster_vmnk(cluster_mn: tuple[int, int], mma):
    """The cluster as (V, M, N, K): V = the CTAs of one MMA (1, or 2 for a pair)."""
    return cute.tiled_divide(cute.make_layout((*cluster_mn, 1)), (mma.thr_id.shape,))


def smem_layouts(mma, mma_tiler, ab_dtype, stages: int):
    """Staged, swizzled (128-byte rows) smem layouts of this CTA's share of A and B."""
    return (bw.make_smem_layout_a(mma, mma_tiler, ab_dtype, stages),
            bw.make_smem_layout_b(mma, mma_tiler, ab_dtype, stages))


def tma_load_a(a, sA_staged, mma_tiler, mma, vmnk, cluster_mn):
    """TMA load of A: multicast along the cluster's N (the CTAs that share these rows of A); for a
    pair the ``.2CTA`` form, whose completion lands on the leader CTA's mbarrier."""
    op = bw.cluster_shape_to_tma_atom_A(cluster_mn, mma.thr_id)
    return cute.nvgpu.make_tiled_tma_atom_A(op, a, cute.slice_(sA_staged, (None, None, None, 0)),
                                            mma_tiler, mma, vmnk.shape)


def tma_load_b(b, sB_staged, mma_tiler, mma, vmnk, cluster_mn):
    """TMA load of B: multicast along the cluster's M; for a pair each CTA loads half of B's rows."""
    op = bw.cluster_shape_to_tma_atom_B(cluster_mn, mma.thr_id)
    return cute.nvgpu.make_tiled_tma_atom_B(op, b, cute.slice_(sB_staged, (None, None, None, 0)),
                                            mma_tiler, mma, vmnk.shape)


def epilogue_smem_layout(c_dtype, c_layout, epi_tile, stages: int):
    return bw.make_smem_layout_epi(c_dtype, c_layout, epi_tile, stages)


def tma_store(c, sC_staged, epi_tile):
    """One TMA store per epilogue sub-tile (clipped at the tensor's edges)."""
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                       cute.select(sC_staged, mode=[0, 1]), epi_tile)


def ab_pipeline(barriers, stages: int, vmnk, tx_bytes: int, mcast_peers: int):
    """TMA warp -> MMA warp, one stage of A and B per k-block.  "full" is armed (by the leader CTA)
    with the bytes of the whole MMA tile's stage; "empty" is arrived on by ``tcgen05.commit`` of the
    MMA that read the stage, multicast to every CTA whose TMA wrote into it."""
    return pipeline.PipelineTmaUmma.create(
        barrier_storage=barriers, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, mcast_peers),
        tx_count=tx_bytes, cta_layout_vmnk=vmnk, defer_sync=True,
    )


def acc_pipeline(barriers, stages: int, vmnk, epilogue_warps: int, pair: bool):
    """MMA warp -> epilogue warps, one TMEM accumulator stage per output tile.  "full": the MMA
    warp's ``tcgen05.commit`` after the tile's last MMA (multicast to both CTAs of a pair);
    "empty": one arrival per epilogue warp of each CTA of the MMA (the leader's barrier)."""
    return pipeline.PipelineUmmaAsync.create(
        barrier_storage=barriers, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                 epilogue_warps * (2 if pair else 1)),
        cta_layout_vmnk=vmnk, defer_sync=True,
    )


def tmem_allocator(holding, dealloc_barrier, retrieve_barrier_id: int, retrieve_threads: int,
                   allocator_warp: int, pair: bool):
    """TMEM allocation (``tcgen05.alloc`` by one warp, the address published through smem and a
    named barrier); for a pair the allocation spans both CTAs and its release waits for the peer."""
    return TmemAllocator(
        holding,
        barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=retrieve_barrier_id,
                                                   num_threads=retrieve_threads),
        allocator_warp_id=allocator_warp, is_two_cta=pair,
        two_cta_tmem_dealloc_mbar_ptr=dealloc_barrier if pair else None,
    )


def tmem_load(cta_tile, c_layout, c_dtype, epi_tile, pair: bool, acc_epi):
    """The tcgen05.ld tiled copy of one epilogue sub-tile of the accumulator (TMEM -> registers);
    ``acc_epi`` is one sub-tile's TMEM view."""
    atom = bw.get_tmem_load_op(cta_tile, c_layout, c_dtype, cutlass.Float32, epi_tile, pair)
    return tcgen05.make_tmem_copy(atom, acc_epi)


def smem_store(c_layout, c_dtype, t2r):
    """Registers -> smem in the order the tcgen05.ld left them (stmatrix where it applies)."""
    atom = bw.get_smem_store_op(c_layout, c_dtype, cutlass.Float32, t2r)
    return cute.make_tiled_copy_D(atom, t2r)


# --- block-scaled MMA (MXFP8, NVFP4): scale factors through smem into TMEM ------------------------
# The scale factors of A (and B) reach the MMA as the PTX ISA's "128x4" atoms (see
# runtime/blockscaled.py for the byte layout, which is the global layout too): TMA copies whole
# 512-byte atoms (128 rows x 4 scale factors along K) into smem next to the data, the MMA warp
# moves them into TMEM with tcgen05.cp (.32x128b.warpx4: each 32-row slice of an atom is
# broadcast to the 4 lane quadrants), and tcgen05.mma ...block_scale reads them from there.
SF_ATOM_ROWS = 128  # rows of one scale-factor atom (M of A, N of B)
SF_ATOM_K = 4  # scale factors along K in one atom
SF_ATOM_BYTES = SF_ATOM_ROWS * SF_ATOM_K


def sf_tmem_columns(rows: int, k_blocks: int) -> int:
    """TMEM columns one k-tile's scale factors take for ``rows`` rows (A: the CTA's M; B: N
    rounded up to 128) and ``k_blocks`` MMA instructions per k-tile: one 32-bit column per
    32-lane slice of rows per instruction."""
    return rows // 32 * k_blocks


def blockscaled_tiled_mma(ab_dtype, sf_dtype, sf_vec: int, pair: bool, mma_mn: tuple[int, int]):
    """One block-scaled tcgen05.mma atom over the (M, N) MMA tile, K-major A and B: kind::mxf8f6f4
    for fp8 data with e8m0 scales per 32 (K = 32 per instruction), kind::mxf4nvf4 for packed
    e2m1 data with scales per 16 (K = 64 per instruction); fp32 accumulator in TMEM."""
    from cutlass.cute.nvgpu import OperandMajorMode

    return bw.make_blockscaled_trivial_tiled_mma(ab_dtype, ab_dtype, OperandMajorMode.K, OperandMajorMode.K,
                                                 sf_dtype, sf_vec, cta_group(pair), mma_mn)


def sf_smem_layouts(mma, mma_tiler, sf_vec: int, stages: int):
    """Staged smem layouts of one k-tile's scale factors of A (this CTA's rows) and of B (all N,
    rounded up to 128), as the tcgen05.cp atoms read them."""
    from cutlass.utils import blockscaled_layout as bsl

    return (bsl.make_smem_layout_sfa(mma, mma_tiler, sf_vec, stages),
            bsl.make_smem_layout_sfb(mma, mma_tiler, sf_vec, stages))


def sf_global_tensor(sf, data_shape, sf_vec: int):
    """The scale-factor tensor of an (rows, K, L) operand, over the flat buffer ``sf``: the 128x4
    atoms tiled K-block-fastest, then rows, then L (``blockscaled_layout.tile_atom_to_shape_SF``)."""
    from cutlass.utils import blockscaled_layout as bsl

    return cute.make_tensor(sf.iterator, bsl.tile_atom_to_shape_SF(data_shape, sf_vec))


def tma_load_sfa(sfa, sSFA_staged, mma_tiler, mma, vmnk, cluster_mn):
    """TMA of A's scale factors: as A (multicast along N, ``.2CTA`` in a pair), moved as 16-bit
    words (the atoms' 16-byte rows hold one row's 4 scale factors of 4 row slices)."""
    op = bw.cluster_shape_to_tma_atom_A(cluster_mn, mma.thr_id)
    return cute.nvgpu.make_tiled_tma_atom_A(op, sfa, cute.slice_(sSFA_staged, (None, None, None, 0)),
                                            mma_tiler, mma, vmnk.shape, internal_type=cutlass.Int16)


def tma_load_sfb(sfb, sSFB_staged, sfb_tiler, mma_sfb, sfb_vmnk, cluster_mn, mma):
    """TMA of B's scale factors.  Every CTA's MMA needs all N of them (a pair's B data is split,
    its scale factors are not), so they are partitioned for a 1-CTA MMA over N rounded up to 128
    and multicast along the cluster's M (both CTAs of a pair included)."""
    op = bw.cluster_shape_to_tma_atom_SFB(cluster_mn, mma.thr_id)
    return cute.nvgpu.make_tiled_tma_atom_B(op, sfb, cute.slice_(sSFB_staged, (None, None, None, 0)),
                                            sfb_tiler, mma_sfb, sfb_vmnk.shape, internal_type=cutlass.Int16)


def sf_tmem_tensors(mma, mma_tiler, sf_vec: int, sSFA_staged, sSFB_staged, sfa_ptr, sfb_ptr):
    """TMEM views of one k-tile's scale factors of A and B at ``sfa_ptr`` / ``sfb_ptr`` (TMEM
    addresses recast to the scale-factor dtype), in the layout the block-scaled MMA reads."""
    from cutlass.utils import blockscaled_layout as bsl

    la = bsl.make_tmem_layout_sfa(mma, mma_tiler, sf_vec, cute.slice_(sSFA_staged, (None, None, None, 0)))
    lb = bsl.make_tmem_layout_sfb(mma, mma_tiler, sf_vec, cute.slice_(sSFB_staged, (None, None, None, 0)))
    return cute.make_tensor(sfa_ptr, la), cute.make_tensor(sfb_ptr, lb)


def sf_s2t_copy(sf_dtype, pair: bool, sSF, tSF):
    """tcgen05.cp (smem -> TMEM) of scale factors, ``.32x128b.warpx4``, issued by one thread of
    the MMA warp.  Returns (tiled copy, staged smem source as descriptors, TMEM destination)."""
    s = cute.filter_zeros(sSF)
    t = cute.filter_zeros(tSF)
    copy = tcgen05.make_s2t_copy(cute.make_copy_atom(tcgen05.Cp4x32x128bOp(cta_group(pair)), sf_dtype), t)
    thr = copy.get_slice(0)
    return copy, tcgen05.get_s2t_smem_desc_tensor(copy, thr.partition_S(s)), thr.partition_D(t)


# --- attention (attention/sm100_fa4.py): P in TMEM as the A operand, fences around TMEM handoffs ---
def tiled_mma_tmem_a(ab_dtype, b_major, mma_mn: tuple[int, int]):
    """tcgen05.mma with its A operand read from Tensor Memory (the ``.kind::f16`` form whose A is
    ``[a_tmem]`` instead of a shared-memory descriptor), B from shared memory; one CTA, fp32
    accumulator in TMEM.  A is K-major: TMEM lane = row of A, 16-bit elements two per column."""
    return bw.make_trivial_tiled_mma(ab_dtype, ab_dtype, tcgen05.OperandMajorMode.K, b_major,
                                     cutlass.Float32, tcgen05.CtaGroup.ONE, mma_mn,
                                     tcgen05.OperandSource.TMEM)


def tmem_a_operand(mma, mma_tiler, ab_dtype, tmem_f32_ptr, column: int):
    """The MMA's A-operand fragment for a (M, K) tile of 16-bit values that starts at 32-bit TMEM
    column ``column`` past ``tmem_f32_ptr`` (it takes K/2 columns): the shared-memory A layout's
    shape, laid over TMEM."""
    a_layout = bw.make_smem_layout_a(mma, mma_tiler, ab_dtype, 1)
    frag = mma.make_fragment_A(cute.make_tensor(tmem_f32_ptr, a_layout.outer))[None, None, None, 0]
    return cute.make_tensor(cute.recast_ptr(tmem_f32_ptr + column, dtype=frag.element_type),
                            frag.layout)


def tmem_copy_32x32b(tmem_tile, columns: int, store: bool):
    """tcgen05.ld (or .st) of the 32x32b shape, ``columns`` 32-bit columns per instruction: each
    thread of a warp moves one TMEM lane (= one row of a 128-row tile, warp w of its warpgroup
    lanes 32w..32w+31), its values in column order."""
    rep = {1: tcgen05.Repetition.x1, 2: tcgen05.Repetition.x2, 4: tcgen05.Repetition.x4,
           8: tcgen05.Repetition.x8, 16: tcgen05.Repetition.x16, 32: tcgen05.Repetition.x32,
           64: tcgen05.Repetition.x64, 128: tcgen05.Repetition.x128}[columns]
    op = tcgen05.St32x32bOp(rep) if store else tcgen05.Ld32x32bOp(rep)
    return tcgen05.make_tmem_copy(cute.make_copy_atom(op, cutlass.Float32), tmem_tile)


def tmem_fence_before_sync():
    """tcgen05.fence::before_thread_sync: this thread's completed tcgen05 operations (waited with
    tcgen05.wait::ld/st) are ordered before the barrier arrive that follows."""
    from cutlass.experimental.primitives.nvvm_wrapper import tcgen05_fence
    tcgen05_fence("before_thread_sync")


def tmem_fence_after_sync():
    """tcgen05.fence::after_thread_sync: tcgen05 operations after a barrier wait are ordered after
    what the arrivals published."""
    from cutlass.experimental.primitives.nvvm_wrapper import tcgen05_fence
    tcgen05_fence("after_thread_sync")
