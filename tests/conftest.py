"""Shared fixtures: one small bundle (the "test" tier of every family, every target with kernels)
built once per test run on this GPU-less machine; GPU tests use $FACTORY_BUNDLE or that bundle."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# What Bundle.open remembers between processes (runtime/open_cache.py) stays inside this test run.
os.environ.setdefault("KERNEL_FACTORY_OPEN_CACHE", tempfile.mkdtemp(prefix="kf-open-cache-"))

HAVE_DSL = importlib.util.find_spec("cutlass") is not None
# Datacenter Blackwell is built for the family target sm_100f (10.0 and 10.3: notes/blackwell.md).
BLACKWELL_DC = "sm_100f"
TEST_TARGETS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", BLACKWELL_DC, "sm_120a"]

needs_dsl = pytest.mark.skipif(not HAVE_DSL, reason="nvidia-cutlass-dsl is not installed (build tests need it)")


def _have_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


needs_gpu = pytest.mark.skipif(not _have_gpu(), reason="no CUDA GPU on this machine")


# --- parallel test runs ------------------------------------------------------------------------
WORKERS = 2  # the README's command on a machine without a GPU (a 2-core CI machine)


def _gpu_present() -> bool:
    """A GPU on this machine, as the driver shows it in /dev and /proc (no torch import)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return Path("/dev/nvidiactl").exists() or (gpus.is_dir() and any(gpus.iterdir()))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With pytest-xdist installed, the whole suite (no test paths given) runs in ``WORKERS``
    processes on a machine without a GPU: its tests are CPU tests (compiles, links, disassembly)
    and spread over the cores.  ``-n N`` chooses (``-n 0``: one process), and so does naming test
    files.  With a GPU the run stays in one process: the GPU tests share one CUDA context per
    device, and the run record (``--run-record``) is written once."""
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", False) is not None:
        return  # a worker itself (it must not start workers), xdist absent, or -n given
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.collectonly:
        return
    if _gpu_present() or config.getoption("--run-record") or (os.cpu_count() or 1) < WORKERS:
        return
    config.option.numprocesses = WORKERS
    if config.option.dist == "no":
        config.option.dist = "loadfile"  # a file's tests on one worker: its module fixtures built once


@pytest.fixture(scope="session")
def test_bundle(tmp_path_factory) -> Path:
    """The test-tier bundle for every target (built here, from the compile cache when warm).  The
    workers of a parallel run share one: the first builds it (the others wait on a lock), so a
    cold compile cache compiles each variant once."""
    env = os.environ.get("FACTORY_TEST_BUNDLE")
    if env:
        return Path(env)
    if not HAVE_DSL:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import fcntl

        shared = tmp_path_factory.getbasetemp().parent  # this run's, common to its workers
        with open(shared / "test-bundle.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out = shared / "test-bundle" / "test"
            if not (out / "manifest.json").exists():
                _build_test_bundle(out, shared / "no-runs")
        return out
    return _build_test_bundle(tmp_path_factory.mktemp("bundle") / "test", tmp_path_factory.mktemp("no-runs"))


def _build_test_bundle(out: Path, no_runs: Path) -> Path:
    from factory.compiler.builder import build

    no_runs.mkdir(parents=True, exist_ok=True)
    # No run records: its proof labels do not depend on the repository's evidence/runs
    # (tests/test_evidence.py builds with records of its own).
    summary = build(out, TEST_TARGETS, tier="test", jobs=os.cpu_count(), evidence=no_runs)
    assert summary["variants"] > 0
    return out


def pytest_addoption(parser):
    parser.addoption("--run-record", default=os.environ.get("FACTORY_RUN_RECORD"), metavar="PATH",
                     help="write the run record of the variants the GPU tests launched and checked against "
                          "float32 (a .json file, or a directory for <date>-<device>.json; docs/proof.md)")


@pytest.fixture(scope="session")
def run_record(request):
    """Collects each variant a GPU test launched and checked (``run_record.add(bundle, name,
    results)``, results from ``factory.testing``); written at the end of the test run to
    ``--run-record`` (or $FACTORY_RUN_RECORD) when given: the evidence the build's ``executed``
    labels come from."""
    from factory.evidence import RunRecord

    rec = RunRecord(source="python3 -m pytest " + " ".join(request.config.invocation_params.args))
    yield rec
    path = request.config.getoption("--run-record")
    if path and rec.rows:
        written = rec.write(path, rec.bundle)
        print(f"\nrun record: {written} ({len(rec.rows)} variants, "
              f"{sum(not r['pass'] for r in rec.rows.values())} failed)")


@pytest.fixture(scope="session")
def gpu_bundle() -> Path:
    p = Path(os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    if not (p / "manifest.json").exists():
        pytest.skip(f"no bundle at {p}: build one (scripts/build_bundle.py) and set FACTORY_BUNDLE")
    return p


def bundle_with_swapped_cubin(test_bundle: Path, dst: Path, name: str, donor: str | None = None) -> Path:
    """A copy of the test bundle whose manifest keeps only ``name``, with ``donor``'s cubin in its
    place (when given) and the manifest's hash and size updated, so that only the SASS and resource
    checks can object: ``factory verify`` then disassembles one cubin, not the whole bundle (one
    full verify of the test bundle runs in tests/test_build.py)."""
    import json
    import shutil

    from factory.runtime.manifest import sha256_file

    shutil.copytree(test_bundle, dst)
    m = json.loads((dst / "manifest.json").read_text())
    if donor is not None:
        rec = m["variants"][name]["files"]["cubin"]
        shutil.copyfile(dst / m["variants"][donor]["files"]["cubin"]["path"], dst / rec["path"])
        rec["sha256"] = sha256_file(dst / rec["path"])
        rec["bytes"] = (dst / rec["path"]).stat().st_size
    m["variants"] = {name: m["variants"][name]}
    (dst / "manifest.json").write_text(json.dumps(m, indent=1))
    return dst


def verify_cli(bundle: Path):
    """``python -m factory verify BUNDLE`` (a CompletedProcess)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "factory", "verify", str(bundle)], cwd=ROOT,
                          capture_output=True, text=True)


# --- shared by the GPU test modules ---------------------------------------------------------------
# Absolute (a relative FACTORY_BUNDLE is taken from the repository root), so that tests that run
# tools in other directories (make -C examples/cpp) find it.
GPU_BUNDLE = ROOT / os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default")


def gpu_marks() -> list:
    """pytestmark of a module that runs the bundle at $FACTORY_BUNDLE on a GPU."""
    return [pytest.mark.gpu,
            pytest.mark.skipif(not _have_gpu(), reason="needs a CUDA GPU"),
            pytest.mark.skipif(not (GPU_BUNDLE / "manifest.json").exists(),
                               reason=f"no bundle at {GPU_BUNDLE} (set FACTORY_BUNDLE)")]


class Recorder:
    """A host library whose launchers record the variant launched instead of launching (for
    ``BundleCore.simulate``)."""

    def __init__(self):
        self.launched = []

    def launcher(self, name):
        def fn(argv):
            self.launched.append(name)
            return 0

        return fn

