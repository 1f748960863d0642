#!/usr/bin/env python3
"""Run every variant of a bundle that fits the GPU present against a float32 reference.

Fresh random inputs, NaN-poisoned outputs; prints a table; exits non-zero on any failure.
``--json`` writes the results (device, driver, versions, per-variant errors): the record of which
variants were executed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("bundle", nargs="?", default="artifacts/default")
    p.add_argument("--op", action="append", help="only these ops (default: all)")
    p.add_argument("--filter", default=None, help="substring of variant names")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("smoke: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    ops = a.op or sorted({v["op"] for v in bundle.manifest["variants"].values()})
    results, skipped = [], []
    for op in ops:
        check = getattr(testing, f"smoke_{op}", None)
        entries = [e for e in bundle.candidates(op) if not a.filter or a.filter in e["name"]]
        if check is None:
            skipped += [e["name"] for e in entries]
            continue
        for e in entries:
            try:
                results += check(bundle, e)
            except Exception as ex:  # noqa: BLE001 - a crash is a failure of that variant
                results.append({"variant": e["name"], "shape": None, "rel_err": None, "nan": None,
                                "ok": False, "error": f"{type(ex).__name__}: {ex}"})
        plain = [e for e in entries if e.get("family") != "decode"]  # (decode: graphs in tests/test_decode.py)
        if op == "gemm" and plain:
            results.append(testing.check_graph_capture(bundle, plain[0]))
    width = max([len(r["variant"]) for r in results] + [10])
    print(f"{'variant'.ljust(width)}  {'problem':22}  {'rel err':>9}  {'NaN':>5}  result")
    for r in results:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        shape = "-" if r["shape"] is None else ",".join(map(str, r["shape"]))
        print(f"{r['variant'].ljust(width)}  {shape:22}  {err:>9}  {str(r['nan']):>5}  "
              f"{'ok' if r['ok'] else 'FAIL ' + r.get('error', '')}")
    failed = [r for r in results if not r["ok"]]
    names = sorted({r["variant"] for r in results})
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed "
          f"({len(names)} variants on {torch.cuda.get_device_name()})"
          + (f"; no smoke check for {len(skipped)} variants" if skipped else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "capability": list(bundle.capability),
            "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "bundle_versions": bundle.manifest["versions"], "results": results, "skipped": skipped,
        }, indent=1))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
