"""Consumer Blackwell (sm_120a: RTX 50-series, RTX PRO 6000) on this GPU-less machine: the mma.sync
families built for it, which devices may run them and what selection takes on a 12.0 device (no
launches; no such GPU has run them: proof is the SASS).

sm_120a cubins are arch-specific: only compute capability 12.0 runs them, and nothing else in a
bundle runs there (sm_8x/sm_90 builds run only on their own major, sm_90a/sm_100a only on their chip).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch

from conftest import Recorder, bundle_with_swapped_cubin, verify_cli
from factory.runtime import Bundle, NoVariantError
from factory.runtime.gemm import _as_rkl, select

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed (the bundle is built here)")

RTX = {"name": "planned RTX", "sm_count": 170}


def _select(b, m, n, k, dt="bf16"):
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn if dt == "e4m3" else torch.bfloat16)
    w = torch.empty(n, k, dtype=a.dtype)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    scales = [(0, (1,), (1,))] * 2 if dt == "e4m3" else []
    return select(b, _as_rkl(a, "a"), _as_rkl(w, "b"), _as_rkl(out, "c"), dt, "bf16", scales)


def _sm120(manifest: dict) -> dict[str, dict]:
    """The sm_120a builds of the mma.sync (sm80) families; its packed decode GEMM has its own tests
    (tests/test_decode_blackwell.py)."""
    return {n: v for n, v in manifest["variants"].items() if v["target"] == "sm_120a" and v["family"] == "sm80"}


def test_sm120_variants_never_run_on_hopper_or_blackwell_datacenter(test_bundle):
    for cap in ((9, 0), (10, 0)):
        b = Bundle.open(test_bundle, capability=cap)
        assert _sm120(b.manifest), "the test bundle should hold sm_120a variants"
        for op in ("gemm", "attention"):
            assert not any(v["target"] == "sm_120a" for v in b.candidates(op)), (cap, op)
        for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096), (1000, 520, 264)):
            assert not _select(b, m, n, k).startswith("gemm_sm120a_"), cap
        b.simulate(Recorder())
        name = next(iter(_sm120(b.manifest)))
        why = rf"built for sm_120a, which cannot run on compute capability {cap[0]}\.0"
        with pytest.raises(NoVariantError, match=why):
            b.launch(name, [])


def test_gemm_selection_on_12_0(test_bundle):
    b = Bundle.open(test_bundle, capability=(12, 0), device=RTX)
    assert {v["target"] for v in b.candidates("gemm")} == {"sm_120a"}
    assert _select(b, 4096, 4096, 4096) == "gemm_sm120a_bf16_obf16_ak_bk_t128x128x32_w2x2"
    assert _select(b, 1000, 520, 264) == "gemm_sm120a_bf16_obf16_ak_bk_t128x128x32_w2x2"
    fp8 = _select(b, 4096, 4096, 4096, dt="e4m3")
    assert fp8 == "gemm_sm120a_e4m3_obf16_ak_bk_t128x128x64_w2x2"
    for name in (fp8, _select(b, 16, 4096, 4096)):
        e = b.manifest["variants"][name]
        assert e["proof"] == "sass-only" and e["family"] == "sm80", name
    # 12.0's minor revisions and other majors get nothing from an sm_120a build.
    for cap in ((12, 1), (11, 0)):
        with pytest.raises(NoVariantError, match="no gemm variant"):
            _select(Bundle.open(test_bundle, capability=cap), 64, 256, 256)


def test_attention_selection_on_12_0(test_bundle, monkeypatch):
    from factory.runtime import attention as rt

    b = Bundle.open(test_bundle, capability=(12, 0), device=RTX)
    assert {v["target"] for v in b.candidates("attention")} == {"sm_120a"}
    monkeypatch.setattr(rt, "_check_common", lambda *a, **k: None)
    b.simulate(None)  # CPU tensors; launch itself is replaced below
    calls = []
    monkeypatch.setattr(b, "launch", lambda name, args, device=None: calls.append((name, args)))
    q = torch.zeros(2, 300, 8, 64, dtype=torch.bfloat16)
    kv = torch.zeros(2, 500, 2, 64, dtype=torch.bfloat16)  # GQA 8:2
    o, lse = rt.attention(b, q, kv, kv, return_lse=True)
    name, args = calls[-1]
    assert name == "attention_sm120a_bf16_d64_m128_n128_w8_s2"
    assert len(args) == 6 and args[3] is o and args[4] is lse  # (q, k, v, o, lse, scale)
    assert b.manifest["variants"][name]["proof"] == "sass-only"
    # f16 D128 causal: only the varlen variant has it in the test tier.
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    packed = torch.zeros(300, 4, 128, dtype=torch.float16)
    rt.attention(b, packed, packed, packed, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200)
    assert calls[-1][0] == "attention_sm120a_f16_d128_m128_n64_w8_s2_causal_varlen"
    with pytest.raises(LookupError, match="no attention kernel"):
        kv128 = torch.zeros(1, 500, 2, 128, dtype=torch.bfloat16)
        rt.attention(b, torch.zeros(1, 300, 4, 128, dtype=torch.bfloat16), kv128, kv128)


def test_sm120_sass_and_resources(test_bundle):
    """QMMA for fp8 (not the f16 HMMA Hopper lowers fp8 mma.sync to), HMMA otherwise; cp.async and
    ldmatrix; the cubin's own target is sm_120a; everything fits 99 KB of shared memory per CTA."""
    from factory.compiler.cubin import disassemble

    m = json.loads((test_bundle / "manifest.json").read_text())
    vs = _sm120(m)
    assert {v["op"] for v in vs.values()} == {"gemm", "attention", "attention_kvcache"}
    assert any(v["dtypes"].get("a") == "e4m3" for v in vs.values() if v["op"] == "gemm")
    for name, v in vs.items():
        sass = disassemble(test_bundle / v["files"]["cubin"]["path"])
        assert re.search(r"\.target\s+sm_120a\b", sass), name
        fp8 = v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3"
        assert re.search(r"\bQMMA\.16832\.F32\.E4M3" if fp8 else r"\bHMMA\.16816\.F32", sass), name
        assert not re.search(r"\bHMMA\b" if fp8 else r"\bQMMA\b", sass), name
        assert "LDGSTS" in sass and "LDSM" in sass, name
        assert not re.search(r"\b(HGMMA|UTC\w*MMA|UTMALDG)\b", sass), name
        r = v["resources"]
        assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 99 * 1024, name
        assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, name


def test_verify_refuses_an_sm120_variant_with_another_targets_cubin(test_bundle, tmp_path):
    """An sm_89 cubin (same source and SASS family) in place of an sm_120a one fails ``factory
    verify`` on its target; Hopper's fp8 build (HMMA) relabelled as sm_120a lacks the QMMA."""
    from factory.compiler.cubin import disassemble
    from factory.compiler.sass import sass_problems

    m = json.loads((test_bundle / "manifest.json").read_text())
    v120 = next(n for n, v in _sm120(m).items() if v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3")
    donor = v120.replace("sm120a", "sm89")
    assert donor in m["variants"]
    r = verify_cli(bundle_with_swapped_cubin(test_bundle, tmp_path / "bad", v120, donor))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{v120}: cubin is for sm_89, manifest says sm_120a" in r.stderr
    hopper = next(n for n, v in m["variants"].items()
                  if v["target"] == "sm_90" and v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3")
    sass = re.sub(r"\.target\s+sm_\w+", ".target sm_120a",
                  disassemble(test_bundle / m["variants"][hopper]["files"]["cubin"]["path"]))
    problems = sass_problems(m["variants"][v120]["target"], m["variants"][v120]["sass_requirements"], sass)
    assert len(problems) == 1 and "SASS lacks" in problems[0] and "QMMA" in problems[0], problems
