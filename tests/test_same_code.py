"""Targets whose cubins are another target's code (``Target.same_code_as``): sm_89 builds only what
sm_86 lacks (the fp8 GEMMs), since every variant both have compiles to byte-identical SASS and
sm_86 cubins run on 8.9.  Checked here: the enumeration, that the claim still holds for the test
tier's variants (compiled for sm_89 alone and compared with the test bundle's sm_86 ones), and
what an 8.9 device then runs."""

from __future__ import annotations

import json

import torch

from conftest import needs_dsl
from factory.atoms.targets import TARGETS, get_target
from factory.registry import enumerate_variants
from factory.runtime import Bundle


def test_a_same_code_target_keeps_only_what_the_other_lacks():
    assert {n: t.same_code_as for n, t in TARGETS.items() if t.same_code_as} == {"sm_89": "sm_86"}
    assert get_target("sm_86").runs_on((8, 9))
    both = enumerate_variants(["sm_86", "sm_89"], tier="default")
    alone = enumerate_variants(["sm_89"], tier="default")
    kept = [v for v in both if v.target == "sm_89"]
    assert kept and all(getattr(v, "is_fp8", False) for v in kept)  # the fp8 builds only
    assert len(alone) == len(kept) + sum(1 for v in both if v.target == "sm_86")
    # Each dropped sm_89 variant has its sm_86 twin in the build.
    names86 = {v.name for v in both if v.target == "sm_86"}
    for v in alone:
        if not getattr(v, "is_fp8", False):
            assert v.name.replace("_sm89_", "_sm86_") in names86, v.name


@needs_dsl
def test_sm89_code_is_the_sm86_code(test_bundle, tmp_path):
    """The test tier's non-fp8 variants built for sm_89 alone: every .text section equals the sm_86
    build's in the test bundle (so dropping them loses no code)."""
    from factory.compiler.builder import build
    from factory.compiler.cubin import _sections

    out = tmp_path / "sm89"
    build(out, ["sm_89"], tier="test", name_filter="*_sm89_[bf]*", jobs=1)  # bf16 / f16 only
    m89 = json.loads((out / "manifest.json").read_text())["variants"]
    m86 = json.loads((test_bundle / "manifest.json").read_text())["variants"]
    assert len(m89) >= 3

    def text(root, entry):
        data = (root / entry["files"]["cubin"]["path"]).read_bytes()
        secs = _sections(data)
        return {k: data[o:o + n] for k, (_t, o, n, _i) in secs.items() if k.startswith(".text.")}

    for name, e in m89.items():
        twin = m86[name.replace("_sm89_", "_sm86_")]
        t89, t86 = text(out, e), text(test_bundle, twin)
        assert t89 and t89 == t86, name


def test_an_ada_device_runs_sm86_code_and_sm89_fp8(test_bundle):
    from factory.runtime.gemm import _as_rkl, select

    b = Bundle.open(test_bundle, capability=(8, 9), device={"name": "planned L4", "sm_count": 58})
    assert not any(v["target"] == "sm_89" and not (v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3")
                   for v in b.manifest["variants"].values())
    a, w = torch.empty(512, 256, dtype=torch.bfloat16), torch.empty(512, 256, dtype=torch.bfloat16)
    c = torch.empty(512, 512, dtype=torch.bfloat16)
    assert select(b, _as_rkl(a, "a"), _as_rkl(w, "b"), _as_rkl(c, "c"), "bf16", "bf16", []).startswith("gemm_sm86_")
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    name = select(b, _as_rkl(a8, "a"), _as_rkl(w8, "b"), _as_rkl(c, "c"), "e4m3", "bf16", [(0, (1,), (1,))] * 2)
    assert name.startswith("gemm_sm89_e4m3_")
