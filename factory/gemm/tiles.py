"""The GEMM tile tables: which variants each tier of each family builds.  Data only; the kernels
are gemm/sm80.py, sm90.py, sm100.py and decode.py, whose ``enumerate_*`` read these tables and
drop what a target cannot implement.  What each tile was measured to win, and on which device,
is in notes/gemm-sm80.md, notes/gemm-sm90.md and notes/gemm-sm100.md.

Each row gives the variant's fields that differ from the family's defaults.  This module is not
among any variant's sources: a row changes which variants exist, never how one compiles.
"""

from __future__ import annotations

BF16 = dict(ab="bf16", c="bf16")
FP8 = dict(ab="e4m3", c="bf16")

# --- sm80 family (mma.sync; sm_80, sm_86, sm_89, sm_90 portability build, sm_120a) ---------------
SM80_TEST = (dict(**BF16, tile=(128, 128, 32), warps=(2, 2)),)  # and the first SM80_FP8 row
SM80_DEFAULT = tuple(
    row for ab in ("bf16", "f16") for row in (
        dict(ab=ab, c=ab, tile=(128, 128, 32), warps=(2, 2)),
        dict(ab=ab, c="f32", tile=(128, 128, 32), warps=(2, 2)),
        dict(ab=ab, c=ab, tile=(128, 256, 32), warps=(2, 4)),
        dict(ab=ab, c=ab, tile=(64, 128, 32), warps=(2, 2)),
        dict(ab=ab, c=ab, a_major="m", tile=(128, 128, 32), warps=(2, 2)),
        dict(ab=ab, c=ab, b_major="n", tile=(128, 128, 32), warps=(2, 2)),
        dict(ab=ab, c=ab, a_major="m", b_major="n", tile=(128, 128, 32), warps=(2, 2)),
    )
)
# fp8, by whether the target's fp8 mma.sync is native (else it runs as f16 HMMA plus conversions:
# twice the warps halve each thread's accumulators, and 128x256 spills at any warp count).
SM80_FP8 = {
    True: (dict(**FP8, tile=(128, 128, 64), warps=(2, 2)), dict(**FP8, tile=(128, 256, 64), warps=(2, 4))),
    False: (dict(**FP8, tile=(128, 128, 64), warps=(4, 2)),),
}
# Row-wise fp8 scales (torch ``_scaled_mm`` row-wise, the form fp8 servers run on Ada): the
# per-tensor tiles' row-scaled twins, default tier.
SM80_FP8_ROW = {native: tuple(dict(s, row_scale=True) for s in rows) for native, rows in SM80_FP8.items()}
SM80_FULL_EXTRA = tuple(
    row for ab in ("bf16", "f16") for row in (
        dict(ab=ab, c=ab, tile=(256, 128, 32), warps=(4, 2)),
        dict(ab=ab, c=ab, tile=(128, 128, 64), warps=(2, 2)),
        dict(ab=ab, c=ab, tile=(64, 64, 64), warps=(2, 2)),
    )
)
# Split-K (decode shapes: M <= 64, few tiles, long K): 64x128 tiles split over K; full = default.
SM80_SPLIT_K = {
    "test": (dict(**BF16, tile=(64, 128, 32), warps=(2, 2), split_k=4),),
    "default": tuple(dict(ab=ab, c=ab, tile=(64, 128, 32), warps=(2, 2), split_k=sk)
                     for ab in ("bf16", "f16") for sk in (4, 8)),
}
# Fused epilogues (bias, silu_mul, residual) on the mma.sync GEMM.  Test tier (built for every
# sm80-family target; the sm_90 portability build runs on an H100): each field alone and together
# on the two tiles the plain selection takes for bf16 (128x128 filling the SMs, else 64x128), and
# residual / silu_mul on the plain GEMM's prefill tile 128x256 (its fp32 staging, 130 KiB, fits
# sm_80's and sm_90's shared memory, not sm_86/89's: pruned there).  No default tier yet.
SM80_EPILOGUE_TEST = (
    dict(**BF16, tile=(128, 128, 32), warps=(2, 2), residual=True),
    dict(**BF16, tile=(128, 128, 32), warps=(2, 2), silu_mul=True),
    dict(**BF16, tile=(64, 128, 32), warps=(2, 2), residual=True),
    dict(**BF16, tile=(64, 128, 32), warps=(2, 2), silu_mul=True),
    dict(**BF16, tile=(64, 128, 32), warps=(2, 2), bias=True),
    dict(**BF16, tile=(64, 128, 32), warps=(2, 2), bias=True, silu_mul=True, residual=True),
) + tuple(dict(**BF16, tile=(128, 256, 32), warps=(2, 4), **f) for f in (dict(residual=True), dict(silu_mul=True)))

# --- sm90 family (WGMMA, TMA, warp-specialised; sm_90a) ------------------------------------------
SM90_TEST = (
    dict(**BF16, tile=(128, 128, 64), cluster=(1, 1)),
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1)),
    # fp8 decode path: QGMMA, scales, swapped operands, transposed C store, split-K with the DSMEM
    # reduction, PDL; and its twin that loads the weights before the PDL wait.
    dict(**FP8, tile=(32, 64, 128), schedule="ws", swap_ab=True, split_k=2, pdl=True),
    dict(**FP8, tile=(32, 64, 128), schedule="ws", swap_ab=True, split_k=2, pdl=True, early_b=True),
)
# Every default row is built with pdl=True; each swap_ab row also as an early_b twin
# (SM90_EARLY_B_ONLY: rows built only as early_b).  No tier sets ``raster``: every row keeps "m",
# which swap_ab rows walk along N (raster_along_m = (raster == "m") != swap_ab).
SM90_DEFAULT = (
    # Large problems: cooperative and ping-pong tiles, 1- and 2-CTA clusters.
    dict(**BF16, tile=(128, 128, 64)),
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1)),
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2)),
    dict(**BF16, tile=(128, 128, 64), cluster=(2, 1)),
    dict(**BF16, tile=(128, 128, 64), cluster=(1, 2), schedule="pp"),
    dict(**BF16, tile=(64, 128, 64), schedule="ws"),
    dict(**BF16, tile=(128, 128, 64), b_major="n"),  # x @ W with W stored (K, N)
    dict(ab="bf16", c="f32", tile=(128, 256, 64), cluster=(2, 1)),
    dict(ab="f16", c="f16", tile=(128, 128, 64)),
    dict(ab="f16", c="f16", tile=(128, 256, 64), cluster=(2, 1)),
    dict(**FP8, tile=(128, 128, 128)),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1)),
    dict(**FP8, tile=(64, 128, 128), schedule="pp"),
    dict(**FP8, tile=(128, 256, 128), cluster=(2, 1), fast_accum=True),
    # Decode (M <= 64): swapped operands, N on the WGMMA's 64-row side; split-K over a 2-CTA cluster.
    dict(**BF16, tile=(16, 64, 64), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(32, 64, 64), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(64, 64, 64), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(16, 64, 64), schedule="ws", swap_ab=True, split_k=2),
    dict(**BF16, tile=(32, 64, 64), schedule="ws", swap_ab=True, split_k=2),
    dict(**BF16, tile=(16, 64, 128), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(32, 64, 128), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(64, 64, 64), schedule="ws", swap_ab=True, split_k=2),
    dict(**FP8, tile=(64, 64, 128), schedule="ws", swap_ab=True),
    dict(**FP8, tile=(64, 64, 128), schedule="ws", swap_ab=True, split_k=2),
    # Tall problems (the cost model takes them from M ~3072): swizzled raster, 8 clusters along N.  Where N's clusters
    # divide by 8 the library's swizzle; elsewhere its twin without padding tiles (swizzle_exact: the
    # last group only as wide as the clusters left; H100 by name 16384 x 3072 x 5120: 712.7 us
    # against 984.1 swizzled with padding and 828.3 unswizzled; notes/gemm-sm90.md).
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2), swizzle=8),
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2), swizzle=8, swizzle_exact=True),
    dict(**FP8, tile=(128, 256, 128), cluster=(2, 1), fast_accum=True, swizzle=8),
    dict(**FP8, tile=(32, 64, 128), schedule="ws", swap_ab=True),
    dict(**FP8, tile=(32, 64, 128), schedule="ws", swap_ab=True, split_k=2),
    dict(**FP8, tile=(16, 64, 128), schedule="ws", swap_ab=True),
    # Mid M (128..1024): tile widths for the SM count.
    dict(**BF16, tile=(128, 192, 64), cluster=(2, 1)),
    dict(**BF16, tile=(128, 160, 64), cluster=(2, 1)),
    dict(**FP8, tile=(128, 192, 128), cluster=(2, 1), fast_accum=True),
    dict(**FP8, tile=(128, 160, 128), cluster=(2, 1), fast_accum=True),
    dict(**BF16, tile=(64, 96, 64), schedule="ws"),
    # N in 64-column steps for grids of few tiles (N = 2112 = 33 x 64: 132 tiles at M = 512).
    dict(**BF16, tile=(128, 64, 64), cluster=(2, 1)),
    # M = 128 weight streams: 64-row tiles, B multicast over a 2x1 cluster.
    dict(**BF16, tile=(64, 128, 64), cluster=(2, 1), schedule="ws"),
    dict(**FP8, tile=(64, 128, 128), cluster=(2, 1), schedule="ws"),
    dict(**FP8, tile=(64, 96, 128), schedule="ws"),
    dict(**BF16, tile=(64, 32, 64), schedule="ws"),
    dict(**FP8, tile=(64, 32, 128), schedule="ws"),
    # M = 64..128: swap tiles whose weight slab two CTAs share by multicast; also 16-stage twins.
    dict(**BF16, tile=(64, 64, 64), cluster=(2, 1), schedule="ws", swap_ab=True),
    dict(**FP8, tile=(64, 64, 128), cluster=(2, 1), schedule="ws", swap_ab=True),
    dict(**BF16, tile=(64, 64, 64), cluster=(2, 1), schedule="ws", swap_ab=True, deep=True),
    dict(**FP8, tile=(64, 64, 128), cluster=(2, 1), schedule="ws", swap_ab=True, deep=True),
    # Large fp8: ping-pong 64x256 tiles.
    dict(**FP8, tile=(64, 256, 128), cluster=(2, 1), schedule="pp", fast_accum=True),
    dict(**FP8, tile=(64, 256, 128), cluster=(1, 2), schedule="pp", fast_accum=True),
)
# Full tier: the 128x256 2x1 tile swizzled, with and without padding tiles (the selection took
# neither for any of 6520 bf16 problems, M 256..65536, on 132 / 114 / 78 / 66 SMs; the 256x128 1x2
# ones above win its shapes in the cost model).
SM90_SWIZZLED_FULL = (
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1), swizzle=8),
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1), swizzle=8, swizzle_exact=True),
)
# fp8 with a scale per row of A and of B (row_scale) and DeepSeek-V3 block scales (block_scale):
# built with pdl=True like the rows above (swap rows also as early_b twins).
SM90_SCALED_DEFAULT = (
    dict(**FP8, tile=(128, 128, 128), row_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), row_scale=True),
    dict(**FP8, tile=(128, 256, 128), cluster=(2, 1), fast_accum=True, row_scale=True),
    dict(**FP8, tile=(64, 128, 128), cluster=(2, 1), schedule="ws", row_scale=True),
    dict(**FP8, tile=(16, 64, 128), schedule="ws", swap_ab=True, row_scale=True),
    dict(**FP8, tile=(64, 64, 128), schedule="ws", swap_ab=True, row_scale=True),
    # M >= 2048: the 128x128 ping-pong tile, 1x2 multicast (cuBLAS's row-wise kernel at 8192 x
    # 14336 x 4096 on an H100: nvjet 128x128, 6 stages, 1x2; this tile 0.86x -> 0.94x of it, 8192 x
    # 7168 x 2048 0.84x -> 0.98x against the 128x256 2x1 it replaces there; notes/gemm-fp8.md).
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), schedule="pp", fast_accum=True, row_scale=True),
    # Its swizzled twin (groups of 8 clusters along N, no padding tiles): a quarter to a third of
    # the plain raster's DRAM bytes where A and B stream from DRAM many times (M 8192, K >= 4096;
    # N 2112); the cost model takes it there (its DRAM term) and the plain one elsewhere.
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), schedule="pp", fast_accum=True, swizzle=8, swizzle_exact=True,
         row_scale=True),
    # The 2x1 ping-pong tile (B multicast): the selection's pick at M 512..1024 (the fastest of these
    # tiles at all 8 such shapes timed on an H100; notes/gemm-fp8.md).
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), schedule="pp", fast_accum=True, row_scale=True),
    # A clusterless 128x192 tile: fewer waves where 128-wide tiles leave a short last round (by name
    # on an H100 0.73-0.92x the other picks at M 384..4096, e.g. 2048 x 1536 x 7168 33.5 vs 41.8 us,
    # 4096 x 576 x 7168 30.6 vs 41.0); the selection takes it from M 384 (fx_select.c wide_fp8_c1x1).
    dict(**FP8, tile=(128, 192, 128), fast_accum=True, row_scale=True),
)
# The block-scaled tiles (DeepSeek-V3 scales).  Default: each with scale_b staged with the k-block
# (scale_b_stage: 1058-1069 vs 991-1029 TFLOP/s at 4096x7168x16384 for 128x128 c2x1 on an H100, same
# passes; notes/gemm-fp8.md); the full tier keeps them with scale_b read from global memory.
SM90_BLOCK_TILES = (
    dict(**FP8, tile=(128, 128, 128), block_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), block_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), block_scale=True),
    dict(**FP8, tile=(64, 128, 128), cluster=(2, 1), schedule="ws", block_scale=True),
    dict(**FP8, tile=(64, 128, 128), schedule="pp", block_scale=True),
)
SM90_SCALED_DEFAULT += tuple(dict(d, scale_b_stage=True) for d in SM90_BLOCK_TILES)
# Full tier only: more clusters for the block-scaled tile; the block tiles with the promotion under
# the next k-block's WGMMAs (promote_ahead) or serialised per k-block (promote_serial).
SM90_SCALED_FULL = SM90_BLOCK_TILES + tuple(dict(d, promote_ahead=True) for d in SM90_BLOCK_TILES) + tuple(
    dict(d, promote_serial=True) for d in SM90_BLOCK_TILES if d["tile"][0] == 128) + (
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 2), block_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), swizzle=8, block_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), row_scale=True),
    dict(**FP8, tile=(128, 64, 128), cluster=(2, 1), block_scale=True),
    dict(**FP8, tile=(128, 256, 128), cluster=(2, 1), fast_accum=True, swizzle=8, row_scale=True),
    dict(**FP8, tile=(256, 128, 128), cluster=(1, 2), fast_accum=True, row_scale=True),
    dict(**FP8, tile=(256, 128, 128), cluster=(1, 2), fast_accum=True, swizzle=8, row_scale=True),
    dict(**FP8, tile=(64, 256, 128), cluster=(1, 2), schedule="pp", fast_accum=True, row_scale=True),
    # (the 2x1 one left the default tier: the selection picked it for no row problem of 5500, M 1-16384,
    # on 132 / 114 / 78 / 66 SMs, once the ping-pong and 128x192 tiles were in)
    dict(**FP8, tile=(64, 256, 128), cluster=(2, 1), schedule="pp", fast_accum=True, row_scale=True),
    # Row scales on 128x128 ping-pong tiles (each consumer warpgroup a whole 128x128 tile, its
    # epilogue under the other's main loop; the plain 1x2 and 2x1 ones and the swizzled 1x2 one are
    # in the default tier).
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), schedule="pp", fast_accum=True, swizzle=8, row_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), schedule="pp", fast_accum=True, swizzle=8, row_scale=True),
    # Swizzled without padding tiles (swizzle_exact).
    dict(**FP8, tile=(128, 128, 128), cluster=(1, 2), schedule="pp", fast_accum=True, swizzle=4, swizzle_exact=True,
         row_scale=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), schedule="pp", fast_accum=True, swizzle=8, swizzle_exact=True,
         row_scale=True),
    dict(**FP8, tile=(128, 256, 128), cluster=(2, 1), fast_accum=True, swizzle=8, swizzle_exact=True, row_scale=True),
    # Wide row tiles for fewer waves (the clusterless 128x192 one is in the default tier): by name on
    # an H100 the 1x2 128x192 tile ran level with it or up to 4 % faster at M 768-1024, 38 % slower
    # at 4096 x 576 x 7168 (N padded to whole clusters); the 128x256 one lost at M <= 128.
    dict(**FP8, tile=(128, 256, 128), fast_accum=True, row_scale=True),
    dict(**FP8, tile=(128, 192, 128), cluster=(1, 2), fast_accum=True, row_scale=True),
) + tuple(
    # On the coop block tiles: scale_b staged and the two warpgroups' pair loops offset by one
    # k-block (stagger; 6-10 % slower than scale_b_stage alone on an H100).
    dict(d, scale_b_stage=True, stagger=True) for d in SM90_BLOCK_TILES if d["tile"][0] == 128) + (
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), block_scale=True, stagger=True),
    dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), block_scale=True, promote_ahead=True, scale_b_stage=True),
) + tuple(
    # The promotion FFMAs' scheduling hints edited to let every one yield (ffma_yield).
    dict(**FP8, tile=(128, 128, 128), cluster=cl, block_scale=True, ffma_yield=True, **kw)
    for cl in ((1, 1), (2, 1)) for kw in (dict(scale_b_stage=True), dict(promote_serial=True))
) + (dict(**FP8, tile=(128, 128, 128), cluster=(2, 1), block_scale=True, promote_ahead=True, scale_b_stage=True,
          ffma_yield=True),
)
# (the full tier builds this list's rows with pdl=True: the swizzled bf16 ones ride along)
SM90_SCALED_FULL += SM90_SWIZZLED_FULL
# Fused epilogues (bias, silu_mul, residual), built with pdl=True.  Default: what a Llama-3 layer
# calls (bf16, no bias): residual for o_proj / down_proj at the tiles the plain GEMM's selection
# takes for those shapes (H100, 132 SMs, M 1..8192: the swapped decode tiles up to M 128, then
# 128x128 with and without a 2x1 cluster, 128x256 from M 1024), so that the fused call runs the
# plain call's kernel plus the residual read (a 256x128 1x2 residual tile measured no faster than
# 128x256 2x1 at M 1024-16384: full tier); silu_mul (tile N 128: 64 gate + 64 up columns) for
# gate_up, 64x128 ws up to M 64, then 128x128 with and without a 2x1 cluster, and the plain GEMM's
# prefill tile 256x128 1x2 from M 1024 (H100, M x 28672 x 4096: 1.27x / 1.43x the 128x128 2x1 at
# M 8192 / 16384, level with it at M 1024-4096).
SM90_EPILOGUE_DEFAULT = (
    dict(**BF16, tile=(16, 64, 128), schedule="ws", swap_ab=True, residual=True),
    dict(**BF16, tile=(16, 64, 64), schedule="ws", swap_ab=True, split_k=2, residual=True),
    dict(**BF16, tile=(32, 64, 128), schedule="ws", swap_ab=True, residual=True),
    dict(**BF16, tile=(64, 64, 64), schedule="ws", swap_ab=True, split_k=2, residual=True),
    dict(**BF16, tile=(64, 64, 64), cluster=(2, 1), schedule="ws", swap_ab=True, deep=True, residual=True),
    dict(**BF16, tile=(128, 128, 64), residual=True),
    dict(**BF16, tile=(128, 128, 64), cluster=(2, 1), residual=True),
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1), residual=True),
    dict(**BF16, tile=(128, 128, 64), silu_mul=True),
    dict(**BF16, tile=(128, 128, 64), cluster=(2, 1), silu_mul=True),
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2), silu_mul=True),
    dict(**BF16, tile=(64, 128, 64), schedule="ws", silu_mul=True),
    # The plain GEMM's tall-problem tile (swizzled raster, selected from M 4096): its residual twin
    # (H100: 1.10x / 1.07x the 128x256 2x1 residual at M 16384 for o_proj / down_proj, within 2 % of
    # it at M 1024-8192, where the selection takes it as well).
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2), swizzle=8, residual=True),
    # The plain GEMM's mid-M tiles (Llama-3-8B o_proj / down_proj: 64x96 at M 192, 128x192 2x1 at
    # M 640-768 and 1536): without these twins the residual ran on another tile there, 0.72-0.90x
    # the plain GEMM + torch add (H100).
    dict(**BF16, tile=(64, 96, 64), schedule="ws", residual=True),
    dict(**BF16, tile=(128, 192, 64), cluster=(2, 1), residual=True),
)
# Full tier: the residual alone also at the other tiles the plain GEMM takes for decode and mid M.
SM90_EPILOGUE_RESIDUAL_FULL = tuple(
    dict(**BF16, residual=True, **kw) for kw in (
        dict(tile=(16, 64, 64), schedule="ws", swap_ab=True),
        dict(tile=(32, 64, 64), schedule="ws", swap_ab=True),
        dict(tile=(64, 64, 64), schedule="ws", swap_ab=True),
        dict(tile=(64, 128, 64), schedule="ws"),
        dict(tile=(256, 128, 64), cluster=(1, 2)),
    )
)
# fp8 output with a scale per row and 128 columns (``fp8_groups``): the gate/up projection's
# SiLU(gate)·up written as the down projection's block-scaled input (a 128x256 kernel tile: 128
# output columns, one scale group); default: the bf16 one.  Full: a 2x1 cluster, the plain GEMM's
# output (128x128), and fp8 inputs with row scales.
SM90_EPILOGUE_FP8_GROUPS_DEFAULT = (
    dict(ab="bf16", c="e4m3", tile=(128, 256, 64), silu_mul=True, fp8_groups=True),
)
SM90_EPILOGUE_FP8_GROUPS_FULL = (
    dict(ab="bf16", c="e4m3", tile=(128, 256, 64), cluster=(2, 1), silu_mul=True, fp8_groups=True),
    dict(ab="bf16", c="e4m3", tile=(128, 128, 64), fp8_groups=True),
    dict(ab="e4m3", c="e4m3", tile=(128, 256, 128), fast_accum=True, row_scale=True, silu_mul=True, fp8_groups=True),
)
# Test tier: each field alone, all three together, and the e4m3 output (the GPU tests' variants).
SM90_EPILOGUE_TEST = (
    dict(**BF16, tile=(128, 128, 64), bias=True),
    dict(**BF16, tile=(128, 128, 64), residual=True),
    dict(**BF16, tile=(128, 128, 64), silu_mul=True),
    dict(**BF16, tile=(64, 128, 64), schedule="ws", bias=True, silu_mul=True, residual=True),
    dict(ab="bf16", c="e4m3", tile=(128, 128, 64), fp8_groups=True),
)
# Full tier adds every combination of the fields on these tiles, bf16 and fp8 (row scales too).
SM90_EPILOGUE_FULL_TILES = (
    dict(**BF16, tile=(128, 128, 64)),
    dict(**BF16, tile=(128, 128, 64), cluster=(2, 1)),
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2)),  # the plain GEMM's prefill tile (M >= 1024)
    # Its swizzled-raster twin (M >= 4096).  silu_mul on it measured 0.93-0.96x the unswizzled tile
    # at M 4096, level at 8192, 1.06-1.12x at 16384 (H100): full tier.
    dict(**BF16, tile=(256, 128, 64), cluster=(1, 2), swizzle=8),
    dict(**BF16, tile=(64, 128, 64), schedule="ws"),
    dict(ab="f16", c="f16", tile=(128, 128, 64)),
    dict(**FP8, tile=(128, 128, 128)),
    dict(**FP8, tile=(128, 128, 128), row_scale=True),
)
SM90_EARLY_B_ONLY = (
    dict(**FP8, tile=(16, 64, 256), schedule="ws", swap_ab=True, deep=True),
    dict(**BF16, tile=(16, 64, 128), schedule="ws", swap_ab=True, deep=True),
)
# The full tier adds the product of these (schedules "ws"/"pp" for 64-row tiles, else
# "coop"/"pp"; fp8 with and without fast accumulation), and the swap tiles of SM90_FULL_SWAP.
SM90_FULL_TILES = ((128, 128), (128, 256), (256, 128), (64, 128), (64, 256), (128, 64))
SM90_FULL_DTYPES = (("bf16", "bf16"), ("bf16", "f32"), ("f16", "f16"), ("f16", "f32"), ("e4m3", "bf16"))
SM90_FULL_CLUSTERS = ((1, 1), (2, 1), (1, 2))
SM90_FULL_MAJORS = (("k", "k"), ("m", "k"), ("k", "n"), ("m", "n"))
SM90_FULL_SWAP = dict(tile_m=(16, 32, 64), tile_n=(64, 128), split_k=(1, 2, 4))

# --- sm100 family (tcgen05, TMEM; sm_100f) ---------------------------------------------------------
# Every row of every tier is built with pdl=True (enumerate_sm100); ``pdl=False`` is never built.
SM100_TEST = (
    # The CTA pair with multicast along N: every SASS form the family relies on.
    dict(**BF16, pair=True, tile=(256, 128, 64), cluster=(2, 2)),
)
SM100_DEFAULT = (
    dict(**BF16, tile=(128, 256, 64), cluster=(2, 1)),
    dict(**BF16, tile=(128, 128, 64)),
    dict(**BF16, tile=(128, 128, 64), b_major="n"),  # x @ W with W stored (K, N)
    dict(**BF16, pair=True, tile=(256, 256, 64), cluster=(2, 1)),  # CTA pairs
    dict(**BF16, pair=True, tile=(256, 128, 64), cluster=(2, 2)),
    dict(**BF16, tile=(64, 32, 64)),  # decode (M <= 64)
    dict(ab="f16", c="f16", pair=True, tile=(256, 256, 64), cluster=(2, 1)),
    dict(ab="f16", c="f16", tile=(64, 32, 64)),
    dict(ab="bf16", c="f32", pair=True, tile=(256, 256, 64), cluster=(2, 1)),
    dict(**FP8, pair=True, tile=(256, 256, 128), cluster=(2, 1)),
    dict(**FP8, tile=(64, 32, 128)),
    # Decode (M <= 16) beyond one wave of 64x32 tiles: the cost model's decode rule picks these
    # (runtime/cost_sm100.py); not measured on a device.
    dict(**BF16, tile=(64, 64, 64)),
    dict(**FP8, tile=(64, 64, 128)),
)
# Row-wise fp8 scales and fused epilogue fields (bias, residual, silu_mul) on the same kernel:
# 1-CTA 128x128 variants (compiled and SASS-checked; unmeasured), the CTA pairs in the full tier.
SM100_FORMS_TEST = (
    dict(**FP8, row_scale=True, bias=True, residual=True, tile=(128, 128, 128)),
    dict(**BF16, bias=True, residual=True, pair=True, tile=(256, 128, 64), cluster=(2, 1)),
    dict(**BF16, silu_mul=True, residual=True, tile=(128, 128, 64)),
    dict(ab="bf16", c="e4m3", fp8_groups=True, tile=(128, 128, 64)),
)
# (Default: ~0.14 MB a variant with its share of the host library; two here and one grouped GEMM
# keep the Blackwell forms under 0.5 MB of the default bundle.)
SM100_FORMS_DEFAULT = (
    dict(**FP8, row_scale=True, tile=(128, 128, 128)),
    dict(**BF16, silu_mul=True, tile=(128, 128, 64)),
)
SM100_FORMS_FULL = SM100_FORMS_DEFAULT + SM100_FORMS_TEST + (
    dict(**BF16, bias=True, tile=(128, 128, 64)),
    dict(**BF16, residual=True, tile=(128, 128, 64)),
    dict(**BF16, silu_mul=True, residual=True, tile=(128, 128, 64)),
    dict(**FP8, row_scale=True, pair=True, tile=(256, 256, 128), cluster=(2, 1)),
    dict(**FP8, row_scale=True, tile=(64, 64, 128)),
    dict(**BF16, bias=True, residual=True, tile=(128, 128, 64)),
    dict(**BF16, bias=True, pair=True, tile=(256, 256, 64), cluster=(2, 1)),
    dict(**BF16, residual=True, pair=True, tile=(256, 256, 64), cluster=(2, 1)),
    dict(**BF16, bias=True, residual=True, pair=True, tile=(256, 256, 64), cluster=(2, 1)),
    dict(**FP8, row_scale=True, bias=True, residual=True, pair=True, tile=(256, 256, 128), cluster=(2, 1)),
)

# --- packed fp8 decode GEMM (gemm/decode.py; sm_90 and the Blackwell targets) ----------------------
# (warps_n, warps_k, atoms, unroll, cluster_k); each also as an early_b twin.
DECODE_SHAPES = {
    "test": ((1, 8, 4, 2, 2),),
    "default": ((1, 8, 4, 2, 2), (2, 4, 4, 2, 2)),
}

# --- sm90 split-K over the persistent grid with the in-kernel fix-up (gemm/sm90_splitk.py) ---------
# Every row built with pdl=True.  ``splits`` parts per output tile.
SM90_SPLITK_TEST = (dict(**BF16, tile=(64, 128, 64), schedule="ws", splits=4),)
SM90_SPLITK_DEFAULT = ()
# The tail split (whole tiles first, the last partial round split along K): up to 16 parts.  The
# default tier keeps the tiles the selection picks on the off-grid tune and report halves (H100,
# notes/gemm-sm90.md "The tail split"); the others are in the full tier.
SM90_TAIL_DEFAULT = tuple(
    dict(**BF16, tile=t, schedule="coop", cluster=c, splits=16, tail=True)
    for t, c in (((128, 192, 64), (2, 1)), ((128, 256, 64), (2, 1)))
)
SM90_TAIL_FULL = tuple(
    dict(**BF16, tile=t, schedule="coop", cluster=c, splits=16, tail=True)
    for t, c in (((128, 256, 64), (1, 2)), ((128, 192, 64), (1, 1)), ((128, 128, 64), (2, 1)),
                 ((128, 128, 64), (1, 2)), ((128, 128, 64), (1, 1)))
)
# fp8 e4m3 (fast accumulation) tail splits, row and per-tensor scales applied after the parts' sum.
# Default: the row-scaled 128x128 and 128x192 2x1 tails, which the selection takes where the last
# round of whole tiles would leave most SMs idle between one and four rounds (H100, by name: M 1024 x
# 2112 x 7168 31.1 us against the ping-pong pick's 38.6, M 2048: 52.1 against 60.5).
SM90_TAIL_FP8_DEFAULT = tuple(
    dict(**FP8, tile=t, schedule="coop", cluster=(2, 1), splits=8, tail=True, fast_accum=True, row_scale=True)
    for t in ((128, 128, 128), (128, 192, 128))
)
SM90_TAIL_FP8_FULL = tuple(
    dict(**FP8, tile=t, schedule="coop", cluster=(2, 1), splits=sp, tail=True, fast_accum=True, row_scale=row)
    for t, sp, row in (((128, 256, 128), 4, True), ((128, 192, 128), 8, False))
) + (dict(**FP8, tile=(128, 128, 128), schedule="coop", cluster=(1, 1), splits=8, tail=True, fast_accum=True,
          row_scale=True),)
SM90_TAIL_TEST = (dict(**BF16, tile=(128, 128, 64), schedule="coop", cluster=(1, 1), splits=16, tail=True),)
SM90_SPLITK_FULL = tuple(
    dict(**BF16, tile=t, schedule=s, cluster=c, splits=k)
    for t, s, c, ks in (((128, 256, 64), "coop", (1, 2), (2, 3, 4)), ((128, 192, 64), "coop", (1, 2), (2, 3)),
                        ((128, 192, 64), "coop", (1, 1), (3,)),
                        ((128, 128, 64), "coop", (1, 2), (2, 3, 4)), ((64, 128, 64), "ws", (1, 2), (4, 6)),
                        ((64, 128, 64), "ws", (1, 1), (4, 7)))
    for k in ks
)
