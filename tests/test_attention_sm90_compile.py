"""Compile-only checks of the Hopper FlashAttention-forward family (``factory/attention/sm90.py``)
and the runtime's choice between it and the sm80 family on a 9.0 device (no GPU needed).

The "test" tier (bf16, D128, causal, overlap: the 128-row tile with ping-pong and its 64-row twin)
is compiled for sm_90a in one subprocess (the compile worker sets the target before ``cutlass`` is
imported); each cubin must show both WGMMA forms (S = Q·Kᵀ from smem, P·V with P from registers),
TMA loads and the TMA store, setmaxnreg both ways, one WGMMA group kept in flight (the overlap),
the ping-pong named barrier where it ping-pongs, no spills, and the header must take the sm80
dense arguments in order.  So must the head_dim 256 default (128 x 80).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import selection_lib as sl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

needs_dsl = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)

_WORKER = textwrap.dedent(
    """
    import json, re, sys
    from factory.compiler.compile import init_worker
    init_worker("sm_90a")
    from factory.compiler.builder import compile_cached  # the build's cache: compiled once
    from factory.atoms.targets import get_target
    from factory.compiler import cubin as cb
    from factory.attention.sm90 import enumerate_attention

    report = {}
    tier, names = (sys.argv[2], sys.argv[3:]) if len(sys.argv) > 2 else ("test", [])
    for v in enumerate_attention(get_target("sm_90a"), tier):
        if names and v.name not in names:
            continue
        info = compile_cached(v, sys.argv[1])
        sass = cb.disassemble(f"{sys.argv[1]}/{v.name}.cubin")
        res = max(info["kernels"].values(), key=lambda r: r["registers"])
        lines = [ln.split(";")[0].split("*/")[-1].strip() for ln in sass.splitlines() if "*/" in ln]
        report[v.name] = {
            "config": v.config(),
            "resources": res,
            "hist": cb.opcode_histogram(sass),
            "hgmma": [ln for ln in lines if ln.startswith("HGMMA")],
            "bars": [ln for ln in lines if ln.startswith(("BAR.", "USETMAXREG", "WARPGROUP.DEPBAR"))],
            # the order of the WGMMA waits, exponentials and WGMMAs: 1 / 0 = DEPBAR.LE gsb0 0x1 / 0x0
            "order": "".join({"WARPGROUP.DEPBAR.LE gsb0, 0x1": "1", "WARPGROUP.DEPBAR.LE gsb0, 0x0": "0"}
                             .get(ln, "E" if ln.startswith("MUFU.EX2") else "G" if ln.startswith("HGMMA")
                                  else "") for ln in lines),
            "missing_sass": [r for r in v.sass_requirements() if not re.search(r, sass)],
            "sass_target": cb.sass_target(sass),
            "params": [p for _, p in info["header"]["params"]],
            "arg_names": [a.name for a in v.signature().args],
        }
    print("REPORT" + json.dumps(report))
    """
)


def _compile_report(tmp_path, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _WORKER, str(tmp_path), *args], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))[6:])


@needs_dsl
def test_test_tier_sass(tmp_path):
    report = _compile_report(tmp_path)
    assert len(report) == 3  # (the preferred tile, its 64-row twin, its dynamic twin)
    _check_report(report)


@needs_dsl
def test_head_dim_256_sass(tmp_path):
    """The D256 defaults (128 x 80, causal 128 x 64; overlap + ping-pong, persistent with O through
    Q's slabs, the lazy rescale): P·V as m64n256k16 with A from registers (tile_n/16 k-steps), S = Q·Kᵀ as
    m64n<tile_n>k16 from smem (256/16 k-steps), setmaxnreg 24 / 240, no spills although O alone
    holds 128 of the consumer's 240 registers."""
    names = ["attention_sm90a_bf16_d256_m128_n80_s2_ov_pp_ps_kf_lz_cw_mc",
             "attention_sm90a_bf16_d256_m128_n64_s2_causal_ov_pp_ps_kf_lz"]
    report = _compile_report(tmp_path, "default", *names)
    assert sorted(report) == sorted(names)
    _check_report(report)
    for name in names:
        bars = report[name]["bars"]
        assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in bars and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0" in bars, bars
        assert report[name]["resources"]["registers"] * 384 <= 65536


def _check_report(report: dict) -> None:
    for name, r in report.items():
        cfg = r["config"]
        d, bn = cfg["head_dim"], cfg["tile_n"]
        assert r["sass_target"] == "sm_90a", name
        assert not r["missing_sass"], (name, r["missing_sass"])
        # S = Q·Kᵀ: both operands from smem descriptors, D/16 k-steps, issued three times (first
        # key tile, the masked loop over the diagonal tiles, the unmasked loop); P·V: A from
        # registers, V transposed from smem, tile_n/16 k-steps, three times (two loops, last tile).
        ss = [h for h in r["hgmma"] if h.startswith(f"HGMMA.64x{bn}x16.F32.BF16 R") and ", gdesc[" in h
              and not h.split(", ")[1].startswith("R")]
        rs = [h for h in r["hgmma"] if h.startswith(f"HGMMA.64x{d}x16.F32.BF16 R")
              and h.split(", ")[1].startswith("R") and ".tnspB" in h]
        # (Non-causal: no masked loop over diagonal tiles, so each GEMM is issued twice; const_wg:
        # the consumer code once per consumer warpgroup, so twice as many issue sites.)
        copies = 2 if cfg.get("const_wg") else 1
        issues = (3 if cfg["causal"] else 2) * copies
        assert len(ss) == issues * d // 16 and len(rs) == issues * bn // 16, (name, r["hgmma"])
        assert len(r["hgmma"]) == len(ss) + len(rs), name
        bars = r["bars"]
        assert any(b.startswith("USETMAXREG.DEALLOC") for b in bars), name
        assert any(b.startswith("USETMAXREG.TRY_ALLOC") for b in bars), name
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in bars, name  # overlap: P·V in flight over softmax
        # Each loop waits for S ("1"), then for P·V ("0"), then issues the next WGMMA ("G").
        loops = re.findall(r"1(E*)0(E*)G", r["order"])
        assert len(loops) == issues - copies, (name, r["order"])
        if cfg["pingpong"]:
            assert any(b.startswith("BAR.SYNC") and b.endswith("0x100") for b in bars), name
        hist = r["hist"]
        assert hist.get("UTMALDG.4D", 0) > 0 and hist.get("UTMASTG.4D", 0) > 0, name
        assert hist.get("MUFU.EX2", 0) >= bn // 4, name  # one per score element and thread
        assert not any(op.startswith(("LDL", "STL")) for op in hist), (name, "local memory")
        assert r["resources"]["stack_frame_bytes"] == 0, name
        assert r["params"] == ["module", *r["arg_names"], "stream"], name
        # dynamic: the tile counter's atomic adds (the next tile; the arrival), none elsewhere
        atoms = sum(n for op, n in hist.items() if op.startswith("ATOMG"))
        assert (atoms >= 2) if cfg.get("dynamic") else (atoms == 0), (name, atoms)


# --- no DSL needed below (the family module imports the DSL, so these skip without it) ----------
def _family():
    pytest.importorskip("cutlass")
    from factory.attention import sm90

    return sm90


@needs_dsl
def test_enumeration_and_names():
    from factory.atoms.targets import get_target

    sm90 = _family()
    test = sm90.enumerate_attention(get_target("sm_90a"), "test")
    assert [v.name for v in test] == ["attention_sm90a_bf16_d128_m128_n128_s2_causal_ov_pp_er_ps_kf_lz_sd",
                                      "attention_sm90a_bf16_d128_m64_n128_s2_causal_ov",
                                      "attention_sm90a_bf16_d128_m128_n128_s2_causal_ov_pp_er_ps_kf_lz_sd_sc_dy"]
    default = sm90.enumerate_attention(get_target("sm_90a"), "default")
    # the dynamic twins of the causal dense persistent builds of head_dim 64 (128 and 192 rows), 128
    # and 256, of the bf16 causal varlen ones of head_dim 64 and 128, and of the bf16 non-causal
    # dense and varlen ones of head_dim 128, which the selection takes in their place
    # (tests/test_attention_dynamic.py)
    dyn = [v for v in default if v.dynamic]
    assert sorted((v.dtype, v.head_dim, v.tile_m, v.causal, v.varlen) for v in dyn) == sorted(
        [(dt, d, m, True, False) for dt in ("bf16", "f16") for d, m in ((64, 128), (64, 192), (128, 128), (256, 128))]
        + [("bf16", 64, 192, True, True), ("bf16", 128, 128, True, True)]
        + [("bf16", 128, 128, False, vl) for vl in (False, True)])
    assert all(v.persistent for v in dyn)
    assert all(dataclasses.replace(v, dynamic=False, slot_coords=False, diag_half=False, o_stmatrix=False,
                                   store_defer=v.store_defer and v.causal).name in {u.name for u in default}
               for v in dyn)
    default = [v for v in default if not v.dynamic]
    problems = {(dt, d, c) for dt in ("bf16", "f16") for d in (64, 128, 256) for c in (False, True)}
    varlen = [v for v in default if v.varlen]
    default = [v for v in default if not v.varlen]
    assert {(v.dtype, v.head_dim, v.causal) for v in varlen} == problems and len(varlen) == 12
    assert all(v.describe()["preferred"] and v.tile_m > 64 for v in varlen)
    split = [v for v in default if v.kv_split]  # head_dim 64 causal: the 64-row tile's cluster twin
    assert {(v.dtype, v.head_dim, v.causal, v.tile_m) for v in split} == {("bf16", 64, True, 64), ("f16", 64, True, 64)}
    assert all(v.describe()["cluster"] == [2, 1] and v.describe()["kv_splits"] == 2 and not v.persistent
               and not v.describe()["preferred"] for v in split)
    default = [v for v in default if not v.kv_split]
    # causal, dense: the 128-row head_dim 64 tile and the one-tile-per-CTA head_dim 256 build beside
    # the preferred ones (the selection's short-causal rules), neither preferred
    short = [v for v in default if v.causal and ((v.head_dim, v.tile_m) == (64, 128)
                                                 or (v.head_dim == 256 and v.tile_m == 128 and not v.persistent))]
    assert {(v.dtype, v.head_dim) for v in short} == {(dt, d) for dt in ("bf16", "f16") for d in (64, 256)}
    assert not any(v.describe()["preferred"] for v in short)
    assert all(v.persistent and v.store_defer and v.stages == 2 for v in short if v.head_dim == 64)
    assert all(v.describe()["tile"] == [128, 64] and v.lazy_rescale for v in short if v.head_dim == 256)
    default = [v for v in default if v not in short]
    big = [v for v in default if v.tile_m > 64]
    small = [v for v in default if v.tile_m == 64]
    assert {v.tile_m for v in big + varlen if v.head_dim == 64} == {192}
    assert {v.tile_m for v in big + varlen if v.head_dim >= 128} == {128}
    # D256: FA3's 128 x 80 (O alone is 128 registers per consumer thread), 64 x 80 when under-filled
    assert {tuple(v.describe()["tile"]) for v in default if v.head_dim == 256} == {(128, 80), (64, 80), (128, 64), (64, 64)}  # causal: 128x64 (128x80 spills)
    assert len(default) == 24 and len(big) == len(small) == 12
    assert {(v.dtype, v.head_dim, v.causal) for v in big} == problems
    assert {(v.dtype, v.head_dim, v.causal) for v in small} == problems
    assert all(v.can_implement() is None and v.overlap for v in default)
    assert all(v.pingpong and v.describe()["preferred"] for v in big)
    # persistent, dense and varlen; O through Q's slabs where its own do not fit (head_dim 256)
    assert all(v.persistent and v.o_in_q == (v.head_dim == 256) for v in big + varlen)
    assert not any(v.persistent for v in small)
    assert all(v.describe()["tile_scheduler"]["max_ctas"] == sm90.PERSISTENT_CTAS for v in big + varlen)
    # the lazy rescale: the dense and varlen head_dim 128 and 256 tiles
    assert {(v.dtype, v.head_dim, v.causal, v.varlen) for v in default + varlen if v.lazy_rescale} == {
        (dt, d, c, vl) for dt in ("bf16", "f16") for d in (128, 256) for c in (False, True)
        for vl in (False, True)}
    assert all(v.tile_m == 128 for v in default + varlen if v.lazy_rescale)
    # store_defer: the dense causal persistent tiles with O slabs of their own (head_dim 64, 128)
    assert {(v.dtype, v.head_dim) for v in default + varlen if v.store_defer} == {
        (dt, d) for dt in ("bf16", "f16") for d in (64, 128)}
    assert all(v.causal and not v.varlen and v.persistent and not v.o_in_q
               for v in default + varlen if v.store_defer)
    assert "lazy_rescale needs overlap" in sm90.AttentionSm90(
        target="sm_90a", head_dim=128, lazy_rescale=True).can_implement()
    assert all(("o_smem" in v.describe()["tile_scheduler"]) == v.o_in_q for v in big + varlen)
    full = sm90.enumerate_attention(get_target("sm_90a"), "full")
    assert {v.name for v in full} > {v.name for v in default + varlen}
    assert sum(v.describe()["preferred"] for v in full) == 24  # the ablations are not preferred
    assert not any(v.pingpong or v.describe()["preferred"] for v in small)
    assert small[0].describe()["registers_per_role"] == {"producer": 56, "consumer": 256}
    three = next(v for v in big if v.tile_m == 192).describe()
    assert three["registers_per_role"] == {"producer": 32, "consumer": 160} and three["threads"] == 512
    for t in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100a"):
        assert sm90.enumerate_attention(get_target(t), "default") == []


@needs_dsl
def test_const_wg_is_the_head_dim_256_non_causal_default():
    """The per-warpgroup copy of the consumer code: the preferred head_dim 256 non-causal persistent
    builds (bf16, f16; dense (with the K/V multicast pair) and varlen) and their full-tier twins, the
    plain twins in the full tier not preferred, refused without persistence and by the subclasses'
    own kernels."""
    sm90 = _family()
    from factory.atoms.targets import get_target

    full = sm90.enumerate_attention(get_target("sm_90a"), "full")
    cw = [v for v in full if v.const_wg and not v.kv_mcast]
    assert {(v.dtype, v.head_dim, v.causal, v.varlen) for v in cw} == {
        (dt, 256, False, vl) for dt in ("bf16", "f16") for vl in (False, True)}
    pref = [v for v in full if v.const_wg and v.describe()["preferred"]]
    assert sorted((v.dtype, v.varlen) for v in pref) == sorted((dt, vl) for dt in ("bf16", "f16") for vl in (False, True))
    assert all(v.name.endswith("_lz_cw_mc" if not v.varlen else "_lz_cw") for v in pref)
    # dense: the multicast pair's static twin (--candidates); varlen without the lazy rescale; the
    # dynamic twins (bf16, dense)
    assert all(v.varlen != v.lazy_rescale for v in cw if v not in pref and not v.dynamic)
    assert {(v.dtype, v.varlen) for v in cw if not v.dynamic and not v.varlen} == {("bf16", False), ("f16", False)}
    assert all(v.dtype == "bf16" and not v.varlen and v.lazy_rescale for v in cw if v.dynamic)
    default = sm90.enumerate_attention(get_target("sm_90a"), "default")
    assert {v.name for v in default if v.const_wg and not v.dynamic} == {v.name for v in pref}
    assert not any(v.const_wg and v.dynamic for v in default)
    cw = pref
    plain = {v.name: v for v in full if v.head_dim == 256 and not v.causal and not v.const_wg}
    assert all(v.name.removesuffix("_mc").removesuffix("_cw") in plain for v in cw)  # the plain twin, for --candidates
    assert not any(v.describe()["preferred"] for v in plain.values())
    assert "const_wg needs persistent" in dataclasses.replace(cw[0], persistent=False).can_implement()
    from factory.attention.sm90_fp8 import AttentionFp8Sm90

    assert "own kernels only" in AttentionFp8Sm90(target="sm_90a", head_dim=128, overlap=True, pingpong=True,
                                      persistent=True, const_wg=True).can_implement()


@needs_dsl
def test_exponential_options_off_by_default_and_named_where_used():
    """ex2_fma / ex2_pairs (the key tiles' exponentials partly off MUFU): no enumerated variant
    uses them (names, configs and describe as before), a variant that does is named and described
    by them, its SASS requirements name what they leave, and the kernels without them refuse."""
    sm90 = _family()
    from factory.atoms.targets import get_target
    from factory.attention.sm90_fp8 import AttentionFp8Sm90, enumerate_attention_fp8

    t = get_target("sm_90a")
    every = [*sm90.enumerate_attention(t, "full"), *enumerate_attention_fp8(t, "full")]
    for v in every:
        assert not {"xf0", "xb"} & set(v.name.split("_")) and not re.search(r"_xf\d", v.name), v.name
        assert "ex2_fma" not in v.config() and "exp2" not in v.describe(), v.name
    seed = next(v for v in every if v.name == "attention_sm90a_bf16_d64_m64_n128_s2_ov")
    fma = dataclasses.replace(seed, ex2_fma=8)
    assert fma.name == seed.name + "_xf8" and fma.can_implement() is None
    assert fma.config()["ex2_fma"] == 8 and fma.describe()["exp2"] == {"fma_per_16": 8, "degree": 3}
    assert r"\bFADD\.RM\b" in fma.sass_requirements()
    pairs = dataclasses.replace(seed, ex2_pairs=True)
    assert pairs.name == seed.name + "_xb" and r"\bMUFU\.EX2\.BF16\b" in pairs.sass_requirements()
    fp8 = next(v for v in every if isinstance(v, AttentionFp8Sm90) and v.head_dim == 128)
    fp8_fma = dataclasses.replace(fp8, ex2_fma=2)
    assert fp8_fma.can_implement() is None and fp8_fma.describe()["exp2"]["degree"] == 2  # e4m3 P
    assert "_xf2_" in fp8_fma.name and r"\bFADD\.RM\b" in fp8_fma.sass_requirements()
    assert "0-16" in dataclasses.replace(seed, ex2_fma=17).can_implement()
    assert "takes them all" in dataclasses.replace(seed, ex2_fma=4, ex2_pairs=True).can_implement()
    f16 = next(v for v in every if v.dtype == "f16" and not v.causal)
    assert "bf16" in dataclasses.replace(f16, ex2_pairs=True).can_implement()
    assert dataclasses.replace(f16, ex2_fma=4).can_implement() is None
    from factory.attention.sm90 import AttentionKvcacheSm90

    kv = AttentionKvcacheSm90(target="sm_90a", head_dim=128, overlap=True, pingpong=True, ex2_fma=4)
    assert "sm90 and fp8 kernels only" in kv.can_implement()


@needs_dsl
def test_kv_multicast_pairs_preferred_at_head_dim_256_non_causal():
    """kv_mcast (a cluster of two persistent CTAs on adjacent query tiles, K/V halves multicast
    into both): in the default tier only the preferred dense non-causal head_dim 256 builds (bf16,
    f16), whose static twins stay in the full tier (not preferred; bf16 with its dynamic twins); the
    varlen, one-tile-per-CTA, under-filled-grid and dynamic builds of that problem do not inherit
    it; the full tier's twins of the other dense persistent defaults are clusters of two, not
    preferred; every one must show the multicast TMA load; the dynamic, varlen and
    one-tile-per-CTA builds refuse it."""
    sm90 = _family()
    from factory.atoms.targets import get_target

    t = get_target("sm_90a")
    default = sm90.enumerate_attention(t, "default")
    dmc = [v for v in default if v.kv_mcast or "mc" in v.name.split("_") or "kv_mcast" in v.config()]
    assert sorted((v.dtype, v.head_dim, v.causal, v.varlen) for v in dmc) == [("bf16", 256, False, False),
                                                                             ("f16", 256, False, False)]
    assert all(v.kv_mcast and v.describe()["preferred"] and v.name.endswith("_lz_cw_mc") for v in dmc)
    assert all(sm90.default_schedule(256, False, persistent_all=True)["kv_mcast"] for _ in dmc)
    assert not any(sm90.default_schedule(d, c, vl, persistent_all=pa)["kv_mcast"]
                   for d in (64, 128, 256) for c in (False, True) for vl in (False, True) for pa in (False, True)
                   if (d, c, vl, pa) != (256, False, False, True))
    assert not sm90.default_schedule(256, False, small=True, persistent_all=True)["kv_mcast"]
    # the same problem's other default builds: no pair (varlen, the 64-row tile)
    assert {(v.varlen, v.tile_m) for v in default if v.head_dim == 256 and not v.causal and not v.kv_mcast} == {
        (True, 128), (False, 64)}
    full = sm90.enumerate_attention(t, "full")
    by_name = {v.name: v for v in full}
    for v in dmc:
        static = by_name[v.name.removesuffix("_mc")]
        assert not static.kv_mcast and not static.describe()["preferred"]
        twins = {n[len(static.name):] for n in by_name if n.startswith(static.name + "_")}
        assert twins == ({"_mc", "_dy", "_sc_dy", "_om_sc_dy"} if v.dtype == "bf16" else {"_mc"}), twins
    mc = [v for v in full if v.kv_mcast]
    assert {(v.dtype, v.head_dim, v.causal) for v in mc} == {
        (dt, d, c) for dt in ("bf16", "f16") for d in (64, 128, 256) for c in (False, True) if dt == "bf16" or (d >= 128 and not c)}
    for v in mc:
        d = v.describe()
        assert v.name.endswith("_mc") and v.config()["kv_mcast"] and d["cluster"] == [2, 1], v.name
        assert d["tile_scheduler"]["persistent"] and not v.dynamic and not v.varlen
        assert d["preferred"] == (v in dmc or v.name in {u.name for u in dmc}), v.name
        assert r"\bUTMALDG\.4D\.MULTICAST\b" in v.sass_requirements()
        assert dataclasses.replace(v, kv_mcast=False, stages=2).name in {u.name for u in full}
    base = next(v for v in mc if v.head_dim == 128 and not v.causal and v.dtype == "bf16")
    for bad in ({"dynamic": True}, {"varlen": True}, {"persistent": False, "k_first": False}):
        assert "kv_mcast needs" in dataclasses.replace(base, **bad).can_implement(), bad


@needs_dsl
def test_head_dim_256_selection_takes_the_multicast_pair():
    """The host library's choice (C; the Python loader asks it) among the default tier's head_dim
    256 manifest entries, with the full tier's static twin of the multicast pair and that twin's
    dynamic twins beside them: full dense non-causal grids take the pair (bf16, f16), never a
    dynamic twin of the static build; the under-filled grid its 64-row tile; varlen and causal
    problems the builds they took before."""
    sm90 = _family()
    from factory.atoms.targets import get_target

    t = get_target("sm_90a")

    def entry(v):
        return {"name": v.name, "op": v.op, "family": v.family, "target": v.target, "config": v.config(),
                **v.describe(), "signature": v.signature().to_json()}

    default = [v for v in sm90.enumerate_attention(t, "default") if v.head_dim == 256]
    full = {v.name: v for v in sm90.enumerate_attention(t, "full")}
    static = [full[v.name.removesuffix("_mc")] for v in default if v.kv_mcast]
    twins = [full[n] for n in full for s in static if n.startswith(s.name + "_") and full[n].dynamic]
    assert len(static) == 2 and len(twins) == 3
    lib = sl.Lib([entry(v) for v in default + static + twins], sm_count=132)
    for dt in ("bf16", "f16"):
        p = f"attention_sm90a_{dt}_d256_"
        for dims in ((4, 32, 32, 4096, 4096), (1, 16, 16, 16384, 16384), (8, 16, 16, 2048, 2048), (32, 32, 32, 512, 512)):
            assert lib.attention(*dims, d=256, dtype=dt, causal=False) == (p + "m128_n80_s2_ov_pp_ps_kf_lz_cw_mc", 1)
        assert lib.attention(1, 8, 8, 512, 512, d=256, dtype=dt, causal=False)[0] == p + "m64_n80_s2_ov"
        assert lib.attention(8, 16, 16, 2048, 2048, d=256, dtype=dt, causal=False, varlen=True)[0] == (
            p + "m128_n80_s2_varlen_ov_pp_ps_kf_lz_cw")
        assert lib.attention(8, 16, 16, 2048, 2048, d=256, dtype=dt, causal=True)[0] == (
            p + "m128_n64_s2_causal_ov_pp_ps_kf_lz_dh_om_sc_dy")
        assert lib.attention(32, 32, 32, 512, 512, d=256, dtype=dt, causal=True)[0] == p + "m128_n64_s2_causal_ov_pp_lz"


@needs_dsl
def test_signature_describe_and_limits():
    sm90 = _family()
    from factory.attention.sm80 import AttentionSm80

    V = sm90.AttentionSm90
    v = V(target="sm_90a", dtype="f16", head_dim=128, causal=True, overlap=True, pingpong=True,
          persistent=True, k_first=True, early_rescale=True, lazy_rescale=True, store_defer=True)
    assert v.name == "attention_sm90a_f16_d128_m128_n128_s2_causal_ov_pp_er_ps_kf_lz_sd"
    # The sm80 family's dense calling convention, argument for argument: no new launch code.
    assert v.signature() == AttentionSm80(target="sm_90", dtype="f16", head_dim=128,
                                          causal=True).signature()
    d = v.describe()
    assert (d["dtype"], d["head_dim"], d["causal"], d["varlen"]) == ("f16", 128, True, False)
    assert d["tile"] == [128, 128] and d["splits"] == 1 and d["pack_gqa"] is False
    assert d["preferred"] and d["min_seqlen_q"] == sm90.MIN_SEQLEN_Q and d["ctas_per_sm"] == 1
    assert d["registers_per_role"] == {"producer": 24, "consumer": 240} and d["threads"] == 384
    json.dumps(d)
    assert not dataclasses.replace(v, lazy_rescale=False).describe()["preferred"]
    assert not dataclasses.replace(v, store_defer=False).describe()["preferred"]
    assert "store_defer needs" in dataclasses.replace(v, persistent=False).can_implement()
    assert "store_defer needs" in dataclasses.replace(v, varlen=True).can_implement()
    assert "store_defer needs" in dataclasses.replace(v, stages=3).can_implement()  # O through Q's slabs
    assert not V(target="sm_90a", dtype="f16", head_dim=64).describe()["preferred"]
    assert "Hopper" in V(target="sm_90", dtype="bf16").can_implement()
    # varlen: the sm80 family's packed convention
    assert V(target="sm_90a", dtype="bf16", varlen=True).signature() == AttentionSm80(
        target="sm_90", dtype="bf16", varlen=True).signature()
    assert "(Hq, Tq)" in V(target="sm_90a", dtype="bf16", varlen=True).describe()["constraints"]["lse"]
    assert "head_dim" in V(target="sm_90a", dtype="bf16", head_dim=96).can_implement()
    assert "tile_m" in V(target="sm_90a", dtype="bf16", tile_m=96).can_implement()
    assert "pingpong" in V(target="sm_90a", dtype="bf16", tile_m=64, pingpong=True).can_implement()
    assert "smem" in V(target="sm_90a", dtype="bf16", stages=4).can_implement()  # 32K + 4x64K
    assert "registers" in V(target="sm_90a", dtype="bf16", tile_n=256).can_implement()
    assert V(target="sm_90a", dtype="bf16", stages=3).can_implement() is None  # 225 KB fits
    # persistent: O gets its own slabs (32K more at D128) where they fit, else it leaves through Q's
    two = V(target="sm_90a", dtype="bf16", persistent=True)
    assert not two.o_in_q and two.smem_bytes() == V(target="sm_90a", dtype="bf16").smem_bytes() + 32768
    three = V(target="sm_90a", dtype="bf16", stages=3, persistent=True)
    assert three.o_in_q and three.can_implement() is None
    assert three.smem_bytes() == V(target="sm_90a", dtype="bf16", stages=3).smem_bytes()
    assert V(target="sm_90a", dtype="bf16", varlen=True, persistent=True).can_implement() is None
    assert "overlap" in V(target="sm_90a", dtype="bf16", early_rescale=True).can_implement()
    assert not V(target="sm_90a", dtype="bf16", varlen=True).describe()["tile_scheduler"]["persistent"]


@needs_dsl
def test_head_dim_256_budgets():
    """D256 tiles: registers (O 128 + S tile_n/2 + P tile_n/4 per consumer thread, +32, within
    setmaxnreg's 240 / 256) and smem (Q 64 KB + 2 stages of K and V) decide what exists."""
    sm90 = _family()
    V = sm90.AttentionSm90

    def why(tm, tn, s=2):
        return V(target="sm_90a", dtype="bf16", head_dim=256, tile_m=tm, tile_n=tn, stages=s,
                 overlap=True, pingpong=tm > 64).can_implement()

    assert why(128, 80) is None and why(128, 64) is None and why(64, 80) is None and why(64, 96) is None
    assert V(target="sm_90a", head_dim=256, tile_n=80).smem_bytes() + 1024 == 231424 <= 227 * 1024
    assert "registers" in why(128, 112) and "registers" in why(128, 128)
    assert "smem" in why(128, 96) and "smem" in why(128, 64, 3) and "smem" in why(64, 128)
    assert "registers" in why(192, 64)  # 3 consumers at 160 registers: no room for O
    from factory.atoms.targets import get_target

    full = sm90.enumerate_attention(get_target("sm_90a"), "full")
    tiles = {(v.tile_m, v.tile_n, v.overlap, v.pingpong) for v in full if v.head_dim == 256 and not v.varlen}
    assert tiles == {(128, 80, True, True), (128, 64, True, True), (128, 80, True, False), (128, 80, False, True),
                     (64, 80, True, False), (64, 64, True, False)}


# --- selection on a 9.0 device ----------------------------------------------------------------
def _e(name, target, causal=False, tile=(128, 128), splits=1, pack=False, **kw):
    return {"name": name, "target": target, "dtype": "bf16", "head_dim": 128, "causal": causal,
            "varlen": False, "tile": list(tile), "stages": 2, "splits": splits, "pack_gqa": pack, **kw}


# Best target first, as Bundle.candidates orders them on a 9.0 device.
_SM90 = dict(min_seqlen_q=2, ctas_per_sm=1)
H100 = [
    _e("h", "sm_90a", preferred=True, **_SM90), _e("hc", "sm_90a", True, preferred=True, **_SM90),
    _e("hs", "sm_90a", tile=(64, 128), **_SM90), _e("hsc", "sm_90a", True, tile=(64, 128), **_SM90),
    _e("big", "sm_90", preferred=True), _e("small", "sm_90", tile=(64, 128)),
    _e("bigc", "sm_90", True, preferred=True), _e("smallc", "sm_90", True, tile=(64, 128)),
    _e("s4", "sm_90", tile=(64, 128), splits=4), _e("s16", "sm_90", tile=(64, 128), splits=16),
    _e("s4c", "sm_90", True, tile=(64, 128), splits=4),
    _e("p4", "sm_90", tile=(64, 128), splits=4, pack=True),
    _e("p16", "sm_90", tile=(64, 128), splits=16, pack=True),
]


def _pick(causal, b, hq, hkv, sq, sk, cands=H100):
    """The host library's choice on these entries (tests/selection_lib.py), a 132-SM H100."""
    return sl.Lib(cands, sm_count=132).attention(b, hq, hkv, sq, sk, causal=causal)[0]


def test_h100_prefill_takes_the_sm90_family():
    assert _pick(False, 1, 16, 16, 16384, 16384) == "h"
    assert _pick(True, 2, 16, 16, 4096, 4096) == "hc"
    assert _pick(True, 4, 32, 8, 2048, 2048) == "hc"           # GQA prefill
    # under-filled grids: the 64-row tile when its grid needs no more waves (1 CTA per SM)
    assert _pick(False, 1, 8, 8, 512, 512) == "hs"             # 64 vs 32 CTAs: one wave each
    assert _pick(True, 4, 32, 8, 128, 4096) == "hc"            # 256 vs 128 CTAs: two waves vs one
    assert _pick(True, 4, 32, 8, 4, 8192) == "hsc"             # 128 CTAs either way, no split
    assert _pick(True, 8, 32, 32, 2, 4096) == "hsc"            # at min_seqlen_q: two waves either way
    assert _pick(True, 1, 8, 8, 64, 4096) == "s4c"             # a grid that needs split-KV


def test_h100_small_grid_takes_the_key_split_tile():
    """Where the 64-row tile is chosen for a causal under-filled grid, its kv_split twin (a cluster
    of two CTAs per query tile, half of the key tiles each) takes it when the grid of pairs is at
    most one CTA per SM and sees four key tiles or more; the plain small-tile rule never picks it."""
    ks = [_e("hks", "sm_90a", tile=(64, 128), kv_splits=2, cluster=[2, 1], **_SM90),
          _e("hksc", "sm_90a", True, tile=(64, 128), kv_splits=2, cluster=[2, 1], **_SM90)]
    c = H100 + ks
    assert _pick(True, 1, 8, 8, 512, 512, c) == "hksc"     # 64 query tiles: 128 CTAs, 4 key tiles
    assert _pick(True, 1, 4, 4, 1024, 1024, c) == "s4c"    # (a grid the split-KV rule takes first)
    assert _pick(False, 1, 8, 8, 512, 512, c) == "hs"      # not causal: measured no faster
    assert _pick(True, 1, 8, 8, 256, 256, c) == "hsc"      # two key tiles: measured slower
    assert _pick(True, 1, 16, 16, 512, 512, c) == "hsc"    # 128 query tiles: 256 CTAs
    assert _pick(True, 2, 16, 16, 4096, 4096, c) == "hc"   # a full grid: the preferred tile
    assert _pick(True, 1, 8, 8, 512, 512, ks + H100) == "hksc"  # (listed first: still not the plain small tile)
    assert _pick(True, 1, 16, 16, 512, 512, ks + H100) == "hsc"


def test_h100_short_causal_rows_take_the_128_row_tile():
    """A preferred query tile over 128 rows (head_dim 64: 192) gives way to the 128-row tile of the
    same key tile for causal problems of at most four key tiles on a full grid; longer keys, no
    mask, under-filled grids and bundles without the 128-row tile choose as before."""
    d64 = [_e("w", "sm_90a", True, tile=(192, 128), preferred=True, **_SM90),
           _e("m", "sm_90a", True, tile=(128, 128), **_SM90),
           _e("s", "sm_90a", True, tile=(64, 128), **_SM90),
           _e("wn", "sm_90a", tile=(192, 128), preferred=True, **_SM90),
           _e("mn", "sm_90a", tile=(128, 128), **_SM90)]
    assert _pick(True, 32, 32, 32, 512, 512, d64) == "m"
    assert _pick(True, 64, 32, 32, 384, 384, d64) == "m"
    assert _pick(True, 32, 32, 8, 100, 512, d64) == "m"       # fewer queries than keys
    assert _pick(True, 32, 32, 32, 640, 640, d64) == "w"      # five key tiles
    assert _pick(True, 8, 16, 16, 2048, 2048, d64) == "w"
    assert _pick(False, 32, 32, 32, 512, 512, d64) == "wn"    # not causal
    assert _pick(True, 1, 8, 8, 512, 512, d64) == "s"         # under-filled: the small-tile rule
    assert _pick(True, 32, 32, 32, 512, 512, [d64[0], d64[2]]) == "w"
    assert _pick(True, 32, 32, 32, 512, 512) == "hc"          # a preferred 128-row tile stays


def test_h100_short_causal_rows_leave_o_through_q_persistence():
    """A preferred persistent variant whose O leaves through Q's slabs (head_dim 256) gives way to
    its one-tile-per-CTA twin for causal problems of at most 512 keys on a full grid; a preferred
    persistent variant with O slabs of its own, longer keys and no mask keep the preferred one."""
    qs = {"persistent": True, "max_ctas": 132, "o_smem": "q slabs"}
    own = {"persistent": True, "max_ctas": 132}
    one = {"persistent": False}
    d256 = [_e("p", "sm_90a", True, tile=(128, 64), preferred=True, tile_scheduler=qs, **_SM90),
            _e("t", "sm_90a", True, tile=(128, 64), tile_scheduler=one, **_SM90),
            _e("s", "sm_90a", True, tile=(64, 64), tile_scheduler=one, **_SM90),
            _e("pn", "sm_90a", tile=(128, 64), preferred=True, tile_scheduler=qs, **_SM90),
            _e("tn", "sm_90a", tile=(128, 64), tile_scheduler=one, **_SM90)]
    assert _pick(True, 32, 32, 32, 512, 512, d256) == "t"
    assert _pick(True, 64, 32, 8, 256, 256, d256) == "t"
    assert _pick(True, 8, 16, 16, 2048, 2048, d256) == "p"
    assert _pick(True, 32, 32, 32, 640, 640, d256) == "p"
    assert _pick(False, 32, 32, 32, 512, 512, d256) == "pn"   # not causal
    assert _pick(True, 1, 8, 8, 512, 512, d256) == "s"        # under-filled: the small-tile rule
    own_o = [dict(d256[0], tile_scheduler=own), d256[1]]
    assert _pick(True, 32, 32, 32, 512, 512, own_o) == "p"


def test_h100_decode_keeps_the_sm80_family():
    # Sq = 1 with GQA: packed split-KV (sm_90 build), as before sm_90a variants existed
    assert _pick(False, 8, 32, 8, 1, 4096) == "p4"
    assert _pick(True, 1, 32, 8, 1, 16384) == "p16"
    # no GQA / a few queries: plain split-KV where the grid is under-filled
    assert _pick(False, 1, 32, 32, 1, 4096) == "s4"
    assert _pick(True, 2, 32, 8, 4, 16384) == "s4c"
    # one query, a full grid without split: below min_seqlen_q, the sm_90 build's rule as before
    assert _pick(False, 8, 32, 32, 1, 4096) == "small"
    assert _pick(True, 8, 32, 32, 1, 4096) == "smallc"
    # bundles without sm_90a variants choose exactly as before
    old = H100[4:]
    assert _pick(False, 1, 16, 16, 16384, 16384, old) == "big"
    assert _pick(False, 8, 32, 8, 1, 4096, old) == "p4"
    assert _pick(True, 4, 32, 8, 128, 4096, old) == "smallc"   # (no ctas_per_sm: the old rule)
    # only sm_90a variants: used for every shape (correct, if not the fastest)
    assert _pick(False, 8, 32, 8, 1, 4096, H100[:4]) == "hs"


def test_h100_varlen_takes_the_sm90_family():
    vl = [dict(_e("hv", "sm_90a", preferred=True, **_SM90), varlen=True),
          dict(_e("hvs", "sm_90a", tile=(64, 128), **_SM90), varlen=True),
          dict(_e("bv", "sm_90", preferred=True), varlen=True)]
    assert sl.Lib(vl).attention(2, 8, 8, 64, 64, causal=False, varlen=True)[0] == "hv"  # the preferred tile
    assert sl.Lib(vl[2:]).attention(2, 8, 8, 64, 64, causal=False, varlen=True)[0] == "bv"


def test_h100_selection_through_a_bundle(test_bundle, monkeypatch):
    """The test-tier bundle opened as on an H100: its sm_90a variant (bf16, D128, causal) serves
    causal bf16 D128 prefill; what it does not cover (D64, decode) comes from the sm_90 build."""
    torch = pytest.importorskip("torch")
    from factory.runtime import Bundle
    from factory.runtime import attention as rt

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    cands = b.candidates("attention")
    assert cands[0]["target"] == "sm_90a" and {c["target"] for c in cands} == {"sm_90a", "sm_90"}
    sm90a = [c["name"] for c in cands if c["target"] == "sm_90a"]
    monkeypatch.setattr(rt, "_check_common", lambda *a, **k: None)
    b.simulate(None)  # CPU tensors; launch itself is replaced below
    calls = []
    monkeypatch.setattr(b, "launch", lambda name, args, device=None: calls.append((name, args)))
    bf = torch.bfloat16
    q = torch.zeros(1, 300, 4, 128, dtype=bf)
    kv = torch.zeros(1, 500, 2, 128, dtype=bf)
    for _ in ("first", "hot path"):
        o, lse = rt.attention(b, q, kv, kv, causal=True, return_lse=True)
        name, args = calls[-1]
        assert name in sm90a and len(args) == 6 and args[3] is o and args[4] is lse
    # one query: the decode family (sm_90 build; its rule: 2 kv heads, 8 key tiles -> 4 splits
    # merged in a cluster, with PDL); without it, sm_90a (nothing else for bf16 D128 causal)
    rt.attention(b, torch.zeros(1, 1, 4, 128, dtype=bf), kv, kv, causal=True)
    assert calls[-1][0] == "attention_sm90_bf16_d128_q16_n64_w4_s3_causal_kv4_cl_pdl"
    # (a library of the bundle's entries without the decode family)
    b._selector = sl.Lib([e for e in b.manifest["variants"].values() if not e.get("decode_rows")],
                         sm_count=132, name="planned H100").sel
    rt.attention(b, torch.zeros(1, 1, 4, 128, dtype=bf), kv[:, :499], kv[:, :499], causal=True)
    assert calls[-1][0] in sm90a
    # D64: the sm_90 build's variant
    rt.attention(b, torch.zeros(1, 300, 4, 64, dtype=bf), *(torch.zeros(1, 500, 2, 64, dtype=bf),) * 2)
    assert calls[-1][0] == "attention_sm90_bf16_d64_m128_n128_w8_s2"
    with pytest.raises(LookupError, match="no attention kernel"):
        rt.attention(b, torch.zeros(1, 300, 4, 128, dtype=torch.float16), kv.half(), kv.half())
