"""Hopper (sm_90a) building blocks shared by the GEMM (``gemm/sm90.py``) and the attention
(``attention/sm90.py``): TMA copy atoms and descriptor prefetch, the TMA mbarrier pipeline,
register reallocation budgets (setmaxnreg), the persistent tile scheduler, WGMMA accumulator views.

Imported only by kernel modules (it needs the DSL), never by the runtime.

WGMMA accumulator fragments (m64nNk16, fp32, one warpgroup) have the value mode ``(2, 2, N/8)``:
(column pair, row +8, 8-column block), per thread two rows (lane/4 and lane/4 + 8 of its warp's
16) and N/4 columns; the four threads of a quad hold one row between them, as in mma.sync.  The
register A operand of the next WGMMA (16-bit, k16) has the value mode ``(2, 2, 2)`` per k-block
with exactly the registers of the accumulator's 16 columns in the same order, so a converted
accumulator *is* the A fragment of the next GEMM: no shuffles (see :func:`acc_as_a_operand`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass._mlir.dialects import nvvm as _nvvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

# --- register reallocation (setmaxnreg) ----------------------------------------------------------
# Budgets in registers per thread by consumer warpgroup count: the producer warpgroup gives
# registers back, the consumers take them.  The sum over the CTA must stay within the 64K register
# file (checked by :func:`register_split_fits`, CPU-tested for every table below).
# Attention: 2 consumers: 24·128 + 2·240·128 = 64512; 3 consumers: 32·128 + 3·160·128 = 65536.
PRODUCER_REGS = {1: 56, 2: 24, 3: 32}
CONSUMER_REGS = {1: 256, 2: 240, 3: 160}
# GEMM (its producer warp keeps a few more registers for the tile scheduler and multicast masks):
# 2 consumers: 40·128 + 2·232·128 = 64512.
GEMM_PRODUCER_REGS = 40
GEMM_CONSUMER_REGS = {1: 240, 2: 232}
REGISTER_FILE = 65536


def register_split_fits(producer: int, consumer: int, consumers: int) -> bool:
    """setmaxnreg takes multiples of 8 in [24, 256]; the CTA's warpgroups share the register file."""
    ok = all(r % 8 == 0 and 24 <= r <= 256 for r in (producer, consumer))
    return ok and 128 * (producer + consumers * consumer) <= REGISTER_FILE


# --- TMA -----------------------------------------------------------------------------------------
def tma_load_atom(t: cute.Tensor, smem_layout_staged, smem_tile, n_mcast: int = 1):
    """TMA load of ``smem_tile`` boxes of ``t`` into one stage of ``smem_layout_staged`` (the
    multicast form when ``n_mcast`` > 1 CTAs of the cluster receive each box).  Returns the atom
    and the TMA view of ``t``."""
    op = cpasync.CopyBulkTensorTileG2SMulticastOp() if n_mcast > 1 else cpasync.CopyBulkTensorTileG2SOp()
    return cpasync.make_tiled_tma_atom(op, t, cute.slice_(smem_layout_staged, (None, None, 0)), smem_tile,
                                       num_multicast=n_mcast)


def tma_load_box_atom(t: cute.Tensor, smem_box_layout, box):
    """TMA load of ``box`` boxes of ``t`` into shared memory laid out as ``smem_box_layout``: one
    box that fills part of a larger slot (e.g. a page's rows of a K/V tile, the slot's layout
    restricted to them).  Returns the atom and the TMA view of ``t``."""
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), t, smem_box_layout, box)


def tma_store_atom(t: cute.Tensor, smem_layout_staged, smem_tile):
    """TMA store of one stage of ``smem_layout_staged`` into ``smem_tile`` boxes of ``t``."""
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), t,
                                       cute.slice_(smem_layout_staged, (None, None, 0)), smem_tile)


def prefetch_tma_descriptors(*atoms) -> None:
    """Prefetch the descriptors of ``atoms`` (``None`` entries skipped); one warp calls this."""
    for atom in atoms:
        if atom is not None:
            cpasync.prefetch_descriptor(atom)


def stage_bytes(dtype, smem_layout_staged) -> int:
    """Bytes of one stage of a staged smem layout: a TMA pipeline's transaction count."""
    return cute.size_in_bytes(dtype, cute.slice_(smem_layout_staged, (None, None, 0)))


def tma_pipeline(barriers, stages: int, tx_bytes, consumer_arrivals: int, cta_layout_vmnk):
    """A ring of ``stages`` smem slots filled by TMA: a "full" mbarrier per slot completed by the
    copies' byte count (``tx_bytes``, armed by one producer thread), an "empty" one that
    ``consumer_arrivals`` threads arrive on (one per consumer warp, times the multicast peers that
    write into the slot).  ``defer_sync``: the caller fences and syncs the cluster once after
    every barrier is initialised (``pipeline.pipeline_init_arrive`` / ``_wait``)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrivals),
        tx_count=tx_bytes,
        cta_layout_vmnk=cta_layout_vmnk,
        defer_sync=True,
    )


# --- persistent tile scheduler -------------------------------------------------------------------
def persistent_schedule(tiles_mnl, cluster_mn, swizzle: int, raster_along_m: bool, max_clusters):
    """Parameters of the static persistent scheduler over a (tiles_m, tiles_n, L) grid of tiles,
    and the launch grid: at most ``max_clusters`` clusters (a run-time value: the loader passes
    what the device holds at once, runtime/occupancy.py)."""
    params = utils.PersistentTileSchedulerParams(tiles_mnl, (*cluster_mn, 1), swizzle, raster_along_m)
    grid = utils.StaticPersistentTileScheduler.get_grid_shape(params, cutlass.max(max_clusters, cutlass.Int32(1)))
    return params, grid


@cute.jit
def swizzle_groups_exact(tile_idx, params, cluster_mn: cutlass.Constexpr, swizzle: cutlass.Constexpr):
    """The tile a plain M-raster schedule's ``tile_idx`` stands for when the clusters are walked in
    groups of ``swizzle`` clusters along N (consecutive work units along N inside a group, then
    down M, then the next group), the last group as wide as the clusters left: the library's
    swizzle without its padding tiles.  ``params``: the schedule built with swizzle 1 and M raster,
    whose linear order (cluster m fastest, then n, then l) this inverts."""
    m, n, l = tile_idx
    cm, cn = cluster_mn
    mc = params.problem_layout_ncluster_mnl.shape[0]
    nc = params.problem_layout_ncluster_mnl.shape[1]
    lin = (n // cn) * mc + m // cm
    span = mc * swizzle
    group = lin // span
    r = lin - group * span
    w = cutlass.min(nc - group * swizzle, swizzle)
    q = r // w
    return q * cm + m % cm, (group * swizzle + (r - q * w)) * cn + n % cn, l


def tile_scheduler(params):
    """This CTA's walk over the persistent schedule (device side)."""
    return utils.StaticPersistentTileScheduler.create(params, cute.arch.block_idx(), cute.arch.grid_dim())


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator partition ``((2, 2, V), M, N)`` (or an identity tensor partitioned
    like one) viewed as ``(rows, cols) = ((2, M), ((2, V), N))``."""
    shape = t.layout.shape
    flat = cute.make_layout(shape)
    mn = cute.make_layout(
        ((shape[0][1], shape[1]), ((shape[0][0], shape[0][2]), shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]),
                ((flat.stride[0][0], flat.stride[0][2]), flat.stride[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))


def acc_as_a_operand(acc_layout: cute.Layout, a_fragment: cute.Tensor) -> cute.Tensor:
    """The register A fragment ``a_fragment`` (``((2, 2, 2), M, K/16)``, 16-bit) viewed with the
    accumulator's layout: storing converted accumulator values through this view fills the A
    operand.  Both are compact in the same value order (module docstring); checked here."""
    if cute.cosize(acc_layout) != cute.cosize(a_fragment.layout):
        raise ValueError(f"accumulator {acc_layout} and A fragment {a_fragment.layout} differ in size")
    return cute.make_tensor(a_fragment.iterator, acc_layout)


# --- fp8 scales on WGMMA accumulators -------------------------------------------------------------
# DeepSeek-V3 block scaling: A carries one fp32 scale per row and 128 elements of K, B one per
# 128x128 block; the GEMM's k-tile is one 128-element block (one 128-byte fp8 row).
BLOCK_SCALE_K = 128


@cute.jit
def load_block_scales(coords: cute.Tensor, scale_a: cute.Tensor, scale_b: cute.Tensor, row0, n_blk, kb):
    """Per accumulator row of this thread, ``scale_a[row, kb] * scale_b[n_blk, kb]`` for the k-block
    ``kb`` (a register tensor, one value per row of :func:`acc_mn_view`).  ``coords``: the tile
    coordinates of the accumulators (an identity tensor partitioned like them); ``row0``: the tile's
    first row.  Rows past the end read the last row's scale (their outputs are never stored), so
    the loads need no predicate.  Issue them right after the k-block's WGMMAs: the latency hides
    under the tensor core's work."""
    c_mn = acc_mn_view(coords)
    rows = cute.size(c_mn, mode=[0])
    last = cute.size(scale_a, mode=[0]) - 1
    sb = scale_b[n_blk, kb]
    out = cute.make_rmem_tensor(rows, cutlass.Float32)
    for r in cutlass.range_constexpr(rows):
        out[r] = scale_a[cutlass.min(row0 + c_mn[r, 0][0], last), kb] * sb
    return out


@cute.jit
def block_scale_regs(coords: cute.Tensor) -> cute.Tensor:
    """Registers for one k-block's per-row scales (one value per accumulator row of this thread)."""
    return cute.make_rmem_tensor(cute.size(acc_mn_view(coords), mode=[0]), cutlass.Float32)


@cute.jit
def load_block_scales_into(dst: cute.Tensor, coords: cute.Tensor, scale_a: cute.Tensor, scale_b: cute.Tensor,
                           row0, n_blk, kb):
    """:func:`load_block_scales` into the registers ``dst`` (a :func:`block_scale_regs` tensor), so
    that a loop can issue the loads well ahead of their use."""
    c_mn = acc_mn_view(coords)
    last = cute.size(scale_a, mode=[0]) - 1
    sb = scale_b[n_blk, kb]
    for r in cutlass.range_constexpr(cute.size(dst)):
        dst[r] = scale_a[cutlass.min(row0 + c_mn[r, 0][0], last), kb] * sb


@cute.jit
def block_scales_from_smem(dst: cute.Tensor, coords: cute.Tensor, sSA: cute.Tensor, stage, scale_b: cute.Tensor,
                           n_blk, kb):
    """Per accumulator row of this thread, ``sSA[row, 0, stage] * scale_b[n_blk, kb]`` into the
    registers ``dst``: scale_a's k-block column for the tile's rows as the producer's TMA put it in
    the stage (``sSA``: (tile M, 1, stages) float32)."""
    c_mn = acc_mn_view(coords)
    sb = scale_b[n_blk, kb]
    for r in cutlass.range_constexpr(cute.size(dst)):
        dst[r] = sSA[c_mn[r, 0][0], 0, stage] * sb


@cute.jit
def promote_scaled(acc: cute.Tensor, part: cute.Tensor, row_scales: cute.Tensor):
    """Two-level accumulation: ``acc += part * row_scales[row]`` on WGMMA accumulator fragments
    (``part``: one k-block's partial sum, retired)."""
    acc_mn = acc_mn_view(acc)
    p_mn = acc_mn_view(part)
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        s = row_scales[r]
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            acc_mn[r, c] = acc_mn[r, c] + p_mn[r, c] * s


@cute.jit
def issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks):
    """Wait for the stage at ``read``, start its WGMMAs into ``part`` (overwritten) and commit
    them as one group.  Returns ``tiled_mma``: its accumulate flag changes here, and the DSL
    threads it through the caller's loops only as a rebound local."""
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
def promoted_mainloop(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, k_begin, k_end,
                      scales=None):
    """fp8 two-level accumulation over the k-blocks [k_begin, k_end) of one tile: each k-block's
    WGMMAs into a partial sum (``part`` / ``part2`` in turns), added into the fp32 ``acc`` once
    retired, its smem stage then released.  Two k-blocks per step: the second block's WGMMAs queue
    right behind the first's and run while the first partial is added, so each pair waits once
    on the tensor core.  No WGMMA is in flight across the loop's back edge: the DSL carries
    register tensors through loops as values, and ptxas serialises every WGMMA when such a copy
    reads an accumulator in flight.  ``acc`` is not cleared here.

    ``scales`` (block scales) = ``(s0, s1, coords, sSA, scale_b, n_blk)``: each partial sum is
    multiplied per row by ``sSA[row, 0, stage] * scale_b[n_blk, kb]`` as it is added
    (:func:`block_scales_from_smem`, :func:`promote_scaled`; ``s0``/``s1`` from
    :func:`block_scale_regs`); with ``n_blk`` None, ``scale_b`` is the k-blocks' scale_b values staged
    with the stages (``(stages,)`` float32 in shared memory, read at the stage's index).  ``read``
    and ``release`` are also advanced in place (the caller's
    objects take the final states), so a caller's loop that advances them elsewhere carries them
    without assigning them (an assignment changes the loop's carried values and with them the
    register allocation of the caller's other paths).  Returns ``tiled_mma`` (see
    :func:`issue_k_block`): its accumulate flag is set again by the next :func:`issue_k_block`."""
    read_in, release_in = read, release
    n_k = k_end - k_begin
    if cutlass.const_expr(scales is not None):
        s0, s1, coords, sSA, scale_b, n_blk = scales
        for pair in range(n_k // 2):
            kb = k_begin + 2 * pair
            tiled_mma = issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
            _stage_scales(s0, coords, sSA, read.index, scale_b, n_blk, kb)
            read.advance()
            tiled_mma = issue_k_block(tiled_mma, part2, tCrA, tCrB, ab_pipe, read, k_blocks)
            _stage_scales(s1, coords, sSA, read.index, scale_b, n_blk, kb + 1)
            read.advance()
            cute.nvgpu.warpgroup.wait_group(1)
            promote_scaled(acc, part, s0)
            ab_pipe.consumer_release(release)
            release.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            promote_scaled(acc, part2, s1)
            ab_pipe.consumer_release(release)
            release.advance()
        if n_k % 2 == 1:
            tiled_mma = issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
            _stage_scales(s0, coords, sSA, read.index, scale_b, n_blk, k_end - 1)
            read.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            promote_scaled(acc, part, s0)
            ab_pipe.consumer_release(release)
            release.advance()
    else:
        for _pair in range(n_k // 2):
            tiled_mma = issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
            read.advance()
            tiled_mma = issue_k_block(tiled_mma, part2, tCrA, tCrB, ab_pipe, read, k_blocks)
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
            tiled_mma = issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
            read.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            acc.store(acc.load() + part.load())
            ab_pipe.consumer_release(release)
            release.advance()
    _assign_state(read_in, read)
    _assign_state(release_in, release)
    return tiled_mma


# k-blocks per drain of the promoted main loop that promotes under the next k-block's WGMMAs.
PROMOTE_AHEAD_UNROLL = 8


@cute.jit
def promoted_mainloop_ahead(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks, k_begin,
                            k_end, scales=None, unroll: cutlass.Constexpr = PROMOTE_AHEAD_UNROLL):
    """:func:`promoted_mainloop` with the promotion of each k-block's partial sum under the next
    k-block's WGMMAs: in steps of ``unroll`` k-blocks (even), block j's WGMMAs are issued into
    ``part``/``part2`` (by parity) before block j-1's partial is waited for (``wait_group(1)``)
    and added, so the tensor core always has the next block queued; each step drains once at its
    end (``wait_group(0)``), where :func:`promoted_mainloop` drains every two k-blocks.  The
    k-blocks past the last whole step go through :func:`promoted_mainloop`.  (Within a step
    only: a WGMMA in flight across the loop's back edge makes ptxas serialise them, see there.)
    Block scales: the step's ``unroll`` scale_b values are global loads issued one step ahead
    (registers carried across the back edge), so no k-block waits on a load of its own; staged
    scale_b (``n_blk`` None) is read from the k-block's stage instead.
    Same arguments, scales and in-place state advance as :func:`promoted_mainloop`."""
    read_in, release_in = read, release
    n_k = k_end - k_begin
    parts = (part, part2)
    regs = (None, None)
    sb_cur = sb_next = None
    staged = False
    if cutlass.const_expr(scales is not None):
        s0, s1, coords, sSA, scale_b, n_blk = scales
        regs = (s0, s1)
        staged = n_blk is None
    if cutlass.const_expr(scales is not None and not staged):
        last_kb = cute.size(scale_b, mode=[1]) - 1
        sb_cur = cute.make_rmem_tensor(unroll, cutlass.Float32)
        sb_next = cute.make_rmem_tensor(unroll, cutlass.Float32)
        for j in cutlass.range_constexpr(unroll):
            sb_cur[j] = scale_b[n_blk, cutlass.min(k_begin + j, last_kb)]
    n_steps = n_k // unroll
    for step in range(n_steps):
        kb0 = k_begin + step * unroll
        if cutlass.const_expr(scales is not None and not staged):
            for j in cutlass.range_constexpr(unroll):
                sb_next[j] = scale_b[n_blk, cutlass.min(kb0 + unroll + j, last_kb)]
        for j in cutlass.range_constexpr(unroll):
            tiled_mma = issue_k_block(tiled_mma, parts[j % 2], tCrA, tCrB, ab_pipe, read, k_blocks)
            if cutlass.const_expr(staged):
                _row_scales_from_smem(regs[j % 2], coords, sSA, read.index, scale_b[read.index])
            elif cutlass.const_expr(scales is not None):
                _row_scales_from_smem(regs[j % 2], coords, sSA, read.index, sb_cur[j])
            read.advance()
            if cutlass.const_expr(j > 0):
                cute.nvgpu.warpgroup.wait_group(1)
                _promote(acc, parts[(j - 1) % 2], regs[(j - 1) % 2])
                ab_pipe.consumer_release(release)
                release.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        _promote(acc, parts[(unroll - 1) % 2], regs[(unroll - 1) % 2])
        ab_pipe.consumer_release(release)
        release.advance()
        if cutlass.const_expr(scales is not None and not staged):
            sb_cur.store(sb_next.load())
    tiled_mma = promoted_mainloop(tiled_mma, acc, part, part2, tCrA, tCrB, ab_pipe, read, release, k_blocks,
                                  k_begin + n_steps * unroll, k_end, scales)
    _assign_state(read_in, read)
    _assign_state(release_in, release)
    return tiled_mma


@cute.jit
def promoted_mainloop_serial(tiled_mma, acc, part, tCrA, tCrB, ab_pipe, read, release, k_blocks, k_begin, k_end,
                             scales=None):
    """fp8 two-level accumulation with one partial sum per warpgroup: each k-block's WGMMAs into
    ``part``, waited for (``wait_group(0)``) and added into ``acc`` before the next k-block is
    issued.  With two consumer warpgroups on a tile the tensor core still has work while one of
    them adds: the other's WGMMAs (the warpgroups drift out of phase).  One accumulator set fewer
    than :func:`promoted_mainloop`.  Block scales: ``scales`` as there (``s1`` unused); scale_b's
    value for the k-block is loaded before its WGMMAs are issued.  States advanced in place."""
    read_in, release_in = read, release
    s0 = coords = sSA = scale_b = n_blk = None
    if cutlass.const_expr(scales is not None):
        s0, _s1, coords, sSA, scale_b, n_blk = scales
    for k in range(k_begin, k_end):
        sb = cutlass.Float32(1.0)
        if cutlass.const_expr(scales is not None):
            sb = scale_b[n_blk, k]
        tiled_mma = issue_k_block(tiled_mma, part, tCrA, tCrB, ab_pipe, read, k_blocks)
        if cutlass.const_expr(scales is not None):
            _row_scales_from_smem(s0, coords, sSA, read.index, sb)
        read.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        _promote(acc, part, s0)
        ab_pipe.consumer_release(release)
        release.advance()
    _assign_state(read_in, read)
    _assign_state(release_in, release)
    return tiled_mma


@cute.jit
def _stage_scales(dst: cute.Tensor, coords: cute.Tensor, sSA: cute.Tensor, stage, scale_b, n_blk, kb):
    """The k-block's per-row scales into ``dst``: :func:`block_scales_from_smem`, or with ``n_blk``
    None scale_b's value from the stage (``scale_b``: (stages,) float32 in shared memory)."""
    if cutlass.const_expr(n_blk is None):
        _row_scales_from_smem(dst, coords, sSA, stage, scale_b[stage])
    else:
        block_scales_from_smem(dst, coords, sSA, stage, scale_b, n_blk, kb)


@cute.jit
def stage_scale_b(scale_b: cute.Tensor, n_blk, k, sSB: cute.Tensor, stage, full_barrier):
    """Producer side of staged scale_b: one thread copies ``scale_b[n_blk, k]`` (4 bytes, cp.async)
    into ``sSB[stage]`` and has the stage's full mbarrier track the copy (an arrive that first
    raises the pending count, so the barrier's arrival count is unchanged).  Call after the
    stage was acquired and before its TMA loads are issued: their transaction bytes keep the
    phase open until the arrive is counted."""
    with cute.arch.elect_one():
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=32)
        src = cute.local_tile(scale_b[n_blk, None], (1,), (k,))
        dst = cute.local_tile(sSB, (1,), (stage,))
        cute.copy(atom, src, dst)
        _cp_async_arrive(full_barrier)


@dsl_user_op
def _cp_async_arrive(mbar_ptr, *, loc=None, ip=None) -> None:
    """``cp.async.mbarrier.arrive.shared::cta.b64``: the mbarrier's pending count is raised by
    one, and one arrive-on follows once this thread's earlier cp.async copies completed."""
    _nvvm.cp_async_mbarrier_arrive(mbar_ptr.to_llvm_ptr(loc=loc, ip=ip), noinc=False, loc=loc, ip=ip)


@cute.jit
def _row_scales_from_smem(dst: cute.Tensor, coords: cute.Tensor, sSA: cute.Tensor, stage, sb):
    """:func:`block_scales_from_smem` with scale_b's value ``sb`` already in a register."""
    c_mn = acc_mn_view(coords)
    for r in cutlass.range_constexpr(cute.size(dst)):
        dst[r] = sSA[c_mn[r, 0][0], 0, stage] * sb


@cute.jit
def _promote(acc: cute.Tensor, part: cute.Tensor, row_scales):
    """``acc += part`` (``row_scales`` None) or :func:`promote_scaled`."""
    if cutlass.const_expr(row_scales is None):
        acc.store(acc.load() + part.load())
    else:
        promote_scaled(acc, part, row_scales)


def _assign_state(dst, src) -> None:
    """Pipeline state ``dst`` takes ``src``'s count, index and phase (the loops above may rebind
    their local names to new state objects)."""
    if dst is not src:
        dst._count, dst._index, dst._phase = src._count, src._index, src._phase


@cute.jit
def apply_row_col_scales(acc: cute.Tensor, coords: cute.Tensor, row_scale: cute.Tensor,
                         col_scale: cute.Tensor, row0, col0):
    """Row-wise scaling: ``acc[r, c] *= row_scale[row0 + r] * col_scale[col0 + c]`` over this
    thread's accumulators (``coords`` as in :func:`load_block_scales`).  Coordinates past the end
    read the last scale (those outputs are never stored)."""
    acc_mn = acc_mn_view(acc)
    c_mn = acc_mn_view(coords)
    cols = cute.size(acc_mn, mode=[1])
    last_r = cute.size(row_scale) - 1
    last_c = cute.size(col_scale) - 1
    sc = cute.make_rmem_tensor(cols, cutlass.Float32)
    for c in cutlass.range_constexpr(cols):
        sc[c] = col_scale[cutlass.min(col0 + c_mn[0, c][1], last_c)]
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        sr = row_scale[cutlass.min(row0 + c_mn[r, 0][0], last_r)]
        for c in cutlass.range_constexpr(cols):
            acc_mn[r, c] = acc_mn[r, c] * (sr * sc[c])


# --- fused GEMM epilogues on WGMMA accumulators ----------------------------------------------------
# Each helper takes the accumulators and ``coords`` (an identity tensor over the CTA tile
# partitioned like them, as in :func:`load_block_scales`).  Coordinates past the end read the last
# element (those outputs are never stored), so no load needs a predicate.


@cute.jit
def scale_acc(acc: cute.Tensor, scale):
    """``acc *= scale`` (fp8's per-tensor scales, applied before an epilogue adds anything)."""
    for v in cutlass.range_constexpr(cute.size(acc)):
        acc[v] = acc[v] * scale


@cute.jit
def add_col_vector(acc: cute.Tensor, coords: cute.Tensor, vec: cute.Tensor, col0):
    """``acc[r, c] += vec[col0 + c]`` (a bias per output column, converted to fp32)."""
    acc_mn = acc_mn_view(acc)
    c_mn = acc_mn_view(coords)
    last = cute.size(vec) - 1
    for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
        x = vec[cutlass.min(col0 + c_mn[0, c][1], last)].to(cutlass.Float32)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            acc_mn[r, c] = acc_mn[r, c] + x


__all__ = ["add_col_vector", "scale_acc", "BLOCK_SCALE_K", "apply_row_col_scales", "block_scale_regs", "issue_k_block", "promoted_mainloop", "promoted_mainloop_ahead", "promoted_mainloop_serial", "PROMOTE_AHEAD_UNROLL", "block_scales_from_smem", "load_block_scales", "load_block_scales_into", "promote_scaled", "stage_scale_b", "CONSUMER_REGS", "GEMM_CONSUMER_REGS", "GEMM_PRODUCER_REGS", "PRODUCER_REGS", "REGISTER_FILE",
           "acc_as_a_operand", "acc_mn_view", "persistent_schedule", "prefetch_tma_descriptors",
           "register_split_fits", "stage_bytes", "swizzle_groups_exact", "tile_scheduler", "tma_load_atom", "tma_load_box_atom", "tma_pipeline",
           "tma_store_atom"]
