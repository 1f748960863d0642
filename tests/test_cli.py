"""The command line on this GPU-less machine: ``doctor`` and target lists with commas."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def _factory(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "factory", *args], cwd=ROOT, capture_output=True, text=True)


def test_doctor_reports_the_bundle_and_the_machine(test_bundle, tmp_path):
    r = _factory("doctor", str(test_bundle), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["host library"].startswith("ok")
    assert rep["built with"]["nvidia-cutlass-dsl"]
    assert "gemm/sm90" in rep["variants by target"]["sm_90a"]
    assert "python" in rep and "torch" in rep and "GPU" in rep
    # The damaged bundle through the same report, in this process (the command line is shown
    # above with --json and below in text form).
    from factory.doctor import report

    copy = tmp_path / "b"
    shutil.copytree(test_bundle, copy)
    lib = copy / json.loads((copy / "manifest.json").read_text())["host_library"]["path"]
    lib.write_bytes(lib.read_bytes()[:-1])
    assert "MISSING, TRUNCATED OR ALTERED" in report(copy)["host library"]
    assert "no manifest.json" in _factory("doctor", str(tmp_path / "none")).stdout


def test_targets_and_ops_take_commas(tmp_path):
    from factory.compiler.builder import build

    # The filter matches nothing, so nothing compiles: the error shows how the lists were read.
    with pytest.raises(ValueError, match=r"targets=\['sm_80', 'sm_90a', 'sm_89'\] ops=\['gemm', 'attention'\]"):
        build(tmp_path / "b", ["sm_80,sm_90a", "sm_89"], ["gemm,attention"], tier="test", name_filter="nothing*")
    r = _factory("build", "--targets", "sm_80,sm_90a", "--ops", "gemm", "--tier", "test", "--filter", "nothing*",
                 "--out", str(tmp_path / "b"))
    assert r.returncode != 0 and "targets=['sm_80', 'sm_90a']" in r.stderr


def test_version_and_short_errors(test_bundle, tmp_path):
    from factory import __version__

    r = _factory("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kernel-factory {__version__}"
    # a wrong variant name: the closest names, never the whole list, no traceback
    m = json.loads((test_bundle / "manifest.json").read_text())
    name = sorted(m["variants"])[0]
    r = _factory("inspect", str(test_bundle), name[:-3] + "zzz")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: no variant") and name in r.stderr and len(r.stderr) < 1200, r.stderr
    assert r.stderr.count("\n") == 1
    # a path that is not a bundle: one line
    r = _factory("list", str(tmp_path / "none"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "no manifest.json" in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_verify_reports_progress(test_bundle, monkeypatch):
    from factory import verify as v

    seen = []
    monkeypatch.setattr(v, "disassemble", lambda cubin: seen.append(cubin) or "")
    monkeypatch.setattr(v, "sass_problems", lambda *a, **k: [])
    monkeypatch.setattr(v, "resource_problems", lambda *a, **k: [])
    calls = []
    v.verify(test_bundle, lambda done, total, name: calls.append((done, total, name)))
    n = len(json.loads((test_bundle / "manifest.json").read_text())["variants"])
    assert [c[0] for c in calls] == list(range(n)) and all(c[1] == n for c in calls)
