"""fx_rms_norm, fx_fp8_rows and fx_rope_kvcache (the host library's C entries) on a GPU: the output
bits of ``bundle.rms_norm`` for the plain, residual and residual + e4m3 forms (the residual updated
in place alike), of ``bundle.fp8_rows`` (out of place and in place) and of ``bundle.rope_kvcache``
(q and k rotated, caches written; q of zero heads; -1 slots), and a host pointer refused
(FX_ERR_INPUT, nothing launched) in a subprocess that then still computes.  Skips without a GPU,
without the ops' variants in ``$FACTORY_BUNDLE`` or without the entries in its host library."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def setup():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not b.candidates("rms_norm"):
        pytest.skip(f"{BUNDLE} has no rms_norm variant for this device")
    path = BUNDLE / json.loads((BUNDLE / "manifest.json").read_text())["host_library"]["path"]
    lib = b.selector.lib  # the library the bundle loaded (one copy per process)
    if not hasattr(lib, "fx_rms_norm"):
        pytest.skip("the host library predates fx_rms_norm")
    lib.fx_rms_norm.restype = ctypes.c_int32
    return b, lib, path


def c_problem(x, w, y, residual=None, scale=None, eps=1e-5):
    from factory.runtime import selector as rs

    m, n = x.shape
    return rs.RmsNormProblem(dtype=rs.DTYPE["bf16"], m=m, n=n, x=x.data_ptr(), x_stride=x.stride(0),
                             weight=w.data_ptr(), residual_add=int(residual is not None),
                             residual=0 if residual is None else residual.data_ptr(),
                             residual_stride=n if residual is None else residual.stride(0),
                             quantize=int(scale is not None), y=y.data_ptr(), y_stride=y.stride(0),
                             scale=0 if scale is None else scale.data_ptr(), eps=eps)


@pytest.mark.parametrize("form", ["plain", "residual", "residual+fp8"])
def test_fx_rms_norm_matches_the_python_op(setup, form):
    from factory.runtime import selector as rs

    b, lib, _ = setup
    res, quant = form != "plain", form.endswith("fp8")
    if not any(e["dtype"] == "bf16" and e["residual"] == res and e["quant"] == quant for e in b.candidates("rms_norm")):
        pytest.skip(f"no bf16 {form} rms_norm variant")
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(37, 4096, device="cuda", generator=g).bfloat16()
    w = torch.randn(4096, device="cuda", generator=g).bfloat16()
    r0 = torch.randn(37, 4096, device="cuda", generator=g).bfloat16() if res else None
    # Python
    r1 = r0.clone() if res else None
    want = b.rms_norm(x, w, 1e-5, residual=r1, quantize=FP8 if quant else None)
    # C
    r2 = r0.clone() if res else None
    y = torch.full((37, 4096), float("nan"), device="cuda").to(FP8 if quant else torch.bfloat16)
    sc = torch.full((37,), float("nan"), device="cuda") if quant else None
    dev = rs.Device(*torch.cuda.get_device_capability(), torch.cuda.get_device_properties(0).multi_processor_count,
                    torch.cuda.get_device_name().encode()[:255])
    sel = rs.Selection()
    rc = lib.fx_rms_norm(ctypes.byref(dev), ctypes.byref(c_problem(x, w, y, r2, sc)),
                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    torch.cuda.synchronize()
    assert rc == 0, lib.fx_last_error_message()
    if quant:
        q, s = want
        assert torch.equal(y.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sc, s.view(-1))
    else:
        assert torch.equal(y, want)
    if res:
        assert torch.equal(r1, r2) and not torch.equal(r2, r0)


def _device():
    from factory.runtime import selector as rs

    return rs.Device(*torch.cuda.get_device_capability(), torch.cuda.get_device_properties(0).multi_processor_count,
                     torch.cuda.get_device_name().encode()[:255])


@pytest.mark.parametrize("in_place", [False, True])
def test_fx_fp8_rows_matches_the_python_op(setup, in_place):
    from factory.runtime import selector as rs

    b, lib, _ = setup
    if not b.candidates("fp8_rows") or not hasattr(lib, "fx_fp8_rows"):
        pytest.skip("no fp8_rows variant or no fx_fp8_rows")
    lib.fx_fp8_rows.restype = ctypes.c_int32
    g = torch.Generator(device="cuda").manual_seed(9)
    m, n = 37, 14336
    codes = (torch.randn(m, n, device="cuda", generator=g) * 100).to(FP8)
    gsc = (torch.rand(n // 128, m, device="cuda", generator=g) * 2.0 ** torch.randint(
        -6, 6, (n // 128, m), device="cuda", generator=g)).t()  # M-major (m, n/128), scales over 2^12
    want_q, want_s = b.fp8_rows(codes, gsc)
    src = codes.clone()
    out = src if in_place else torch.full((m, n), float("nan"), device="cuda").to(FP8)
    sc = torch.full((m,), float("nan"), device="cuda")
    p = rs.Fp8RowsProblem(m=m, n=n, codes=src.data_ptr(), codes_stride=n, group_scale=gsc.data_ptr(),
                          group_scale_stride=gsc.stride(1), out=out.data_ptr(), out_stride=n, scale=sc.data_ptr())
    rc = lib.fx_fp8_rows(ctypes.byref(_device()), ctypes.byref(p),
                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), None)
    torch.cuda.synchronize()
    assert rc == 0, lib.fx_last_error_message()
    assert torch.equal(out.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sc, want_s.view(-1))


@pytest.mark.parametrize("q_heads", [8, 0])
def test_fx_rope_kvcache_matches_the_python_op(setup, q_heads):
    from factory.runtime import selector as rs

    b, lib, _ = setup
    if not any(e["neox"] and not e.get("table") and e.get("cache_dtype", e["dtype"]) == "bf16"
               for e in b.candidates("rope_kvcache")) or not hasattr(lib, "fx_rope_kvcache"):
        pytest.skip("no bf16 neox rope_kvcache variant or no fx_rope_kvcache")
    lib.fx_rope_kvcache.restype = ctypes.c_int32
    g = torch.Generator(device="cuda").manual_seed(11)
    T, hkv, d, P, PS = 13, 2, 128, 6, 16
    qkv = torch.randn(T, (8 + 2 * hkv) * d, device="cuda", generator=g).bfloat16()
    cs = torch.randn(500, 128, device="cuda", generator=g)
    pos = torch.randint(0, 600, (T,), device="cuda", generator=g)  # some past the table
    slots = torch.randperm(P * PS, device="cuda", generator=g)[:T].clone()
    slots[3] = -1
    caches = [torch.full((P, PS, hkv, d), float("nan"), device="cuda").bfloat16() for _ in range(4)]
    qkv2 = qkv.clone()
    outs = []
    for x, (kc, vc), use_c in ((qkv, caches[:2], False), (qkv2, caches[2:], True)):
        q = x[:, : 8 * d].view(T, 8, d)[:, :q_heads]
        k = x[:, 8 * d: (8 + hkv) * d].view(T, hkv, d)
        v = x[:, (8 + hkv) * d:].view(T, hkv, d)
        if not use_c:
            b.rope_kvcache(q, k, v, pos, cs, kc, vc, slots)
        else:
            p = rs.RopeKVCacheProblem(dtype=1, cache_dtype=1, neox=1, table=0, tokens=T, heads_q=q_heads, heads_kv=hkv,
                                      head_dim=d, rotary_dim=128, max_position=500, num_pages=P, page_size=PS,
                                      q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), positions=pos.data_ptr(),
                                      slot_mapping=slots.data_ptr(), cos_sin_cache=cs.data_ptr(), cos_sin_stride=128,
                                      k_cache=kc.data_ptr(), v_cache=vc.data_ptr())
            p.q_stride[:] = [x.stride(0), d]
            p.k_stride[:] = p.v_stride[:] = [x.stride(0), d]
            p.k_cache_stride[:] = list(kc.stride()[:3])
            p.v_cache_stride[:] = list(vc.stride()[:3])
            rc = lib.fx_rope_kvcache(ctypes.byref(_device()), ctypes.byref(p),
                                     ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), None)
            torch.cuda.synchronize()
            assert rc == 0, lib.fx_last_error_message()
        outs.append((x, kc, vc))
    (x1, k1, v1), (x2, k2, v2) = outs
    i16 = torch.int16
    assert torch.equal(x1, x2) and torch.equal(k1.view(i16), k2.view(i16)) and torch.equal(v1.view(i16), v2.view(i16))


_CHILD = textwrap.dedent("""
    import ctypes, sys
    import torch
    from factory.runtime import selector as rs
    lib = ctypes.CDLL(sys.argv[1])
    lib.fx_last_error_message.restype = ctypes.c_char_p
    x = torch.randn(4, 4096).bfloat16()  # host memory
    w = torch.randn(4096, device="cuda").bfloat16()
    y = torch.empty(4, 4096, device="cuda").bfloat16()
    dev = rs.Device(*torch.cuda.get_device_capability(), torch.cuda.get_device_properties(0).multi_processor_count,
                    torch.cuda.get_device_name().encode()[:255])
    def call(xx):
        p = rs.RmsNormProblem(dtype=1, m=4, n=4096, x=xx.data_ptr(), x_stride=4096, weight=w.data_ptr(),
                              residual_stride=4096, y=y.data_ptr(), y_stride=4096, eps=1e-5)
        return lib.fx_rms_norm(ctypes.byref(dev), ctypes.byref(p), None, None)
    rc = call(x)
    print("host", rc, lib.fx_last_error_message().decode())
    rc2 = call(x.cuda())
    torch.cuda.synchronize()
    print("device", rc2, bool(torch.isfinite(y.float()).all()))
""")


def test_fx_rms_norm_refuses_a_host_pointer_in_a_subprocess(setup):
    _, _, path = setup
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    host, device = r.stdout.strip().splitlines()[-2:]
    assert host.startswith("host -1 x (0x") and host.endswith("is not device memory"), host
    assert device == "device 0 True", r.stdout
