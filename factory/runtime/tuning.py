"""GEMM (and attention) tuning data: shape buckets, the bundle's ``tuning.json``, and the cost model used without it.

Standard library only (the runtime never imports the DSL; torch is not needed here either).

``tuning.json`` (written by ``scripts/tune.py`` on the GPU, read by ``Bundle``)::

    {"schema": 1, "created": "...",
     "device": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "capability": [9, 0],
                "driver": "...", "torch": "...", "cuda": "..."},
     "manifest_sha256": "<sha256 of the bundle's manifest.json>",
     "method": {...how it was timed...},
     "buckets": {"bf16>bf16:kk:m16_n4096_k4096_l1": {"shape": [16, 4096, 4096, 1],
                 "winner": "<variant>", "timings_us": {"<variant>": 12.3, ...}}, ...},
     "attention": {"attention:bf16:d128:causal:q4096_k4096_bh32": {"shape": [B, Hq, Hkv, Sq, Sk, D],
                   "winner": "<variant>", "timings_us": {...}}, ...}}

``attention`` (optional; ``scripts/tune.py attention``): dense attention buckets
(:func:`attention_bucket_key`), consumed by the selection (compiler/csrc/fx_select.c) after
the split-KV / packed-GQA decode rules.

The table is compiled into the bundle's host library by ``python -m factory link`` (when its
manifest hash matches) and used only where the device name and SM count match; otherwise the
selection (compiler/csrc/fx_select.c ``estimate_us``) ranks by the cost model whose constants are
``MODEL`` below (this module is their one description; the model's code is in C, evaluated for
tools by ``Selector.estimate_us``).  Either way the choice is made once per problem key and cached
by ``runtime/gemm.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SCHEMA = 1
FILE = "tuning.json"


# --- buckets -------------------------------------------------------------------------------------
def m_bucket(m: int) -> int:
    """Upper bound of M's bucket: decode (<= 16), then powers of two (32, 64, 128, ...)."""
    return max(16, 1 << max(0, (m - 1).bit_length()))


def nk_bucket(x: int) -> int:
    """N and K rounded up to 3 significant bits (steps of 1/4 of the power of two below): every
    Llama projection size (4096, 6144, 10240, 14336, 28672, 57344, ...) is its own bucket."""
    if x <= 64:
        return 64
    step = 1 << max(0, x.bit_length() - 3)
    return -(-x // step) * step


def bucket_shape(M: int, N: int, K: int, L: int) -> tuple[int, int, int, int]:
    """The representative (largest) shape of the bucket a problem falls into: what tune.py times."""
    return m_bucket(M), nk_bucket(N), nk_bucket(K), 1 << max(0, (L - 1).bit_length())


def bucket_key(ab: str, c: str, a_major: str, b_major: str, M: int, N: int, K: int, L: int) -> str:
    m, n, k, l_ = bucket_shape(M, N, K, L)
    return f"{ab}>{c}:{a_major}{b_major}:m{m}_n{n}_k{k}_l{l_}"


# --- attention buckets (dense problems; scripts/tune.py attention) ----------------------------------
def pow2_bucket(x: int) -> int:
    """Upper bound of x's power-of-two bucket (1, 2, 4, ...)."""
    return 1 << max(0, (x - 1).bit_length())


def attention_bucket_key(dtype: str, head_dim: int, causal: bool, sq: int, sk: int, bh: int) -> str:
    """The bucket of a dense attention problem: dtype, head_dim, causal, seqlen_q, seqlen_k and
    batch x q-heads, each sequence length and batch x heads rounded up to a power of two.  (A
    tuning table names only the buckets it measured: scripts/tune.py times seqlen_q = seqlen_k.)"""
    return (f"attention:{dtype}:d{head_dim}:{'causal' if causal else 'full'}:"
            f"q{pow2_bucket(sq)}_k{pow2_bucket(sk)}_bh{pow2_bucket(bh)}")


# --- the table -----------------------------------------------------------------------------------
def manifest_sha256(bundle_path: str | Path) -> str:
    return hashlib.sha256((Path(bundle_path) / "manifest.json").read_bytes()).hexdigest()


class Tuning:
    """A loaded table: ``winner(key)`` or None."""

    def __init__(self, data: dict):
        self.data = data
        buckets = data.get("buckets", {})
        self._winners = {k: b["winner"] for k, b in buckets.items() if b.get("winner")}
        # Measured separately: the bucket's fastest early_b variant, for a constant B.
        self._const = {k: b["b_constant"]["winner"] for k, b in buckets.items()
                       if (b.get("b_constant") or {}).get("winner")}
        # Decode buckets (fp8): the packed-weight decode variants on packed weights, without and
        # with b_constant (runtime/packed.py).
        self._packed = {(k, bc): b["packed"][f] for k, b in buckets.items() if b.get("packed")
                        for bc, f in ((False, "winner"), (True, "b_constant_winner")) if b["packed"].get(f)}
        # Attention buckets (attention_bucket_key -> the fastest variant measured there).
        self._attention = {k: b["winner"] for k, b in data.get("attention", {}).items() if b.get("winner")}

    def winner(self, key: str, b_constant: bool = False, packed: bool = False) -> str | None:
        if packed:
            return self._packed.get((key, b_constant))
        return (self._const if b_constant else self._winners).get(key)

    def attention_winner(self, key: str) -> str | None:
        return self._attention.get(key)

    def __len__(self) -> int:
        return len(self._winners)


def read(bundle_path: str | Path, manifest_hash: str) -> tuple[dict | None, str]:
    """The bundle's tuning.json if it is readable, of this schema and measured for the manifest
    whose sha256 is ``manifest_hash``, else (None, why not).  (The device is the caller's check.)"""
    p = Path(bundle_path) / FILE
    if not p.exists():
        return None, "no tuning.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, RecursionError) as e:
        return None, f"tuning.json unreadable: {e}"
    if not isinstance(data, dict):
        return None, "tuning.json unreadable: not a JSON object"
    if data.get("schema") != SCHEMA:
        return None, f"tuning.json schema {data.get('schema')}, this loader reads {SCHEMA}"
    if data.get("manifest_sha256") != manifest_hash:
        return None, "tuning.json was measured for another build of this bundle (manifest hash differs)"
    return data, "ok"


def load(bundle_path: str | Path, device: dict) -> tuple[Tuning | None, str]:
    """The bundle's tuning table if it was measured on this device for this very manifest, else
    (None, why not).  ``device``: {"name", "sm_count"} of the GPU selection is for."""
    if not (Path(bundle_path) / FILE).exists():  # (before hashing the manifest)
        return None, "no tuning.json"
    data, why = read(bundle_path, manifest_sha256(bundle_path))
    if data is None:
        return None, why
    dev = data.get("device", {})
    if not isinstance(dev, dict):
        return None, "tuning.json unreadable: its device is not a JSON object"
    if dev.get("name") != device.get("name") or dev.get("sm_count") != device.get("sm_count"):
        return None, (f"tuned on {dev.get('name')} ({dev.get('sm_count')} SMs), this is "
                      f"{device.get('name')} ({device.get('sm_count')} SMs)")
    try:  # (a table of another shape than tune.py writes: selection falls back to the cost model)
        return Tuning(data), "ok"
    except (AttributeError, TypeError, KeyError) as e:
        return None, f"tuning.json unreadable: {type(e).__name__}: {e}"


def pick_winner(timings_us: dict[str, float], model_pick: str | None, margin: float = 0.03) -> str:
    """The bucket's winner: the fastest measured variant, unless the cost model's own pick was
    measured within ``margin`` of it (then the model's pick: a few percent is inside the run-to-run
    noise of one H100, and the model's choice generalises to the whole bucket)."""
    best = min(timings_us, key=timings_us.get)
    if model_pick in timings_us and timings_us[model_pick] <= (1 + margin) * timings_us[best]:
        return model_pick
    return best


def write(bundle_path: str | Path, data: dict) -> Path:
    """Write ``tuning.json`` atomically (a reader never sees half a file)."""
    p = Path(bundle_path) / FILE
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(p)
    return p


# --- the cost model (no tuning data) --------------------------------------------------------------
# Constants for the Hopper (sm90) family, from H100 SXM graph-replay measurements (2026-11-22,
# factory/gemm/sm90.py _default and notes/gemm-sm90.md):
#   bf16 8192^3: 128x256 c2x1 coop 775 TFLOP/s, 256x128 c1x2 768, 128x128 c1x2 ping-pong 654,
#   128x128 c1x1 coop 477 (cuBLAS ~790); fp8 4096^3 128x256 c2x1 fast-accum 1404 (2x the bf16
#   rate is the ceiling); decode M=16 N=4096 K=14336 (117 MB of weights) 48.8 us with 128 CTAs
#   (split-K 2) vs 54.9 us with 64: ~2.4 TB/s when every SM streams, ~11 % less from half the SMs.
_PEAK_TFLOPS = {"bf16": 800.0, "f16": 800.0, "e4m3": 1600.0, "e5m2": 1600.0}
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
_STREAM_TBS = 2.5  # weight-streaming bandwidth of the kernel with a full grid (H100 SXM)
# MODEL["grid_bw_exp"]: bandwidth ~ (busy SMs / SMs)^exp (0.17: 64 of 132 SMs give 0.89x, measured).
# MODEL["fixed_us"]: launch, prologue, pipeline fill and drain; MODEL["split_us"]: per extra K slice
# (cluster pairing, the DSMEM reduction); MODEL["overlap"]: the share of the shorter of compute
# and memory that does not hide under the longer.
_L2_BYTES = 50 << 20  # H100 SXM


# Mainloop efficiency (fraction of the dtype's peak) per kind of config, and the costs the model
# adds; the values after the measured anchors above were fitted to the H100 tuning table of the
# default tier (scripts/tune.py; notes/gemm-sm90.md gives the fit's regret); v3 (33 variants) added
# the split-K tile cost, useful-CTA bandwidth, the sparse-grid coop rate and eff_small 0.45; v6
# (39 variants) the narrow-tile and per-tile terms, then scripts/fit_cost_model.py on the v6
# table (regret 1.032 -> 1.027; on the v4 and v5 tables it did not see: 1.031 -> 1.026, 1.035 ->
# 1.026).
MODEL = {
    # Refit on the v13 table (scripts/fit_cost_model.py: regret 1.0299 -> 1.0242; out of sample
    # v12 1.0269 -> 1.0244, v11 1.0274 -> 1.0251, v10 1.0234 -> 1.0229; notes/gemm-sm90.md).
    # eff_256x128_c1x2 (1.018 then) and eff_coop_narrow: fitted (--keys) on the tune half of
    # scripts/bench_offgrid.py's sweeps (Llama 3, Qwen, MoE experts, H100); the other keys left
    # as they were, which keeps every fp8 pick of the v16/v17 tuning tables' buckets (notes/
    # gemm-sm90.md, "Off the tuning grid").
    "eff_256x128_c1x2": 0.967, "eff_128x256_c2x1": 0.921, "eff_large": 0.9,
    "eff_pp": 0.35, "eff_coop_mc": 0.924, "eff_coop": 0.7, "eff_small": 0.384,
    "eff_swap_base": 0.11, "eff_swap_slope": 0.312,
    "fp8_promoted": 0.9, "fp8_fast": 0.9,
    "split_us": 1.8, "fixed_us": 3.0, "overlap": 0.35, "grid_bw_exp": 0.1, "split_tile_exp": 1.0,
    "narrow_exp": 1.0, "tile_us": 1.0,
    # 13-stage multicast swap tiles ran 2-10 % faster than their 8-stage twins in every bucket of
    # the v10 table; any factor 1.02-1.15 gives the same picks there (regret 1.0255 -> 1.0234).
    "deep_bw": 1.05,
    # bf16 swap tiles with 128-wide K stages (two 128-byte rows) streamed 1.4-6 % faster than
    # their 64-wide twins at M = 16 (notes/results/probe_overhead_h100.json).
    "wide_k_bw": 1.05,
    # 128x64 / 128x96 cooperative tiles (two consumer warpgroups on a narrow tile).
    "eff_coop_narrow": 0.48,
    # Split-K with the in-kernel fix-up (gemm/sm90_splitk.py): per wave and (splits + 1), the
    # partial tiles' store, wait and read back, in us per 128x128 tile.  Fitted (one key) on the
    # tune half of scripts/bench_offgrid.py's sweep (H100, regret 1.0274 without split -> 1.0238
    # at 2.0-2.5; notes/gemm-sm90.md, "Split-K over the grid").
    "wsplit_us": 2.5,
    # The tail split (gemm/sm90_splitk.py, tail=True): the fix-up round of the split last round
    # (every part's partial out, the wait for the tile's slowest part, its share of the sum back),
    # in us per 128x128 tile.
    "tail_us": 16.0,
    # 128x128 fp8 ping-pong tiles with fast accumulation (each consumer warpgroup a whole tile,
    # its epilogue under the other's main loop; competing at M 512..1024 with a 2x1 cluster, above
    # with any other: fx_select.c pp_fp8_competes): fitted on the H100's
    # row-scaled tiles by name at M 1024-16384 (regret 1.11 -> 1.007 over 9 shapes; notes/gemm-fp8.md).
    "eff_pp_fp8": 1.1,
    # The fp8 tail split's fix-up round (row scales, fast accumulation; tail_us's term for e4m3
    # operands): by name on an H100 at M 1024 / 2048 x 2112 x 7168 the 128x128 / 128x192 tails ran
    # 0.81x / 0.86x the ping-pong pick, which the model's ratios give at 3-4 us; 8 kept as a margin
    # (notes/gemm-fp8.md, "The tail split for fp8").
    "tail_us_fp8": 8.0,
}

# MODEL's keys in the order the host library's fx_model holds them (compiler/selection.py generates
# the constants into C; fx_cost_model_set reads them in this order).
MODEL_KEYS = ("eff_256x128_c1x2", "eff_128x256_c2x1", "eff_large", "eff_pp", "eff_coop_mc", "eff_coop",
              "eff_small", "eff_swap_base", "eff_swap_slope", "fp8_promoted", "fp8_fast", "split_us",
              "fixed_us", "overlap", "grid_bw_exp", "split_tile_exp", "narrow_exp", "tile_us", "deep_bw",
              "wide_k_bw", "eff_coop_narrow", "wsplit_us", "tail_us",
              "eff_pp_fp8", "tail_us_fp8")
