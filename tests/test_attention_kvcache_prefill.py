"""Prefill attention over a KV cache, without a GPU: the sm80 family's kvcache variants (cp.async
row gathers, every switch) and the sm90a family's (TMA page boxes of 16-64 rows for pages of at
least that size, cp.async row gathers for any page size; window, softcap and sink switches;
head_dim 256; fp8 e4m3 caches converted by the gathering producer threads).

Enumeration (one variant per switch in the test tier), the contract's signature (the page size a
launch-time symbol), manifest fields the selection reads, refusals; and, with the DSL, one compile
per kind of K/V load (in a subprocess: the target must be set before ``cutlass`` is imported)
checked in the SASS: mma.sync/cp.async/ldmatrix for sm80, HGMMA with TMA page boxes or LDGSTS
gathers for sm90a, no local memory where the register budget allows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

needs_dsl = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)
pytestmark = needs_dsl  # the family modules import the DSL


def _variants(target: str, tier: str):
    from factory.registry import enumerate_variants

    return [v for v in enumerate_variants([target], ["attention_kvcache"], tier=tier)
            if v.family in ("sm80", "sm90")]


def test_test_tier_has_each_switch():
    vs = _variants("sm_90", "test")
    assert {v.family for v in vs} == {"sm80"}
    for switch in ("local", "softcap", "sinks", "varlen"):
        assert any(getattr(v, switch) for v in vs), switch
    assert any(not v.paged for v in vs) and any(v.paged for v in vs)
    assert any(not v.causal for v in vs) and any(v.causal for v in vs)
    assert any(v.kv_dtype == "e4m3" for v in vs)
    hopper = _variants("sm_90a", "test")
    assert {v.family for v in hopper} == {"sm90"}
    assert {v.page_box for v in hopper} == {0, 64}
    assert any(v.varlen for v in hopper)
    assert any(v.local and v.softcap and v.sinks for v in hopper)
    # head_dim 256 (TMA boxes) and an fp8 cache on the gathers
    assert [v.page_box for v in hopper if v.head_dim == 256] == [64]
    fp8 = [v for v in hopper if v.kv_dtype == "e4m3"]
    assert fp8 and all(v.page_box == 0 and v.dtype == "bf16" for v in fp8)


def test_default_tier_sm90a():
    """The default tier's sm_90a prefill builds (bf16, causal): page boxes of 64 rows and the
    gathers, and the switch build on the gathers (any page size), each for dense and packed q;
    boxes of 16 rows for packed and dense q (two stages); the same at head_dim 256 (no 16-row
    boxes; the switch build for packed q); the fp8-cache gathers at head_dim 128.  The page-box
    builds are persistent, on the page-box schedule (``box_schedule``) and preferred (selection:
    fewest page sizes, then preferred)."""
    # (e4m3 q, the fp8-WGMMA builds: tests/test_attention_kvcache_fp8_prefill.py)
    vs = [v for v in _variants("sm_90a", "default") if v.dtype != "e4m3"]
    assert all(v.dtype == "bf16" and v.causal for v in vs)
    d128 = [v for v in vs if v.head_dim == 128 and v.kv_dtype == "bf16"]
    plain = {(v.page_box, v.varlen) for v in d128 if not v.local}
    assert plain == {(pb, vl) for pb in (64, 0) for vl in (False, True)} | {(16, True), (16, False)}
    assert {(v.varlen, v.stages) for v in d128 if v.page_box == 16} == {(True, 2), (False, 2)}
    for v in vs:
        assert v.persistent == (v.page_box > 0 and v.kv_dtype == "bf16"), v.name
        if v.persistent:
            assert v.describe()["preferred"] and v.describe()["tile_scheduler"]["persistent"], v.name
            # the page-box schedule: the lazy rescale; at head_dim 128 also the early rescale, the
            # diagonal half softmax and the stmatrix epilogue (at 256 those two for dense q)
            assert v.lazy_rescale and v.early_rescale == (v.head_dim == 128), v.name
            assert v.diag_half == v.o_stmatrix == (v.head_dim == 128 or not v.varlen), v.name
    sw = [v for v in d128 if v.local]
    assert {(v.page_box, v.varlen) for v in sw} == {(0, False), (0, True)}
    assert all(v.softcap and v.sinks for v in sw)
    # head_dim 256: boxes of 64 rows and the gathers, dense and packed q; the switch build packed
    d256 = [v for v in vs if v.head_dim == 256]
    assert {(v.page_box, v.varlen, v.local) for v in d256} == (
        {(pb, vl, False) for pb in (64, 0) for vl in (False, True)} | {(0, True, True)})
    # fp8 caches (head_dim 128): the gathers, dense and packed q
    fp8 = [v for v in vs if v.kv_dtype == "e4m3"]
    assert {(v.head_dim, v.page_box, v.varlen) for v in fp8} == {(128, 0, False), (128, 0, True)}
    assert len(vs) == len(d128) + len(d256) + len(fp8)


def test_fp8_only_where_the_target_converts():
    for t in ("sm_80", "sm_86"):
        assert not [v for v in _variants(t, "test") + _variants(t, "full") if v.kv_dtype == "e4m3"], t
    assert [v for v in _variants("sm_89", "full") if v.kv_dtype == "e4m3"]
    from factory.attention.sm80 import AttentionKvcacheSm80

    v = AttentionKvcacheSm80(target="sm_80", dtype="bf16", kv_dtype="e4m3", head_dim=128, tile_m=128,
                             tile_n=128, warps=8, stages=2)
    assert "e4m3" in v.can_implement()


def test_signature_is_the_contract():
    from factory.attention import contract

    for v in _variants("sm_90", "test") + _variants("sm_90a", "test"):
        sig = v.signature()
        assert sig == contract.signature_kvcache(v.dtype, v.kv_dtype, v.head_dim, v.paged, None,
                                                 varlen_q=v.varlen), v.name
        k = next(a for a in sig.args if a.name == "k_cache")
        assert k.shape[1] == ("PS" if v.paged else "Sk"), v.name  # the page size at launch
        names = [a.name for a in sig.args]
        assert ("cu_seqlens_q" in names) == v.varlen and ("max_seqlen_q" in names) == v.varlen


def test_manifest_fields():
    for v in _variants("sm_90", "test") + _variants("sm_90a", "test"):
        d = v.describe()
        for k in ("dtype", "kv_dtype", "head_dim", "paged", "causal", "local", "softcap", "sinks",
                  "varlen", "page_sizes", "tile"):
            assert k in d, (v.name, k)
        if v.family == "sm80":
            assert d["page_sizes"] == ([1, 8, 16, 32, 64, 128, 256] if v.paged else [])
        else:
            assert d["page_sizes"] == [p for p in (1, 8, 16, 32, 64, 128, 256) if p >= v.page_box]
            assert d["kv_loads"] == ("tma" if v.page_box else "cp.async")
            assert (d["local"], d["softcap"], d["sinks"]) == (v.local, v.softcap, v.sinks)
            assert d["kv_dtype"] in (d["dtype"], "e4m3")


def test_sm90_refusals():
    import dataclasses

    ps = _variants("sm_90a", "test")[0]
    v = dataclasses.replace(ps, persistent=False, early_rescale=False, lazy_rescale=False, diag_half=False,
                            o_stmatrix=False)
    # persistent CTAs: on the TMA page boxes of 16-bit caches only; preferred over one tile per CTA,
    # with the page-box schedule's consumer options (the lazy rescale on persistent builds only;
    # the stmatrix epilogue and the diagonal half softmax not on the gathers)
    assert ps.can_implement() is None and ps.describe()["tile_scheduler"]["persistent"]
    assert "_ps_" in ps.name and "_ps_" not in v.name
    assert ps.describe()["preferred"] and not v.describe()["preferred"]
    assert not dataclasses.replace(ps, lazy_rescale=False).describe()["preferred"]
    assert "lazy_rescale" in dataclasses.replace(v, lazy_rescale=True).can_implement()
    assert "o_stmatrix" in dataclasses.replace(v, page_box=0, o_stmatrix=True).can_implement()
    assert "diag_half" in dataclasses.replace(v, page_box=0, diag_half=True).can_implement()
    assert "persistent" in dataclasses.replace(v, persistent=True, page_box=0).can_implement()
    assert "persistent" in dataclasses.replace(v, persistent=True, page_box=0, kv_dtype="e4m3").can_implement()
    assert "k_first" in dataclasses.replace(v, k_first=True).can_implement()
    assert "page_box" in dataclasses.replace(v, page_box=48).can_implement()
    assert dataclasses.replace(v, page_box=16).can_implement() is None
    assert "gather" in dataclasses.replace(v, page_box=0, tile_n=192).can_implement()
    assert "window" in dataclasses.replace(v, causal=False, local=True).can_implement()
    assert "dtype" in dataclasses.replace(v, kv_dtype="f16").can_implement()
    assert "gathers" in dataclasses.replace(v, kv_dtype="e4m3").can_implement()
    fp8 = dataclasses.replace(v, kv_dtype="e4m3", page_box=0)
    assert fp8.can_implement() is None
    assert "softcap" in dataclasses.replace(fp8, softcap=True).can_implement()
    assert "head_dim" in dataclasses.replace(fp8, head_dim=64).can_implement()
    # head_dim 256: 64-key tiles of 64- or 32-row boxes or the gathers; 16-row boxes spill
    d256 = dataclasses.replace(v, head_dim=256, tile_n=64)
    assert d256.can_implement() is None and d256.smem_bytes() <= 227 * 1024
    assert dataclasses.replace(d256, page_box=32).can_implement() is None
    assert "256" in dataclasses.replace(d256, page_box=16).can_implement()
    assert "head_dim" in dataclasses.replace(d256, page_box=0, kv_dtype="e4m3").can_implement()


_WORKER = textwrap.dedent(
    """
    import json, re, sys
    from factory.compiler.compile import init_worker
    target, out_dir, pattern = sys.argv[1], sys.argv[2], sys.argv[3]
    init_worker(target)
    from factory.compiler.builder import compile_cached  # the build's cache: compiled once
    from factory.compiler import cubin as cb
    from factory.registry import enumerate_variants
    import fnmatch
    report = {}
    for v in enumerate_variants([target], ["attention_kvcache"], tier="test"):
        if not any(fnmatch.fnmatch(v.name, p) for p in pattern.split("|")):
            continue
        info = compile_cached(v, out_dir)
        sass = cb.disassemble(f"{out_dir}/{v.name}.cubin")
        report[v.name] = {"hist": cb.opcode_histogram(sass), "page_box": getattr(v, "page_box", None),
                          "missing": [r for r in v.sass_requirements() if not re.search(r, sass)],
                          "params": [p for _, p in info["header"]["params"]],
                          "args": [a.name for a in v.signature().args]}
    print("REPORT" + json.dumps(report))
    """
)


def _compile(target: str, out_dir: Path, pattern: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _WORKER, target, str(out_dir), pattern], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))[len("REPORT"):])


def test_compile_sm80_family_switches(tmp_path):
    """The window/softcap/sink variant (sm_90 portability build): mma.sync, cp.async gathers,
    tanh for the softcap, no local memory, the header's arguments in the contract's order."""
    report = _compile("sm_90", tmp_path, "attention_kvcache_sm90_*_m128_*_win_cap_sink*")
    assert len(report) == 1
    for name, r in report.items():
        h = r["hist"]
        assert not r["missing"], (name, r["missing"])
        assert h.get("LDGSTS.E.BYPASS.LTC128B.128", 0) > 0 and h.get("MUFU.TANH", 0) > 0, name
        assert not any(op.startswith(("LDL", "STL")) for op in h), name
        assert r["params"] == ["module", *r["args"], "stream"], name


@pytest.fixture(scope="module")
def sm90_report(tmp_path_factory):
    """One compile subprocess for the sm_90a checks below."""
    return _compile("sm_90a", tmp_path_factory.mktemp("sm90a"),
                    "*bf16_d128*causal_ov_pp_*cbf16*|*_win_cap_sink|*sm90a_bf16_d256*causal*pb64|*ce4m3*")


def test_compile_sm90_paged(sm90_report):
    """sm_90a: the TMA page-box variant loads K/V with 4D TMA boxes and no LDGSTS, the gather
    variants with LDGSTS, per-thread barrier arrives and one row offset per thread shuffled
    around its warp (the producer's 40 registers: no local memory); the switch build's softcap
    on MUFU.TANH; all on HGMMA."""
    report = {k: r for k, r in sm90_report.items() if "_d256_" not in k and "ce4m3" not in k}
    assert {r["page_box"] for r in report.values()} == {0, 64} and len(report) == 3
    for name, r in report.items():
        h = r["hist"]
        assert not r["missing"], (name, r["missing"])
        assert not any(op.startswith(("LDL", "STL")) for op in h), (name, "local memory")
        if r["page_box"]:
            assert h.get("UTMALDG.4D", 0) >= 3 and not h.get("LDGSTS.E.BYPASS.128"), name
        else:
            assert h.get("LDGSTS.E.BYPASS.128", 0) > 0 and h.get("ARRIVES.LDGSTSBAR.64.ARVCNT", 0) > 0, name
            assert h.get("SHFL.IDX", 0) >= 16, name
        assert (h.get("MUFU.TANH", 0) > 0) == name.endswith("_win_cap_sink"), name
        assert r["params"] == ["module", *r["args"], "stream"], name


def test_compile_sm90_d256_and_fp8(sm90_report):
    """sm_90a: head_dim 256 over TMA page boxes (P·V on 64x256 HGMMAs, no local memory within
    227 KB of smem) and the fp8-cache gather (e4m3 copies by LDGSTS into the staging tile,
    converted by the producer threads and stored with 16-byte STS into the rings; no local
    memory at the producer's 40 registers)."""
    report = {k: r for k, r in sm90_report.items() if "_d256_" in k or "ce4m3" in k}
    assert len(report) == 2
    for name, r in report.items():
        h = r["hist"]
        assert not r["missing"], (name, r["missing"])
        assert not any(op.startswith(("LDL", "STL")) for op in h), (name, "local memory")
        assert r["params"] == ["module", *r["args"], "stream"], name
        if "ce4m3" in name:
            assert h.get("F2FP.F16.E4M3.UNPACK_B", 0) > 0 and h.get("STS.128", 0) > 0, name
            assert h.get("LDGSTS.E.BYPASS.128", 0) > 0 and h.get("SHFL.IDX", 0) >= 16, name
            assert not h.get("ARRIVES.LDGSTSBAR.64.ARVCNT"), name  # arrives after the stores
        else:
            assert h.get("UTMALDG.4D", 0) >= 3 and not h.get("LDGSTS.E.BYPASS.128"), name


def _entries(target: str, tier: str = "test"):
    return [{"name": v.name, "family": v.family, "target": v.target, **v.describe()}
            for v in _variants(target, tier)]


def _problem(**kw):
    from kvcache_rules import Problem

    base = dict(batch=4, seqlen_q=512, heads_q=32, heads_kv=8, head_dim=128, max_seqlen_k=8192,
                dtype="bf16", kv_dtype="bf16", page_size=16, causal=True, local=False, softcap=False,
                sinks=False, varlen_q=False)
    return Problem(**{**base, **kw})


def test_selection_hopper():
    """On a 9.0 device (sm_90a candidates before sm_90): page sizes of whole TMA boxes take the
    sm90 TMA variant, smaller ones its cp.async gather; the window/softcap/sink switches its
    switch build where one fits the problem; fp8, a dense cache and what no sm90 build has fall
    to the sm80 family's sm_90 build."""
    from kvcache_rules import select

    cands = _entries("sm_90a") + _entries("sm_90")
    pick = lambda **kw: select(cands, _problem(**kw))  # noqa: E731
    assert pick(page_size=128)["kv_loads"] == "tma"
    assert pick(page_size=64, seqlen_q=2048)["kv_loads"] == "tma"
    assert pick(page_size=16)["kv_loads"] == "cp.async" and pick(page_size=16)["family"] == "sm90"
    assert pick(page_size=128, varlen_q=True)["varlen"]
    e = pick(head_dim=64, dtype="f16", kv_dtype="f16", local=True, softcap=True, sinks=True, varlen_q=True)
    assert e["family"] == "sm90" and e["target"] == "sm_90a" and e["local"] and e["sinks"]
    e = pick(kv_dtype="e4m3", causal=False)
    assert e["family"] == "sm80" and e["kv_dtype"] == "e4m3" and e["paged"]
    e = pick(kv_dtype="e4m3")
    assert e["family"] == "sm90" and e["kv_dtype"] == "e4m3" and e["kv_loads"] == "cp.async"
    e = pick(head_dim=256, page_size=64)
    assert e["family"] == "sm90" and e["head_dim"] == 256 and e["kv_loads"] == "tma"
    e = pick(head_dim=64, page_size=None, causal=False, varlen_q=True)
    assert e["family"] == "sm80" and not e["paged"]
    # beside the one-tile-per-CTA builds of the same page boxes ("full"): the persistent ones
    full = _entries("sm_90a", "full") + _entries("sm_90")
    for kw in (dict(page_size=64), dict(page_size=64, varlen_q=True), dict(page_size=16),
               dict(page_size=32, varlen_q=True), dict(head_dim=256, heads_q=16, page_size=128)):
        e = select(full, _problem(**kw))
        assert e["kv_loads"] == "tma" and e["tile_scheduler"]["persistent"] and e["stages"] == 2, (kw, e["name"])


def test_selection_ampere_ada():
    """sm_80 / sm_89 devices: the sm80 family for every seqlen_q (no decode family there)."""
    from kvcache_rules import select

    for t in ("sm_80", "sm_89"):
        cands = _entries(t, "default")
        for sq in (1, 4, 17, 2048):
            e = select(cands, _problem(seqlen_q=sq, page_size=16))
            assert e["family"] == "sm80" and e["paged"] and e["causal"], (t, sq)
    e = select(_entries("sm_89", "full"), _problem(kv_dtype="e4m3", page_size=256))
    assert e["kv_dtype"] == "e4m3"

