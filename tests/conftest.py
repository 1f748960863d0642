"""Shared fixtures: one small bundle (the "test" tier of every family, every target with kernels)
built once per test run on this GPU-less machine; GPU tests use $FACTORY_BUNDLE or that bundle."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


@pytest.fixture(scope="session")
def test_bundle(tmp_path_factory) -> Path:
    """The test-tier bundle for every target (built here, from the compile cache when warm)."""
    env = os.environ.get("FACTORY_TEST_BUNDLE")
    if env:
        return Path(env)
    if not HAVE_DSL:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    from factory.compiler.builder import build

    out = tmp_path_factory.mktemp("bundle") / "test"
    summary = build(out, TEST_TARGETS, tier="test", jobs=os.cpu_count())
    assert summary["variants"] > 0
    return out


@pytest.fixture(scope="session")
def gpu_bundle() -> Path:
    p = Path(os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    if not (p / "manifest.json").exists():
        pytest.skip(f"no bundle at {p}: build one (scripts/build_bundle.py) and set FACTORY_BUNDLE")
    return p


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

