"""The wheels: the pure ``kernel-factory`` wheel (built by the project's build backend) and a
kernels wheel of the test bundle (factory/wheels.py), installed with pip into a fresh venv (no
network, no dependencies resolved: torch comes from this interpreter's site-packages through a
path file), where ``Bundle.default()`` must find and open the installed bundle."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from factory.runtime import BundleError
from factory.runtime.installed import Installed, choose

ROOT = Path(__file__).resolve().parents[1]


def test_choose_picks_the_package_that_serves_the_device():
    sm80 = Installed("kernel-factory-kernels-sm80", "0.1.0", Path("/a"), ("sm_80", "sm_86", "sm_89"))
    sm90 = Installed("kernel-factory-kernels-sm90", "0.1.0", Path("/b"), ("sm_90", "sm_90a"))
    assert choose((9, 0), [sm80, sm90]) is sm90  # sm_90a beats sm_80 on an H100
    assert choose((8, 9), [sm80, sm90]) is sm80
    assert choose((8, 6), [sm90, sm80]) is sm80
    with pytest.raises(BundleError, match=r"compute capability 9\.0: pip install kernel-factory-kernels-sm90 "
                                          r"\(installed: kernel-factory-kernels-sm80 0\.1\.0 \(sm_86\)\)"):
        choose((9, 0), [Installed("kernel-factory-kernels-sm80", "0.1.0", Path("/a"), ("sm_86",))])
    with pytest.raises(BundleError, match="pip install kernel-factory-kernels-sm120.*installed: none"):
        choose((12, 0), [])


def _start_pure_wheel(tmp: Path) -> subprocess.Popen:
    """``pip wheel`` of a copy of the project's source (the build leaves nothing in the tree)."""
    src = tmp / "src"
    shutil.copytree(ROOT / "factory", src / "factory", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / f, src / f)
    return subprocess.Popen([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_wheels_install_into_a_fresh_venv(test_bundle, tmp_path):
    import torch

    from factory.wheels import build_kernels_wheel

    venv = tmp_path / "venv"
    building = _start_pure_wheel(tmp_path)  # (the build, the venv and the kernels wheel side by side)
    making_venv = subprocess.Popen([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    kernels = build_kernels_wheel(test_bundle, tmp_path / "dist", compression=zipfile.ZIP_STORED)
    out, _ = building.communicate()
    assert building.returncode == 0, out[-2000:]
    assert making_venv.wait() == 0
    pure = next((tmp_path / "dist").glob("kernel_factory-*.whl"))
    with zipfile.ZipFile(pure) as z:
        names = z.namelist()
    assert "factory/runtime/api.py" in names and not any(n.startswith("tests/") for n in names)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # torch from this interpreter, but not its other packages (no editable kernel-factory)
    (site / "torch_from_host.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "--no-deps", "-q",
                    "--no-compile", "--disable-pip-version-check", str(pure), str(kernels)], check=True,
                   capture_output=True)
    probe = ("import json, factory, factory.runtime as rt\n"
             "b = rt.Bundle.default(capability=(9, 0))\n"
             "print(json.dumps({'factory': factory.__file__, 'version': factory.__version__, 'bundle': str(b.path),\n"
             "                  'variants': len(b.manifest['variants']), 'selects': b.selector is not None}))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["factory"].startswith(str(site)) and got["bundle"].startswith(str(site)), got
    assert got["variants"] == len(json.loads((test_bundle / "manifest.json").read_text())["variants"])
    assert got["selects"]
    cli = subprocess.run([str(venv / "bin" / "kernel-factory"), "--version"], capture_output=True, text=True, env=env)
    assert cli.returncode == 0 and got["version"] in cli.stdout
