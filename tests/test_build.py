"""Building a bundle on this GPU-less machine: manifest, hashes, SASS, cache, host library."""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BLACKWELL_DC, ROOT, TEST_TARGETS, bundle_with_swapped_cubin, needs_dsl, verify_cli

pytestmark = needs_dsl


def manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_manifest_describes_every_variant(test_bundle):
    m = manifest(test_bundle)
    assert m["schema_version"] == 1
    assert m["versions"]["nvidia-cutlass-dsl"]
    assert {v["target"] for v in m["variants"].values()} >= {"sm_80", "sm_86", "sm_89", "sm_90"}
    # Sorted by name: of equal tiles the loader's heuristic keeps the first, which for Blackwell is
    # the CTA pair ("..._2cta_t..." sorts before "..._t...").
    assert list(m["variants"]) == sorted(m["variants"])
    for name, v in m["variants"].items():
        assert name == v["name"]
        assert v["proof"] in ("executed", "portability-build", "compiled", "sass-only")
        assert v["resources"]["registers"] > 0
        # (the row-wise kernels (norm, rotary + cache write) may use no shared memory at all)
        assert 0 < v["resources"]["dynamic_smem_bytes"] <= 227 * 1024 or (
            v["family"] == "rowwise" and v["resources"]["dynamic_smem_bytes"] >= 0)
        assert v["resources"]["spill_instructions"] == 0, f"{name} spills"
        for f in v["files"].values():
            assert (test_bundle / f["path"]).stat().st_size == f["bytes"]
        assert v["abi"]["params"][-1][0] == "cudaStream_t"


def test_verify_passes_and_catches_tampering(test_bundle, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "factory", "verify", str(test_bundle)], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verify: OK" in ok.stdout
    # One report line per variant (an order requirement shows as "first … last" instruction).
    lines = [ln for ln in ok.stdout.splitlines() if ln.startswith(("ok ", "BAD"))]
    assert len(lines) == sum(1 for ln in ok.stdout.splitlines() if ln.strip() and not ln.startswith("verify"))
    eb = [ln for ln in lines if "_eb " in ln]
    # (the decode kernel's early weight loads: sm_90 and sm_120a builds; sm90's TMA ones otherwise)
    assert eb and all(("LDG.E.NA.128 … ACQBULK" if "[sm_90]" in ln or "[sm_120a]" in ln else "UTMALDG.3D … ACQBULK")
                      in ln for ln in eb), eb
    name = next(iter(manifest(test_bundle)["variants"]))
    bad = bundle_with_swapped_cubin(test_bundle, tmp_path / "bad", name)
    cubin = bad / manifest(bad)["variants"][name]["files"]["cubin"]["path"]
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    r = verify_cli(bad)
    assert r.returncode == 1 and "is altered (its sha256 differs from the manifest's)" in r.stderr


def test_sass_proves_each_family(test_bundle):
    m = manifest(test_bundle)
    for v in m["variants"].values():
        s = v["sass"]
        if v["family"] == "sm80":
            fp8 = v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3"
            if fp8 and v["target"] in ("sm_89", "sm_120a"):
                assert s["QMMA"] > 0 and s["HMMA"] == 0, v["name"]  # Ada's / RTX Blackwell's fp8 mma.sync
            else:
                assert s["HMMA"] > 0, v["name"]  # (Hopper lowers fp8 mma.sync to f16 HMMA)
            assert s["LDGSTS"] > 0 and s["LDSM"] > 0, v["name"]
            if v["target"] == "sm_120a":  # consumer Blackwell: never run; 99 KB per CTA
                r = v["resources"]
                assert v["proof"] == "sass-only", v["name"]
                assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 99 * 1024, v["name"]
                assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, v["name"]
                assert s["UTCHMMA"] == s["HGMMA"] == 0, v["name"]
        if v["family"] == "sm90":
            assert s["HGMMA"] + s["QGMMA"] > 0 and s["UTMALDG"] > 0, v["name"]
        if v["family"] == "decode":  # mma.sync fed by plain loads: no shared-memory operands
            assert (s["QMMA"] if v["target"] == "sm_120a" else s["HMMA"]) > 0 and s["LDSM"] == s["LDGSTS"] == s["UTMALDG"] == 0, v["name"]
        if v["family"] == "sm90_decode":  # decode attention: mma.sync, cp.async, ldmatrix; DSMEM merge
            assert s["HMMA"] > 0 and s["LDGSTS"] > 0 and s["LDSM"] > 0 and s["HGMMA"] == 0, v["name"]
            r = v["resources"]
            assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, v["name"]
        if v["family"] == "sm100":  # tcgen05 (UTC*MMA) fed by TMA; no warp- or warpgroup-MMA
            assert s["UTCHMMA"] + s["UTCQMMA"] + s["UTCOMMA"] > 0 and s["UTMALDG"] > 0, v["name"]
            # Block-scaled: the scale factors reach TMEM by tcgen05.cp (UTCCP); the dense GEMM (but
            # its DeepSeek-form block scales, on the block-scale MMA): never.
            if v["op"] in ("gemm", "gemm_blockscaled"):
                scaled = v["op"] == "gemm_blockscaled" or v.get("scale_mode") == "block"
                assert (s["UTCCP"] > 0) == scaled, v["name"]
            assert s["HMMA"] == s["HGMMA"] == s["QGMMA"] == 0, v["name"]
            # Never run: proven by SASS only; its resources recorded and within the SM's.
            r = v["resources"]
            assert v["proof"] == "sass-only" and v["target"] == BLACKWELL_DC, v["name"]
            assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 227 * 1024, v["name"]
            assert 32 <= v["tmem_columns"] <= 512 and r["registers"] * v["threads"] <= 65536, v["name"]
            assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, v["name"]
        if v["family"] == "rowwise":  # norm / rotary + cache write: plain vector loads, no MMA, no spills
            r = v["resources"]
            assert s["HMMA"] == s["HGMMA"] == s["UTCHMMA"] == s["LDGSTS"] == 0, v["name"]
            assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, v["name"]
    assert any(v["family"] == "sm100" for v in m["variants"].values()), "no Blackwell variant built"
    assert {v["op"] for v in m["variants"].values() if v["target"] == "sm_120a"} == {
        "gemm", "attention", "attention_kvcache", "rope_kvcache"}


@pytest.mark.parametrize("donor_family", ["sm90", "sm80"])
def test_verify_refuses_a_blackwell_variant_whose_cubin_is_not_tcgen05(test_bundle, tmp_path, donor_family):
    """A Hopper (WGMMA) or Ampere-family (mma.sync) cubin standing in for the datacenter Blackwell
    one must fail ``factory verify``: on its target, and on every tcgen05 / TMEM / TMA requirement
    on its own (the requirement list applied to the donor's disassembly relabelled as sm_100)."""
    from factory.compiler.cubin import disassemble
    from factory.compiler.sass import sass_problems

    m = manifest(test_bundle)
    bw = next(n for n, v in m["variants"].items() if v["family"] == "sm100" and v["op"] == "gemm")
    donor = next(n for n, v in m["variants"].items() if v["family"] == donor_family and v["op"] == "gemm")
    r = verify_cli(bundle_with_swapped_cubin(test_bundle, tmp_path / "bad", bw, donor))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{bw}: cubin is for {m['variants'][donor]['target']}, manifest says {BLACKWELL_DC}" in r.stderr
    assert f"{bw}: SASS lacks" in r.stderr and "UTCHMMA" in r.stderr
    assert any(ln.startswith("BAD " + bw) for ln in r.stdout.splitlines())
    # The requirements alone: the donor's SASS relabelled as sm_100 passes the target check and
    # must still lack every tcgen05 instruction the Blackwell family is proven by.
    sass = disassemble(test_bundle / m["variants"][donor]["files"]["cubin"]["path"])
    relabelled = re.sub(r"\.target\s+sm_\w+", ".target sm_100", sass)  # nvdisasm's spelling of sm_100f
    e = m["variants"][bw]
    problems = sass_problems(e["target"], e["sass_requirements"], relabelled)
    assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
    for key in ("UTCHMMA", "UTCATOMSWS", "LDTM", "UTCBAR", "2CTA"):
        assert key in problems[0], (key, problems[0])
    assert sass_problems(e["target"], e["sass_requirements"], disassemble(test_bundle / e["files"]["cubin"]["path"])) == []


def test_host_library_needs_only_libc(test_bundle):
    lib = test_bundle / "lib" / "libfactory_bundle.so"
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    needed = sorted(line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line)
    assert all(n.startswith(("libc.so", "libm.so", "libpthread", "libdl", "librt", "ld-linux")) for n in needed), needed
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "fx_launch_" in syms and " cudaLaunchKernel" not in syms  # cudart stays private


def test_host_objects_compile_once_per_preprocessed_source(tmp_path):
    """The host library's C sources compile through a cache keyed on the preprocessed source and
    the flags: the same source in another directory is the same object (no compile); a changed
    header or flag is another; the object is the source's own; a source that does not compile
    stops the link."""
    import ctypes

    from factory.compiler.link import compile_object

    cache = tmp_path / "cache"
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "k.h").write_text("#define K 3\n")
        (tmp_path / d / "f.c").write_text('#include "k.h"\nint f(void) { return K; }\n')

    def obj(d, flags=("-O2", "-fPIC")):
        return compile_object(tmp_path / d / "f.c", list(flags), [f"-I{tmp_path / d}"], cache)

    a = obj("a")
    stamp = a.stat().st_mtime_ns
    assert obj("b") == a and a.stat().st_mtime_ns == stamp  # (found, not compiled again)
    (tmp_path / "b" / "k.h").write_text("#define K 4\n")
    b = obj("b")
    assert b != a and obj("a", ("-O1", "-fPIC")) not in (a, b)
    for o, want in ((a, 3), (b, 4)):
        so = tmp_path / f"{o.stem}.so"
        subprocess.run(["gcc", "-shared", "-o", str(so), str(o)], check=True)
        assert ctypes.CDLL(str(so)).f() == want
    (tmp_path / "a" / "f.c").write_text("int f(void) { return }\n")
    with pytest.raises(RuntimeError, match="compiling f.c failed"):
        obj("a")


def test_host_object_with_relative_include_paths(tmp_path, monkeypatch):
    """A bundle built to a relative path (``--out artifacts/x``) gives relative include paths: the
    compile, which runs in the source's directory, still finds the headers."""
    from factory.compiler.link import compile_object

    (tmp_path / "bundle" / "include").mkdir(parents=True)
    (tmp_path / "bundle" / "src").mkdir()
    (tmp_path / "bundle" / "include" / "k.h").write_text("#define K 5\n")
    (tmp_path / "bundle" / "src" / "f.c").write_text('#include "k.h"\nint f(void) { return K; }\n')
    monkeypatch.chdir(tmp_path)
    obj = compile_object(Path("bundle/src/f.c"), ["-O2", "-fPIC"], ["-Ibundle/include"], tmp_path / "cache")
    assert obj.exists() and obj.is_absolute()


def test_unchanged_rebuild_comes_from_the_cache(test_bundle, tmp_path):
    from factory.compiler.builder import build

    t0 = time.perf_counter()
    # (a slice of the test tier, one bf16 GEMM per target: linking all of it again would add
    # time, not coverage)
    s = build(tmp_path / "again", TEST_TARGETS, tier="test", name_filter="gemm_sm*_bf16_obf16_ak_bk_t128x128x*[0-9]")
    assert 0 < s["variants"] < len(manifest(test_bundle)["variants"])
    assert s["compiled"] == 0 and s["cached"] == s["variants"]
    assert time.perf_counter() - t0 < 60
    a, b = manifest(test_bundle), manifest(tmp_path / "again")
    assert {k: a["variants"][k]["files"]["cubin"]["sha256"] for k in b["variants"]} == \
           {k: v["files"]["cubin"]["sha256"] for k, v in b["variants"].items()}


def test_a_cached_cubin_is_checked_again_when_the_sass_check_changes(test_bundle, tmp_path):
    """The build caches each cubin's SASS check with the check's version: an entry checked by
    another version is checked again (and rewritten) before it enters a bundle, so a problem the
    old check recorded, or missed, does not outlive the check."""
    from factory.compiler.builder import build, cache_key, default_cache_dir
    from factory.compiler.sass import checker_version
    from factory.registry import enumerate_variants

    v = enumerate_variants(["sm_80"], ["gemm"], tier="test")[0]
    entry = f"{v.name}-{cache_key(v)}"
    cache = tmp_path / "cache"
    shutil.copytree(default_cache_dir() / entry, cache / entry)  # filled by the test bundle's build
    info_path = cache / entry / "info.json"
    info = json.loads(info_path.read_text())
    info.update(sass_problems=["planted by an older check"], sass_checked_by="older")
    info_path.write_text(json.dumps(info))
    s = build(tmp_path / "b", ["sm_80"], ops=["gemm"], tier="test", name_filter=v.name, cache=cache, jobs=1)
    assert s["compiled"] == 0 and s["variants"] == 1
    again = json.loads(info_path.read_text())
    assert again["sass_problems"] == [] and again["sass_checked_by"] == checker_version()
    # A problem recorded by the current check stops the build.
    again["sass_problems"] = ["registers past a setmaxnreg budget: R250 after TRY_ALLOC 240"]
    info_path.write_text(json.dumps(again))
    with pytest.raises(RuntimeError, match="setmaxnreg budget"):
        build(tmp_path / "c", ["sm_80"], ops=["gemm"], tier="test", name_filter=v.name, cache=cache, jobs=1)


def test_cli_list_and_inspect(test_bundle):
    r = subprocess.run([sys.executable, "-m", "factory", "list", str(test_bundle)], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    assert "gemm_sm80_bf16_obf16_ak_bk_t128x128x32_w2x2" in r.stdout
    r = subprocess.run([sys.executable, "-m", "factory", "inspect", str(test_bundle),
                        "gemm_sm80_bf16_obf16_ak_bk_t128x128x32_w2x2"], cwd=ROOT, capture_output=True,
                       text=True, check=True)
    assert json.loads(r.stdout)["target"] == "sm_80"


def test_unknown_target_is_a_clear_error():
    from factory.registry import enumerate_variants

    with pytest.raises(ValueError, match="unknown target"):
        enumerate_variants(["sm_75"], ["gemm"])


def test_header_struct_widths_match_the_symbols_we_compile_with(test_bundle):
    """Sizes are 32-bit symbols and strides 64-bit ones (see factory/compiler/compile.py: this DSL's
    header always declares 64-bit strides, so 32-bit stride symbols would make it lie)."""
    m = manifest(test_bundle)
    for v in m["variants"].values():
        for st in v["abi"]["structs"].values():
            if st["n_strides"]:
                assert st["stride_ctype"] == "int64_t", v["name"]
            if st["n_shapes"]:
                assert st["shape_ctype"] == "int32_t", v["name"]


def test_fake_tensors_use_64_bit_stride_symbols():
    from factory.compiler.compile import fake_args, init_worker
    from factory.gemm.common import GemmVariant

    init_worker("sm_80")
    sig = GemmVariant(target="sm_80").signature()
    a = fake_args(sig)[0]
    strides = [s for s in a.stride if not isinstance(s, int)]
    shapes = [s for s in a.shape if not isinstance(s, int)]
    assert strides and all(s.width == 64 for s in strides)
    assert shapes and all(s.width == 32 for s in shapes)


def test_c_callers_can_link_and_call_the_host_library(test_bundle, tmp_path):
    """A C program built against include/fx_bundle.h and lib/libfactory_bundle.so runs here, on a
    machine with no GPU: the ABI version answers, and loading a variant fails with a CUDA error
    code (no device / no driver) instead of crashing."""
    name = next(iter(manifest(test_bundle)["variants"]))
    src = tmp_path / "caller.c"
    src.write_text(f"""
#include <stdio.h>
#include "fx_bundle.h"
int main(void) {{
    int32_t err = fx_load_{name}();
    printf("abi=%d load=%d (%s)\\n", fx_abi_version(), err, fx_error_string(err));
    return fx_abi_version() == 1 && err != 0 ? 0 : 1;
}}
""")
    exe = tmp_path / "caller"
    subprocess.run(["gcc", "-o", str(exe), str(src), f"-I{test_bundle / 'include'}",
                    f"-L{test_bundle / 'lib'}", "-lfactory_bundle", f"-Wl,-rpath,{test_bundle / 'lib'}"],
                   check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "abi=1 load=" in r.stdout  # (the DSL header's loader also prints the CUDA error)


def test_ada_fp8_variants_are_not_claimed_as_proven_by_the_portability_build(test_bundle):
    m = manifest(test_bundle)
    fp8_89 = [v for v in m["variants"].values() if v["target"] == "sm_89" and v["op"] == "gemm"
              and v["dtypes"]["a"] == "e4m3"]
    assert fp8_89, "the test tier should hold an sm_89 fp8 GEMM"
    assert all(v["proof"] == "sass-only" for v in fp8_89)
    # (its bf16/fp16 variants are sm_86's cubins: same_code_as)
    assert not [v for v in m["variants"].values() if v["target"] == "sm_89" and v["dtypes"].get("a") != "e4m3"]
