"""Fused GEMM epilogues (bias, silu_mul, residual) of the mma.sync family without a GPU: the fields
and their limits, the arguments they add (the same contract as the sm90 family's, the residual read
as 16-byte vectors), the tiers, one variant compiled with its SASS checked (no spills), and the host
library's selection: an sm80-family epilogue variant on sm_80/86/89 devices, never over an sm_90a
one on an H100.  Their values on a GPU (the sm_90 portability build): test_gemm_epilogue_gpu.py."""

from __future__ import annotations

import pytest

import selection_lib as sl
from factory.atoms.targets import get_target

pytest.importorskip("cutlass", reason="the variant fields come from the kernel module (needs the DSL)")
from factory.gemm import sm80  # noqa: E402
from factory.gemm.sm80 import GemmSm80, enumerate_sm80  # noqa: E402
from factory.runtime import epilogue as ep  # noqa: E402
from factory.runtime import selector as rs  # noqa: E402
from factory.runtime.errors import NoVariantError  # noqa: E402

TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90")


def _v(target="sm_86", **kw) -> GemmSm80:
    return GemmSm80(target=target, ab="bf16", c="bf16", **kw)


def test_fields_off_leave_the_variants_as_they_were():
    for t in TARGETS:
        for tier in ("test", "default"):
            for v in enumerate_sm80(get_target(t), tier):
                if not v.has_epilogue:
                    assert not any(x in v.name.split("_") for x in ("bias", "silumul", "res")), v.name
                    assert "epilogue" not in v.describe()
                    assert [a.name for a in v.signature().args][:3] == ["a", "b", "c"]
    v = _v(tile=(128, 128, 32), warps=(2, 2))
    assert v.name == "gemm_sm86_bf16_obf16_ak_bk_t128x128x32_w2x2" and v.smem_bytes() == _v(
        tile=(128, 128, 32), warps=(2, 2)).smem_bytes()


def test_limits_and_arguments():
    v = _v(tile=(64, 128, 32), warps=(2, 2), bias=True, silu_mul=True, residual=True)
    assert v.can_implement() is None and v.name.endswith("_bias_silumul_res")
    args = {a.name: a for a in v.signature().args}
    assert list(args) == ["a", "b", "c", "bias", "residual"]
    assert args["c"].shape == ("M", "NO", "L") and args["residual"].shape == ("M", "NO", "L")
    assert args["bias"].shape == ("N",) and args["bias"].align == 2
    div = dict(v.signature().divisibility)
    assert args["residual"].align == 16 and div["sRm"] == div["sRl"] == div["NO"] == 8  # 16-byte vectors
    assert v.describe()["epilogue"] == ["bias", "silu_mul", "residual"]
    assert v.describe()["gate_up_block"] == sm80.GATE_UP_BLOCK == ep.GATE_UP_BLOCK
    assert "tile N" in _v(tile=(128, 64, 32), warps=(2, 2), silu_mul=True).can_implement()
    assert _v("sm_80", tile=(128, 256, 32), warps=(2, 4), silu_mul=True).can_implement() is None
    assert "unsplit" in sm80.GemmSm80SplitK(target="sm_86", tile=(64, 128, 32), warps=(2, 2), split_k=4,
                                            residual=True).can_implement()
    assert "bf16/f16" in GemmSm80(target="sm_89", ab="e4m3", c="bf16", tile=(128, 128, 64), warps=(2, 2),
                                  residual=True).can_implement()
    # fp32 staging: 128x256 needs 132 KiB of shared memory (sm_80 and sm_90 have it, sm_86/89 not)
    assert _v("sm_80", tile=(128, 256, 32), warps=(2, 4), residual=True).can_implement() is None
    assert "shared memory" in _v("sm_86", tile=(128, 256, 32), warps=(2, 4), residual=True).can_implement()


def test_tiers():
    for t in TARGETS:
        test = [v for v in enumerate_sm80(get_target(t), "test") if v.has_epilogue]
        assert {tuple(v.epilogue) for v in test} == {("bias",), ("residual",), ("silu_mul",),
                                                     ("bias", "silu_mul", "residual")}
        fits = [v for v in test if v.can_implement() is None]
        assert len(fits) == (8 if t in ("sm_80", "sm_90") else 6)  # 128x256: shared memory
        default = [v for v in enumerate_sm80(get_target(t), "default") if v.has_epilogue]
        assert not default  # test tier only (notes/gemm-epilogue.md: why not the default tier yet)


def _entries(target_tiles: dict) -> list[dict]:
    """Selection entries of real variants: {target: [(tile, warps, fields), ...]} plus each
    target's plain twin."""
    out = []
    for t, rows in target_tiles.items():
        for tile, warps, fields in rows:
            for f in (fields, ()):
                if t == "sm_90a":
                    from factory.gemm.sm90 import GemmSm90

                    v = GemmSm90(target=t, ab="bf16", c="bf16", tile=tile, **{x: True for x in f})
                else:
                    v = _v(t, tile=tile, warps=warps, **{x: True for x in f})
                d = v.describe()
                d.update(name=v.name, target=t, family=v.family, op="gemm")
                d.setdefault("split_k", 1)
                args = [sl._tensor(n, 3) for n in "abc"] + [sl._tensor("residual", 3)] * ("residual" in f)
                if t == "sm_90a":
                    args.append(sl._scalar("max_clusters"))
                d["signature"] = {"args": args, "divisibility": {}}
                if d not in out:
                    out.append(d)
    return out


def _select(lib, M, N, K, flags, n_out=None, res=1 << 43):
    n_out = N if n_out is None else n_out
    p = rs.Selector.gemm_problem((1 << 41, (M, K, 1), (K, 1, 0)), (1 << 42, (N, K, 1), (K, 1, 0)),
                                 (1 << 40, (M, n_out, 1), (n_out, 1, 0)), "bf16", "bf16", [], False)
    r = res if flags & ep.FLAGS["residual"] else 0
    return lib.sel.select_epilogue(p, None, flags, n_out, 0, r, (n_out, 1, 0)).name.decode()


def test_selection_on_ampere_ada_and_never_over_sm90a():
    R, S = ep.FLAGS["residual"], ep.FLAGS["silu_mul"]
    rows = [((128, 128, 32), (2, 2), ("residual",)), ((128, 128, 32), (2, 2), ("silu_mul",)),
            ((64, 128, 32), (2, 2), ("residual",))]
    h = [((128, 128, 64), None, ("residual",)), ((128, 128, 64), None, ("silu_mul",))]
    entries = _entries({"sm_90a": h, "sm_90": rows, "sm_86": rows, "sm_80": rows})
    a10 = sl.Lib(entries, cc=(8, 6), sm_count=72)
    # Llama-3-8B o_proj + residual, gate_up + silu_mul: the sm_86 builds, the plain rule's tile
    assert _select(a10, 2048, 4096, 4096, R) == "gemm_sm86_bf16_obf16_ak_bk_t128x128x32_w2x2_res"
    assert _select(a10, 2048, 28672, 4096, S, n_out=14336) == "gemm_sm86_bf16_obf16_ak_bk_t128x128x32_w2x2_silumul"
    assert a10.gemm(2048, 4096, 4096) == "gemm_sm86_bf16_obf16_ak_bk_t128x128x32_w2x2"
    with pytest.raises(NoVariantError):  # no bias variant among these
        p = rs.Selector.gemm_problem((1 << 41, (64, 64, 1), (64, 1, 0)), (1 << 42, (256, 64, 1), (64, 1, 0)),
                                     (1 << 40, (64, 256, 1), (256, 1, 0)), "bf16", "bf16", [], False)
        a10.sel.select_epilogue(p, None, ep.FLAGS["bias"], 256, 1 << 44, 0, (256, 1, 0))
    a100 = sl.Lib(entries, cc=(8, 0), sm_count=108)
    assert _select(a100, 16, 4096, 4096, R).startswith("gemm_sm80_")
    h100 = sl.Lib(entries, cc=(9, 0), sm_count=132)
    for M in (1, 64, 2048):
        assert _select(h100, M, 4096, 4096, R).startswith("gemm_sm90a_")
        assert _select(h100, M, 28672, 4096, S, n_out=14336).startswith("gemm_sm90a_")
    # without sm_90a builds, an H100 runs the sm_90 portability build
    h100p = sl.Lib([e for e in entries if e["target"] != "sm_90a"], cc=(9, 0), sm_count=132)
    assert _select(h100p, 2048, 4096, 4096, R).startswith("gemm_sm90_bf16_obf16_ak_bk_t128x128x32")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from factory.compiler.builder import build

    out = tmp_path_factory.mktemp("sm80epi")
    build(out, ["sm_86"], ["gemm"], tier="test", name_filter="*t64x128x32_w2x2_bias_silumul_res", jobs=1)
    return out


def test_compiles_with_its_sass_and_no_spills(built):
    import json

    m = json.loads((built / "manifest.json").read_text())
    (e,) = m["variants"].values()
    assert e["epilogue"] == ["bias", "silu_mul", "residual"] and e["target"] == "sm_86"
    assert e["resources"]["spill_instructions"] == 0 and e["resources"]["stack_frame_bytes"] == 0
    assert [a["name"] for a in e["signature"]["args"]] == ["a", "b", "c", "bias", "residual"]
