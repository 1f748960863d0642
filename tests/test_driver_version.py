"""A CUDA driver older than the host library's runtime: one clear error naming both versions.

The host library links the CUDA runtime statically; at its first call that runtime asks the
driver (libcuda.so.1's ``cuDriverGetVersion``) for its version and refuses one of an older major
(cudaErrorInsufficientDriver).  Here a stand-in libcuda.so.1, compiled from the C below and put
first on ``LD_LIBRARY_PATH`` in a subprocess, reports the version under test; the real runtime
linked into the test bundle does the refusing, and the loader's error must say which driver was
found and which is needed.  (Past the version check the stand-in answers nothing else, so a new
enough version fails later, differently.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

FAKE_LIBCUDA = r"""
#include <stdlib.h>
static int version(void) { const char *v = getenv("FAKE_CUDA_DRIVER_VERSION"); return v ? atoi(v) : 0; }
int cuDriverGetVersion(int *v) { if (!v) return 1; *v = version(); return 0; }
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) { if (p) *p = 0; return 500; }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st) {
    if (p) *p = 0; if (st) *(int *)st = 0; return 500; }
"""

SCRIPT = textwrap.dedent("""
    import json, sys
    from factory.runtime import Bundle, LaunchError
    from factory.runtime.loader import HostLibrary
    b = Bundle.open(sys.argv[1], capability=(9, 0))
    name = next(iter(b.manifest["variants"]))
    try:
        HostLibrary(b.path / b.manifest["host_library"]["path"]).launcher(name)
        print(json.dumps({"error": None}))
    except LaunchError as e:
        print(json.dumps({"error": str(e)}))
""")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    from factory.compiler import toolchain

    d = tmp_path_factory.mktemp("fake-libcuda")
    (d / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run([toolchain.cc(), "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(d / "fake.c")], check=True)
    return d


def _load_error(bundle, fake_dir, version: int) -> str | None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LD_LIBRARY_PATH": str(fake_dir),
           "FAKE_CUDA_DRIVER_VERSION": str(version)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(bundle)], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["error"]


def test_old_driver_named_with_the_version_needed(test_bundle, fake_driver):
    runtime = json.loads((test_bundle / "manifest.json").read_text())["versions"]["nvidia-cuda-runtime"]
    major = int(runtime.split(".")[0])
    err = _load_error(test_bundle, fake_driver, (major - 1) * 1000 + 40)
    assert err is not None and f"the NVIDIA driver supports CUDA {major - 1}.4" in err, err
    assert f"links the CUDA {major}." in err and f"needs a driver for CUDA {major}.0 or newer" in err, err
    assert "cudaErrorInsufficientDriver" in err and "(35)" in err, err
    # the last version of the previous major is refused too; the major itself passes the check
    assert "needs a driver for CUDA" in _load_error(test_bundle, fake_driver, (major - 1) * 1000 + 990)
    new_enough = _load_error(test_bundle, fake_driver, major * 1000)
    assert new_enough is not None and "InsufficientDriver" not in new_enough, new_enough


def test_relinked_for_cuda12(test_bundle, fake_driver, tmp_path):
    """``python -m factory link --cuda 12``: the same objects linked with the CUDA 12 runtime; the
    manifest records it and the library's own driver floor is 12.0.  (Skipped where no CUDA 12
    runtime is installed: pip's nvidia-cuda-runtime-cu12, or FACTORY_CUDA12_RUNTIME.)"""
    import shutil

    from factory.compiler import toolchain
    from factory.compiler.link import relink
    from factory.runtime.manifest import host_library_problem, load_manifest

    try:
        toolchain.cuda12_runtime()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    copy = tmp_path / "b"
    shutil.copytree(test_bundle, copy)
    s = relink(copy, 12)
    m = load_manifest(copy)
    assert s["cuda_runtime"].startswith("12.") and m["versions"]["nvidia-cuda-runtime"] == s["cuda_runtime"]
    assert host_library_problem(copy, m) is None
    err = _load_error(copy, fake_driver, 11080)
    assert err is not None and "needs a driver for CUDA 12.0 or newer" in err, err
