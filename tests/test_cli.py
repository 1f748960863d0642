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
