"""The Blackwell datacenter (sm_100f: 10.0, 10.3) attention forward on this GPU-less machine: its SASS and resources, the
negative check (a non-tcgen05 attention cubin fails its requirements) and selection on a 10.0
device (no launches; nothing Blackwell has run: proof is the SASS).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch

from conftest import BLACKWELL_DC
from factory.runtime import Bundle

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed (the bundle is built here)")

B200 = {"name": "planned B200", "sm_count": 148}
DC = BLACKWELL_DC.replace("_", "")  # "sm100f"
TEST_VARIANT = f"attention_{DC}_bf16_d128_n128_causal"


def _manifest(bundle) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _attn100(m: dict) -> dict[str, dict]:
    return {n: v for n, v in m["variants"].items() if v["op"] == "attention" and v["family"] == "sm100"}


def test_sm100_attention_sass_and_resources(test_bundle):
    from factory.compiler.cubin import disassemble, ptxas_arch
    from factory.verify import sass_problems

    vs = _attn100(_manifest(test_bundle))
    assert set(vs) == {TEST_VARIANT}
    for name, v in vs.items():
        sass = disassemble(test_bundle / v["files"]["cubin"]["path"])
        assert re.search(r"\.target\s+sm_100a?\b", sass), name  # nvdisasm shows sm_100f as sm_100
        assert ptxas_arch((test_bundle / v["files"]["cubin"]["path"]).read_bytes()) == BLACKWELL_DC, name
        assert sass_problems(v, sass) == [], name
        for key in (r"\bUTCHMMA\b", r"\bUTCATOMSWS\.FIND_AND_SET\b", r"\bLDTM\.x32\b",
                    r"\bSTTM\.x32\b", r"\bUTMALDG\.4D\b", r"\bUTCBAR\b"):
            assert re.search(key, sass), (name, key)
        assert not re.search(r"\b(HGMMA|HMMA|LDSM|LDGSTS)\b", sass), name
        r = v["resources"]
        assert v["proof"] == "sass-only" and v["target"] == BLACKWELL_DC, name
        assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 227 * 1024, name
        assert v["tmem_columns"] == 256 and r["registers"] * v["threads"] <= 65536, name
        assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, name


def test_sm100_attention_requirements_fail_on_a_hopper_attention_cubin(test_bundle):
    """The sm_90a attention test-tier cubin (WGMMA, TMA, no tcgen05) relabelled as sm_100 lacks
    every tcgen05 / TMEM requirement of the Blackwell attention variant."""
    from factory.compiler.cubin import disassemble
    from factory.verify import sass_problems

    m = _manifest(test_bundle)
    donor = next(n for n, v in m["variants"].items()
                 if v["op"] == "attention" and v["target"] == "sm_90a")
    sass = re.sub(r"\.target\s+sm_\w+", ".target sm_100",
                  disassemble(test_bundle / m["variants"][donor]["files"]["cubin"]["path"]))
    problems = sass_problems(m["variants"][TEST_VARIANT], sass)
    assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
    for key in ("UTCHMMA", "UTCATOMSWS", "LDTM", "STTM", "UTCBAR"):
        assert key in problems[0], (key, problems[0])


def test_sm100_attention_selection(test_bundle, monkeypatch):
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
        if cap[0] == 10:  # the family cubin serves B200 and B300
            assert name == TEST_VARIANT
            assert len(args) == 6 and args[3] is o and args[4] is lse  # (q, k, v, o, lse, scale)
            assert b.manifest["variants"][name]["proof"] == "sass-only"
        else:
            assert not any(v["target"] == BLACKWELL_DC for v in b.candidates("attention"))
            assert not name.startswith(f"attention_{DC}_"), name
