"""``factory verify`` on the Hopper attention family (sm_90a): what every such cubin must prove —
WGMMA with both operands in smem (S = Q·Kᵀ), WGMMA with A from registers (P·V), TMA loads — and
its resources: the manifest's registers / static smem / stack frame equal the cubin's, smem within
the target's 227 KB, the setmaxnreg budget per warpgroup role in the SASS equal to the manifest's,
the CTA's register file not overcommitted, and no spills.  Each check is shown to fail: an sm_90
(sm80-family, mma.sync) cubin in the sm_90a slot, a Hopper GEMM cubin (WGMMA and TMA, but no
register-A form and other budgets) in it, a manifest whose role budget, registers or smem lie, and
a disassembly with local-memory spills.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, needs_dsl

pytestmark = needs_dsl


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _attn90(m) -> str:
    return next(n for n, v in m["variants"].items() if v["family"] == "sm90" and v["op"] == "attention"
                and v["target"] == "sm_90a")


def _verify(bundle) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "factory", "verify", str(bundle)], cwd=ROOT,
                          capture_output=True, text=True)


def _swap_cubin(bundle, name: str, donor: str) -> None:
    """``donor``'s cubin in ``name``'s place, the manifest's hash and size updated (only the SASS
    and resource checks can object)."""
    from factory.runtime.manifest import sha256_file

    m = _manifest(bundle)
    rec = m["variants"][name]["files"]["cubin"]
    shutil.copyfile(bundle / m["variants"][donor]["files"]["cubin"]["path"], bundle / rec["path"])
    rec["sha256"] = sha256_file(bundle / rec["path"])
    rec["bytes"] = (bundle / rec["path"]).stat().st_size
    (bundle / "manifest.json").write_text(json.dumps(m, indent=1))


def _copy(test_bundle, dst, keep: list[str]):
    """The test bundle with only the variants ``keep`` in its manifest (verify then disassembles
    a few cubins, not all of them)."""
    shutil.copytree(test_bundle, dst)
    m = _manifest(dst)
    m["variants"] = {n: m["variants"][n] for n in keep}
    (dst / "manifest.json").write_text(json.dumps(m, indent=1))
    return dst


def _edit(bundle, name: str, fn) -> None:
    m = _manifest(bundle)
    fn(m["variants"][name])
    (bundle / "manifest.json").write_text(json.dumps(m, indent=1))


def test_verify_proves_the_sm90a_attention_cubin(test_bundle, tmp_path):
    from factory.compiler.cubin import disassemble
    from factory.compiler.sass import sass_problems, setmaxnreg_counts
    from factory.verify import resource_problems

    m = _manifest(test_bundle)
    name = _attn90(m)
    e = m["variants"][name]
    cubin = test_bundle / e["files"]["cubin"]["path"]
    sass = disassemble(cubin)
    assert sass_problems(e["target"], e["sass_requirements"], sass) == []
    assert resource_problems(e, cubin.read_bytes(), sass) == []
    reqs = e["sass_requirements"]
    assert any("HGMMA" in r and r"R\d+, R\d+, gdesc" in r for r in reqs), reqs  # register-A P·V
    assert any("HGMMA" in r and r"R\d+, gdesc" in r for r in reqs), reqs  # smem-smem S = Q·Kᵀ
    assert any("UTMALDG" in r for r in reqs), reqs
    roles = e["registers_per_role"]
    assert setmaxnreg_counts(sass) == {"DEALLOC": {roles["producer"]}, "TRY_ALLOC": {roles["consumer"]}}
    r = _verify(_copy(test_bundle, tmp_path / "one", [name]))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if f" {name} " in ln)
    smem = e["resources"]["dynamic_smem_bytes"] + e["resources"]["static_smem_bytes"]
    assert line.startswith("ok ") and f"roles={roles['producer']}/{roles['consumer']}" in line, line
    assert f"smem={smem}" in line and "spill-instr=0" in line and ", R" in line, line


def test_verify_refuses_an_sm90_build_in_the_sm90a_attention_slot(test_bundle, tmp_path):
    """The sm80 family's sm_90 attention cubin (mma.sync, cp.async) standing in for the sm_90a one:
    wrong target (exactly sm_90a is required, not the portability build), and no WGMMA or TMA —
    also when its disassembly is relabelled sm_90a."""
    from factory.compiler.cubin import disassemble
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    name = _attn90(m)
    donor = next(n for n, v in m["variants"].items() if v["family"] == "sm80" and v["op"] == "attention"
                 and v["target"] == "sm_90" and not v.get("varlen"))
    bad = _copy(test_bundle, tmp_path / "bad", [name, donor])
    _swap_cubin(bad, name, donor)
    r = _verify(bad)
    assert r.returncode == 1, r.stdout[-2000:]
    assert f"{name}: cubin is for sm_90, manifest says sm_90a" in r.stderr, r.stderr[-3000:]
    assert f"{name}: SASS lacks" in r.stderr and "HGMMA" in r.stderr and "UTMALDG" in r.stderr
    assert f"{name}: manifest's consumer budget" in r.stderr  # no setmaxnreg in an sm80-family cubin
    assert any(ln.startswith("BAD " + name) for ln in r.stdout.splitlines())
    sass = disassemble(test_bundle / m["variants"][donor]["files"]["cubin"]["path"])
    relabelled = re.sub(r"\.target\s+sm_\w+", ".target sm_90a", sass)
    problems = sass_problems(m["variants"][name]["target"], m["variants"][name]["sass_requirements"], relabelled)
    assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
    missing = [p for p in m["variants"][name]["sass_requirements"] if not re.search(p, relabelled)]
    assert any(r"R\d+, R\d+, gdesc" in p for p in missing) and any("UTMALDG" in p for p in missing), missing
    assert any(r"R\d+, gdesc" in p and r"R\d+, R\d+" not in p for p in missing), missing


def test_verify_refuses_a_cubin_without_register_a_wgmma(test_bundle, tmp_path):
    """A Hopper GEMM cubin (sm_90a, WGMMA from smem, TMA) in the attention slot: the target and
    the smem-smem WGMMA pass, the register-A form (P from registers) does not, nor its setmaxnreg
    budgets or its registers."""
    m = _manifest(test_bundle)
    name = _attn90(m)
    tile_n = m["variants"][name]["tile"][1]
    donor = next(n for n, v in m["variants"].items() if v["family"] == "sm90" and v["op"] == "gemm"
                 and v["target"] == "sm_90a" and v["tile"][1] == tile_n)
    bad = _copy(test_bundle, tmp_path / "bad", [name, donor])
    _swap_cubin(bad, name, donor)
    r = _verify(bad)
    assert r.returncode == 1, r.stdout[-2000:]
    mine = [ln for ln in r.stderr.splitlines() if f"{name}:" in ln]
    assert any("SASS lacks" in ln for ln in mine), mine
    from factory.compiler.cubin import disassemble

    sass = disassemble(test_bundle / m["variants"][donor]["files"]["cubin"]["path"])
    missing = [p for p in m["variants"][name]["sass_requirements"] if not re.search(p, sass)]
    assert any(r"R\d+, R\d+, gdesc" in p for p in missing), missing  # no register-A WGMMA
    assert not any(r"R\d+, gdesc" in p and r"R\d+, R\d+" not in p for p in missing), missing  # smem-smem ok
    assert not any("cubin is for" in ln for ln in mine), mine
    assert any("setmaxnreg" in ln for ln in mine), mine


@pytest.mark.parametrize("lie", ["role_budget", "over_budget", "registers", "smem", "stack"])
def test_verify_refuses_a_manifest_whose_resources_lie(test_bundle, tmp_path, lie):
    m = _manifest(test_bundle)
    name = _attn90(m)
    bad = _copy(test_bundle, tmp_path / "bad", [name])

    def edit(e):
        if lie == "role_budget":
            e["registers_per_role"]["consumer"] -= 8
        elif lie == "over_budget":  # both SASS budgets named, but 128·(24 + 2·256) > 64K
            e["threads"] = 128 * 4
        elif lie == "registers":
            e["resources"]["registers"] += 8
        elif lie == "smem":
            e["resources"]["dynamic_smem_bytes"] = 227 * 1024
        else:
            e["resources"]["stack_frame_bytes"] = 64

    _edit(bad, name, edit)
    r = _verify(bad)
    assert r.returncode == 1, r.stdout[-2000:]
    want = {"role_budget": "manifest's consumer budget", "over_budget": "register budget per role",
            "registers": "manifest records registers=", "smem": "shared memory",
            "stack": "manifest records stack_frame_bytes=64"}[lie]
    assert any(f"{name}:" in ln and want in ln for ln in r.stderr.splitlines()), r.stderr[-3000:]


def test_spills_fail_a_warp_specialized_variant(test_bundle):
    """Local-memory instructions in the disassembly of a variant with a budget per role fail it
    (the cubins built here have none: the check is shown on the SASS text)."""
    from factory.compiler.cubin import disassemble
    from factory.verify import resource_problems

    m = _manifest(test_bundle)
    name = _attn90(m)
    e = m["variants"][name]
    cubin = test_bundle / e["files"]["cubin"]["path"]
    sass = disassemble(cubin)
    spilled = sass + "\n        /*fff0*/                   STL.64 [R1+0x8], R24 ;\n"
    assert resource_problems(e, cubin.read_bytes(), sass) == []
    assert resource_problems(e, cubin.read_bytes(), spilled) == [
        "spills: 1 local-memory instructions, 0 B stack frame"]
    # A variant without a budget per role is reported, not failed, on the same text.
    plain = {k: v for k, v in e.items() if k != "registers_per_role"}
    assert resource_problems(plain, cubin.read_bytes(), spilled) == []
