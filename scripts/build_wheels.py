#!/usr/bin/env python3
"""Build the wheels a server installs: the pure ``kernel-factory`` wheel (runtime, CLI) and one
kernels wheel per built bundle (``kernel-factory-kernels-sm90`` for a bundle of sm_90 + sm_90a,
...; factory/wheels.py).  Build each target set's bundle first, from the compile cache:

    for t in "sm_80 sm_86 sm_89" "sm_90 sm_90a" "sm_100f" "sm_120a"; do
      python3 -m factory build --targets $t --out artifacts/sets/$(echo $t | cut -d' ' -f1)
    done
    python3 scripts/build_wheels.py artifacts/sets/* --out dist

Prints each wheel's name and size.  ``--no-pure`` skips the pure wheel.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from factory.wheels import build_kernels_wheel, describe  # noqa: E402


def pure_wheel(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", tmp, str(ROOT)], check=True)
        built = next(Path(tmp).glob("kernel_factory-*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        return Path(built.replace(out / built.name))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="*", help="built bundle directories (one kernels wheel each)")
    p.add_argument("--out", default=str(ROOT / "dist"))
    p.add_argument("--no-pure", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    wheels = [] if a.no_pure else [pure_wheel(out)]
    wheels += [build_kernels_wheel(b, out) for b in a.bundles]
    for w in wheels:
        d = describe(w)
        print(json.dumps({**d, "MB": round(d["bytes"] / 1e6, 2), "unpacked_MB": round(d["unpacked_bytes"] / 1e6, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
