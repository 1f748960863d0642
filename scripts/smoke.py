#!/usr/bin/env python3
"""Run every variant of a bundle that fits the GPU present against a float32 reference.

Fresh random inputs, NaN-poisoned outputs (``factory.testing.check_variant``, the checks of
``tests/test_every_variant_gpu.py``); prints a table; exits non-zero on any failure.  ``--record``
writes the run record (device, driver, versions, commit, per variant its cubin's sha256, largest
error and pass: ``factory/evidence.py``, docs/proof.md) that the build's ``executed`` labels come
from; ``--json`` the per-problem results.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.evidence import RunRecord  # noqa: E402
from factory.runtime import Bundle  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("bundle", nargs="?", default="artifacts/default")
    p.add_argument("--op", action="append", help="only these ops (default: all)")
    p.add_argument("--filter", default=None, help="substring of variant names")
    p.add_argument("--json", default=None, help="per-problem results")
    p.add_argument("--record", default=None, help="the run record: a .json file, or a directory (evidence/runs)")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("smoke: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    ops = a.op or sorted({v["op"] for v in bundle.manifest["variants"].values()})
    results, skipped = [], []
    record = RunRecord(source="scripts/smoke.py " + " ".join(sys.argv[1:]))
    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    for op in ops:
        entries = [e for e in bundle.candidates(op) if not a.filter or a.filter in e["name"]]
        if op not in ("gemm", "gemm_blockscaled", "attention"):
            skipped += [e["name"] for e in entries]
            continue
        for e in entries:
            try:
                got = testing.check_variant(bundle, e, gen)
            except Exception as ex:  # noqa: BLE001 - a crash is a failure of that variant
                got = [{"variant": e["name"], "shape": None, "rel_err": None, "nan": None,
                        "ok": False, "error": f"{type(ex).__name__}: {ex}"}]
            record.add(bundle, e["name"], got)
            results += got
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
    if a.record:
        print(f"run record: {record.write(a.record, bundle)}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "capability": list(bundle.capability),
            "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "bundle_versions": bundle.manifest["versions"], "results": results, "skipped": skipped,
        }, indent=1))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
