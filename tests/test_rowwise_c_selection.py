"""The C entries of the row-wise ops (fx_rms_norm[_select], fx_fp8_rows[_select],
fx_rope_kvcache[_select] of the host library, csrc/fx_select.c) on the test bundle: the same variant as the Python rule for every device
generation, dtype, switch set and row length; bad problems refused (FX_ERR_INPUT naming the field,
the selection zeroed) before anything could launch."""

from __future__ import annotations

import ctypes
import json

import pytest

from factory.runtime import NoVariantError
from factory.runtime import fused
from factory.runtime import selector as rs

FX_ERR_INPUT, FX_ERR_NO_VARIANT = -1, -2


@pytest.fixture(scope="module")
def lib(test_bundle):
    m = json.loads((test_bundle / "manifest.json").read_text())
    lib = ctypes.CDLL(str(test_bundle / m["host_library"]["path"]))
    if not hasattr(lib, "fx_rms_norm_select"):
        pytest.skip("the host library has no fx_rms_norm_select")
    lib.fx_last_error_message.restype = ctypes.c_char_p
    for fn in (lib.fx_rms_norm_select, lib.fx_rms_norm, lib.fx_fp8_rows_select, lib.fx_fp8_rows,
               lib.fx_rope_kvcache_select, lib.fx_rope_kvcache):
        fn.restype = ctypes.c_int32
    return lib, m


def device(cc, sms=132):
    return rs.Device(cc[0], cc[1], sms, b"test device")


def problem(dt="bf16", m=4, n=4096, res=False, quant=False, **kw):
    p = rs.RmsNormProblem(dtype=rs.DTYPE[dt], m=m, n=n, x_stride=n, residual_add=int(res), residual_stride=n,
                          quantize=int(quant), y_stride=n, eps=1e-6)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def select(lib, dev, p):
    sel = rs.Selection()
    rc = lib.fx_rms_norm_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    return rc, sel, (lib.fx_last_error_message() or b"").decode()


def python_rule(b, dt, n, res, quant):
    """fused._pick's rule: the fitting entries of the best target (bundle.candidates' order), the
    least max_n, then the first name."""
    fits = [e for e in b.candidates("rms_norm")
            if e["dtype"] == dt and e["residual"] == res and e["quant"] == quant and e["max_n"] >= n]
    if not fits:
        return None
    return min((e for e in fits if e["target"] == fits[0]["target"]), key=lambda e: (e["max_n"], e["name"]))["name"]


def opened(test_bundle, cc):
    from factory.runtime import Bundle

    return Bundle.open(test_bundle, capability=cc, device={"name": "planned", "sm_count": 132})


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_c_selection_equals_python(lib, test_bundle, cc):
    lib, m = lib
    dev = device(cc)
    b = opened(test_bundle, cc)
    seen = 0
    for dt in ("bf16", "f16"):
        for n in (8, 2048, 4096, 8200, 16384, 16392):
            for res in (False, True):
                for quant in (False, True):
                    want = python_rule(b, dt, n, res, quant)
                    rc, sel, msg = select(lib, dev, problem(dt, 4, n, res, quant))
                    got = sel.name.decode() if rc == 0 else None
                    assert got == want, (cc, dt, n, res, quant, rc, msg)
                    assert rc in (0, FX_ERR_NO_VARIANT), msg
                    seen += rc == 0
    if cc == (9, 0):
        assert seen > 0  # the test tier has sm_90 rms_norm variants


def test_the_runtime_asks_c(test_bundle):
    b = opened(test_bundle, (9, 0))
    if b.selector._fns.get("rms_norm") is None or not b.candidates("rms_norm"):
        pytest.skip("no C rms_norm selection or no rms_norm variant")
    e = b.candidates("rms_norm")[0]
    assert fused.rms_norm_choose(b, e["dtype"], 4096, e["residual"], e["quant"]) == python_rule(
        b, e["dtype"], 4096, e["residual"], e["quant"])
    with pytest.raises(NoVariantError, match="no rms_norm variant for bf16 rows of 16392"):
        fused.rms_norm_choose(b, "bf16", 16392, False, False)


BAD = [
    (dict(dtype=3), "x must be bf16 or f16"),
    (dict(m=-1), "m must not be negative"),
    (dict(n=4100), "must be a positive multiple of 8"),
    (dict(n=0), "must be a positive multiple of 8"),
    (dict(eps=float("nan")), "eps must be a finite number >= 0"),
    (dict(eps=-1.0), "eps must be a finite number >= 0"),
    (dict(residual_add=2), "residual_add must be 0 or 1"),
    (dict(quantize=-1), "quantize must be 0 or 1"),
    (dict(x_stride=4088), "x_stride 4088: rows of 4096 elements must not overlap"),
    (dict(y_stride=0), "y_stride 0"),
    (dict(x=0x100000, y=0x100000 + 4096), "y overlaps x in memory"),
    (dict(weight=0x200000, y=0x200000), "y overlaps weight in memory"),
    (dict(x=0x10008), "x data pointer is not 16-byte aligned"),
    (dict(x_stride=4100), "x stride 4100 (mode 0) must be a multiple of 8"),
]


@pytest.mark.parametrize("change,msg", BAD, ids=[m for _, m in BAD])
def test_bad_problems_are_refused(lib, change, msg):
    lib, _ = lib
    rc, sel, got = select(lib, device((9, 0)), problem(res=True, quant=True, **change))
    assert rc == FX_ERR_INPUT and msg in got and sel.variant == -1, (rc, got)


def test_residual_and_scale_must_not_alias(lib):
    lib, _ = lib
    p = problem(res=True, quant=True, x=0x100000, residual=0x100000 + 8, scale=0x900000, y=0xA00000)
    rc, _, msg = select(lib, device((9, 0)), p)
    assert rc == FX_ERR_INPUT and "residual overlaps x" in msg
    p = problem(res=True, quant=True, x=0x100000, residual=0x800000, scale=0x800000 + 64, y=0xA00000)
    rc, _, msg = select(lib, device((9, 0)), p)
    assert rc == FX_ERR_INPUT and "overlaps" in msg and "scale" in msg


def test_launch_needs_the_pointers(lib):
    lib, _ = lib
    sel = rs.Selection()
    rc = lib.fx_rms_norm(ctypes.byref(device((9, 0))), ctypes.byref(problem(res=True, quant=True)), None,
                         ctypes.byref(sel))
    assert rc == FX_ERR_INPUT and b"needs the x, weight, y" in lib.fx_last_error_message() and sel.variant == -1
    rc, sel, _ = select(lib, device((9, 0)), problem(m=0, res=True, quant=True))
    assert rc == 0 and sel.variant == -1  # empty: nothing to launch


# --- fp8_rows ---------------------------------------------------------------------------------------
def f8_problem(m=4, n=4096, **kw):
    p = rs.Fp8RowsProblem(m=m, n=n, codes_stride=n, group_scale_stride=max(m, 1), out_stride=n)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def f8_select(lib, dev, p):
    sel = rs.Selection()
    rc = lib.fx_fp8_rows_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    return rc, sel, (lib.fx_last_error_message() or b"").decode()


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (9, 0), (10, 0)])
def test_fp8_rows_c_selection_equals_python(lib, test_bundle, cc):
    lib, _ = lib
    b = opened(test_bundle, cc)
    for n in (16, 4096, 14336, 16384, 16400):
        fits = [e for e in b.candidates("fp8_rows") if e["max_n"] >= n]
        want = min((e for e in fits if e["target"] == fits[0]["target"]),
                   key=lambda e: (e["max_n"], e["name"]))["name"] if fits else None
        rc, sel, msg = f8_select(lib, device(cc), f8_problem(3, n))
        assert (sel.name.decode() if rc == 0 else None) == want, (cc, n, rc, msg)
        assert rc in (0, FX_ERR_NO_VARIANT), msg
        if want is not None:
            assert fused.fp8_rows_choose(b, n) == want


F8_BAD = [
    (dict(m=-2), "m must not be negative"),
    (dict(n=4104), "a positive multiple of 16"),
    (dict(codes_stride=4080), "row stride >= 4096 and a multiple of 16"),
    (dict(out_stride=4104), "row stride >= 4096 and a multiple of 16"),
    (dict(group_scale_stride=2), "group_scale must be M-major"),
    (dict(codes=0x100000, out=0x100000 + 64), "out overlaps codes in memory"),
    (dict(codes=0x100000, scale=0x100000), "scale overlaps codes in memory"),
    (dict(codes=0x100008), "codes data pointer is not 16-byte aligned"),
]


@pytest.mark.parametrize("change,msg", F8_BAD, ids=[m for _, m in F8_BAD])
def test_fp8_rows_bad_problems_are_refused(lib, change, msg):
    lib, _ = lib
    if not opened_has(lib):
        pytest.skip("no fp8_rows variant for sm_90 in the test bundle")
    rc, sel, got = f8_select(lib, device((9, 0)), f8_problem(**change))
    assert rc == FX_ERR_INPUT and msg in got and sel.variant == -1, (rc, got)


def opened_has(lib) -> bool:
    return f8_select(lib, device((9, 0)), f8_problem())[0] == 0


def test_fp8_rows_in_place_and_pointers(lib):
    lib, _ = lib
    if not opened_has(lib):
        pytest.skip("no fp8_rows variant for sm_90 in the test bundle")
    rc, _, msg = f8_select(lib, device((9, 0)), f8_problem(codes=0x100000, out=0x100000, scale=0x900000,
                                                           group_scale=0xA00000))
    assert rc == 0, msg  # out = codes: in place
    sel = rs.Selection()
    rc = lib.fx_fp8_rows(ctypes.byref(device((9, 0))), ctypes.byref(f8_problem()), None, ctypes.byref(sel))
    assert rc == FX_ERR_INPUT and b"needs the codes, group_scale, out and scale" in lib.fx_last_error_message()


# --- rope_kvcache -----------------------------------------------------------------------------------
def rope_problem(dt="bf16", cache=None, neox=True, table=False, T=6, hq=8, hkv=2, d=128, r=128, **kw):
    p = rs.RopeKVCacheProblem(dtype=rs.DTYPE[dt], cache_dtype=rs.DTYPE[cache or dt], neox=int(neox), table=int(table),
                              tokens=T, heads_q=hq, heads_kv=hkv, head_dim=d, rotary_dim=r, max_position=4096,
                              num_pages=10, page_size=16, batch=2 if table else 0, max_pages=4 if table else 0,
                              block_table_stride=4, cos_sin_stride=r)
    p.q_stride[:] = [hq * d, d]
    p.k_stride[:] = p.v_stride[:] = [hkv * d, d]
    p.k_cache_stride[:] = p.v_cache_stride[:] = [16 * hkv * d, hkv * d, d]
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(p, k)[:] = v
        else:
            setattr(p, k, v)
    return p


def rope_select(lib, dev, p):
    sel = rs.Selection()
    rc = lib.fx_rope_kvcache_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    return rc, sel, (lib.fx_last_error_message() or b"").decode()


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_rope_c_selection_equals_python(lib, test_bundle, cc):
    lib, _ = lib
    b = opened(test_bundle, cc)
    for dt in ("bf16", "f16"):
        for neox in (True, False):
            for table in (False, True):
                for fp8 in (False, True):
                    cache = "e4m3" if fp8 else dt
                    fits = [e for e in b.candidates("rope_kvcache") if e["dtype"] == dt and e["neox"] == neox
                            and e.get("table", False) == table and e.get("cache_dtype", e["dtype"]) == cache]
                    want = min((e for e in fits if e["target"] == fits[0]["target"]),
                               key=lambda e: (e.get("max_n", 0), e["name"]))["name"] if fits else None
                    rc, sel, msg = rope_select(lib, device(cc), rope_problem(dt, cache, neox, table))
                    assert (sel.name.decode() if rc == 0 else None) == want, (cc, dt, neox, table, fp8, msg)
                    assert rc in (0, FX_ERR_NO_VARIANT), msg
                    if want is not None:
                        assert fused.rope_kvcache_choose(b, dt, neox, table, fp8) == want


ROPE_BAD = [
    (dict(dtype=3), "q must be bf16 or f16"),
    (dict(cache_dtype=3), "k_cache / v_cache must be bf16"),
    (dict(neox=2), "neox must be 0 or 1"),
    (dict(rotary_dim=40), "rotary_dim 40 must be a positive multiple of 16"),
    (dict(rotary_dim=256), "at most head_dim 128"),
    (dict(head_dim=100, rotary_dim=64), "head_dim 100 must be a positive multiple of 8"),
    (dict(max_position=0), "cos_sin_cache has no positions"),
    (dict(tokens=-1), "tokens must not be negative"),
    (dict(table=1, batch=4, tokens=6), "batch >= 1 dividing tokens"),
    (dict(table=1, max_pages=0), "block_table has no columns"),
    (dict(k_cache_stride=[16 * 256, 256, 0]), "k_cache: stride 0 of mode 2 makes elements overlap"),
    (dict(q_stride=[128, 128]), "q: stride 128 of mode 1 makes elements overlap"),
    (dict(q=0x100000, k_cache=0x100000 + 4096), "k_cache overlaps q in memory"),
    (dict(k_cache=0x4000000, v_cache=0x4000000 + 1024), "overlaps"),
    (dict(q=0x100008), "q data pointer is not 16-byte aligned"),
    (dict(cos_sin_stride=130), "must be a multiple of 4"),
]


@pytest.mark.parametrize("change,msg", ROPE_BAD, ids=[m for _, m in ROPE_BAD])
def test_rope_bad_problems_are_refused(lib, change, msg):
    lib, _ = lib
    table = bool(change.get("table"))
    kw = {k: v for k, v in change.items() if k != "table"}
    rc, sel, got = rope_select(lib, device((9, 0)), rope_problem(table=table, **kw))
    if rc == FX_ERR_NO_VARIANT:
        pytest.skip(got)
    assert rc == FX_ERR_INPUT and msg in got and sel.variant == -1, (rc, got)


def test_rope_q_of_zero_heads_and_pointers(lib):
    lib, _ = lib
    rc, sel, msg = rope_select(lib, device((9, 0)), rope_problem(hq=0))
    assert rc == 0 and sel.variant >= 0, msg  # k only (the attention prologue rotates q)
    sel = rs.Selection()
    rc = lib.fx_rope_kvcache(ctypes.byref(device((9, 0))), ctypes.byref(rope_problem()), None, ctypes.byref(sel))
    assert rc == FX_ERR_INPUT and b"needs the q, k, v, positions, slot_mapping" in lib.fx_last_error_message()
    full = dict(k=0x100000, v=0x200000, positions=0x300000, slot_mapping=0x400000, cos_sin_cache=0x500000,
                k_cache=0x1000000, v_cache=0x2000000)
    lib.fx_rope_kvcache(ctypes.byref(device((9, 0))), ctypes.byref(rope_problem(hq=0, **full)), None, None)
    assert b"needs the" not in lib.fx_last_error_message()  # q may be NULL with no q heads
