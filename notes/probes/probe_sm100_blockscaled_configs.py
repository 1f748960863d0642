#!/usr/bin/env python3
"""Probe (no GPU): does every block-scaled Blackwell GEMM config that
``GemmSm100BlockScaled.can_implement`` accepts compile for sm_100a, pass the trace-time plan checks
(SharedStorage = the smem plan, the scale factors' smem bytes, the DSL's accumulator TMEM columns,
the epilogue tile) and show its SASS requirements (block-scaled MMA with TMEM scale-factor
operands, UTCCP into the planned columns, the pair and multicast forms)?  Grid: every format,
1 CTA or a pair, clusters 1x1 / 2x1 / 1x2 / 2x2 / 4x1 / 2x4 with bf16 out, and f16 / f32 out on
the 1x1 and 2x1 clusters.

Answer (2-core build machine, DSL 4.8.1, 2026-11-25, branch `bw-blockscaled`;
notes/gemm-sm100.md): 48 of 48 accepted configs compiled and passed (12 of the grid refused:
pairs need an even cluster M); registers 40-56, no stack frame.  So ``can_implement`` admits
nothing that fails to build; whether any of it computes the right numbers is unknown (no
Blackwell GPU).

  python3 notes/probes/probe_sm100_blockscaled_configs.py [OUT_DIR]"""

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
from factory.gemm.sm100_blockscaled import GemmSm100BlockScaled  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sm100bs-probe-"))
    ok, bad, refused = 0, 0, 0
    grid = itertools.product(("nvf4", "mxf8e4m3", "mxf8e5m2"), (False, True),
                             ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (2, 4)), ("bf16", "f16", "f32"))
    for fmt, pair, cl, c in grid:
        if c != "bf16" and cl not in ((1, 1), (2, 1)):
            continue
        v = GemmSm100BlockScaled(target="sm_100a", pdl=True, fmt=fmt, c=c, pair=pair, cluster=cl,
                                 tile=(256 if pair else 128, 128, 256 if fmt == "nvf4" else 128))
        if v.can_implement() is not None:
            refused += 1
            continue
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
    print(f"{ok} of {ok + bad} accepted configs compiled with their SASS requirements met ({refused} refused)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
