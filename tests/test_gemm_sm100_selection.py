"""The loader and the Blackwell datacenter variants, on this GPU-less machine: which devices may run
them, and which one selection takes on a 10.0 device (no launches; nothing Blackwell has run).

They are built for the family target sm_100f, whose cubins run on compute capability 10.0 and 10.3
(B200, B300) and nowhere else (Target.ccs).  On 10.x nothing else in a bundle runs (sm_8x and
sm_90 builds run only on their own major, sm_90a only on 9.0), so every shape there, decode
included, is served by this family.  Selection on 10.0 is the
least time of the Blackwell cost model (runtime/cost_sm100.py: a roofline from published B200
figures, unmeasured; its own tests in tests/test_cost_sm100.py).  For decode (M <= 16, N = 4096)
that is the 64-row tile (tcgen05 M = 64, N = 32): N/32 CTAs, the rows past M being the TMA's zero
fill.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

import selection_lib as sl
from conftest import BLACKWELL_DC, Recorder
from factory.runtime import Bundle, NoVariantError
from factory.runtime.gemm import _as_rkl, select

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed (the bundle is built here)")

B200 = {"name": "planned B200", "sm_count": 148}
DC = BLACKWELL_DC.replace("_", "")  # in variant names: gemm_sm100f_...


def _select(b, a, w, dt="bf16", out_dt=None):
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16 if dt == "e4m3" else a.dtype)
    scales = [(0, (1,), (1,))] * 2 if dt == "e4m3" else []
    out_dt = out_dt or ("bf16" if dt == "e4m3" else dt)
    return select(b, _as_rkl(a, "a"), _as_rkl(w, "b"), _as_rkl(out, "c"), dt, out_dt, scales)


def _bf16(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16)


def _sm100(manifest: dict) -> list[str]:
    return [n for n, v in manifest["variants"].items() if v["target"] == BLACKWELL_DC]


def test_blackwell_variants_never_run_on_hopper(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0))
    assert _sm100(b.manifest), f"the test bundle should hold an {BLACKWELL_DC} GEMM"
    assert not any(v["target"] == BLACKWELL_DC for v in b.candidates("gemm"))
    for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096), (1000, 520, 264)):
        assert not _select(b, _bf16(m, k), _bf16(n, k)).startswith(f"gemm_{DC}_")
    # Asked for by name, the loader refuses before touching the cubin, and says why (a recording
    # launcher stands in for the host library: nothing is loaded either way).
    b.simulate(Recorder())
    name = _sm100(b.manifest)[0]
    with pytest.raises(NoVariantError, match=rf"built for {BLACKWELL_DC}, which cannot run on compute capability 9\.0"):
        b.launch(name, [])


def test_blackwell_variants_serve_bf16_gemm_on_10_0_and_10_3(test_bundle):
    """B200 (10.0) and B300 (10.3) both run the family build (the recorded capabilities of
    sm_100f); Thor (11.0) and consumer Blackwell (12.x) get nothing from it."""
    for cap in ((10, 0), (10, 3)):
        b = Bundle.open(test_bundle, capability=cap, device=B200)
        assert {v["target"] for v in b.candidates("gemm")} == {BLACKWELL_DC}
        for m, n, k in ((4096, 4096, 4096), (16, 4096, 4096), (1000, 520, 264)):
            name = _select(b, _bf16(m, k), _bf16(n, k))
            assert name.startswith(f"gemm_{DC}_bf16_"), name
            entry = b.manifest["variants"][name]
            assert entry["proof"] == "sass-only" and entry["family"] == "sm100"
    # 12.0 is served by its own sm_120a build (tests/test_sm120.py).
    assert not any(v["target"] == BLACKWELL_DC for v in Bundle.open(test_bundle, capability=(12, 0)).candidates("gemm"))
    for cap in ((11, 0), (12, 1)):
        with pytest.raises(NoVariantError, match="no gemm variant"):
            _select(Bundle.open(test_bundle, capability=cap), _bf16(64, 256), _bf16(64, 256))


def _predicted_abi(v) -> dict:
    """The argument structs the DSL's exported header declares for ``v``, predicted from its
    signature (sizes int32_t, strides int64_t, one slot per symbolic mode; checked against a
    compiled variant's header below)."""
    from factory.abi import TensorArg

    params = [[f"{v.name}_Kernel_Module_t *", "module"]]
    structs = {}
    for a in v.signature().args:
        if isinstance(a, TensorArg):
            st = f"{v.name}_Tensor_{a.name}_t"
            params.append([st + " *", a.name])
            structs[st] = {"shape_ctype": "int32_t", "n_shapes": sum(isinstance(d, str) for d in a.shape),
                           "stride_ctype": "int64_t", "n_strides": sum(isinstance(d, str) for d in a.stride)}
        else:
            params.append([{"i32": "int32_t", "f32": "float"}[a.dtype], a.name])
    params.append(["cudaStream_t", "stream"])
    return {"wrapper": f"cute_dsl_{v.name}_wrapper", "params": params, "structs": structs}


@pytest.fixture(scope="module")
def default_sm100_bundle(test_bundle, tmp_path_factory):
    """The test bundle with the default tier's datacenter Blackwell variants added to its manifest, for
    selection only (which reads nothing but manifest fields; these entries are never launched):
    each variant's own name, config, ``describe()``, signature and predicted ABI, over the compiled
    test variant's entry.  Compiling them would cost the CPU suite the default tier."""
    from factory.atoms.targets import get_target
    from factory.gemm.sm100 import GemmSm100, enumerate_sm100

    out = tmp_path_factory.mktemp("sm100sel") / "bundle"
    shutil.copytree(test_bundle, out)
    m = json.loads((out / "manifest.json").read_text())
    base = m["variants"][next(n for n in _sm100(m) if m["variants"][n]["op"] == "gemm"
                              and not m["variants"][n].get("epilogue") and m["variants"][n].get("scale_mode") != "row")]
    compiled = GemmSm100(target=BLACKWELL_DC, **{k: tuple(x) if isinstance(x, list) else x
                                              for k, x in base["config"].items() if k != "target"})
    assert compiled.name == base["name"] and _predicted_abi(compiled) == base["abi"]
    for v in enumerate_sm100(get_target(BLACKWELL_DC), "default"):
        e = json.loads(json.dumps(base))
        e.update(name=v.name, config=v.config(), **json.loads(json.dumps(v.describe())),
                 signature=v.signature().to_json(), abi=_predicted_abi(v),
                 sass_requirements=list(v.sass_requirements()))
        e["resources"]["dynamic_smem_bytes"] = v.smem_bytes()
        # (files: the compiled variant's, which the manifest's schema asks for; never loaded)
        m["variants"][v.name] = e
    m["variants"] = dict(sorted(m["variants"].items()))  # as the builder writes them
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return out


@pytest.mark.parametrize("m", [1, 8, 16])
def test_decode_on_10_0_takes_the_64_row_tile(default_sm100_bundle, m):
    """M <= 16, N = 4096: the 64 x 32 tile (128 CTAs) over every 128-row tile (32 CTAs or fewer)."""
    b = sl.attach(Bundle.open(default_sm100_bundle, capability=(10, 0), device=B200))
    assert _select(b, _bf16(m, 4096), _bf16(4096, 4096)) == f"gemm_{DC}_bf16_obf16_ak_bk_t64x32x64_c1x1_pdl"
    x8 = torch.empty(m, 4096, dtype=torch.float8_e4m3fn)
    w8 = torch.empty(4096, 4096, dtype=torch.float8_e4m3fn)
    assert _select(b, x8, w8, "e4m3") == f"gemm_{DC}_e4m3_obf16_ak_bk_t64x32x128_c1x1_pdl"


def test_large_problems_on_10_0_take_a_cta_pair(default_sm100_bundle):
    """Large problems take a CTA pair (B split between the pair: half the operand reads per SM).
    8192^3: the 256 x 256 pair; 4096^3: the 256 x 128 pair (1024 CTA tiles are 6.9 waves of 148
    CTAs, 512 of the 256 x 256 pair's are 3.5: the model counts whole waves).  fp8: the pair."""
    b = sl.attach(Bundle.open(default_sm100_bundle, capability=(10, 0), device=B200))
    assert _select(b, _bf16(8192, 8192), _bf16(8192, 8192)) == f"gemm_{DC}_bf16_obf16_ak_bk_2cta_t256x256x64_c2x1_pdl"
    assert _select(b, _bf16(4096, 4096), _bf16(4096, 4096)) == f"gemm_{DC}_bf16_obf16_ak_bk_2cta_t256x128x64_c2x2_pdl"
    x8 = torch.empty(4096, 4096, dtype=torch.float8_e4m3fn)
    assert _select(b, x8, x8, "e4m3") == f"gemm_{DC}_e4m3_obf16_ak_bk_2cta_t256x256x128_c2x1_pdl"
    # x @ W with W stored (K, N): the N-major B variant.
    w_kn = _bf16(4096, 4096).t()
    assert _select(b, _bf16(4096, 4096), w_kn) == f"gemm_{DC}_bf16_obf16_ak_bn_t128x128x64_c1x1_pdl"
    # Never the Hopper ones on this device, even where they are in the bundle.
    assert not any(v["target"].startswith("sm_9") for v in b.candidates("gemm"))
