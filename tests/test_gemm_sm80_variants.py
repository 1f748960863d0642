"""The sm80 GEMM family's enumeration, names and pruning (no compilation)."""

import pytest

from conftest import needs_dsl

pytestmark = needs_dsl


@pytest.fixture(scope="module")
def sm80():
    from factory.gemm import sm80

    return sm80


def test_default_tier_names_are_unique_and_deterministic(sm80):
    from factory.registry import enumerate_variants

    vs = enumerate_variants(["sm_80", "sm_86", "sm_89", "sm_90"], ["gemm"], tier="default")
    names = [v.name for v in vs]
    assert len(names) == len(set(names)) > 40
    again = [v.name for v in enumerate_variants(["sm_80", "sm_86", "sm_89", "sm_90"], ["gemm"], tier="default")]
    assert names == again
    assert "gemm_sm80_bf16_obf16_ak_bk_t128x128x32_w2x2" in names


def test_fp8_only_where_the_target_has_it(sm80):
    v80 = sm80.GemmSm80(target="sm_80", ab="e4m3", c="bf16", tile=(128, 128, 64))
    v89 = sm80.GemmSm80(target="sm_89", ab="e4m3", c="bf16", tile=(128, 128, 64))
    assert "sm_89" in v80.can_implement()
    assert v89.can_implement() is None
    mmajor = sm80.GemmSm80(target="sm_89", ab="e4m3", c="bf16", a_major="m", tile=(128, 128, 64))
    assert "K-major" in mmajor.can_implement()
    # Consumer Blackwell: native fp8 mma.sync (QMMA) like Ada, not Hopper's f16 HMMA lowering.
    v120 = sm80.GemmSm80(target="sm_120a", ab="e4m3", c="bf16", tile=(128, 128, 64))
    v90 = sm80.GemmSm80(target="sm_90", ab="e4m3", c="bf16", tile=(128, 128, 64), warps=(4, 2))
    assert v120.can_implement() is None and v120.proof_level() == "sass-only"
    assert "QMMA" in v120.sass_requirements()[0] and "HMMA" in v90.sass_requirements()[0]


def test_stages_follow_shared_memory(sm80):
    big = dict(ab="bf16", c="bf16", tile=(128, 256, 64), warps=(2, 4))
    v80, v86 = sm80.GemmSm80(target="sm_80", **big), sm80.GemmSm80(target="sm_86", **big)
    assert v80.stages > v86.stages
    assert v80.smem_bytes() <= v80.tgt.smem_per_cta
    assert sm80.GemmSm80(target="sm_86", **big).can_implement() is not None or v86.smem_bytes() <= 99 * 1024
    # sm_120a has 99 KB per CTA (not sm_90's 227 KB): the same stage count as sm_86.
    v120 = sm80.GemmSm80(target="sm_120a", **big)
    assert v120.stages == v86.stages < sm80.GemmSm80(target="sm_90", **big).stages
    dflt = sm80.GemmSm80(target="sm_120a", ab="bf16", c="bf16")
    assert dflt.stages == 5 and dflt.smem_bytes() == 5 * 256 * 32 * 2 <= 99 * 1024


def test_invalid_tiles_are_pruned(sm80):
    assert sm80.GemmSm80(target="sm_80", tile=(80, 128, 32)).can_implement()  # 80 rows, 2 warps of 16·k
    assert sm80.GemmSm80(target="sm_80", tile=(128, 128, 16)).can_implement()  # one k-block only
