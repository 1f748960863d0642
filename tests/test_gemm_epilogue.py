"""Fused GEMM epilogues (bias, silu_mul, residual) without a GPU: the variant fields and their
limits, the arguments they add, the tiers, the gate/up weight packing, the bad inputs refused on
metadata, and the host library's selection (only variants with exactly the requested fields; the
plain GEMM never takes one).  The compile and SASS of the test tier's epilogue variants run in
test_gemm_sm90_compile.py; their values on a GPU in test_gemm_epilogue_gpu.py."""

from __future__ import annotations

import pytest
import torch

import selection_lib as sl
from factory.atoms.targets import get_target

pytest.importorskip("cutlass", reason="the variant fields come from the kernel module (needs the DSL)")
from factory.gemm.sm90 import GATE_UP_BLOCK, GemmSm90, enumerate_sm90  # noqa: E402
from factory.runtime import epilogue as ep
from factory.runtime import selector as rs
from factory.runtime.errors import InputError, NoVariantError


def _v(**kw) -> GemmSm90:
    return GemmSm90(target="sm_90a", **kw)


def test_fields_off_leave_the_variant_as_it_was():
    v = _v(tile=(128, 128, 64), pdl=True)
    assert v.name == "gemm_sm90a_bf16_obf16_ak_bk_t128x128x64_c1x1_coop_rm_sw1_sk1_pdl"
    assert "epilogue" not in v.describe() and [a.name for a in v.signature().args] == ["a", "b", "c", "max_clusters"]
    for tier in ("test", "default"):
        for w in enumerate_sm90(get_target("sm_90a"), tier):
            if not w.has_epilogue:
                assert not any(t in w.name.split("_") for t in ("bias", "silumul", "res"))


def test_epilogue_limits_and_arguments():
    # The residual runs on the decode tiles too (swapped, split-K); bias and silu_mul do not.
    assert _v(tile=(32, 64, 64), schedule="ws", swap_ab=True, residual=True).can_implement() is None
    assert _v(tile=(64, 64, 64), schedule="ws", swap_ab=True, split_k=2, residual=True).can_implement() is None
    assert "unswapped" in _v(tile=(32, 64, 64), schedule="ws", swap_ab=True, bias=True).can_implement()
    assert "unswapped" in _v(tile=(64, 64, 64), schedule="ws", swap_ab=True, split_k=2, bias=True,
                             residual=True).can_implement()
    assert "tile N" in _v(tile=(128, 256, 64), cluster=(2, 1), silu_mul=True, residual=True).can_implement()
    assert "tile N" in _v(tile=(128, 192, 64), cluster=(2, 1), silu_mul=True).can_implement()
    v = _v(tile=(128, 128, 64), bias=True, silu_mul=True, residual=True)
    assert v.can_implement() is None and v.name.endswith("_bias_silumul_res")
    args = {a.name: a for a in v.signature().args}
    assert list(args) == ["a", "b", "c", "bias", "residual", "max_clusters"]
    assert args["c"].shape == ("M", "NO", "L") and args["residual"].shape == ("M", "NO", "L")
    assert args["bias"].shape == ("N",) and v.describe()["epilogue"] == ["bias", "silu_mul", "residual"]
    # The residual is read in pairs of adjacent columns: 4-byte base, even strides.
    assert args["residual"].align == 4 and dict(v.signature().divisibility)["sRm"] == 2
    f8 = _v(ab="e4m3", tile=(128, 128, 128), row_scale=True, residual=True)
    assert [a.name for a in f8.signature().args] == ["a", "b", "c", "scale_a", "scale_b", "residual", "max_clusters"]


def test_tiers():
    t = get_target("sm_90a")
    test = [v for v in enumerate_sm90(t, "test") if v.has_epilogue]
    default = [v for v in enumerate_sm90(t, "default") if v.has_epilogue]
    assert len(test) == 5 and len(default) == 16
    assert {tuple(v.epilogue) for v in test} == {("bias",), ("residual",), ("silu_mul",),
                                                 ("bias", "silu_mul", "residual"), ("fp8_groups",)}
    assert all(v.ab == "bf16" and not v.bias and v.pdl for v in default)


def test_pack_gate_up_round_trip_and_padding():
    I, K = 100, 8
    gate, up = torch.randn(I, K), torch.randn(I, K)
    packed = ep.pack_gate_up(torch.cat([gate, up]))
    assert packed.shape == (ep.gate_up_rows(I), K) == (256, K)
    assert torch.equal(packed[:64], gate[:64]) and torch.equal(packed[64:128], up[:64])
    assert torch.equal(packed[128:164], gate[64:]) and not packed[164:192].any()
    g, u = ep.unpack_gate_up(packed, I)
    assert torch.equal(g, gate) and torch.equal(u, up)
    assert torch.equal(ep.pack_gate_up(gate, up), packed)
    bias = ep.pack_gate_up(torch.arange(2 * I, dtype=torch.float32))
    assert bias.shape == (256,) and bias[64] == I and bias[128] == 64
    with pytest.raises(InputError):
        ep.pack_gate_up(torch.randn(5, 4))
    assert GATE_UP_BLOCK == ep.GATE_UP_BLOCK


def test_metadata_checks():
    a = torch.empty(4, 16, dtype=torch.bfloat16)
    assert ep._n_out(256, ep.FLAGS["silu_mul"], None, None) == 128
    assert ep._n_out(256, ep.FLAGS["silu_mul"], torch.empty(4, 100), None) == 100
    with pytest.raises(InputError, match="pack_gate_up"):
        ep._n_out(200, ep.FLAGS["silu_mul"], None, None)
    with pytest.raises(InputError, match="activation"):
        ep.flags_of(None, None, "gelu")
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    for bias, res, msg in ((torch.empty(32, dtype=torch.float16), None, "dtype"),
                           (torch.empty(31, dtype=torch.bfloat16), None, "shape"),
                           (torch.empty(64, dtype=torch.bfloat16)[::2], None, "contiguous"),
                           (None, torch.empty(4, 31, dtype=torch.bfloat16), "shape"),
                           (None, torch.empty(32, 4, dtype=torch.bfloat16).t(), "contiguous"),
                           ([0.0] * 32, None, "torch.Tensor")):
        with pytest.raises(InputError, match=msg):
            ep.check_epilogue(a, out, bias, res, 32, 32, torch.bfloat16, -1)


# --- the host library's selection -------------------------------------------------------------------
def _entry(name, tile, cluster=(1, 1), schedule="coop", epilogue=()):
    args = [sl._tensor(n, 3) for n in "abc"]
    if "bias" in epilogue:
        args.append(sl._tensor("bias", 1))
    if "residual" in epilogue:
        args.append(sl._tensor("residual", 3))
    args.append(sl._scalar("max_clusters"))
    e = {"name": name, "family": "sm90", "tile": list(tile), "cluster": list(cluster), "schedule": schedule,
         "split_k": 1, "threads": 384, "persistent": {"arg": "max_clusters", "cluster_ctas": cluster[0] * cluster[1]},
         "signature": {"args": args, "divisibility": {}}}
    if epilogue:
        e["epilogue"] = list(epilogue)
    return e


_ENTRIES = [
    _entry("plain", (128, 128, 64)),
    _entry("res", (128, 128, 64), epilogue=("residual",)),
    _entry("res_ws", (64, 128, 64), schedule="ws", epilogue=("residual",)),
    _entry("silu", (128, 128, 64), epilogue=("silu_mul",)),
    _entry("all", (128, 128, 64), epilogue=("bias", "silu_mul", "residual")),
]


@pytest.fixture(scope="module")
def lib():
    return sl.Lib(_ENTRIES)


def _select(lib, M, N, K, flags, n_out=None, bias=0, res=0, res_stride=None, c=1 << 40):
    n_out = N if n_out is None else n_out
    p = rs.Selector.gemm_problem((1 << 41, (M, K, 1), (K, 1, 0)), (1 << 42, (N, K, 1), (K, 1, 0)),
                                 (c, (M, n_out, 1), (n_out, 1, 0)), "bf16", "bf16", [], False)
    return lib.sel.select_epilogue(p, None, flags, n_out, bias, res, res_stride or (n_out, 1, 0)).name.decode()


def test_selection_takes_exactly_the_requested_fields(lib):
    R, S, B = ep.FLAGS["residual"], ep.FLAGS["silu_mul"], ep.FLAGS["bias"]
    assert lib.gemm(4096, 4096, 4096) == "plain"
    assert _select(lib, 4096, 4096, 4096, R, res=1 << 43) in ("res", "res_ws")
    assert _select(lib, 4096, 28672, 4096, S, n_out=14336) == "silu"
    assert _select(lib, 64, 256, 4096, B | S | R, n_out=128, bias=1 << 44, res=1 << 43) == "all"
    assert _select(lib, 64, 256, 64, R, res=1 << 40) == "res" or _select(lib, 64, 256, 64, R, res=1 << 40) == "res_ws"
    with pytest.raises(NoVariantError):
        _select(lib, 64, 256, 64, B, bias=1 << 44)


def test_residual_default_tiles_follow_the_plain_selection():
    """Each default residual variant is a plain default variant plus the residual, and wherever the
    plain GEMM's choice has such a twin, the residual selection takes the twin (one cost model):
    the fused call runs the plain call's kernel plus the residual read; from M 4096 that is the
    swizzled-raster 256x128 1x2 tile.  (Llama-3-8B o_proj and down_proj shapes, H100's 132 SMs;
    the entries carry the family and target a built manifest gives them, which the cost model
    reads: the choices are a built sm_90a bundle's.)"""
    default = enumerate_sm90(get_target("sm_90a"), "default")
    names = {v.name for v in default}
    entries = []
    for v in default:
        if not v.has_epilogue or v.epilogue == ["residual"]:
            d = v.describe()
            d.update(name=v.name, family="sm90", target="sm_90a")
            args = [sl._tensor(n, 3) for n in "abc"] + ([sl._tensor("residual", 3)] if v.residual else [])
            d["signature"] = {"args": args + [sl._scalar("max_clusters")], "divisibility": {}}
            entries.append(d)
    res = [e["name"] for e in entries if e["name"].endswith("_res")]
    assert len(res) == 11 and all(n[:-len("_res")] in names for n in res)
    tall = "gemm_sm90a_bf16_obf16_ak_bk_t256x128x64_c1x2_coop_rm_sw8_sk1_pdl"
    lib = sl.Lib(entries)
    twins = 0
    for K in (4096, 14336):
        for M in (1, 16, 32, 64, 128, 192, 256, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384):
            plain = lib.gemm(M, 4096, K)
            got = _select(lib, M, 4096, K, ep.FLAGS["residual"], res=1 << 43)
            if plain + "_res" in res:
                twins += 1
                assert got == plain + "_res", (M, K, plain, got)
            if M >= 4096:
                assert plain == tall and got == tall + "_res", (M, K, plain, got)
            if M in (192, 768, 1536):  # the mid-M tiles (64x96 ws, 128x192 2x1) have their twins
                assert got == plain + "_res" and ("t64x96" in got or "t128x192" in got), (M, K, plain, got)
    assert twins >= 16


def test_silu_default_tiles_follow_the_plain_prefill_selection():
    """gate_up (M x 28672 x 4096, Llama-3-8B): wherever the plain GEMM's choice has a silu_mul twin
    in the default tier, the silu_mul selection takes the twin (one cost model), and from M 1024
    (the plain GEMM's prefill tile) that is the 256x128 1x2 tile, also from M 4096 where the plain
    GEMM takes its swizzled-raster form (whose silu_mul twin is full tier).  (The entries carry the
    family and target of a built manifest: the choices are a built sm_90a bundle's.)"""
    default = enumerate_sm90(get_target("sm_90a"), "default")
    entries = []
    for v in default:
        if not v.has_epilogue or v.epilogue == ["silu_mul"]:
            d = v.describe()
            d.update(name=v.name, family="sm90", target="sm_90a")
            d["signature"] = {"args": [sl._tensor(n, 3) for n in "abc"] + [sl._scalar("max_clusters")],
                              "divisibility": {}}
            entries.append(d)
    silu = {e["name"] for e in entries if e["name"].endswith("_silumul")}
    big = "gemm_sm90a_bf16_obf16_ak_bk_t256x128x64_c1x2_coop_rm_sw1_sk1_pdl_silumul"
    assert len(silu) == 4 and big in silu
    lib = sl.Lib(entries)
    S = ep.FLAGS["silu_mul"]
    twins = 0
    for M in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        plain = lib.gemm(M, 28672, 4096)
        got = _select(lib, M, 28672, 4096, S, n_out=14336)
        if plain + "_silumul" in silu:
            twins += 1
            assert got == plain + "_silumul", (M, plain, got)
        if M >= 1024:
            assert got == big, (M, got)
        if M >= 4096:
            assert plain == big[:-len("_silumul")].replace("_sw1_", "_sw8_"), (M, plain)
    assert twins >= 1


def test_selection_refuses_bad_epilogues(lib):
    R, S = ep.FLAGS["residual"], ep.FLAGS["silu_mul"]
    with pytest.raises(InputError, match="rows"):
        _select(lib, 64, 200, 64, S, n_out=100)
    with pytest.raises(InputError, match="n_out"):
        _select(lib, 64, 256, 64, R, n_out=128, res=1 << 43)
    with pytest.raises(InputError, match="residual pointer"):
        _select(lib, 64, 256, 64, R)
    with pytest.raises(InputError, match="flags"):
        _select(lib, 64, 256, 64, 16)
    with pytest.raises(InputError, match="overlaps"):  # a residual half a row into c
        _select(lib, 64, 256, 64, R, res=(1 << 40) + 256)
    with pytest.raises(InputError, match="contiguous"):
        _select(lib, 64, 256, 64, R, res=1 << 43, res_stride=(1, 64, 0))
    assert _select(lib, 64, 256, 64, R, res=1 << 40) in ("res", "res_ws")  # residual is c: in place


# --- fp8 output with a scale per row and 128 columns (fp8_groups) ------------------------------------
def test_fp8_groups_field_limits_and_arguments():
    v = _v(ab="bf16", c="e4m3", tile=(128, 256, 64), silu_mul=True, fp8_groups=True)
    assert v.can_implement() is None and v.name.endswith("_oe4m3_ak_bk_t128x256x64_c1x1_coop_rm_sw1_sk1_silumul_q128")
    args = {a.name: a for a in v.signature().args}
    assert list(args) == ["a", "b", "c", "scale_out", "max_clusters"]
    assert args["scale_out"].shape == ("M", "NG") and args["scale_out"].stride == (1, "sSOg")
    assert args["scale_out"].align == 16 and dict(v.signature().divisibility)["sSOg"] == 4
    assert v.describe()["epilogue"] == ["silu_mul", "fp8_groups"] and v.describe()["fp8_group"] == 128
    assert _v(ab="bf16", c="e4m3", tile=(128, 128, 64), fp8_groups=True).can_implement() is None
    for kw, msg in ((dict(c="bf16", tile=(128, 128, 64), fp8_groups=True), "e4m3"),
                    (dict(c="e4m3", tile=(128, 128, 64)), "e4m3 only with fp8_groups"),
                    (dict(c="e4m3", tile=(128, 256, 64), cluster=(2, 1), fp8_groups=True), "128 columns"),
                    (dict(c="e4m3", tile=(128, 128, 64), silu_mul=True, fp8_groups=True), "128 columns"),
                    (dict(c="e4m3", tile=(128, 128, 64), residual=True, fp8_groups=True), "no bias or residual"),
                    (dict(c="e4m3", tile=(64, 128, 64), schedule="ws", swap_ab=True, fp8_groups=True), "unswapped"),
                    (dict(c="bf16", tile=(128, 256, 64), silu_mul=True, residual=True), "without residual")):
        assert msg in (_v(**kw).can_implement() or ""), (kw, _v(**kw).can_implement())
    default = [w for w in enumerate_sm90(get_target("sm_90a"), "default") if w.fp8_groups]
    assert [w.name for w in default] == [v.name.replace("_sk1_", "_sk1_pdl_")]


def test_fp8_groups_selection_and_refusals():
    q = GemmSm90(target="sm_90a", ab="bf16", c="e4m3", tile=(128, 256, 64), silu_mul=True, fp8_groups=True, pdl=True)
    d = q.describe()
    d["name"] = q.name
    d["signature"] = {"args": [sl._tensor(n, 3) for n in "abc"] + [sl._tensor("scale_out", 2), sl._scalar("max_clusters")],
                      "divisibility": {}}
    d["dtypes"] = {"a": "bf16", "b": "bf16", "c": "e4m3", "acc": "f32"}
    lib = sl.Lib([_entry("plain", (128, 128, 64)), d])
    SQ = ep.FLAGS["silu_mul"] | ep.FLAGS["fp8_groups"]

    def sel(M, n_out, K, flags=SQ, so=1 << 44, so_stride=None, c="e4m3", c_ptr=1 << 40, res=0):
        N = ep.gate_up_rows(n_out) if flags & ep.FLAGS["silu_mul"] else n_out
        p = rs.Selector.gemm_problem((1 << 41, (M, K, 1), (K, 1, 0)), (1 << 42, (N, K, 1), (K, 1, 0)),
                                     (c_ptr, (M, n_out, 1), (n_out, 1, 0)), "bf16", c, [], False)
        stride = so_stride if so_stride is not None else -(-M // 4) * 4
        return lib.sel.select_epilogue(p, None, flags, n_out, 0, res, (n_out, 1, 0), so, stride).name.decode()

    assert sel(4096, 14336, 4096) == q.name and sel(1, 14336, 4096) == q.name and sel(3, 100, 64) == q.name
    with pytest.raises(InputError, match="scale_out pointer"):
        sel(64, 14336, 4096, so=0)
    with pytest.raises(InputError, match="group stride"):
        sel(64, 14336, 4096, so_stride=62)
    with pytest.raises(InputError, match="16-byte"):
        sel(64, 14336, 4096, so=(1 << 44) + 4)
    with pytest.raises(InputError, match="float8_e4m3fn"):
        sel(64, 14336, 4096, c="bf16")
    with pytest.raises(InputError, match="no bias or residual"):
        sel(64, 4096, 4096, flags=ep.FLAGS["fp8_groups"] | ep.FLAGS["residual"], res=1 << 43)
    with pytest.raises(InputError, match="overlaps"):  # scale_out inside c
        sel(64, 14336, 4096, so=(1 << 40) + 4096)
    with pytest.raises(InputError, match="epilogues write"):  # e4m3 without fp8_groups
        sel(64, 14336, 4096, flags=ep.FLAGS["silu_mul"])


def test_fp8_groups_scale_layout_and_checks():
    a = torch.empty(5, 64, dtype=torch.bfloat16)
    s = ep.new_scale_out(a, 5, 300)
    # (M, ceil(n/128)) float32, M-major with the group stride M rounded up to 4: block scale_a's form.
    assert s.shape == (5, 3) and s.stride() == (1, 8) and s.dtype == torch.float32
    assert ep.fp8_out(None, torch.float8_e4m3fn) and ep.fp8_out(torch.empty(1, dtype=torch.float8_e4m3fn), None)
    assert not ep.fp8_out(None, torch.bfloat16)
    with pytest.raises(InputError, match="no bias or residual"):
        ep.flags_of(None, torch.empty(1), None, quant=True)
    for bad, msg in ((torch.empty(5, 2), "shape"), (torch.empty(5, 3, dtype=torch.float16), "float32"),
                     (torch.empty(5, 3), "M-major"), (torch.empty(3, 6).t()[:5], "group stride")):
        with pytest.raises(InputError, match=msg):
            ep.check_scale_out(bad, 5, 300, -1)


# --- the e4m3 output through a simulated bundle (the test tier's fp8_groups variant) ---------------
@pytest.fixture
def sim(test_bundle):
    from conftest import Recorder
    from factory.runtime import Bundle

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "NVIDIA H100 80GB HBM3", "sm_count": 132})
    if not any("fp8_groups" in (v.get("epilogue") or []) for v in b.candidates("gemm")):
        pytest.skip("the test bundle has no fp8_groups variant")
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def test_fp8_groups_call_path(sim):
    """bundle.gemm(out_dtype=float8_e4m3fn): (out, scale_out) in the block-scaled scale_a layout,
    the e4m3 variant launched; a given out and scale_out are written in place; bad calls refused
    before any launch; K = 0 launches nothing (zero codes, the smallest scale); the torch op's fake
    returns the same metadata."""
    bf = dict(dtype=torch.bfloat16)
    a, b = torch.randn(37, 64, **bf), torch.randn(272, 64, **bf)
    out, s = sim.gemm(a, b, out_dtype=torch.float8_e4m3fn)
    assert out.shape == (37, 272) and out.dtype == torch.float8_e4m3fn
    assert s.shape == (37, 3) and s.stride() == (1, 40) and s.dtype == torch.float32
    assert sim.rec.launched[-1].endswith("_q128")
    n = len(sim.rec.launched)
    o2, s2 = torch.empty(37, 272, dtype=torch.float8_e4m3fn), ep.new_scale_out(a, 37, 272)
    got = sim.gemm(a, b, o2, scale_out=s2)
    assert got[0] is o2 and got[1] is s2 and len(sim.rec.launched) == n + 1
    for kw, err in ((dict(out_dtype=torch.float8_e4m3fn, residual=torch.randn(37, 272, **bf)), InputError),
                    (dict(out_dtype=torch.float8_e4m3fn, scale_out=torch.empty(37, 3)), InputError),
                    (dict(scale_out=ep.new_scale_out(a, 37, 272)), InputError),
                    (dict(out_dtype=torch.float8_e4m3fn, activation="silu_mul"), (InputError, NoVariantError))):
        with pytest.raises(err):
            sim.gemm(a, b, **kw)
    with pytest.raises(InputError, match="multiple of 16"):
        sim.gemm(a, torch.randn(264, 64, **bf), out_dtype=torch.float8_e4m3fn)
    assert len(sim.rec.launched) == n + 1
    z, sz = sim.gemm(torch.randn(5, 0, **bf), torch.randn(128, 0, **bf), out_dtype=torch.float8_e4m3fn)
    assert len(sim.rec.launched) == n + 1 and not z.float().any() and bool((sz == ep.FP8_MIN_SCALE).all())
    fo, fs = ep.check_meta(sim, a, b, out_dtype=torch.float8_e4m3fn)
    assert fo.shape == (37, 272) and fo.dtype == torch.float8_e4m3fn and fs.shape == (37, 3) and fs.stride() == (1, 40)


def test_fp8_rows_call_path(sim):
    """bundle.fp8_rows (group codes -> one scale per row) and gemm(..., row_scales=True) (the
    e4m3 group epilogue, then fp8_rows in place): outputs, launches in order, in place, every
    refusal before any launch, K = 0 and the fakes' metadata."""
    from factory.runtime import fused

    e4, bf = torch.float8_e4m3fn, dict(dtype=torch.bfloat16)
    codes, gs = torch.zeros(37, 272, dtype=e4), ep.new_scale_out(torch.empty(1), 37, 272)
    out, s = sim.fp8_rows(codes, gs)
    assert out.shape == (37, 272) and out.dtype == e4 and out is not codes
    assert s.shape == (37, 1) and s.dtype == torch.float32 and sim.rec.launched[-1] == "fp8_rows_sm90_e4m3_t128_c8"
    assert sim.fp8_rows(codes, gs, out=codes)[0] is codes
    n = len(sim.rec.launched)
    wide, buf = torch.zeros(37, 280, dtype=e4), torch.zeros(38 * 272, dtype=e4)
    c2, o2 = buf[:37 * 272].view(37, 272), buf[16:16 + 37 * 272].view(37, 272)
    for call, msg in (
            (lambda: sim.fp8_rows(codes.view(torch.uint8), gs), "float8_e4m3fn"),
            (lambda: sim.fp8_rows(codes[:, :264], gs), "multiple of 16"),
            (lambda: sim.fp8_rows(codes, gs[:, :2]), "group_scale must be"),
            (lambda: sim.fp8_rows(codes, gs.contiguous()), "M-major"),
            (lambda: sim.fp8_rows(codes, gs, out=wide[:, :256]), "out must be"),
            (lambda: sim.fp8_rows(wide[:, :272], gs), "row stride"),
            (lambda: sim.fp8_rows(c2, gs, out=o2), "overlap"),
            (lambda: sim.fp8_rows(codes, "gs"), "torch.Tensor")):
        with pytest.raises(InputError, match=msg):
            call()
    assert len(sim.rec.launched) == n
    a, b = torch.randn(37, 64, **bf), torch.randn(272, 64, **bf)
    q, rs_ = sim.gemm(a, b, out_dtype=e4, row_scales=True)
    assert q.shape == (37, 272) and q.dtype == e4 and rs_.shape == (37, 1) and rs_.dtype == torch.float32
    assert sim.rec.launched[-2].endswith("_q128") and sim.rec.launched[-1] == "fp8_rows_sm90_e4m3_t128_c8"
    n = len(sim.rec.launched)
    for kw, msg in ((dict(row_scales=True), "e4m3 output"), (dict(out_dtype=e4, row_scales=1), "bool"),
                    (dict(out_dtype=e4, row_scales=True, scale_out=ep.new_scale_out(a, 37, 272)), "no scale_out")):
        with pytest.raises(InputError, match=msg):
            sim.gemm(a, b, **kw)
    assert len(sim.rec.launched) == n
    z, sz = sim.gemm(torch.randn(5, 0, **bf), torch.randn(128, 0, **bf), out_dtype=e4, row_scales=True)
    assert len(sim.rec.launched) == n and sz.shape == (5, 1) and bool((sz == ep.FP8_MIN_SCALE).all())
    fo, fs = ep.check_meta(sim, a, b, out_dtype=e4, row_scales=True)
    assert fo.shape == (37, 272) and fo.dtype == e4 and fs.shape == (37, 1)
    fo, fs = fused._fake_fp8_rows(sim, codes, gs)
    assert fo.shape == (37, 272) and fo.dtype == e4 and fs.shape == (37, 1)


def test_fp8_rows_torch_ops(sim):
    """The fp8_rows and gemm_fp8_rows torch ops: autograd registration and fake vs real
    (torch.library.opcheck on the simulated bundle), and a compiled call's refusal at trace time."""
    kf = sim.torch_ops()
    checks = ("test_autograd_registration", "test_faketensor")
    codes = torch.randn(37, 272).to(torch.float8_e4m3fn)
    torch.library.opcheck(kf.fp8_rows, (codes, ep.new_scale_out(torch.empty(1), 37, 272).fill_(1.0)),
                          test_utils=checks)
    a, b = torch.randn(37, 64, dtype=torch.bfloat16), torch.randn(272, 64, dtype=torch.bfloat16)
    torch.library.opcheck(kf.gemm_fp8_rows, (a, b), test_utils=checks)
    with pytest.raises(Exception, match="multiple of 16"):
        torch.compile(lambda x, y: sim.gemm(x, y, out_dtype=torch.float8_e4m3fn, row_scales=True),
                      fullgraph=True, backend="eager")(a, torch.randn(264, 64, dtype=torch.bfloat16))
