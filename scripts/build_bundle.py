#!/usr/bin/env python3
"""Build the default bundle into artifacts/default (no GPU needed).

The default bundle: every kernel family for the Ampere/Ada targets (sm_80, sm_86, sm_89), their
sm_90 portability build (runs on an H100), the Hopper (sm_90a) families, the Blackwell
datacenter GEMM (dense and block-scaled MXFP8/NVFP4) and attention (sm_100f: one cubin for 10.0 and
10.3) and the consumer-Blackwell (sm_120a) builds of the Ampere/Ada families
(these two compiled and disassembled only: no Blackwell GPU has run them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.compiler.builder import build  # noqa: E402

DEFAULT_TARGETS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100f", "sm_120a"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "artifacts" / "default"))
    p.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS)
    p.add_argument("--ops", nargs="+", default=None)
    p.add_argument("--tier", default="default", choices=("test", "default", "full"))
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    s = build(a.out, a.targets, a.ops, tier=a.tier, jobs=a.jobs)
    print(f"built {s['bundle']}: {s['variants']} variants ({s['compiled']} compiled, {s['cached']} cached) "
          f"in {s['seconds']} s, {s['bytes'] / 1e6:.2f} MB")
    print("proof labels (docs/proof.md): " + ", ".join(f"{k} {n}" for k, n in sorted(s["proof"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
