"""The shared building blocks in factory/atoms: register budgets that fit the register file, and
the Hopper kernels built on the same TMA / pipeline / scheduler helpers."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT, needs_dsl

pytestmark = needs_dsl


def test_register_budgets_fit():
    from factory.atoms import sm90

    for consumers, regs in sm90.CONSUMER_REGS.items():
        assert sm90.register_split_fits(sm90.PRODUCER_REGS[consumers], regs, consumers), consumers
    for consumers, regs in sm90.GEMM_CONSUMER_REGS.items():
        assert sm90.register_split_fits(sm90.GEMM_PRODUCER_REGS, regs, consumers), consumers
    # The check can fail: one register too many per consumer thread, or not a multiple of 8.
    assert not sm90.register_split_fits(24, 248, 2)
    assert not sm90.register_split_fits(24, 236, 2)
    assert not sm90.register_split_fits(16, 240, 2)


@pytest.mark.parametrize("kernel", ["gemm/sm90.py", "attention/sm90.py"])
def test_hopper_kernels_use_the_shared_atoms(kernel):
    """Both Hopper kernels build their TMA atoms, pipelines and descriptor prefetches through
    factory/atoms/sm90.py (no private copies of those pieces)."""
    src = (ROOT / "factory" / kernel).read_text()
    assert "from ..atoms import sm90 as atoms" in src
    for helper in ("tma_load_atom", "tma_pipeline", "prefetch_tma_descriptors"):
        assert f"atoms.{helper}(" in src, helper
    assert not re.search(r"PipelineTmaAsync\.create|CopyBulkTensorTileG2S(Multicast)?Op\(\)|prefetch_descriptor\(", src)
