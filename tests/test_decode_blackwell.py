"""The packed-weight fp8 decode GEMM built for Blackwell (gemm/decode.py): datacenter (sm_100a or
the family target sm_100f: 10.0, 10.3) and consumer (sm_120a: 12.0).  No Blackwell GPU here: what
is checked is the SASS each build must contain (and would lack had it silently become another
target's), that ``factory verify`` refuses a swapped cubin, and which variant the loader picks on
(10, 0) and (12, 0) through the recording launcher (nothing runs).  Proof of these variants:
``sass-only``."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import bundle_with_swapped_cubin, needs_dsl, verify_cli
from factory.atoms.targets import get_target
from factory.runtime import Bundle, NoVariantError

pytestmark = needs_dsl

B200 = {"name": "planned B200", "sm_count": 148}
RTX5090 = {"name": "planned RTX 5090", "sm_count": 170}
HMMA = r"\bHMMA\.16816\.F32\b"
QMMA = r"\bQMMA\.16832\.F32\.E4M3\.E4M3\b"


def _manifest(bundle) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _decode(m: dict, major: int) -> dict[str, dict]:
    return {n: v for n, v in m["variants"].items()
            if v.get("family") == "decode" and get_target(v["target"]).capability[0] == major}


def _fp8(*shape):
    return (torch.randn(*shape) * 4).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("major", [10, 12])
def test_blackwell_decode_sass_and_resources(test_bundle, major):
    """10.x: fp8 mma.sync becomes two f16 HMMA per m16n8k32 (no fp8 mma.sync unit, as on 9.0);
    12.0: native QMMA.  Both: 16-byte weight loads that skip L1 (LDG.E.NA.128), the activations'
    16-byte loads, the PDL wait (ACQBULK), DSMEM stores of the K-cluster (STAS), no spills."""
    from factory.compiler import cubin as cb

    entries = _decode(_manifest(test_bundle), major)
    assert entries, f"the test bundle should hold decode variants for compute capability {major}.x"
    for name, v in entries.items():
        t = get_target(v["target"])
        assert v["proof"] == "sass-only" and t.proof == "sass-only", name
        cubin = test_bundle / v["files"]["cubin"]["path"]
        sass = cb.disassemble(cubin)
        assert cb.ptxas_arch(cubin.read_bytes()) == v["target"], name
        hist = cb.opcode_histogram(sass)
        mma, other = (QMMA, HMMA) if major == 12 else (HMMA, QMMA)
        assert re.search(mma, sass) and not re.search(other, sass), name
        assert any(("QMMA" if major == 12 else "HMMA") in r for r in v["sass_requirements"]), name
        for op in ("LDG.E.NA.128", "LDG.E.128", "ACQBULK", "STAS.64"):
            assert hist.get(op, 0) > 0, (name, op)
        assert hist.get("LDL", 0) == hist.get("STL", 0) == 0, name
        k = next(iter(v["resources"]["kernels"].values()))
        assert k["stack_frame_bytes"] == 0 and v["resources"]["registers"] <= 128, name
        assert v["smem_bytes"] * v["ctas_per_sm"] <= t.smem_per_cta, name


def test_verify_refuses_a_decode_cubin_of_the_other_blackwell(test_bundle, tmp_path):
    """The 10.x decode cubin in the sm_120a slot fails ``factory verify`` (on its target and on
    the missing QMMA); the sm_120a cubin's SASS relabelled as 10.x lacks the HMMA form."""
    from factory.compiler.cubin import disassemble
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    v10 = min(_decode(m, 10))
    v12 = next(n for n, v in _decode(m, 12).items() if v["config"] == {**m["variants"][v10]["config"], "target": "sm_120a"})
    r = verify_cli(bundle_with_swapped_cubin(test_bundle, tmp_path / "bad", v12, v10))
    assert r.returncode == 1, r.stdout + r.stderr
    t10 = m["variants"][v10]["target"]
    assert f"{v12}: cubin is for {t10}, manifest says sm_120a" in r.stderr
    assert f"{v12}: SASS lacks" in r.stderr and "QMMA" in r.stderr
    # The requirement alone, the target check out of the way: QMMA's SASS is not the HMMA form.
    sass12 = disassemble(test_bundle / m["variants"][v12]["files"]["cubin"]["path"])
    relabelled = re.sub(r"\.target\s+sm_\w+", f".target {t10}", sass12)
    problems = sass_problems(m["variants"][v10]["target"], m["variants"][v10]["sass_requirements"], relabelled)
    assert len(problems) == 1 and "SASS lacks" in problems[0] and "HMMA" in problems[0], problems
    assert sass_problems(m["variants"][v12]["target"], m["variants"][v12]["sass_requirements"], sass12) == []


@pytest.mark.parametrize("cap,device", [((10, 0), B200), ((12, 0), RTX5090)])
def test_packed_decode_is_selected_on_blackwell(test_bundle, monkeypatch, cap, device):
    """bundle.gemm(a, bundle.pack_b(w)) on a planned 10.0 / 12.0 device takes that chip's decode
    build (its early_b twin with b_constant=True); asked by name on another device, it is refused."""
    b = Bundle.open(test_bundle, capability=cap, device=device)
    b.simulate(None)
    launched = []
    monkeypatch.setattr(Bundle, "launch", lambda self, name, args, stream=None, checked=False, device=None:
                        launched.append(name))
    x8, w8 = _fp8(16, 2048), _fp8(256, 2048)
    pw = b.pack_b(w8)
    # 10.x has no early_b twins (they spill there: gemm/decode.py), so b_constant keeps the plain one.
    has_eb = cap[0] == 12
    for m_rows, b_constant in ((16, False), (1, False), (5, True)):
        out = b.gemm(x8[:m_rows], pw, b_constant=b_constant)
        assert out.shape == (m_rows, 256) and out.dtype == torch.bfloat16
        e = b.manifest["variants"][launched[-1]]
        assert e["family"] == "decode" and get_target(e["target"]).runs_on(cap), e["name"]
        assert e["target"] == b.candidates("gemm")[0]["target"]  # this chip's best target
        assert bool(e["config"]["early_b"]) == (b_constant and has_eb)
    with pytest.raises(NoVariantError, match="decode"):
        b.gemm(_fp8(17, 2048), pw)  # M > 16
    # Never on Hopper: the 9.0 loader takes the sm_90 build.
    h = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    assert all(v["target"] == "sm_90" for v in h.candidates("gemm") if v.get("family") == "decode")


def test_decode_variants_cover_every_blackwell_target():
    """The enumerator builds the same shapes for every Blackwell target with fp8 mma.sync and for
    sm_90 (not sm_90a, nor the Ampere/Ada targets)."""
    from factory.registry import enumerate_variants

    def shapes(t):
        return sorted(v.name.split("_ak_bk_")[1] for v in enumerate_variants([t], ["gemm"], "default")
                      if v.family == "decode")

    want = shapes("sm_90")
    assert len(want) == 4
    assert shapes("sm_120a") == want
    for t in ("sm_100a", "sm_100f", "sm_103a"):  # the early_b twins spill on 10.x: not built
        assert shapes(t) == [w for w in want if not w.endswith("_eb")], t
    for t in ("sm_80", "sm_86", "sm_89", "sm_90a"):
        assert shapes(t) == [], t
