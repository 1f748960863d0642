#!/usr/bin/env python3
"""Fit a GEMM cost model to a measured tuning table: the sm90 one (factory/runtime/tuning.py MODEL,
the default) or with ``--family sm100`` the Blackwell one (factory/runtime/cost_sm100.py MODEL, whose
constants are assumptions until a B200 has measured a table: scripts/tune.py on a B200, then this).

Input: a tuning.json written by scripts/tune.py (per bucket: every screened variant's graph-replay
time) and the manifest of the bundle it was measured on.  The model is evaluated by that bundle's
host library (``fx_gemm_estimate_us``, the selection's own code, with the candidate constants set by
``fx_cost_model_set``).  Score of a parameter set: the geometric
mean over buckets of (measured time of the model's pick / fastest measured time) — the "regret" —
and the number of buckets where it exceeds 1.1.  Coordinate descent over the MODEL entries, each
tried at a few multiplicative steps, kept when the geometric-mean regret drops.  Prints the fitted
values; it never edits tuning.py (paste what you accept, and note the fit in notes/gemm-sm90.md).
The fit is in-sample: the buckets it scores are the ones it was fitted on; ``--also T.json ...``
scores the current and the fitted model on other tables too (out of sample; a name missing from
the manifest matches its entry with a ``_pdl`` suffix, the same kernel launched with PDL).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.runtime import cost_sm100, tuning  # noqa: E402
from factory.runtime.selector import Selector  # noqa: E402

MODELS = {"sm90": (tuning.MODEL, (9, 0)), "sm100": (cost_sm100.MODEL, (10, 0))}
FAMILY = "sm90"
LIB = None  # the bundle's host library


def regret(table: dict, variants: dict, sm_count: int) -> tuple[float, int, list]:
    model, cc = MODELS[FAMILY]
    sel = Selector(LIB, cc, {"name": None, "sm_count": sm_count})
    sel.set_cost_model(**{FAMILY: model})

    def estimate(v, M, N, K, L, _sms):
        return sel.estimate_us(v["name"], M, N, K, L)

    logs, bad, worst = [], 0, []
    for key, b in table["buckets"].items():
        times = b.get("screen_us") or b["timings_us"]
        times = {n if n in variants else n + "_pdl": t for n, t in times.items()}
        names = [n for n in times if n in variants]
        if not names:
            continue
        M, N, K, L = b["shape"]
        pick = min(names, key=lambda n: (estimate(variants[n], M, N, K, L, sm_count), n))
        r = times[pick] / min(times[n] for n in names)
        logs.append(math.log(r))
        bad += r > 1.1
        worst.append((r, key, pick))
    return math.exp(sum(logs) / len(logs)), bad, sorted(worst, reverse=True)[:8]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tuning_json")
    p.add_argument("manifest")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--also", nargs="*", default=[], help="tuning tables to score out of sample")
    p.add_argument("--family", choices=sorted(MODELS), default="sm90", help="the cost model to fit")
    p.add_argument("--keys", nargs="+", default=None, help="fit only these MODEL entries (default: all)")
    a = p.parse_args()
    global FAMILY, LIB
    FAMILY = a.family
    model = MODELS[a.family][0]
    m = json.loads(Path(a.manifest).read_text())
    LIB = Path(a.manifest).parent / m["host_library"]["path"]
    table = json.loads(Path(a.tuning_json).read_text())
    variants = json.loads(Path(a.manifest).read_text())["variants"]
    sms = table["device"]["sm_count"]
    others = {t: json.loads(Path(t).read_text()) for t in a.also}

    def score_others(label: str) -> None:
        for t, tab in others.items():
            r = regret(tab, variants, tab["device"]["sm_count"])
            print(f"  {label} on {Path(t).name}: regret {r[0]:.4f}, buckets > 1.1: {r[1]}")

    base = regret(table, variants, sms)
    print(f"current model: regret {base[0]:.4f}, buckets > 1.1: {base[1]}")
    score_others("current")
    best = base[0]
    for _ in range(a.rounds):
        for k in a.keys or list(model):
            v0 = model[k]
            # The sm100 constants are guesses: wider steps first.
            for f in ((0.5, 2.0) if a.family == "sm100" else ()) + (0.8, 0.9, 0.95, 1.05, 1.1, 1.25):
                model[k] = v0 * f
                r = regret(table, variants, sms)[0]
                if r < best - 1e-4:
                    best, v0 = r, model[k]
                model[k] = v0
    fit = regret(table, variants, sms)
    print(f"fitted model:  regret {fit[0]:.4f}, buckets > 1.1: {fit[1]}")
    score_others("fitted")
    print("MODEL = " + json.dumps({k: round(v, 3) for k, v in model.items()}))
    for r, key, pick in fit[2]:
        print(f"  {r:.2f}  {key}  {pick.split('_ak_')[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
