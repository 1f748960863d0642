"""The Blackwell datacenter (sm100 family) GEMM cost model: a roofline from published B200 figures.

UNMEASURED.  No Blackwell GPU has run any of this: every constant below is either a published B200
figure (``B200``) or an assumption (``MODEL``), and the picks it makes are what its reasoning says,
not what a measurement showed.  ``scripts/fit_cost_model.py --family sm100`` fits ``MODEL`` to a
tuning table once a B200 has measured one (``scripts/tune.py``); until then ``tests/test_cost_sm100.py``
only checks that the model is monotone and that its picks follow from its reasoning.

This module is the model's one description: its constants (generated into the host library by
compiler/selection.py) and what each means; the model's code is ``sm100_estimate_us`` in
``compiler/csrc/fx_select.c`` (for tools: ``Selector.estimate_us``).  Standard library only.

The model, per manifest entry of the sm100 family (``tile`` = the CTA tile, ``mma_tile``,
``cta_group``, ``cluster``, ``stages``):

* **Mainloop**, per CTA and k-block: the tensor core's time for the CTA's share of the MMA tile at
  the dtype's published dense peak per SM (``rate_m64`` of it for a 64-row MMA, or a 128-row one
  over a CTA pair: half the datapath), against the time to read the operands out of shared memory
  (``smem_bytes_per_clk``): the CTA's A rows and its B rows (a pair splits B's rows between its two
  CTAs: half the reads per SM, the reason CTA pairs exist).  The longer of the two, plus
  ``issue_overlap`` of the shorter.
* **Waves**: the persistent grid is the SMs in whole clusters (the tile grid rounded up to whole
  clusters); CTA tiles / grid waves, the last one partial.
* **DRAM**: A, B (re-read where the operand exceeds half the L2 and the resident window cannot
  keep it: the Hopper model's window rule), C written once, at ``hbm_eff`` of the published HBM
  bandwidth; but no faster than each CTA's pipeline allows: ``stages`` k-blocks in flight per
  ``latency_us`` round trip (Little's law), which is what decode shapes (M <= 16) hit.
* **L2 -> SM**: every CTA's operand bytes per k-block (multicast counted once per cluster
  row/column, a pair's B half once) at ``l2_tbs``: what makes small tiles lose on large problems.
* time = max(compute, memory) + ``mem_overlap``·min(compute, memory) + ``fixed_us``
  + ``wave_us``·(waves - 1).
"""

from __future__ import annotations

# Published B200 (SXM, HGX B200, 1000 W) figures.  NVIDIA's HGX B200 / DGX B200 datasheets: dense
# tensor throughput per GPU 2.25 PFLOP/s bf16/fp16, 4.5 fp8 (and MXFP8), 9 fp4 (NVFP4/MXFP4);
# HBM3e 8 TB/s.  148 SMs (2 dies x 74 enabled: NVIDIA; chipsandcheese.com "Nvidia's B200").  L2
# 126 MB (NVIDIA's Blackwell materials; not a measured figure here).  Shared memory 228 KB per SM,
# 227 KB per CTA (Blackwell Tuning Guide).  TMEM 512 columns x 128 lanes x 32 bit = 256 KB per SM.
B200 = {
    "sm_count": 148,
    "dense_pflops": {"bf16": 2.25, "f16": 2.25, "e4m3": 4.5, "e5m2": 4.5, "e2m1": 9.0},
    "hbm_tbs": 8.0,
    "l2_bytes": 126 << 20,
    "smem_per_sm": 228 << 10,
    "tmem_columns": 512,
}
# The tensor core's dense bf16 FLOPs per clock per SM: 2 x the Hopper SM's 4096 (H100 SXM: 989
# TFLOP/s = 132 SMs x 4096 x 1.83 GHz).  With B200's 2.25 PFLOP/s over 148 SMs that is a 1.86 GHz
# clock, which the model uses to turn clocks into time.
FLOPS_PER_CLK_BF16 = 8192
CLOCK_GHZ = B200["dense_pflops"]["bf16"] * 1e6 / (B200["sm_count"] * FLOPS_PER_CLK_BF16)
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1, "e2m1": 0.5}

# Assumptions (to be fitted on a B200: scripts/fit_cost_model.py --family sm100):
MODEL = {
    # Shared-memory bytes per clock per SM the MMA can read its operands at (the Hopper SM's 128).
    "smem_bytes_per_clk": 128.0,
    # Share of the tensor core a 64-row MMA (cta_group::1 M=64, or M=128 over a pair) keeps busy.
    "rate_m64": 0.5,
    # The share of the shorter of MMA and operand-read time that does not hide under the longer.
    "issue_overlap": 0.1,
    # Streaming efficiency against the published HBM bandwidth (the H100 sm90 kernels measured
    # 2.5 of 3.35 TB/s: 0.75).
    "hbm_eff": 0.75,
    # A round trip to DRAM under load (us): a CTA with B bytes in flight streams at B / latency.
    "latency_us": 1.0,
    # L2 -> SM operand bandwidth (TB/s), all SMs together: not published; assumed 2.5x HBM.
    "l2_tbs": 20.0,
    # The share of the shorter of compute and memory time that does not overlap (H100 fit: 0.35).
    "mem_overlap": 0.35,
    # Launch, TMEM allocation, pipeline fill, the last tile's epilogue (us; H100 fit: 3.0).
    "fixed_us": 4.0,
    # Per further wave of the persistent grid: the accumulator hand-off and the schedule's
    # bubbles (the epilogue itself overlaps the next tile's mainloop: two TMEM stages).
    "wave_us": 0.5,
}


def flops_per_clk(ab: str) -> float:
    """Dense tensor FLOPs per clock per SM for operands of dtype ``ab`` (bf16's 8192 scaled by the
    dtype's published peak)."""
    peaks = B200["dense_pflops"]
    return FLOPS_PER_CLK_BF16 * peaks.get(ab, peaks["bf16"]) / peaks["bf16"]


# MODEL's keys in the order the host library's fx_model_sm100 holds them (fx_cost_model_set).
MODEL_KEYS = ("smem_bytes_per_clk", "rate_m64", "issue_overlap", "hbm_eff", "latency_us", "l2_tbs",
              "mem_overlap", "fixed_us", "wave_us")
