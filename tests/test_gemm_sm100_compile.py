"""Compile-only checks of the Blackwell GEMM family (no GPU here, and no Blackwell GPU anywhere: these
variants are proven by their SASS and resources only).  The "test" tier (one CTA-pair variant with
multicast) builds for sm_100a, plus one 1-CTA variant for the negative check: the pair's SASS
requirements must fail on a 1-CTA cubin, as the tcgen05 requirements must on a Hopper cubin
(tests/test_build.py runs ``factory verify`` on swapped cubins).

Everything that imports the DSL runs in one subprocess, because the compile worker must set the
target architecture before ``cutlass`` is first imported (AOT notes, trap 3).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, needs_dsl

pytestmark = needs_dsl

_WORKER = textwrap.dedent(
    """
    import json, re, sys
    from factory.compiler.compile import init_worker
    init_worker("sm_100a")
    from factory.compiler.builder import compile_cached  # the build's cache: compiled once
    from factory.atoms.targets import get_target
    from factory.compiler import cubin as cb
    from factory.compiler.sass import sass_problems
    from factory.gemm.sm100 import GemmSm100, enumerate_sm100, sass_tmem_alloc

    out_dir = sys.argv[1]
    tgt = get_target("sm_100a")
    tiers = {t: [v.name for v in enumerate_sm100(tgt, t)] for t in ("test", "default", "full")}
    others = sum(len(enumerate_sm100(get_target(t), "full")) for t in ("sm_80", "sm_90", "sm_90a"))
    report = {"tiers": tiers, "other_targets": others, "variants": {}}
    one_cta = GemmSm100(target="sm_100a", ab="bf16", c="bf16", tile=(128, 128, 64), pdl=True)
    sass_of = {}
    for v in enumerate_sm100(tgt, "test") + [one_cta]:
        info = compile_cached(v, out_dir)
        sass = sass_of[v.name] = cb.disassemble(f"{out_dir}/{v.name}.cubin")
        (kname, res), = info["kernels"].items()
        report["variants"][v.name] = {
            "pair": v.pair, "fp8": v.is_fp8, "cluster": list(v.cluster),
            "resources": res,
            "hist": cb.opcode_histogram(sass),
            "problems": sass_problems(v.target, v.sass_requirements(), sass),
            "requirements": list(v.sass_requirements()),
            "sass_target": cb.sass_target(sass),
            "smem_bytes": v.smem_bytes(),
            "capacity": v.tgt.smem_per_cta,
            "describe": v.describe(),
            "compile_seconds": info["compile_seconds"],
        }
    # The negative check: each pair variant's requirements against the 1-CTA cubin.
    report["pair_on_one_cta"] = {
        v.name: {"problems": sass_problems(v.target, v.sass_requirements(), sass_of[one_cta.name]),
                 "pair_only": sorted(set(v.sass_requirements()) - set(one_cta.sass_requirements()))}
        for v in enumerate_sm100(tgt, "test") if v.pair}
    # The TMEM allocation size as the SASS states it, for every column count an allocation may have.
    report["tmem_alloc_in_sass"] = {
        name: [c for c in (32, 64, 128, 256, 512) if re.search(sass_tmem_alloc(c), sass)]
        for name, sass in sass_of.items()}
    print("REPORT" + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm100")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CUTE_DSL_ARCH", None)
    p = subprocess.run([sys.executable, "-c", _WORKER, str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))
    return {**json.loads(line[len("REPORT"):]), "out": str(out)}


def test_tiers(report):
    tiers = report["tiers"]
    assert len(tiers["test"]) == 1  # the CPU suite compiles one Blackwell kernel (CI has 2 cores)
    # The default bundle keeps its Blackwell share small: build time and size.
    assert 4 <= len(tiers["default"]) <= 16  # 13: 11 + the two 64x64 decode tiles (cost_sm100)
    assert set(tiers["default"]) <= set(tiers["full"])
    for names in tiers.values():
        assert len(names) == len(set(names))
    default = tiers["default"]
    assert any("_2cta_" in n for n in default) and any("_2cta_" not in n for n in default)
    assert len({re.search(r"_t(\d+x\d+)x", n).group(1) for n in default}) >= 3
    assert any("_e4m3_" in n for n in default), "no fp8 variant"
    assert any(re.search(r"_t64x\d+x", n) for n in default), "no decode (64-row) tile"
    assert report["other_targets"] == 0  # only sm100-family targets get these variants


def test_test_tier_compiles_to_tcgen05_sass(report):
    assert len(report["variants"]) == 2
    for name, r in report["variants"].items():
        assert r["sass_target"] == "sm_100a", name
        assert not r["problems"], (name, r["problems"])
        hist = r["hist"]
        mma = "UTCQMMA" if r["fp8"] else "UTCHMMA"
        assert hist.get(mma + (".2CTA" if r["pair"] else ""), 0) > 0, name
        assert any(op.startswith("LDTM") for op in hist), name  # tcgen05.ld: TMEM -> registers
        assert not any(op.startswith(("HGMMA", "QGMMA", "HMMA", "LDGSTS")) for op in hist), \
            f"{name}: not a tcgen05/TMA kernel"
        assert sum(c for op, c in hist.items() if op.startswith("UTMASTG")) > 0, name
        if r["pair"]:
            assert any(op.startswith("UTMALDG") and op.endswith(".2CTA") for op in hist), name
            assert hist.get("UTCATOMSWS.2CTA.FIND_AND_SET.ALIGN", 0) > 0, name
        else:
            assert not any(".2CTA" in op for op in hist), name
        if r["cluster"] != [2 if r["pair"] else 1, 1]:
            assert any(op.startswith("UTMALDG") and "MULTICAST" in op for op in hist), name


def test_pair_requirements_fail_on_a_one_cta_cubin(report):
    """The .2CTA requirements are what tells a pair kernel from a 1-CTA one: a 1-CTA cubin (same
    family, same target) must fail exactly the pair's own requirements (the 2CTA MMA, TMA load,
    TMEM allocation and commit; multicast where the pair's cluster has it) and pass the rest."""
    assert report["pair_on_one_cta"]
    for name, r in report["pair_on_one_cta"].items():
        assert len(r["problems"]) == 1 and r["problems"][0].startswith("SASS lacks "), r["problems"]
        lacked = set(ast.literal_eval(r["problems"][0][len("SASS lacks "):]))
        assert lacked == set(r["pair_only"]), (name, lacked)
        assert {p for p in lacked if "2CTA" in p} >= {
            r"\bUTCHMMA\.2CTA\b", r"\bUTMALDG\.3D[\w.]*\.2CTA\b",
            r"\bUTCATOMSWS\.2CTA\.FIND_AND_SET\b", r"\bUTCBAR\.2CTA\b"}, lacked


def test_resources(report):
    for name, r in report["variants"].items():
        res, d = r["resources"], r["describe"]
        assert res["stack_frame_bytes"] == 0, f"{name} spills"
        assert not any(op.startswith(("LDL", "STL")) for op in r["hist"]), f"{name} spills"
        assert 0 < res["registers"] <= min(255, 65536 // d["threads"] // 8 * 8), (name, res)
        # Dynamic (the plan, equal to the kernel's SharedStorage: checked when tracing) + static.
        assert res["static_smem_bytes"] <= 1024, name
        assert r["smem_bytes"] + res["static_smem_bytes"] <= r["capacity"], name
        assert d["smem_bytes"] == r["smem_bytes"] and d["stages"] >= 3, name
        # TMEM: a power of two of at least 32 columns, within the SM's 512.
        cols = d["tmem_columns"]
        assert 32 <= cols <= 512 and cols & (cols - 1) == 0, (name, cols)
        assert cols >= d["acc_stages"] * d["mma_tile"][1] // (2 if d["tile"][0] == 64 else 1), name
        for key in ("tile", "mma_tile", "cta_group", "cluster", "persistent", "threads", "constraints"):
            assert key in d, (name, key)
        assert d["persistent"]["cluster_ctas"] == r["cluster"][0] * r["cluster"][1], name


def test_tmem_allocation_in_sass_is_the_plan(report):
    """The column count ptxas hands tcgen05.alloc (UMOV URn, cols/32 -> UTCATOMSWS.FIND_AND_SET) is
    the plan's, and no other count matches (the requirement would catch a wrong plan)."""
    for name, r in report["variants"].items():
        assert report["tmem_alloc_in_sass"][name] == [r["describe"]["tmem_columns"]], name


def test_names_follow_fields(report):
    for name in report["variants"]:
        assert re.match(r"gemm_sm100a_(bf16|f16|e4m3)_o(bf16|f16|f32)_a[km]_b[kn]_(2cta_)?t\d+x\d+x\d+_c\dx\d",
                        name), name


def test_the_family_target_cubin_holds_the_arch_specific_code(report, test_bundle):
    """The evidence for building datacenter Blackwell as sm_100f (notes/blackwell.md): ptxas
    accepts every tcgen05 / TMEM / 2-CTA form of the test-tier pair variant for the family target,
    and the cubin's code is byte for byte the sm_100a build's (every .text section equal, the ELF
    header flags equal); what differs is the ptxas -arch it records and its .nv.compat attributes,
    which is where the driver learns that it may also load it on 10.3."""
    import struct
    from pathlib import Path

    from conftest import BLACKWELL_DC
    from factory.compiler.cubin import _sections, ptxas_arch

    m = json.loads((test_bundle / "manifest.json").read_text())
    fam = next(v for v in m["variants"].values() if v["target"] == BLACKWELL_DC and v["family"] == "sm100"
               and v["op"] == "gemm" and not v.get("epilogue") and v.get("scale_mode") != "row")
    assert fam["target"] == "sm_100f"
    a_name = fam["name"].replace("sm100f", "sm100a")
    assert a_name in report["variants"]
    f_bin = (test_bundle / fam["files"]["cubin"]["path"]).read_bytes()
    a_bin = (Path(report["out"]) / f"{a_name}.cubin").read_bytes()
    assert (ptxas_arch(f_bin), ptxas_arch(a_bin)) == ("sm_100f", "sm_100a")
    assert struct.unpack_from("<I", f_bin, 0x30) == struct.unpack_from("<I", a_bin, 0x30)
    fs, as_ = _sections(f_bin), _sections(a_bin)
    texts = [k for k in as_ if k.startswith(".text.")]
    assert texts and set(texts) == {k for k in fs if k.startswith(".text.")}
    for k in texts:
        (_, fo, fn, _), (_, ao, an, _) = fs[k], as_[k]
        assert f_bin[fo:fo + fn] == a_bin[ao:ao + an], k
    compat = [a_bin[as_[".nv.compat"][1]:][:as_[".nv.compat"][2]], f_bin[fs[".nv.compat"][1]:][:fs[".nv.compat"][2]]]
    assert compat[0] != compat[1]
