"""Row-wise fp8 scales (torch ``_scaled_mm``'s row-wise form) on the mma.sync GEMM family without a
GPU: the ``row_scale`` field and its limits, the tiers (the per-tensor fp8 tiles' row-scaled
twins), one variant each for sm_89 (native fp8 QMMA) and sm_90 (the portability build, f16 HMMA)
compiled with their SASS checked (the scales read once per row and column, no spills), and the host
library's selection on simulated Ada, Hopper and consumer-Blackwell devices: the row-scaled twin of
the per-tensor pick, never over a Hopper sm_90a row variant, and a NoVariantError that names the
form where a bundle has no row-scaled variant.  Their values on a GPU: test_gemm_fp8_gpu.py and
test_every_variant_gpu.py on an sm_90 build."""

from __future__ import annotations

import json

import pytest

import selection_lib as sl
from conftest import Recorder
from factory.atoms.targets import get_target

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="the variant fields come from the kernel module (needs the DSL)")
from factory.gemm.sm80 import GemmSm80, GemmSm80SplitK, enumerate_sm80  # noqa: E402
from factory.runtime import Bundle, NoVariantError  # noqa: E402
from factory.runtime import selector as rs  # noqa: E402

TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120a")
L4 = {"name": "NVIDIA L4", "sm_count": 58}
H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}


def _fp8(target="sm_89", warps=(2, 2), **kw) -> GemmSm80:
    return GemmSm80(target=target, ab="e4m3", c="bf16", tile=(128, 128, 64), warps=warps, **kw)


def test_field_off_leaves_the_variants_as_they_were():
    for t in TARGETS:
        for tier in ("test", "default"):
            for v in enumerate_sm80(get_target(t), tier):
                if v.row_scale:
                    continue
                assert "rowsc" not in v.name.split("_"), v.name
                if v.is_fp8:
                    assert v.describe()["scale_mode"] == "tensor"
                    sig = {a.name: a for a in v.signature().args}
                    assert sig["scale_a"].shape == sig["scale_b"].shape == (1,)
                else:
                    assert "scale_mode" not in v.describe()
    v, r = _fp8(), _fp8(row_scale=True)
    assert r.name == v.name + "_rowsc" == "gemm_sm89_e4m3_obf16_ak_bk_t128x128x64_w2x2_rowsc"
    assert r.smem_bytes() == v.smem_bytes() and r.stages == v.stages


def test_limits_and_arguments():
    r = _fp8(row_scale=True)
    assert r.can_implement() is None and r.describe()["scale_mode"] == "row"
    args = {a.name: a for a in r.signature().args}
    assert list(args) == ["a", "b", "c", "scale_a", "scale_b"]
    assert args["scale_a"].shape == ("M",) and args["scale_b"].shape == ("N",)
    assert args["scale_a"].stride == args["scale_b"].stride == (1,) and args["scale_a"].align == 4
    assert dict(r.signature().divisibility) == dict(_fp8().signature().divisibility)
    assert "fp8 only" in GemmSm80(target="sm_89", tile=(128, 128, 32), row_scale=True).can_implement()
    assert "unsplit" in GemmSm80SplitK(target="sm_89", ab="e4m3", c="bf16", tile=(64, 128, 64), warps=(2, 2),
                                       split_k=4, row_scale=True).can_implement()
    assert "sm_89" in _fp8("sm_86", row_scale=True).can_implement()
    assert "QMMA" in _fp8("sm_120a", row_scale=True).sass_requirements()[0]
    assert "HMMA" in _fp8("sm_90", row_scale=True, warps=(4, 2)).sass_requirements()[0]


def test_tiers_hold_the_per_tensor_tiles_row_scaled_twins():
    want = {"sm_80": 0, "sm_86": 0, "sm_89": 2, "sm_90": 1, "sm_120a": 2}
    for t in TARGETS:
        default = [v for v in enumerate_sm80(get_target(t), "default") if v.can_implement() is None]
        rows = [v for v in default if v.row_scale]
        tensor = {v.name for v in default if v.is_fp8 and not v.row_scale and not isinstance(v, GemmSm80SplitK)}
        assert len(rows) == want[t], t
        assert {v.name.removesuffix("_rowsc") for v in rows} == (tensor if rows else set()), t
        assert not any(v.row_scale for v in enumerate_sm80(get_target(t), "test"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The 128x128 fp8 tiles of sm_89 (QMMA) and sm_90 (HMMA), per-tensor and row-scaled."""
    from factory.compiler.builder import build

    out = tmp_path_factory.mktemp("sm80row") / "b"
    build(out, ["sm_89", "sm_90"], ["gemm"], tier="default", jobs=1, name_filter="*e4m3*_t128x128x64_*",
          evidence=tmp_path_factory.mktemp("no-runs"))
    return out


def test_compiles_with_its_sass_and_no_spills(built):
    from factory.compiler.cubin import disassemble, opcode_histogram

    m = json.loads((built / "manifest.json").read_text())
    rows = {e["target"]: e for e in m["variants"].values() if e.get("scale_mode") == "row"}
    assert set(rows) == {"sm_89", "sm_90"}
    assert rows["sm_89"]["sass"]["QMMA"] > 0 and rows["sm_89"]["sass"]["HMMA"] == 0
    assert rows["sm_90"]["sass"]["HMMA"] > 0 and rows["sm_90"]["sass"]["QMMA"] == 0
    for t, e in rows.items():
        assert e["resources"]["spill_instructions"] == 0 and e["resources"]["stack_frame_bytes"] == 0, t
        assert e["proof"] == ("sass-only" if t == "sm_89" else "compiled")
        twin = m["variants"][e["name"].removesuffix("_rowsc")]
        h, h0 = (opcode_histogram(disassemble(built / x["files"]["cubin"]["path"])) for x in (e, twin))
        # each thread reads its rows' and columns' scales once: 2 warps x 2 warps of 64x64 (sm_89)
        # hold 8 rows and 16 columns, 4 x 2 warps of 32x64 (sm_90) 4 and 16; the twin reads 2 scales
        assert h["LDG.E"] - h0["LDG.E"] == (8 + 16 if t == "sm_89" else 4 + 16) - 2, t


def _pick(b, M, N, K, row=True):
    a = torch.zeros(M, K, dtype=torch.float8_e4m3fn)
    w = torch.zeros(N, K, dtype=torch.float8_e4m3fn)
    if row:
        b.gemm(a, w, scale_a=torch.ones(M), scale_b=torch.ones(N))
    else:
        b.gemm(a, w, scale_a=torch.ones(1), scale_b=torch.ones(1))
    return b.rec.launched[-1]


SHAPES = [(1, 4096, 4096), (1, 24, 16), (300, 504, 1008), (4096, 4096, 4096), (257, 136, 208)]


def test_bundle_selects_the_row_scaled_variant(built):
    for cc, dev, target in (((8, 9), L4, "sm89"), ((9, 0), H100, "sm90")):
        b = Bundle.open(built, capability=cc, device=dev)
        b.rec = Recorder()
        b.simulate(b.rec)
        for M, N, K in SHAPES:
            row, tensor = _pick(b, M, N, K), _pick(b, M, N, K, row=False)
            assert row == tensor + "_rowsc" and row.startswith(f"gemm_{target}_e4m3"), (cc, M, N, K, row)
            assert row == _row(b, M, N, K)  # what the loader launched is the C entry's answer
        M, N = 300, 504  # torch._scaled_mm's (M, 1) and (1, N) shapes
        a, w = torch.zeros(M, 1008, dtype=torch.float8_e4m3fn), torch.zeros(N, 1008, dtype=torch.float8_e4m3fn)
        b.gemm(a, w, scale_a=torch.ones(M, 1), scale_b=torch.ones(1, N))
        assert b.rec.launched[-1].endswith("_rowsc")


def _entries(targets: dict[str, list[dict]]) -> list[dict]:
    """Selection entries of real variants (their manifest fields and argument contracts)."""
    out = []
    for t, specs in targets.items():
        for s in specs:
            if t == "sm_90a":
                from factory.gemm.sm90 import GemmSm90

                v = GemmSm90(target=t, **s)
            else:
                v = GemmSm80(target=t, **s)
            d = v.describe()
            d.update(name=v.name, target=t, family=v.family, op="gemm", signature=v.signature().to_json())
            d.setdefault("split_k", 1)
            out.append(d)
    return out


def _row(lib, M, N, K):
    """``fx_gemm_scaled_select`` of a row-scaled problem (``lib``: a selection_lib.Lib or a Bundle)."""
    a3, b3, c3 = (1 << 41, (M, K, 1), (K, 1, 0)), (1 << 42, (N, K, 1), (K, 1, 0)), (1 << 40, (M, N, 1), (N, 1, 0))
    p = rs.Selector.gemm_problem(a3, b3, c3, "e4m3", "bf16", [(1 << 43, (M,), (1,)), (1 << 44, (N,), (1,))], False)
    sel = lib.sel if isinstance(lib, sl.Lib) else lib.selector
    return sel.select_scaled(p, (1, (1, 0), (1, 0))).name.decode()


def test_library_picks_the_twin_of_the_per_tensor_choice():
    """The sm80 rule (the largest tile that fills the SMs, else the most CTAs) picks the row-scaled
    twin of what it picks per tensor, over M 1..16384 on Ada (L4, RTX 4090) and consumer Blackwell."""
    fp8 = [dict(ab="e4m3", c="bf16", tile=(128, 128, 64), warps=(2, 2)),
           dict(ab="e4m3", c="bf16", tile=(128, 256, 64), warps=(2, 4))]
    for t, cc, sms in (("sm_89", (8, 9), 58), ("sm_89", (8, 9), 128), ("sm_120a", (12, 0), 170)):
        lib = sl.Lib(_entries({t: fp8 + [dict(s, row_scale=True) for s in fp8]}), cc=cc, sm_count=sms)
        seen = set()
        for M in (1, 16, 128, 512, 1000, 2048, 4096, 16384):
            for N, K in ((4096, 4096), (14336, 4096), (2112, 7168), (136, 208)):
                row = _row(lib, M, N, K)
                assert row == lib.gemm(M, N, K, ab="e4m3") + "_rowsc", (t, sms, M, N, K)
                seen.add(row)
        assert len(seen) == 2, seen  # both tiles are picked somewhere


def test_hopper_rows_first_and_a_clear_refusal_without_row_variants():
    sm90 = [dict(ab="e4m3", c="bf16", tile=(128, 128, 64), warps=(4, 2))]
    hop = [dict(ab="e4m3", c="bf16", tile=(128, 128, 128), row_scale=True)]
    both = _entries({"sm_90a": hop, "sm_90": sm90 + [dict(sm90[0], row_scale=True)]})
    h100 = sl.Lib(both, cc=(9, 0), sm_count=132)
    assert _row(h100, 300, 4096, 4096).startswith("gemm_sm90a_")
    h100p = sl.Lib([e for e in both if e["target"] == "sm_90"], cc=(9, 0), sm_count=132)
    assert _row(h100p, 300, 4096, 4096) == "gemm_sm90_e4m3_obf16_ak_bk_t128x128x64_w4x2_rowsc"
    # an Ada bundle with per-tensor fp8 only: the row form is refused by name, per tensor still runs
    ada = sl.Lib(_entries({"sm_89": [dict(ab="e4m3", c="bf16", tile=(128, 128, 64), warps=(2, 2))]}),
                 cc=(8, 9), sm_count=58)
    assert ada.gemm(300, 4096, 4096, ab="e4m3") == "gemm_sm89_e4m3_obf16_ak_bk_t128x128x64_w2x2"
    with pytest.raises(NoVariantError, match="no gemm variant with row fp8 scales for a=e4m3"):
        _row(ada, 300, 4096, 4096)
