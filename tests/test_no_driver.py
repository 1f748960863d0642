"""Without a usable CUDA driver or device, every C entry point of the host library and the Python
loader return one error that says so, and print nothing (the exported headers' module loader would
print a line per device of a device count that was never set).  Runs in a subprocess, stdout
captured; skipped where a CUDA device is usable."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, _have_gpu

pytestmark = pytest.mark.skipif(_have_gpu(), reason="a CUDA device is usable here: this tests its absence")

# cudaErrorInsufficientDriver (no driver, or one older than the runtime), cudaErrorNoDevice
NO_DEVICE = (35, 100)
DRIVER_REASON = r"CUDA driver version is insufficient|no CUDA-capable device"

SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, "tests")
    from c_selection import AttentionProblem, CLib, Device, GemmProblem, I64x3, Selection
    from conftest import Recorder
    from factory.runtime import Bundle, LaunchError

    bundle, name, out = sys.argv[1:4]
    meta = json.load(open(bundle + "/manifest.json"))
    c = CLib(bundle + "/" + meta["host_library"]["path"])
    lib, res = c.lib, {}

    def record(key, rc):
        res[key] = [rc, c.message()]

    record("load", getattr(lib, "fx_load_" + name)())
    record("launch", getattr(lib, "fx_launch_" + name)(None))  # loads first: the arguments are never read
    dev = Device()
    record("device_query", lib.fx_device_query(0, ctypes.byref(dev)))
    record("device_query_null", lib.fx_device_query(0, None))
    h100 = c.device((9, 0), 132, "planned H100")
    F = [i << 24 for i in range(1, 7)]  # aligned, disjoint, never dereferenced: the load fails first
    g = GemmProblem(1, 1, 256, 256, 256, 1, F[0], I64x3(256, 1, 0), F[1], I64x3(256, 1, 0), F[2], I64x3(256, 1, 0))
    sel = Selection()
    record("gemm", lib.fx_gemm(ctypes.byref(h100), ctypes.byref(g), None, 0, None, ctypes.byref(sel)))
    res["gemm_variant"] = sel.name.decode() if sel.name else None
    g.k = 0
    record("gemm_k0", lib.fx_gemm(ctypes.byref(h100), ctypes.byref(g), None, 0, None, None))
    s = (128 * 8 * 64, 8 * 64, 64)
    a = AttentionProblem(1, 0, 1, 128, 128, 8, 8, 64, *F[:4], I64x3(*s), I64x3(*s), I64x3(*s), I64x3(*s),
                         F[4], (ctypes.c_int64 * 2)(8 * 128, 128), None, None, 0, 0, 0.0)
    record("attention", lib.fx_attention(ctypes.byref(h100), ctypes.byref(a), None, 0, None, None))
    lib.fx_get_last_error()
    b = Bundle.open(bundle, capability=(9, 0))
    try:
        b.preload(("gemm",))
        res["python"] = None
    except LaunchError as e:
        res["python"] = str(e)
    json.dump(res, open(out, "w"))
""")


def test_every_entry_point_names_the_missing_driver_and_prints_nothing(test_bundle, tmp_path):
    m = json.loads((test_bundle / "manifest.json").read_text())
    name = sorted(k for k, v in m["variants"].items() if v["target"] == "sm_90" and v["op"] == "gemm")[0]
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(test_bundle), name, str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "", r.stdout[:500]  # not one line of "Got Cuda Error"
    res = json.loads(out.read_text())
    for key, who in (("load", name), ("launch", name), ("device_query", "fx_device_query")):
        rc, msg = res[key]
        assert rc in NO_DEVICE and msg.startswith(f"{who}: no usable CUDA device (cudaError"), (key, rc, msg)
    # fx_gemm / fx_attention: refused by whichever check meets the missing driver first (the module
    # load, a device check of the pointers, the K = 0 memset), with the driver's reason
    for key in ("gemm", "attention", "gemm_k0"):
        rc, msg = res[key]
        assert rc != 0 and re.search(DRIVER_REASON, msg), (key, rc, msg)
    assert res["device_query_null"] == [-1, "fx_device_query: out must not be NULL"]
    assert res["python"] and "no usable CUDA device" in res["python"], res["python"]
