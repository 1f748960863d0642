"""The block-scaled Blackwell GEMM (op ``gemm_blockscaled``, gemm/sm100_blockscaled.py) on this
GPU-less machine: the kernel's view of the scale factors against the documented layout, what the
manifest says, what ``factory verify`` demands of the SASS (and that it refuses a dense sm_100a
cubin in a block-scaled slot), and the loader's checks, selection and argument packing on a
simulated 10.0 device.  Nothing here launches a kernel; no Blackwell GPU has run one.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

import selection_lib as sl
from conftest import BLACKWELL_DC, ROOT, Recorder, bundle_with_swapped_cubin, needs_dsl, verify_cli
from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import blockscaled as bs
from test_blockscaled import documented_offset

pytestmark = needs_dsl

B200 = {"name": "planned B200", "sm_count": 148}


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _bs_entries(m):
    return {n: v for n, v in m["variants"].items() if v["op"] == "gemm_blockscaled"}


# --- the kernel reads the layout the runtime writes --------------------------------------------------
_LAYOUT_WORKER = textwrap.dedent(
    """
    import json, sys
    from factory.compiler.compile import init_worker
    init_worker("sm_100a")
    import cutlass.cute as cute
    from factory.atoms import sm100 as atoms
    from cutlass.utils import blockscaled_layout as bsl
    cases = json.loads(sys.argv[1])
    out = []

    @cute.jit
    def probe():
        # The layout GemmSm100BlockScaledKernel builds its scale-factor TMA from
        # (atoms.sf_global_tensor: tile_atom_to_shape_SF over the operand's (rows, K, L)).
        for rows, k, l, vec, coords in cases:
            lay = bsl.tile_atom_to_shape_SF((rows, k, l), vec)
            out.append([cute.crd2idx((r, kk, ll), lay) for r, kk, ll in coords])

    probe()
    print("OFFSETS" + json.dumps(out))
    """
)


def test_kernel_scale_layout_is_the_documented_one(tmp_path):
    cases = []
    for rows, k, l, vec in ((200, 160, 2, 32), (129, 16 * 17, 1, 16), (256, 512, 3, 16), (1, 32, 1, 32)):
        coords = [(r, kk, ll) for ll in range(l) for r in sorted({0, 1, 31, 32, 33, 100, 127, 128, rows - 1})
                  if r < rows for kk in range(0, k, vec)]
        cases.append((rows, k, l, vec, coords))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CUTE_DSL_ARCH", None)
    worker = tmp_path / "layout_worker.py"  # (the DSL traces functions from their source file)
    worker.write_text(_LAYOUT_WORKER)
    p = subprocess.run([sys.executable, str(worker), json.dumps(cases)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.split("OFFSETS", 1)[1])
    for (rows, k, l, vec, coords), offs in zip(cases, got):
        want = [documented_offset(r, kk // vec, rows, -(-k // vec), ll) for r, kk, ll in coords]
        assert offs == want, (rows, k, l, vec)
        # ... and the byte where pack() puts that scale factor.
        codes = torch.arange(l * rows * (k // vec), dtype=torch.int64).reshape(l, rows, k // vec) % 251 + 1
        flat = bs.swizzle_scales(codes.to(torch.uint8)).reshape(-1)
        assert all(int(flat[o]) == int(codes[ll, r, kk // vec]) for (r, kk, ll), o in zip(coords, offs))


# --- manifest and SASS -----------------------------------------------------------------------------
def test_manifest_describes_the_scale_tensors_and_resources(test_bundle):
    m = _manifest(test_bundle)
    entries = _bs_entries(m)
    assert {v["format"] for v in entries.values()} == {"nvf4", "mxf8e4m3"}
    assert {v["cta_group"] for v in entries.values()} == {1, 2}
    for name, v in entries.items():
        assert v["family"] == "sm100" and v["target"] == BLACKWELL_DC and v["proof"] == "sass-only"
        vec = 16 if v["format"] == "nvf4" else 32
        for op_, rows in (("a", "M"), ("b", "N")):
            sc = v["scales"][op_]
            assert sc["layout"] == "sf128x4" and sc["vec"] == vec and sc["padding"] == "zeros"
            assert sc["dtype"] == ("e4m3" if v["format"] == "nvf4" else "e8m0")
            assert sc["shape"] == f"(L, ceil({rows}/128), ceil(ceil(K/vec)/4), 32, 4, 4)"
        assert (v["scales"]["global"] is not None) == (v["format"] == "nvf4")
        sig = {a["name"]: a for a in v["signature"]["args"]}
        assert sig["sfa"]["shape"] == ["SFA"] and v["signature"]["divisibility"]["SFA"] == 512
        assert v["signature"]["divisibility"]["K"] == 32
        r = v["resources"]
        assert r["dynamic_smem_bytes"] + r["static_smem_bytes"] <= 232448, name
        used = v["tmem_columns_used"]
        assert used["acc"] + used["sfa"] + used["sfb"] <= v["tmem_columns"] <= 512, name
        assert r["spill_instructions"] == 0 and r["stack_frame_bytes"] == 0, name
        assert r["registers"] * v["threads"] <= 65536
        s = v["sass"]
        assert s["UTCCP"] > 0 and s["UTMALDG"] > 0, name
        assert (s["UTCOMMA"] > 0) == (v["format"] == "nvf4") and (s["UTCQMMA"] > 0) == (v["format"] != "nvf4")
        assert s["UTCHMMA"] == s["HMMA"] == s["HGMMA"] == 0, name


def _disasm(bundle, entry):
    from factory.compiler.cubin import disassemble

    return disassemble(bundle / entry["files"]["cubin"]["path"])


def test_requirements_tell_block_scaled_from_dense_sass(test_bundle):
    """Each block-scaled variant's requirements hold on its own cubin and fail on every other
    kind: the dense datacenter Blackwell GEMM relabelled into its slot (UTCQMMA/UTCHMMA without scale-factor
    operands, no tcgen05.cp), and the other block-scaled kind (mxf8f6f4 vs mxf4nvf4)."""
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    entries = _bs_entries(m)
    dense = [v for v in m["variants"].values() if v["op"] == "gemm" and v["target"] == BLACKWELL_DC
             and v["family"] == "sm100" and v.get("scale_mode") != "block"]  # (block: the same MMA)
    assert dense
    for name, v in entries.items():
        assert sass_problems(v["target"], v["sass_requirements"], _disasm(test_bundle, v)) == [], name
        for d in dense:
            problems = sass_problems(v["target"], v["sass_requirements"], _disasm(test_bundle, d))
            assert len(problems) == 1 and problems[0].startswith("SASS lacks"), problems
            assert "UTCCP" in problems[0] and "idesc" in problems[0], problems
        for other in entries.values():
            if other["format"] != v["format"]:
                problems = sass_problems(v["target"], v["sass_requirements"], _disasm(test_bundle, other))
                assert problems and ("UTCOMMA" if v["format"] == "nvf4" else "UTCQMMA") in problems[0]
    # The dense fp8 MMA line and the block-scaled one, as the regexes see them.
    from factory.gemm.sm100_blockscaled import SASS_BS_MMA

    assert re.search(SASS_BS_MMA["mxf8"], "UTCQMMA gdesc[UR44], gdesc[UR46], tmem[UR21], tmem[UR42], idesc[UR43], tmem[UR16], UP3 ;")
    assert not re.search(SASS_BS_MMA["mxf8"], "UTCQMMA gdesc[UR42], gdesc[UR44], tmem[UR10], tmem[UR40], idesc[UR41], UR4, UP3 ;")


def test_verify_refuses_a_dense_cubin_in_a_block_scaled_slot(test_bundle, tmp_path):

    m = _manifest(test_bundle)
    name = next(iter(_bs_entries(m)))
    donor = next(n for n, v in m["variants"].items() if v["op"] == "gemm" and v["target"] == BLACKWELL_DC
                 and v["family"] == "sm100" and v.get("scale_mode") != "block")
    r = verify_cli(bundle_with_swapped_cubin(test_bundle, tmp_path / "bad", name, donor))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{name}: SASS lacks" in r.stderr and "UTCCP" in r.stderr
    assert any(ln.startswith("BAD " + name) for ln in r.stdout.splitlines())


# --- the loader ------------------------------------------------------------------------------------
class ArgRecorder(Recorder):
    """Records each launch's name and the bytes of its argument structs (decoded per the binder)."""

    def __init__(self, bundle):
        super().__init__()
        self.bundle, self.args = bundle, []

    def launcher(self, name):
        def fn(argv):
            self.launched.append(name)
            b = self.bundle.binder(name)
            ptrs = ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p))
            vals = []
            for i, (_a, fmt, *_r) in enumerate(b.plan):
                vals.append(struct.unpack(fmt, ctypes.string_at(ptrs[i], struct.calcsize(fmt))))
            self.args.append(vals)
            return 0

        return fn


def simulated(test_bundle, cap=(10, 0)):
    b = Bundle.open(test_bundle, capability=cap, device=B200)
    rec = ArgRecorder(b)
    b.simulate(rec)
    return b, rec


def test_other_devices_are_refused_with_the_reason(test_bundle):
    a = bs.pack(torch.randn(64, 128), "nvfp4")
    w = bs.pack(torch.randn(128, 128), "nvfp4")
    for cap in ((9, 0), (11, 0), (12, 0), (8, 0)):  # (10.3 runs the family build: below)
        b, rec = simulated(test_bundle, cap)
        with pytest.raises(NoVariantError, match=rf"built for {BLACKWELL_DC} only, which runs on Blackwell datacenter "
                                                 r"GPUs \(compute capability 10\.0, 10\.3\)"):
            b.gemm_blockscaled(a, w)
        assert rec.launched == []
    b, rec = simulated(test_bundle, (10, 3))  # B300: the family build (sm_100f) runs there too
    b.gemm_blockscaled(a, w)
    assert rec.launched and b.manifest["variants"][rec.launched[-1]]["target"] == BLACKWELL_DC
    b, rec = simulated(test_bundle, (9, 0))
    name = next(iter(_bs_entries(b.manifest)))
    with pytest.raises(NoVariantError, match=rf"built for {BLACKWELL_DC}, which cannot run on compute capability 9\.0"):
        b.launch(name, [])


def test_launch_on_10_0_packs_elements_and_scales(test_bundle):
    b, rec = simulated(test_bundle)
    M, N, K = 200, 136, 320
    a = bs.pack(torch.randn(M, K), "nvfp4")
    w = bs.pack(torch.randn(N, K), "nvfp4")
    out = b.gemm(a, w)  # bundle.gemm dispatches block-scaled operands
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    name = rec.launched[-1]
    entry = b.manifest["variants"][name]
    assert entry["format"] == "nvf4" and entry["cta_group"] == 2  # M > 128: the pair
    (pa, *sa), (pb, *sb), (pc, *sc), sfa, sfb, ga, gb, (clusters,) = rec.args[-1]
    # fp4 data: sizes and strides in elements (two a byte), pointers as given.
    assert pa == a.data.data_ptr() and tuple(sa) == (M, K, 1, K, 0)
    assert pb == w.data.data_ptr() and tuple(sb) == (N, K, 1, K, 0)
    assert pc == out.data_ptr() and tuple(sc) == (M, N, 1, N, 0)
    assert sfa == (a.scale.data_ptr(), a.scale.numel()) and a.scale.numel() == 2 * 5 * 512
    assert sfb == (w.scale.data_ptr(), w.scale.numel()) and w.scale.numel() == 2 * 5 * 512
    assert ga == (a.global_scale.data_ptr(),) and gb == (w.global_scale.data_ptr(),)
    assert clusters == 148 // 2
    # MXFP8, batched: elements are bytes; the 1-CTA variant.
    a8 = bs.pack(torch.randn(3, 64, 256), "mxfp8")
    w8 = bs.pack(torch.randn(3, 96, 256), "mxfp8")
    out8 = b.gemm_blockscaled(a8, w8)
    assert out8.shape == (3, 64, 96)
    assert b.manifest["variants"][rec.launched[-1]]["format"] == "mxf8e4m3"
    (pa, *sa), _b, _c, sfa, _sfb, (clusters,) = rec.args[-1]
    assert tuple(sa) == (64, 256, 3, 256, 64 * 256) and sfa[1] == 3 * 1 * 2 * 512


def test_loader_refuses_bad_operands(test_bundle):
    b, rec = simulated(test_bundle)
    a = bs.pack(torch.randn(64, 128), "nvfp4")
    w = bs.pack(torch.randn(96, 128), "nvfp4")
    with pytest.raises(InputError, match="both operands need one format"):
        b.gemm(a, bs.pack(torch.randn(96, 128), "mxfp8"))
    with pytest.raises(InputError, match="shapes do not match"):
        b.gemm(a, bs.pack(torch.randn(96, 64), "nvfp4"))
    with pytest.raises(InputError, match="must be a BlockScaled operand"):
        b.gemm_blockscaled(a, torch.zeros(96, 64, dtype=torch.uint8))
    with pytest.raises(InputError, match=r"K = 48 must be a multiple of 32"):
        b.gemm(bs.pack(torch.randn(8, 48), "nvfp4"), bs.pack(torch.randn(8, 48), "nvfp4"))
    with pytest.raises(InputError, match=r"out must have shape \(64, 96\)"):
        b.gemm(a, w, torch.empty(64, 95, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="carry their own scales"):
        b.gemm(a, w, scale_a=torch.ones(1))
    with pytest.raises(InputError, match="contiguous along K"):
        t = bs.pack(torch.randn(128, 64), "mxfp8")
        b.gemm(bs.BlockScaled(t.data.t().contiguous().t(), t.scale, "mxfp8"), bs.pack(torch.randn(8, 64), "mxfp8"))
    # A row start that is not 16-byte aligned (the data is a view at an odd offset).
    big = bs.pack(torch.randn(64, 160), "mxfp8")
    view = bs.BlockScaled(big.data[:, 8:136], bs.swizzle_scales(torch.ones(64, 4, dtype=torch.uint8)), "mxfp8")
    with pytest.raises(InputError, match=r"a.data must start 16-byte aligned .* pointer % 16 = 8"):
        b.gemm(view, bs.pack(torch.randn(8, 128), "mxfp8"))
    odd = bs.BlockScaled(torch.zeros(64, 136, dtype=torch.float8_e4m3fn)[:, :128], view.scale, "mxfp8")
    with pytest.raises(InputError, match=r"rows 16 bytes apart .* byte strides \[136\]"):
        b.gemm(odd, bs.pack(torch.randn(8, 128), "mxfp8"))
    sc = torch.zeros(1 + view.scale.numel(), dtype=torch.uint8)[1:].view(view.scale.shape)
    with pytest.raises(InputError, match=r"a.scale must start 16-byte aligned"):
        b.gemm(bs.BlockScaled(big.data[:, :128], sc, "mxfp8"), bs.pack(torch.randn(8, 128), "mxfp8"))
    # No variant for an output dtype the bundle lacks.
    with pytest.raises(NoVariantError, match=r"nvf4 -> f16"):
        b.gemm(a, w, out_dtype=torch.float16)
    assert rec.launched == []
    # Empty problems launch nothing.
    e = b.gemm(bs.pack(torch.randn(0, 128), "nvfp4"), w)
    assert e.shape == (0, 96) and rec.launched == []


def test_selection_prefers_one_cta_for_short_m(test_bundle, tmp_path):
    """The test tier holds one variant per format; with the default tier's entries added to the
    manifest (selection reads only manifest fields) M <= 128 takes the 1-CTA tile, larger M the pair."""
    from factory.atoms.targets import get_target
    from factory.gemm.sm100_blockscaled import enumerate_sm100_blockscaled

    out = tmp_path / "b"
    shutil.copytree(test_bundle, out)
    m = _manifest(out)
    base = next(v for v in _bs_entries(m).values() if v["format"] == "nvf4")
    for v in enumerate_sm100_blockscaled(get_target(BLACKWELL_DC), "default"):
        if v.fmt != "nvf4":  # (same argument list as the compiled nvf4 entry whose ABI is reused)
            continue
        e = json.loads(json.dumps(base))
        e.update(name=v.name, config=v.config(), **json.loads(json.dumps(v.describe())),
                 signature=v.signature().to_json(), sass_requirements=list(v.sass_requirements()))
        e["abi"] = json.loads(json.dumps(base["abi"]).replace(base["name"], v.name))
        m["variants"][v.name] = e
    m["variants"] = dict(sorted(m["variants"].items()))
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    b, rec = simulated(out)
    sl.attach(b)  # (the added entries are not in the host library: select with a library of the manifest's)
    w = bs.pack(torch.randn(256, 256), "nvfp4")
    b.gemm(bs.pack(torch.randn(16, 256), "nvfp4"), w)
    assert b.manifest["variants"][rec.launched[-1]]["cta_group"] == 1
    b.gemm(bs.pack(torch.randn(512, 256), "nvfp4"), w)
    assert b.manifest["variants"][rec.launched[-1]]["cta_group"] == 2
