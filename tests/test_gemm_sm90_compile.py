"""Compile-only checks of the Hopper GEMM family (no GPU needed): the "test" tier builds for
sm_90a, and each cubin shows the instructions that make it a Hopper kernel (WGMMA, TMA loads and
stores, mbarriers, setmaxnreg; multicast TMA for clusters), no local-memory spills, and the
shared memory the variant's plan promised.

Everything that imports the DSL runs in one subprocess, because the compile worker must set the
target architecture before ``cutlass`` is first imported (AOT notes, trap 3).
"""

from __future__ import annotations

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
    import json, struct, sys
    from factory.compiler.compile import init_worker
    init_worker("sm_90a")
    from factory.compiler.builder import compile_cached  # the build's cache: compiled once
    from factory.atoms.targets import get_target
    from factory.compiler import cubin as cb
    from factory.gemm.sm90 import EARLY_LOAD_SASS, GemmSm90, enumerate_sm90

    def regcount(data, name):
        # EIATTR_REGCOUNT may sit in the global .nv.info section (keyed by symbol), not the
        # per-kernel one: take the largest count found anywhere.
        secs = cb._sections(data)
        best = 0
        for sname, (_t, off, size, _i) in secs.items():
            if sname.startswith(".nv.info"):
                for v in cb._nv_info(data, off, size).get(0x2F, []):
                    if len(v) >= 8:
                        best = max(best, struct.unpack_from("<I", v, 4)[0])
        return best

    out_dir = sys.argv[1]
    tiers = {t: [v.name for v in enumerate_sm90(get_target("sm_90a"), t)]
             for t in ("test", "default", "full")}
    report = {"tiers": tiers, "other_target": len(enumerate_sm90(get_target("sm_80"), "full")),
              "variants": {}}
    for v in enumerate_sm90(get_target("sm_90a"), "test"):
        info = compile_cached(v, out_dir)
        path = f"{out_dir}/{v.name}.cubin"
        data = open(path, "rb").read()
        sass = cb.disassemble(path)
        (kname, res), = info["kernels"].items()
        report["variants"][v.name] = {
            "resources": res,
            "registers": res["registers"] or regcount(data, kname),
            "hist": cb.opcode_histogram(sass),
            "missing_sass": [r for r in v.sass_requirements() if not __import__("re").search(r, sass)],
            "sass_target": cb.sass_target(sass),
            "smem_bytes": v.smem_bytes(),
            "capacity": v.tgt.smem_per_cta,
            "describe": v.describe(),
            "fp8": v.is_fp8,
            "cluster": list(v.cluster),
            "compile_seconds": info["compile_seconds"],
        }
        report.setdefault("early_load", {})[v.name] = bool(
            __import__("re").search(EARLY_LOAD_SASS, sass))
    print("REPORT" + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CUTE_DSL_ARCH", None)
    p = subprocess.run([sys.executable, "-c", _WORKER, str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


def test_tiers(report):
    tiers = report["tiers"]
    # Up to 4 plain variants and the 5 fused-epilogue ones (each field alone, all three together,
    # the e4m3 output with group scales).
    epi = [n for n in tiers["test"] if n.endswith(("_bias", "_res", "_silumul", "_q128"))]
    assert 2 <= len(tiers["test"]) - len(epi) <= 4 and len(epi) == 5
    # 46 kernels, the early_b twins of the decode ones and two more early_b decode tiles; 12 fp8
    # kernels with row or block scales and the early_b twins of their 2 decode ones; the 128x128
    # fp8 ping-pong tiles with row scales (1x2 plain and swizzled, 2x1).
    assert 8 <= len(tiers["default"]) <= 99
    assert len(tiers["full"]) > len(tiers["default"])
    for names in tiers.values():
        assert len(names) == len(set(names))
    assert set(tiers["default"]) <= set(tiers["full"])
    assert any("_c2x1_" in n or "_c1x2_" in n for n in tiers["default"]), "no multicast variant"
    assert any("_e4m3_" in n for n in tiers["default"]), "no fp8 variant"
    assert any("_swap" in n for n in tiers["default"]), "no decode (swap-AB) variant"
    assert any("_sk2" in n for n in tiers["default"]), "no split-K variant"
    assert report["other_target"] == 0  # only sm90-family targets get these variants


def test_test_tier_compiles_to_hopper_sass(report):
    assert report["variants"], "nothing compiled"
    for name, r in report["variants"].items():
        assert r["sass_target"] == "sm_90a", name
        assert not r["missing_sass"], (name, r["missing_sass"])
        hist = r["hist"]
        mma = "QGMMA" if r["fp8"] else "HGMMA"
        assert any(op.startswith(mma) for op in hist), name
        assert not any(op.startswith("HMMA") for op in hist), f"{name}: fell back to mma.sync"
        if r["cluster"] != [1, 1]:
            assert any(op.startswith("UTMALDG") and "MULTICAST" in op for op in hist), name
        if r["fp8"]:  # the per-tensor scales are read and applied
            assert hist.get("FMUL", 0) > 0 and any(op.startswith("LDG") for op in hist), name
        epilogue = r["describe"].get("epilogue") or []
        if "silu_mul" in epilogue:  # silu: exp2 and reciprocal on the MUFU
            assert hist.get("MUFU.EX2", 0) > 0 and hist.get("MUFU.RCP", 0) > 0, name
        if "bias" in epilogue or "residual" in epilogue:  # read in the epilogue
            assert any(op.startswith("LDG") for op in hist), name
        if "fp8_groups" in epilogue:  # the quad's amax by shuffles, saturating e4m3, scales stored
            assert hist.get("SHFL.BFLY", 0) > 0, name
            assert any(op.startswith("F2FP.SATFINITE.E4M3") for op in hist), name
            assert any(op.startswith("STG") for op in hist), name
        if not epilogue and not r["fp8"]:  # a plain bf16 GEMM reads nothing but its TMA tiles
            assert not any(op.startswith("LDG") for op in hist), name


def test_resources(report):
    for name, r in report["variants"].items():
        assert r["resources"]["stack_frame_bytes"] == 0, f"{name} spills"
        assert not any(op.startswith(("LDL", "STL")) for op in r["hist"]), f"{name} spills"
        # What the launch needs for all warpgroups (setmaxnreg then moves registers to the
        # consumers): 168 for three warpgroups.
        threads = r["describe"]["threads"]
        assert 0 < r["registers"] <= min(255, 65536 // threads // 8 * 8), (name, r["registers"])
        assert r["smem_bytes"] + r["resources"]["static_smem_bytes"] <= r["capacity"], name
        d = r["describe"]
        assert d["smem_bytes"] == r["smem_bytes"] and d["stages"] >= 3, name
        for key in ("tile", "cluster", "schedule", "constraints", "threads", "persistent"):
            assert key in d, (name, key)


def test_names_follow_fields(report):
    for name in report["variants"]:
        pattern = r"gemm_sm90a_(bf16|f16|e4m3)_o(bf16|f16|f32|e4m3)_a[km]_b[kn]_t\d+x\d+x\d+_c\dx\d_"
        assert re.match(pattern, name), name


def test_two_row_k_tiles_only_on_swap_ws_tiles():
    """Stages two 128-byte rows deep along K (two TMA boxes) are allowed on the warp-specialized
    swap tiles, where they were run on the H100 (bf16 and fp8, with tails), and nowhere else."""
    from factory.gemm.sm90 import GemmSm90, _default

    bf16 = dict(target="sm_90a", ab="bf16", c="bf16")
    wide = GemmSm90(**bf16, tile=(16, 64, 128), schedule="ws", swap_ab=True)
    assert wide.can_implement() is None
    narrow = GemmSm90(**bf16, tile=(16, 64, 64), schedule="ws", swap_ab=True)
    assert wide.plan().stage_bytes == 2 * narrow.plan().stage_bytes
    assert GemmSm90(target="sm_90a", ab="e4m3", c="bf16", tile=(32, 64, 256), schedule="ws",
                    swap_ab=True).can_implement() is None
    for bad in (dict(tile=(128, 128, 128)), dict(tile=(64, 128, 128), schedule="ws"),
                dict(tile=(16, 64, 256), schedule="ws", swap_ab=True)):
        assert "128-byte row" in GemmSm90(**bf16, **bad).can_implement(), bad
    names = {GemmSm90(target="sm_90a", **d).name for d in _default()}
    assert {"gemm_sm90a_bf16_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl",
            "gemm_sm90a_bf16_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl"} <= names


def test_default_tiles_launch_with_pdl():
    """Every tile of the default tier launches with PDL and carries its SASS requirement (PREEXIT =
    launch_dependents, ACQBULK = wait).  Each swap (decode) tile has an ``early_b`` twin (``_eb``)
    that must show a TMA load before a wait; no other tile has one."""
    import dataclasses

    from factory.gemm.sm90 import EARLY_LOAD_SASS, GemmSm90, _default

    vs = [GemmSm90(target="sm_90a", **d) for d in _default()]
    names = {v.name for v in vs}
    for v in vs:
        assert v.pdl, v.name
        assert r"\bPREEXIT\b" in v.sass_requirements(), v.name
        assert (EARLY_LOAD_SASS in v.sass_requirements()) == v.early_b, v.name
        if not v.early_b:
            # (Fused-epilogue decode tiles have no early_b twin: b_constant calls run them as they are.)
            assert (dataclasses.replace(v, early_b=True).name in names) == (v.swap_ab and not v.has_epilogue), v.name
        if v.early_b:
            assert v.pdl and v.swap_ab, v.name
    assert GemmSm90(target="sm_90a", ab="bf16", c="bf16", tile=(16, 64, 64), schedule="ws",
                    swap_ab=True, early_b=True).can_implement() == \
        "early_b loads B before the PDL wait: it needs pdl"


def test_early_b_sass_order(report):
    """The early_b twin issues a TMA load before its griddepcontrol.wait; the plain PDL kernel
    waits before every load (the pattern must not match it, or the requirement proves nothing)."""
    eb = [n for n in report["variants"] if n.endswith("_eb")]
    assert eb
    for n in eb:
        assert report["early_load"][n] and report["early_load"][n[:-3]] is False, n


def test_swizzle_exact_rules():
    """``swizzle_exact`` walks groups of ``swizzle`` clusters along N without the library's padding
    tiles: it runs only where the kernel remaps the plain M raster (swizzle > 1, raster m,
    unswapped, unsplit), is named ``_swx`` and leaves every other name as it was."""
    from factory.gemm.sm90 import GemmSm90, _default

    fp8 = dict(target="sm_90a", ab="e4m3", c="bf16", tile=(128, 128, 128), cluster=(1, 2), schedule="pp",
               fast_accum=True, row_scale=True, pdl=True)
    v = GemmSm90(**fp8, swizzle=8, swizzle_exact=True)
    assert v.can_implement() is None
    assert v.name.endswith("_sw8_swx_fastacc_sk1_pdl_rowsc") and v.describe()["swizzle_exact"] is True
    assert "swizzle_exact" not in GemmSm90(**fp8, swizzle=8).describe()
    for bad in (dict(swizzle=1), dict(swizzle=8, raster="n")):
        assert "swizzle_exact needs" in GemmSm90(**fp8, swizzle_exact=True, **bad).can_implement(), bad
    swap = GemmSm90(target="sm_90a", ab="e4m3", c="bf16", tile=(64, 64, 128), schedule="ws", swap_ab=True,
                    swizzle=8, swizzle_exact=True)
    assert "swizzle_exact needs" in swap.can_implement()
    assert not any("_swx" in GemmSm90(target="sm_90a", **d).name for d in _default()
                   if not d.get("swizzle_exact"))
