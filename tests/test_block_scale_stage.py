"""Block-scaled fp8 main-loop forms of the Hopper GEMMs without a GPU: scale_b staged with each
k-block (``scale_b_stage``) and the staggered pair loops of the two coop warpgroups (``stagger``):
which variants take them, the shared memory they add, and the SASS their builds must show.
Values: tests/test_every_variant_gpu.py and tests/test_gemm_fp8_gpu.py on a GPU."""

from __future__ import annotations

import pytest

from conftest import HAVE_DSL

pytestmark = pytest.mark.skipif(not HAVE_DSL, reason="needs the CuTe DSL (factory.gemm)")

FP8 = dict(target="sm_90a", ab="e4m3", c="bf16", pdl=True)


def dense(**kw):
    from factory.gemm.sm90 import GemmSm90

    return GemmSm90(**FP8, **kw)


def grouped(**kw):
    from factory.gemm.sm90_grouped import GemmGroupedSm90

    return GemmGroupedSm90(target="sm_90a", ab="e4m3", c="bf16", **kw)


def test_staged_scale_b_keeps_the_stages_and_adds_one_slot():
    plain = dense(tile=(128, 128, 128), cluster=(2, 1), block_scale=True)
    staged = dense(tile=(128, 128, 128), cluster=(2, 1), block_scale=True, scale_b_stage=True)
    assert staged.can_implement() is None
    p0, p1 = plain.plan(), staged.plan()
    assert p1.ab_stages == p0.ab_stages == 6
    # scale_b's 4 bytes per stage fit in the padding of the stage's scale_a slot
    assert p1.stage_bytes == p0.stage_bytes and p1.smem_bytes == p0.smem_bytes
    assert staged.name.endswith("_blksc_sbst") and plain.name.endswith("_blksc")
    reqs = staged.sass_requirements()
    assert r"\bLDGSTS\b" in reqs and r"\bARRIVES\.LDGSTSBAR\b" in reqs
    assert r"\bLDGSTS\b" not in plain.sass_requirements()
    # The pair loop still keeps a WGMMA group in flight while it waits for the one before.
    assert r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1" in reqs


@pytest.mark.parametrize("kw,match", [
    (dict(tile=(128, 128, 128), scale_b_stage=True), "apply to block scales"),
    (dict(tile=(128, 128, 128), stagger=True, row_scale=True), "apply to block scales"),
    (dict(tile=(64, 128, 128), schedule="ws", block_scale=True, stagger=True), "coop"),
    (dict(tile=(128, 128, 128), block_scale=True, stagger=True, promote_ahead=True), "pair loop"),
    (dict(tile=(128, 128, 128), block_scale=True, scale_b_stage=True, promote_serial=True), "pair loop"),
])
def test_dense_refusals(kw, match):
    assert match in (dense(**kw).can_implement() or "")


def test_grouped_forms():
    ok = grouped(layout="contig", tile=(128, 128, 128), schedule="coop", block_scale=True, scale_b_stage=True,
                 stagger=True)
    assert ok.can_implement() is None and ok.name.endswith("_blksc_sbst_stg")
    assert r"\bLDGSTS\b" in ok.sass_requirements()
    assert "coop" in grouped(layout="masked", tile=(64, 128, 128), schedule="ws", block_scale=True,
                             stagger=True).can_implement()
    assert "block scales" in grouped(layout="contig", tile=(128, 128, 128), schedule="coop", row_scale=True,
                                     scale_b_stage=True).can_implement()


def test_enumerated_in_the_full_tier():
    from factory.atoms.targets import get_target
    from factory.gemm.sm90 import enumerate_sm90

    full = [v for v in enumerate_sm90(get_target("sm_90a"), "full") if v.scale_b_stage or v.stagger]
    assert {v.schedule for v in full} == {"coop", "ws", "pp"}
    assert all(v.block_scale and (v.schedule == "coop" or not v.stagger) for v in full)


def test_yield_ffma_edits_only_the_scheduling_bits(test_bundle):
    """On a promoted fp8 cubin of the test bundle: FFMAs that reuse their B operand lose that flag
    and the hold-warp hint, nothing else changes, a second pass finds nothing, and the launcher
    object's embedded copy is replaced byte for byte."""
    import gzip
    import struct
    from pathlib import Path

    from factory.compiler.cubin import extract_cubins
    from factory.compiler.sass_patch import REUSE, YIELD_HOLD, patch_object, yield_ffma

    names = sorted(p.stem for p in (Path(test_bundle) / "cubin").glob("gemm_grouped_*e4m3*blksc*.cubin"))
    if not names:
        pytest.skip("the test bundle has no block-scaled grouped variant")
    cubin = (Path(test_bundle) / "cubin" / f"{names[0]}.cubin").read_bytes()
    patched, n = yield_ffma(cubin)
    assert n >= 16 and len(patched) == len(cubin)
    diff = [i for i in range(len(cubin)) if cubin[i] != patched[i]]
    words = sorted({i - i % 16 for i in diff})  # instructions are 16-byte aligned in the code section
    assert len(words) == n
    mask = REUSE[1] | YIELD_HOLD
    for w in words:
        (hi0,), (hi1,) = struct.unpack_from("<Q", cubin, w + 8), struct.unpack_from("<Q", patched, w + 8)
        assert cubin[w:w + 8] == patched[w:w + 8] and hi0 ^ hi1 == mask and hi0 & mask == mask
    assert yield_ffma(patched) == (patched, 0)
    obj = gzip.decompress((Path(test_bundle) / "obj" / f"{names[0]}.o.gz").read_bytes())
    assert extract_cubins(patch_object(obj, cubin, patched)) == [patched]
