"""Fuzzing on the CPU, each fuzzer in a subprocess (a crash fails the test, not the run).

- manifest.json (tests/fuzz_manifest.py): random edits; every consumer accepts or raises BundleError.
- the C structs (tests/fuzz_c_api.c): random and hand-made problems through the host library's own
  C sources (the bundle's src/), built with AddressSanitizer and UndefinedBehaviorSanitizer where
  the compiler offers them, on a machine without a usable CUDA device: no memory error, no
  undefined behaviour, nothing on stdout, no FX_OK without work, a message naming a field for
  every FX_ERR_INPUT, flags other than 0/1 and impossible devices refused, the message cleared on
  success.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAVE_DSL, ROOT, _have_gpu

HERE = Path(__file__).resolve().parent
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=address"]
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=0:protect_shadow_gap=0:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=0"}


def test_manifest_fuzz(test_bundle):
    r = subprocess.run([sys.executable, str(HERE / "fuzz_manifest.py"), str(test_bundle), "20261126", "100"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["failures"] == [] and res["refused"] > res["iterations"] // 3, res


def _compile(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def c_fuzzer(test_bundle, tmp_path_factory) -> tuple[Path, bool]:
    """The fuzz driver linked with the bundle's C sources and objects: (binary, sanitized)."""
    if not HAVE_DSL:
        pytest.skip("the host library links the DSL's static runtime: nvidia-cutlass-dsl is not installed")
    from factory.compiler import toolchain

    cuda = toolchain.cuda_root()
    m = json.loads((test_bundle / "manifest.json").read_text())
    work = tmp_path_factory.mktemp("fuzz")
    objs = []
    for name, v in m["variants"].items():  # the bundle's objects are gzipped
        objs.append(str(work / f"{name}.o"))
        Path(objs[-1]).write_bytes(gzip.decompress((test_bundle / v["files"]["object"]["path"]).read_bytes()))
    out = work / "fuzz_c_api"
    # (-O0: a third of -O1's compile time here; the sanitizers check the same)
    cmd = [toolchain.cc(), "-O0", "-g", "-ffp-contract=off", f"-I{cuda / 'include'}",
           f"-I{test_bundle / 'include'}", f"-I{test_bundle / 'src'}", "-o", str(out),
           str(HERE / "fuzz_c_api.c"), str(test_bundle / "src" / "fx_glue.c"), str(test_bundle / "src" / "fx_select.c"),
           *objs, "-Wl,--whole-archive", str(toolchain.dsl_runtime_static()), "-Wl,--no-whole-archive",
           str(cuda / "lib" / "libcudart_static.a"), "-lm", "-lpthread", "-ldl", "-lrt"]
    r = _compile(cmd[:1] + SANITIZE + cmd[1:])
    if r.returncode == 0:
        return out, True
    r = _compile(cmd)  # a compiler without the sanitizers: the invariants are still checked
    assert r.returncode == 0, r.stderr[-4000:]
    return out, False


def run_c_fuzz(c_fuzzer, seed: int, n: int) -> tuple[dict, str, list[str]]:
    binary, _ = c_fuzzer
    r = subprocess.run([str(binary), str(seed), str(n)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **SAN_ENV})
    assert r.stdout == "", r.stdout[:2000]  # nothing on stdout, ever
    assert r.returncode == 0 and "AddressSanitizer" not in r.stderr, r.stderr[-6000:]
    lines = r.stderr.strip().splitlines()
    ub = sorted({re.sub(r"^.*?/(fx_\w+\.c:\d+):\d+: runtime error: (\S+ \S+ \S+).*$", r"\1 \2", ln)
                 for ln in lines if "runtime error:" in ln})
    return json.loads(lines[-1]), r.stderr, ub


BASIC = ("unknown_return_code", "selection_inconsistent", "input_error_without_message")
HARDENED = ("success_without_work", "message_names_no_field", "message_not_cleared_on_success",
            "boolean_not_0_or_1_accepted", "sm_count_not_positive_accepted", "negative_max_seqlen_accepted",
            "impossible_capability_accepted")


@pytest.mark.skipif(_have_gpu(), reason="the invariants assume no usable CUDA device")
@pytest.mark.parametrize("seed", [1, 2])
def test_c_api_fuzz(c_fuzzer, seed):
    res, err, ub = run_c_fuzz(c_fuzzer, seed, 20000)
    assert res["iterations"] == 20000 and res["calls"] > 30000, res
    assert res["handmade_failures"] == 0, err[-6000:]
    assert {k: res["violations"][k] for k in BASIC} == dict.fromkeys(BASIC, 0), err[-6000:]
    assert ub == [], ub  # (each place reported once by UndefinedBehaviorSanitizer)
    assert {k: res["violations"][k] for k in HARDENED} == dict.fromkeys(HARDENED, 0), err[-6000:]


def test_the_c_fuzzer_is_sanitized_where_gcc_offers_it(c_fuzzer):
    """(gcc and clang on Linux x86-64 offer both sanitizers: CI runs the fuzz with them.)"""
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert c_fuzzer[1]
