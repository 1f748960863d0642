"""examples/cpp builds here (g++ against the test bundle's include/ and lib/ and pip's CUDA runtime)
and, without a GPU, stops with a CUDA error instead of crashing.  tests/test_c_api_gpu.py runs it."""

import subprocess

from conftest import ROOT, _have_gpu, needs_dsl

pytestmark = needs_dsl


def test_cpp_example_builds(test_bundle, tmp_path):
    from factory.compiler import toolchain

    exe = tmp_path / "fx_example"
    r = subprocess.run(["make", "-s", "-C", str(ROOT / "examples" / "cpp"), f"BUNDLE={test_bundle}",
                        f"CUDA_HOME={toolchain.cuda_root()}", f"BIN={exe}", "CXXFLAGS=-O1 -std=c++17 -Wall -Wextra -Werror"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    if not _have_gpu():
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and run.stderr.startswith("error: "), run.stdout + run.stderr
