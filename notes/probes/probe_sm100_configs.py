#!/usr/bin/env python3
"""Probe (no GPU): does every Blackwell GEMM config that ``GemmSm100.can_implement`` accepts
compile for sm_100a, pass the trace-time plan checks (SharedStorage = the smem plan, the DSL's TMEM
columns = the plan's, the epilogue tile) and show its SASS requirements?  One config per class of
(dtypes, majorness, pair, MMA M, N < 128 or not, cluster or not) over the grid below.

Answer (2-core build machine, DSL 4.8.1, 2026-11-25, branch `blackwell` after 6df518e;
notes/gemm-sm100.md): 120 of 120 sampled configs compiled and passed, among them CTA pairs with
a 128-row MMA (64 rows per CTA), 64-row single-CTA tiles up to N = 256, M-major A, N-major B, fp32
output and 4x1 clusters.  So ``can_implement`` admits nothing that fails to build; whether any of
it computes the right numbers is unknown (no Blackwell GPU).

  python3 notes/probes/probe_sm100_configs.py [OUT_DIR]"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory.compiler.compile import init_worker  # noqa: E402

init_worker("sm_100a")  # before anything imports cutlass (AOT notes, trap 3)

from factory.compiler import cubin as cb  # noqa: E402
from factory.compiler.sass import sass_problems  # noqa: E402
from factory.compiler.compile import compile_variant  # noqa: E402
from factory.gemm.sm100 import GemmSm100  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sm100-probe-"))
    ok, bad, seen = 0, 0, set()
    grid = itertools.product(("bf16", "e4m3"), ("bf16", "f32"), ("k", "m"), ("k", "n"), (False, True),
                             (64, 128, 256), (32, 64, 96, 128, 256), ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1)))
    for ab, c, am, bm, pair, tm, tn, cl in grid:
        v = GemmSm100(target="sm_100a", ab=ab, c=c, a_major=am, b_major=bm, pair=pair,
                      tile=(tm, tn, 128 if ab == "e4m3" else 64), cluster=cl)
        key = (ab, c, am, bm, pair, tm, tn >= 128, cl != (1, 1))
        if v.can_implement() is not None or key in seen:
            continue
        seen.add(key)
        try:
            compile_variant(v, out)
            problems = sass_problems(v.target, v.sass_requirements(), cb.disassemble(out / f"{v.name}.cubin"))
        except Exception as e:  # noqa: BLE001 - report every failure
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            bad += 1
            print("BAD", v.name, problems)
        else:
            ok += 1
    print(f"{ok} of {ok + bad} configs compiled with their SASS requirements met")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
