"""The Blackwell datacenter attention forward (built for the family target sm_100f: 10.0 and 10.3)
on this GPU-less machine: the SASS and resources of the FA4-structured kernel
(attention/sm100_fa4.py), the negative checks (a non-tcgen05 attention cubin fails the
requirements; a tcgen05 cubin without the FA4 structure, the Blackwell GEMM's, fails the
structure's; a role over its register budget fails verify) and selection on a 10.0 device (no
launches; nothing Blackwell has run: proof is the SASS).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch

from conftest import BLACKWELL_DC
from factory.compiler.cubin import ptxas_arch
from factory.runtime import Bundle

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed (the bundle is built here)")

B200 = {"name": "planned B200", "sm_count": 148}
DC = BLACKWELL_DC.replace("_", "")  # "sm100f" in variant names
GEMM = f"gemm_{DC}_bf16_obf16_ak_bk_2cta_t256x128x64_c2x2_pdl"  # tcgen05 and TMEM, no attention
FA4 = f"attention_{DC}_bf16_d128_q2_n128_causal"
FA4_VARLEN = f"attention_{DC}_f16_d64_q2_n128_varlen"


def _manifest(bundle) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _attn100(m: dict) -> dict[str, dict]:
    return {n: v for n, v in m["variants"].items() if v["op"] == "attention" and v["family"] == "sm100"}


def _sass(bundle, entry) -> str:
    from factory.compiler.cubin import disassemble

    return disassemble(bundle / entry["files"]["cubin"]["path"])


def _count(pattern: str, sass: str) -> int:
    return len(re.findall(pattern, sass))


def test_sm100_attention_variants(test_bundle):
    assert set(_attn100(_manifest(test_bundle))) == {FA4, FA4_VARLEN}


@pytest.mark.parametrize("name", [FA4, FA4_VARLEN])
def test_sm100_fa4_attention_sass_and_resources(test_bundle, name):
    """What the FA4 structure must show in SASS, and would lack on a fallback: both tcgen05.mma
    forms (S = Q·Kᵀ from smem descriptors, O += P·V with A = P read from TMEM), tcgen05.ld/st
    (S and O out, P and the rescaled O in), commits, the 512-column allocation, TMA loads, three
    setmaxnreg roles each within its registers, and an exp2 that MUFU does only in part: per row
    and key tile one softmax body (both warpgroups run it) holds fewer MUFU.EX2 than the 128 scores
    it exponentiates, the rest by the polynomial (one round-down add per pair: its Cody-Waite
    floor) — and no spill."""
    from factory.compiler.sass import role_registers, sass_problems

    v = _manifest(test_bundle)["variants"][name]
    sass = _sass(test_bundle, v)
    assert re.search(r"\.target\s+sm_100a?\b", sass)  # nvdisasm shows sm_100f as sm_100
    assert ptxas_arch((test_bundle / v["files"]["cubin"]["path"]).read_bytes()) == BLACKWELL_DC
    assert sass_problems(v["target"], v["sass_requirements"], sass) == []
    d, bn = v["head_dim"], v["tile"][1]
    # S0, S1 before the loop, both in the loop, none after: 4 tiles of D/16 instructions (SS form);
    # P0·V, P1·V in the loop and after it: 4 tiles of BN/16 (TS form: A from TMEM).
    assert _count(r"\bUTCHMMA\s+gdesc\[", sass) == 4 * d // 16
    assert _count(r"\bUTCHMMA\s+tmem\[", sass) == 4 * bn // 16
    assert _count(r"\bUTMALDG\.3D\b" if v["varlen"] else r"\bUTMALDG\.4D\b", sass) > 0
    # tcgen05.ld: S (BN/32 x32) + O rescale and epilogue (2 tiles x 2 x D/16 x16); tcgen05.st: P
    # (BN/2 columns, x32) + the rescale (2 x D/16 x16).
    assert _count(r"\bLDTM\.x32\b", sass) == bn // 32 and _count(r"\bLDTM\.x16\b", sass) == 4 * d // 16
    assert _count(r"\bSTTM\.x32\b", sass) == bn // 64 and _count(r"\bSTTM\.x16\b", sass) == 2 * d // 16
    assert _count(r"\bUTCBAR\b", sass) >= 6  # s_full x2 (twice), o_full x2, K/V releases
    # exp2: 3/4 of the 128 scores on MUFU (+1 for the rescale factor), 1/4 as the polynomial
    ex2 = _count(r"\bMUFU\.EX2\b", sass)
    emulated = v["ex2_emulation"]["fraction"] * bn
    assert ex2 == bn - emulated + 1 < bn, ex2
    assert _count(r"\bFADD2\.RM\b", sass) == emulated // 2
    assert _count(r"\bFFMA2\b", sass) >= bn // 2 + v["ex2_emulation"]["degree"] * emulated // 2
    roles = role_registers(sass)
    assert [(r["action"], r["limit"]) for r in roles] == [
        ("TRY_ALLOC", v["registers_per_role"]["softmax"]),
        ("DEALLOC", v["registers_per_role"]["correction"]),
        ("DEALLOC", v["registers_per_role"]["mma_tma"])]
    assert all(r["max_register"] < r["limit"] for r in roles), roles
    assert sum(r["limit"] for r in roles) + roles[0]["limit"] == 512  # 2 softmax warpgroups
    assert not re.search(r"\b(HGMMA|HMMA|LDSM|LDGSTS)\b", sass)
    r = v["resources"]
    assert v["proof"] == "sass-only" and v["target"] == BLACKWELL_DC and v["preferred"]
    assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 227 * 1024
    assert v["tmem_columns"] == 512 and v["threads"] == 512 and r["registers"] * v["threads"] <= 65536
    assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0


def test_sm100_attention_requirements_fail_on_a_hopper_attention_cubin(test_bundle):
    """The sm_90a attention test-tier cubin (WGMMA, TMA, no tcgen05) relabelled as sm_100 lacks
    every tcgen05 / TMEM requirement of the Blackwell attention kernels."""
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    donor = next(n for n, v in m["variants"].items()
                 if v["op"] == "attention" and v["target"] == "sm_90a")
    sass = re.sub(r"\.target\s+sm_\w+", ".target sm_100", _sass(test_bundle, m["variants"][donor]))
    for name in (FA4, FA4_VARLEN):
        problems = sass_problems(m["variants"][name]["target"], m["variants"][name]["sass_requirements"], sass)
        assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
        for key in ("UTCHMMA", "UTCATOMSWS", "LDTM", "STTM", "UTCBAR"):
            assert key in problems[0], (name, key, problems[0])


def test_sm100_fa4_requirements_fail_on_a_tcgen05_gemm_cubin(test_bundle):
    """A cubin with tcgen05.mma, TMEM loads, commits and mbarriers all the same but no FA4
    attention structure (the test tier's 2-CTA Blackwell GEMM) fails the FA4 variant's
    requirements on exactly the structure: no MMA reading P from TMEM, no tcgen05.st of P, no
    exp2 (MUFU or the emulated one's floor), no setmaxnreg roles, no 512-column allocation."""
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    fa4 = m["variants"][FA4]
    sass = _sass(test_bundle, m["variants"][GEMM])
    problems = sass_problems(fa4["target"], fa4["sass_requirements"], sass)
    assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
    missing = [p for p in fa4["sass_requirements"] if not re.search(p, sass)]
    for key in (r"UTCHMMA\s+tmem", "STTM", "MUFU", "FADD2?", "USETMAXREG", "UMOV (UR"):
        assert sum(key in p for p in missing) == 1, (key, missing)
    for present in (r"\bUTCHMMA\b", r"\bLDTM\.", r"\bUTCBAR\b", r"\bSYNCS\."):  # tcgen05 is there
        assert present in fa4["sass_requirements"] and present not in missing, present


def test_verify_refuses_a_role_over_its_register_budget(test_bundle):
    """The per-role register check can fail: the FA4 SASS with its last setmaxnreg lowered below
    what that role's code uses."""
    from factory.compiler.sass import role_registers, sass_problems

    v = _manifest(test_bundle)["variants"][FA4]
    sass = _sass(test_bundle, v)
    last = role_registers(sass)[-1]
    lowered = re.sub(rf"(USETMAXREG\.DEALLOC\.CTAPOOL\s+){hex(last['limit'])}\b",
                     lambda mo: mo.group(1) + hex(8 * (last["max_register"] // 8)), sass)
    assert lowered != sass
    problems = sass_problems(v["target"], v["sass_requirements"], lowered)
    assert problems and "setmaxnreg budget" in problems[-1], problems


def test_sm100_attention_selection(test_bundle, monkeypatch):
    """On 10.0 the FA4 variants serve dense and varlen calls, with the shared argument order, on 10.3 too (the family cubin); on 9.0 no
    datacenter Blackwell variant is a candidate."""
    from factory.runtime import attention as rt

    monkeypatch.setattr(rt, "_check_common", lambda *a, **k: None)
    q = torch.zeros(2, 300, 8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 500, 2, 128, dtype=torch.bfloat16)  # GQA 8:2
    for cap, device in (((10, 0), B200), ((10, 3), B200), ((9, 0), None)):
        b = Bundle.open(test_bundle, capability=cap, device=device)
        b.simulate(None)
        calls = []
        monkeypatch.setattr(b, "launch", lambda name, args, device=None: calls.append((name, args)))
        o, lse = rt.attention(b, q, kv, kv, causal=True, return_lse=True)
        name, args = calls[-1]
        if cap[0] == 10:
            assert name == FA4
            assert len(args) == 6 and args[3] is o and args[4] is lse  # (q, k, v, o, lse, scale)
            assert b.manifest["variants"][name]["proof"] == "sass-only"
            # one query (decode): still this variant (nothing else for 10.0 in the bundle)
            rt.attention(b, q[:, :1], kv, kv, causal=True)
            assert calls[-1][0] == FA4
            # varlen f16 D64: q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, scale, max_seqlen_q
            qv = torch.zeros(77 + 300, 8, 64, dtype=torch.float16)
            kvv = torch.zeros(130 + 5, 2, 64, dtype=torch.float16)
            cu_q = torch.tensor([0, 77, 377], dtype=torch.int32)
            cu_k = torch.tensor([0, 130, 135], dtype=torch.int32)
            o = rt.attention(b, qv, kvv, kvv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=300)
            name, args = calls[-1]
            assert name == FA4_VARLEN and len(args) == 9 and args[3] is o
            assert args[5] is cu_q and args[6] is cu_k and args[8] == 300
        else:
            assert not any(v["target"] == BLACKWELL_DC for v in b.candidates("attention"))
            assert not name.startswith(f"attention_{DC}_"), name


def test_sm100_attention_refused_elsewhere(test_bundle, monkeypatch):
    """The family cubins run on 10.0 and 10.3 only: an 11.0 (Thor) or 12.1 device finds no attention
    kernel in this bundle, and the error names the device and what the bundle holds."""
    from factory.runtime import attention as rt
    from factory.runtime.errors import NoVariantError

    monkeypatch.setattr(rt, "_check_common", lambda *a, **k: None)
    q = torch.zeros(1, 300, 8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(1, 300, 2, 128, dtype=torch.bfloat16)
    for cap in ((11, 0), (12, 1)):
        b = Bundle.open(test_bundle, capability=cap, device=B200)
        b.simulate(None)
        with pytest.raises(NoVariantError, match="no attention kernel") as e:
            rt.attention(b, q, kv, kv, causal=True)
        assert f"compute capability {cap[0]}.{cap[1]}" in str(e.value)
        assert f"for {BLACKWELL_DC}" in str(e.value), str(e.value)
