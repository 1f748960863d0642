"""fx_gemm / fx_attention on the GPU: the C++ example built and run against $FACTORY_BUNDLE, and the
C API through ctypes on torch tensors, against the Python loader (same variant, same output) and
a float reference.  The bundle must have been built (or relinked: python -m factory link) with
the C selection."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
import torch

import c_selection as cs
from conftest import GPU_BUNDLE, ROOT, gpu_marks
from factory.runtime import Bundle
from factory.runtime import attention as rt_attention
from factory.runtime import gemm as rt_gemm
from factory.testing import TOLERANCE, attention_reference, judge_attention

pytestmark = gpu_marks()


@pytest.fixture(scope="module")
def lib() -> cs.CLib:
    path = GPU_BUNDLE / "lib" / "libfactory_bundle.so"
    c = cs.CLib(path)
    if not hasattr(c.lib, "fx_gemm"):
        pytest.skip(f"{path} predates the C selection: relink it (python -m factory link {GPU_BUNDLE})")
    return c


@pytest.fixture(scope="module")
def bundle():
    return Bundle.open(GPU_BUNDLE)


# A copy of the bundle without its arch- and family-specific variants, relinked: on this GPU the
# plain target's variants then run (split-K with its workspace among them), in C and in Python
# alike.  (A capability one minor above the GPU's used to do this; such capabilities are refused.)
_PLAIN = {}


def _plain():
    """(Bundle, CLib) of that copy; skipped where the toolchain to relink is missing."""
    if "b" not in _PLAIN:
        import json
        import shutil
        import tempfile

        from conftest import HAVE_DSL
        from factory.atoms.targets import TARGETS

        if not HAVE_DSL:
            pytest.skip("relinking a plain-target copy needs the DSL's static runtime")
        from factory.compiler.link import relink

        dst = Path(tempfile.mkdtemp(prefix="plain_")) / "bundle"
        shutil.copytree(GPU_BUNDLE, dst)
        m = json.loads((dst / "manifest.json").read_text())
        m["variants"] = {n: v for n, v in m["variants"].items() if not TARGETS[v["target"]].ccs}
        (dst / "manifest.json").write_text(json.dumps(m, indent=1))
        (dst / "tuning.json").unlink(missing_ok=True)
        relink(dst)
        _PLAIN["b"] = (Bundle.open(dst), cs.CLib(dst / "lib" / "libfactory_bundle.so"))
    return _PLAIN["b"]


def cuda_home() -> Path:
    for p in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if p and (Path(p) / "include" / "cuda_runtime.h").exists() and any(
                (Path(p) / d / "libcudart_static.a").exists() for d in ("lib64", "lib")):
            return Path(p)
    from factory.compiler import toolchain  # pip's nvidia-cuda-runtime

    return toolchain.cuda_root()


def test_cpp_example_runs(lib, tmp_path):
    exe = tmp_path / "fx_example"
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples" / "cpp"), f"BUNDLE={GPU_BUNDLE}",
                    f"CUDA_HOME={cuda_home()}", f"BIN={exe}"], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(r.stdout)
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr


def _device(lib, sm_count: int | None = None) -> cs.Device:
    dev = cs.Device()
    assert lib.lib.fx_device_query(torch.cuda.current_device(), ctypes.byref(dev)) == 0
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert (dev.cc_major, dev.cc_minor, dev.sm_count, dev.name.decode()) == (p.major, p.minor, p.multi_processor_count, p.name)
    if sm_count is not None:
        dev.sm_count = sm_count
    return dev


def _fx_gemm(lib, dev, a, b, c, scales=None, b_constant=False) -> cs.Selection:
    specs = [rt_gemm.rkl_spec(t, w) for t, w in ((a, "a"), (b, "b"), (c, "c"))]
    M, K, L = specs[0][1]
    p = cs.GemmProblem(cs.DTYPE[rt_gemm.DTYPES[a.dtype]], cs.DTYPE[rt_gemm.DTYPES[c.dtype]], M, specs[1][1][0], K, L,
                       a.data_ptr(), cs.I64x3(*specs[0][2]), b.data_ptr(), cs.I64x3(*specs[1][2]),
                       c.data_ptr(), cs.I64x3(*specs[2][2]), scales[0].data_ptr() if scales else None,
                       scales[1].data_ptr() if scales else None, int(b_constant))
    sel = cs.Selection()
    rc = lib.lib.fx_gemm_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    # (every problem here has a variant in the default bundle: FX_ERR_NO_VARIANT is a selection regression)
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"
    ws = torch.empty(max(1, sel.workspace_bytes), dtype=torch.uint8, device=a.device)
    rc = lib.lib.fx_gemm(ctypes.byref(dev), ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()),
                         ctypes.c_uint64(sel.workspace_bytes), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                         ctypes.byref(sel))
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"
    torch.cuda.synchronize()
    return sel


def _rel(x, ref) -> float:
    return ((x.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


@pytest.mark.parametrize("dtype,M,N,K,L,b_constant,plain", [
    (torch.bfloat16, 4096, 4096, 512, 1, False, False), (torch.bfloat16, 4, 4096, 4096, 1, False, False),
    (torch.bfloat16, 16, 4096, 4096, 1, True, False), (torch.bfloat16, 300, 1000, 264, 2, False, False),
    (torch.float8_e4m3fn, 128, 4096, 4096, 1, False, False), (torch.float8_e4m3fn, 16, 4096, 4096, 1, True, False),
    (torch.bfloat16, 4, 4096, 4096, 1, False, True), (torch.bfloat16, 1000, 512, 1024, 1, False, True)])
def test_fx_gemm_matches_python(lib, bundle, dtype, M, N, K, L, b_constant, plain):
    if plain:
        bundle, lib = _plain()
    dev = _device(lib)
    g = torch.Generator(device="cuda").manual_seed(15)
    shape_a, shape_b = ((L, M, K), (L, N, K)) if L > 1 else ((M, K), (N, K))
    a = torch.randn(shape_a, device="cuda", generator=g).to(dtype)
    b = torch.randn(shape_b, device="cuda", generator=g).to(dtype)
    out_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    fp8 = dtype == torch.float8_e4m3fn
    scales = [torch.tensor([0.5], device="cuda"), torch.tensor([2.0], device="cuda")] if fp8 else None
    c = torch.full((*shape_a[:-1], N), float("nan"), dtype=out_dtype, device="cuda")
    sel = _fx_gemm(lib, dev, a, b, c, scales, b_constant)
    ref = (a.float() @ b.float().transpose(-1, -2)) * ((scales[0] * scales[1]).item() if fp8 else 1.0)
    assert _rel(c, ref) < 2e-2, sel.name
    c_py = bundle.gemm(a, b, scale_a=scales[0] if fp8 else None, scale_b=scales[1] if fp8 else None,
                       b_constant=b_constant)
    scal = [(s.data_ptr(), (1,), (1,)) for s in scales] if fp8 else []
    name = rt_gemm.select(bundle, rt_gemm.rkl_spec(a, "a"), rt_gemm.rkl_spec(b, "b"), rt_gemm.rkl_spec(c, "c"),
                          rt_gemm.DTYPES[dtype], rt_gemm.DTYPES[out_dtype], scal, b_constant, a.get_device())
    assert sel.name.decode() == name
    print(sel.name.decode(), "bitwise equal to Python's launch:", torch.equal(c, c_py))
    assert _rel(c, c_py.float()) < 1e-2


def test_fx_gemm_k0_zeroes_c(lib):
    dev = _device(lib)
    a = torch.empty((64, 0), dtype=torch.bfloat16, device="cuda")
    b = torch.empty((128, 0), dtype=torch.bfloat16, device="cuda")
    c = torch.full((64, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    p = cs.GemmProblem(1, 1, 64, 128, 0, 1, a.data_ptr(), cs.I64x3(0, 1, 0), b.data_ptr(), cs.I64x3(0, 1, 0),
                       c.data_ptr(), cs.I64x3(128, 1, 0), None, None, 0)
    sel = cs.Selection()
    rc = lib.lib.fx_gemm(ctypes.byref(dev), ctypes.byref(p), None, ctypes.c_uint64(0),
                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    torch.cuda.synchronize()
    assert rc == 0 and sel.variant == -1 and torch.equal(c, torch.zeros_like(c))


def test_max_clusters_come_from_the_driver(lib, bundle):
    """fx_gemm lowers the grid cap to what cudaOccupancyMaxActiveClusters says fits: told of 1000
    SMs, a persistent variant still gets at most what this GPU holds."""
    dev = _device(lib, sm_count=1000)
    real = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(8192, 4096, device="cuda").to(torch.bfloat16)
    b = torch.randn(8192, 4096, device="cuda").to(torch.bfloat16)
    c = torch.empty(8192, 8192, dtype=torch.bfloat16, device="cuda")
    sel = _fx_gemm(lib, dev, a, b, c)
    e = bundle.manifest["variants"][sel.name.decode()]
    if not e.get("persistent"):  # only a bundle without persistent GEMMs for this GPU may get here
        assert not [x["name"] for x in bundle.candidates("gemm") if x.get("persistent")], \
            f"an 8192x8192x4096 bf16 GEMM picks {sel.name.decode()}, not one of the persistent variants"
        pytest.skip(f"{GPU_BUNDLE} has no persistent (sm_90a) GEMM for this GPU")
    ctas = e["persistent"]["cluster_ctas"]
    print(sel.name.decode(), "max_clusters", sel.max_clusters, "bound without the driver", 1000 // ctas)
    assert 0 < sel.max_clusters <= real // ctas
    from factory.runtime.occupancy import max_active_clusters

    drv = max_active_clusters(GPU_BUNDLE, e, ctas)  # the Python loader's own question (cuda-python)
    if drv is not None:
        assert sel.max_clusters == min(drv, 1000 // ctas)
    assert _rel(c, a.float() @ b.float().T) < 2e-2


def _attention(lib, dev, p, workspace: list | None = None) -> cs.Selection:
    """fx_attention_select + fx_attention on a NaN-filled workspace (appended to ``workspace``)."""
    sel = cs.Selection()
    rc = lib.lib.fx_attention_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"  # (NO_VARIANT: a selection regression)
    ws = torch.full((max(1, sel.workspace_bytes),), 0xFF, dtype=torch.uint8, device="cuda")  # NaN floats
    if workspace is not None:
        workspace.append(ws)
    rc = lib.lib.fx_attention(ctypes.byref(dev), ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()),
                              ctypes.c_uint64(sel.workspace_bytes),
                              ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"
    torch.cuda.synchronize()
    return sel


@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal", [
    (2, 1024, 1024, 16, 4, 128, True), (1, 100, 300, 8, 8, 64, False), (4, 1, 2048, 8, 8, 64, False),
    (2, 128, 512, 8, 2, 128, True), (8, 1, 4096, 32, 8, 128, False), (4, 512, 512, 32, 32, 64, True),
    (2, 1024, 1024, 16, 16, 128, False), (2, 1024, 1024, 16, 16, 256, False)])
def test_fx_attention_matches_python(lib, bundle, monkeypatch, B, Sq, Sk, Hq, Hkv, D, causal):
    dev = _device(lib)
    g = torch.Generator(device="cuda").manual_seed(15)
    q = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32, device="cuda")
    sq, sk = q.stride(), k.stride()
    p = cs.AttentionProblem(1, 0, B, Sq, Sk, Hq, Hkv, D, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                            cs.I64x3(*sq[:3]), cs.I64x3(*sk[:3]), cs.I64x3(*sk[:3]), cs.I64x3(*o.stride()[:3]),
                            lse.data_ptr(), (ctypes.c_int64 * 2)(Hq * Sq, Sq), None, None, 0, int(causal), 0.0)
    sel = _attention(lib, dev, p)
    o_py, lse_py = bundle.attention(q, k, v, causal=causal, return_lse=True)
    name, splits = rt_attention._choose(bundle, "bf16", D, causal, False, B * Hq * Sq, (B, Hq, Hkv, Sq, Sk))
    assert (sel.name.decode(), sel.splits) == (name, splits)
    print(name, "bitwise equal to Python's launch:", torch.equal(o, o_py), torch.equal(lse, lse_py))
    r = judge_attention(name, [B, Sq, Sk, Hq, Hkv, D], o, lse, *attention_reference(q, k, v, causal, D ** -0.5),
                        TOLERANCE["bf16"])
    assert r["ok"], r  # against float32: o, lse (NaN-poisoned before the launch)
    assert _rel(o, o_py.float()) < 1e-2 and _rel(lse, lse_py) < 1e-4


@pytest.mark.parametrize("dtype,D,causal", [("f16", 128, True), ("bf16", 64, True), ("bf16", 128, True),
                                            ("bf16", 128, False)])
@pytest.mark.parametrize("lse_given", [False, True], ids=["lse-in-workspace", "lse"])
def test_fx_attention_varlen_matches_python(lib, bundle, lse_given, dtype, D, causal):
    """Packed sequences (causal or not; lse NULL: written into the workspace, or given and NaN-poisoned)
    against a float32 reference per sequence, and the Python launch; where the choice is a dynamic
    variant, its tile counters come first in the workspace (zeroed by fx_attention), then the lse."""
    from factory.runtime.attention import uses_tile_counters
    from factory.runtime.selector import DTYPE

    dev = _device(lib)
    lens_q, lens_k, H = [100, 37, 300, 0, 1100], [120, 37, 500, 9, 1100], 8
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(15)
    q = torch.randn(sum(lens_q), H, D, device="cuda", generator=g).to(tdt)
    k = torch.randn(sum(lens_k), H, D, device="cuda", generator=g).to(tdt)
    v = torch.randn(sum(lens_k), H, D, device="cuda", generator=g).to(tdt)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((H, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    st = (ctypes.c_int64 * 2)(0, q.shape[0]) if lse_given else (ctypes.c_int64 * 2)(0, 0)
    p = cs.AttentionProblem(DTYPE[dtype], 1, len(lens_q), q.shape[0], k.shape[0], H, H, D,
                            q.data_ptr(), k.data_ptr(),
                            v.data_ptr(), o.data_ptr(), cs.I64x3(0, *q.stride()[:2]), cs.I64x3(0, *k.stride()[:2]),
                            cs.I64x3(0, *v.stride()[:2]), cs.I64x3(0, *o.stride()[:2]),
                            lse.data_ptr() if lse_given else None, st,
                            cu_q.data_ptr(), cu_k.data_ptr(), max(lens_q), int(causal), 0.0)
    ws = []
    sel = _attention(lib, dev, p, ws)
    name = sel.name.decode()
    counters = 16 if uses_tile_counters(bundle.manifest["variants"][name]) else 0
    assert sel.workspace_bytes == counters + (0 if lse_given else 4 * H * q.shape[0])  # the lse it writes
    if counters:
        assert int(ws[0][:counters].count_nonzero()) == 0  # the kernel leaves its counters at 0
    if not lse_given:  # the lse fx_attention wrote into the workspace
        lse = ws[0][counters:counters + 4 * H * q.shape[0]].view(torch.float32).view(H, q.shape[0])
    o_py, lse_py = bundle.attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    max_seqlen_q=max(lens_q), return_lse=True)
    assert name == rt_attention._choose(bundle, dtype, D, causal, True)[0]
    print(name, "bitwise equal to Python's launch:", torch.equal(o, o_py))
    for i in range(len(lens_q)):  # each sequence against float32
        qs, ks = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
        if qs.start == qs.stop:  # (a sequence of no query)
            continue
        ref_o, ref_lse = attention_reference(q[None, qs], k[None, ks], v[None, ks], causal, D ** -0.5)
        r = judge_attention(name, [i], o[None, qs], lse[None, :, qs], ref_o, ref_lse, TOLERANCE[dtype])
        assert r["ok"], r
    assert _rel(o, o_py.float()) < 1e-2 and _rel(lse, lse_py) < 1e-4


@pytest.mark.parametrize("paged,switches,B,Hq,Hkv,D", [
    (True, False, 4, 32, 8, 128), (False, False, 2, 16, 1, 128), (True, True, 3, 32, 8, 128), (True, False, 1, 8, 8, 64),
    (True, False, 4, 16, 1, 128)])
def test_fx_attention_kvcache_matches_python(lib, bundle, paged, switches, B, Hq, Hkv, D):
    """fx_attention_kvcache on a paged (page 16, shuffled pages) or dense cache of ragged lengths:
    the variant Python picks, and Python's output bit for bit (MQA over 4096 rows: where built, a
    split whose last split merges the others, its arrival counters in the C workspace)."""
    if not hasattr(lib.lib, "fx_attention_kvcache"):
        pytest.skip(f"{GPU_BUNDLE} predates fx_attention_kvcache: relink it")
    dev = _device(lib)
    g = torch.Generator(device="cuda").manual_seed(B)
    lens = torch.tensor([777, 1, 2000, 64][:B], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
    ps, mp = (16, 256 if Hkv == 1 else 128) if paged else (2048, 0)
    pages = B * mp + 1 if paged else B
    k = torch.randn(pages, ps, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(pages - 1, device="cuda", generator=g)[: B * mp].view(B, mp).to(torch.int32) if paged else None
    sinks = torch.randn(Hq, device="cuda", generator=g) if switches else None
    opts = dict(window_size=(300, 0), softcap=20.0, sinks=sinks) if switches else {}
    o = torch.full_like(q, float("nan"))
    lse = torch.empty(B, Hq, 1, dtype=torch.float32, device="cuda")
    p = cs.KVCacheProblem()
    p.dtype = p.kv_dtype = 1
    p.batch, p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim = B, 1, Hq, Hkv, D
    p.num_pages, p.page_size, p.max_pages = pages, ps, mp
    p.q, p.k_cache, p.v_cache, p.o, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()
    p.q_stride[:], p.o_stride[:] = list(q.stride()[:3]), list(o.stride()[:3])
    p.k_stride[:], p.v_stride[:] = list(k.stride()[:3]), list(v.stride()[:3])
    p.lse_stride[:] = [Hq, 1]
    p.block_table, p.block_table_stride = (bt.data_ptr(), mp) if paged else (None, 0)
    p.cache_seqlens = lens.data_ptr()
    p.sinks = sinks.data_ptr() if switches else None
    p.causal, p.window_left, p.window_right = 1, (300 if switches else -1), (0 if switches else -1)
    p.softcap = 20.0 if switches else 0.0
    sel = cs.Selection()
    rc = lib.lib.fx_attention_kvcache_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    if rc == cs.FX_ERR_NO_VARIANT:
        pytest.skip(f"{GPU_BUNDLE} has no variant for this problem: {lib.message()}")
    assert rc == 0, lib.message()
    ws = torch.empty(max(1, sel.workspace_bytes), dtype=torch.uint8, device="cuda")
    rc = lib.lib.fx_attention_kvcache(ctypes.byref(dev), ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()),
                                      ctypes.c_uint64(sel.workspace_bytes),
                                      ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"
    torch.cuda.synchronize()
    o_py, lse_py = bundle.attention_kvcache(q, k, v, lens, block_table=bt, return_lse=True, **opts)
    plan = bundle.plan_kvcache(batch=B, seqlen_q=1, heads_q=Hq, heads_kv=Hkv, head_dim=D,
                               **({"max_pages": mp, "page_size": ps} if paged else {"max_seqlen_k": ps}),
                               window_size=opts.get("window_size", (-1, -1)), softcap=opts.get("softcap", 0.0),
                               sinks=switches)
    assert sel.name.decode() == plan.variant
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)


def _kv_packed_problem(q, k, v, o, lse, bt, lens, cu, max_q, Hq, Hkv, D, ps, mp):
    p = cs.KVCacheProblem()
    p.dtype = p.kv_dtype = 1
    p.batch, p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim = lens.numel(), q.shape[0], Hq, Hkv, D
    p.num_pages, p.page_size, p.max_pages = k.shape[0], ps, mp
    p.q, p.k_cache, p.v_cache, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.lse = lse.data_ptr() if lse is not None else None
    p.q_stride[:], p.o_stride[:] = [0, *q.stride()[:2]], [0, *o.stride()[:2]]
    p.k_stride[:], p.v_stride[:] = list(k.stride()[:3]), list(v.stride()[:3])
    p.lse_stride[:] = [0, q.shape[0]]
    p.block_table, p.block_table_stride = bt.data_ptr(), mp
    p.cache_seqlens = lens.data_ptr()
    p.causal, p.window_left, p.window_right = 1, -1, -1
    p.varlen_q, p.max_seqlen_q, p.cu_seqlens_q = 1, max_q, cu.data_ptr()
    return p


def test_fx_attention_kvcache_packed_q_matches_python(lib, bundle):
    """Chunked prefill of three sequences packed in one q (cu_seqlens_q; 130, 1 and 37 new tokens
    against 900, 1 and 2000 cached keys, paged at 16 over shuffled pages) through
    fx_attention_kvcache: the variant Python picks, Python's output bit for bit, and each
    sequence against a float32 reference on its gathered keys (bottom-right causal)."""
    from factory.testing import attention_kvcache_reference

    if not hasattr(lib.lib, "fx_attention_kvcache"):
        pytest.skip(f"{GPU_BUNDLE} predates fx_attention_kvcache: relink it")
    dev = _device(lib)
    g = torch.Generator(device="cuda").manual_seed(7)
    new, Hq, Hkv, D, ps, mp = [130, 1, 37], 32, 8, 128, 16, 128
    lens = torch.tensor([900, 1, 2000], dtype=torch.int32, device="cuda")
    B = lens.numel()
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(new), Hq, D, device="cuda", generator=g).to(torch.bfloat16)
    pages = B * mp + 1
    k = torch.randn(pages, ps, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(pages - 1, device="cuda", generator=g)[: B * mp].view(B, mp).to(torch.int32)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((Hq, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    p = _kv_packed_problem(q, k, v, o, lse, bt, lens, cu, max(new), Hq, Hkv, D, ps, mp)
    sel = cs.Selection()
    rc = lib.lib.fx_attention_kvcache_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
    if rc == cs.FX_ERR_NO_VARIANT:
        pytest.skip(f"{GPU_BUNDLE} has no packed-q variant for this problem: {lib.message()}")
    assert rc == 0, lib.message()
    ws = torch.empty(max(1, sel.workspace_bytes), dtype=torch.uint8, device="cuda")
    rc = lib.lib.fx_attention_kvcache(ctypes.byref(dev), ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()),
                                      ctypes.c_uint64(sel.workspace_bytes),
                                      ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    assert rc == 0, f"{lib.lib.fx_error_string(rc)}: {lib.message()}"
    torch.cuda.synchronize()
    o_py, lse_py = bundle.attention_kvcache(q, k, v, lens, block_table=bt, cu_seqlens_q=cu, max_seqlen_q=max(new),
                                            return_lse=True)
    plan = bundle.plan_kvcache(batch=B, seqlen_q=max(new), heads_q=Hq, heads_kv=Hkv, head_dim=D, max_pages=mp,
                               page_size=ps, varlen_q=True)
    assert sel.name.decode() == plan.variant
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)
    for i in range(B):  # each sequence against float32: its queries are the last of its keys
        rows = slice(cu[i].item(), cu[i + 1].item())
        ref_o, ref_lse = attention_kvcache_reference(q[None, rows], k, v, lens[i:i + 1], bt[i:i + 1])
        assert _rel(o[rows], ref_o[0]) < 2e-2, i
        assert (lse[:, rows] - ref_lse[0]).abs().max().item() < 1e-2, i


_HOST_POINTER_CHILD = r"""
import ctypes, sys, torch
sys.path.insert(0, "tests")
import c_selection as cs
lib = cs.CLib(sys.argv[1])
dev = cs.Device()
assert lib.lib.fx_device_query(0, ctypes.byref(dev)) == 0
B, Hq, Hkv, D, ps, mp = 2, 32, 8, 128, 16, 8
bf = dict(dtype=torch.bfloat16, device="cuda")
q = torch.randn(B, 1, Hq, D, **bf)
k = torch.randn(B * mp, ps, Hkv, D, **bf)
v = torch.randn_like(k)
bt = torch.arange(B * mp, dtype=torch.int32, device="cuda").view(B, mp)
lens = torch.tensor([100, 7], dtype=torch.int32, device="cuda")
lse = torch.empty(B, Hq, 1, dtype=torch.float32, device="cuda")
def problem(q, k, o):
    p = cs.KVCacheProblem()
    p.dtype = p.kv_dtype = 1
    p.batch, p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim = B, 1, Hq, Hkv, D
    p.num_pages, p.page_size, p.max_pages = B * mp, ps, mp
    p.q, p.k_cache, p.v_cache, p.o, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()
    p.q_stride[:], p.o_stride[:] = list(q.stride()[:3]), list(o.stride()[:3])
    p.k_stride[:], p.v_stride[:] = list(k.stride()[:3]), list(v.stride()[:3])
    p.lse_stride[:] = [Hq, 1]
    p.block_table, p.block_table_stride, p.cache_seqlens = bt.data_ptr(), mp, lens.data_ptr()
    p.causal, p.window_left, p.window_right = 1, -1, -1
    return p
def run(p):
    sel = cs.Selection()
    rc = lib.lib.fx_attention_kvcache(ctypes.byref(dev), ctypes.byref(p), None, ctypes.c_uint64(0),
                                      ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(sel))
    return rc
case = sys.argv[2]
o = torch.full_like(q, float("nan"))
if case == "q on the host":
    rc = run(problem(q.cpu(), k, o))
elif case == "k_cache on the host":
    rc = run(problem(q, k.cpu(), o))
else:
    rc = run(problem(q, k, o.cpu()))
print("RC", rc, lib.message())
assert rc == cs.FX_ERR_INPUT and "is not device memory" in lib.message(), (rc, lib.message())
# the process still works: the same call on device memory, against Python's launch
assert run(problem(q, k, o)) == 0, lib.message()
torch.cuda.synchronize()
from factory.runtime import Bundle
b = Bundle.open(sys.argv[3])
ref = b.attention_kvcache(q, k, v, lens, block_table=bt)
torch.cuda.synchronize()
assert torch.equal(o, ref)
print("CONTEXT OK")
"""


@pytest.mark.parametrize("case", ["q on the host", "k_cache on the host", "o on the host"])
def test_fx_attention_kvcache_refuses_host_pointers(lib, case):
    """A host pointer given to fx_attention_kvcache is refused (FX_ERR_INPUT, nothing launched):
    in a fresh process, which then launches the same problem on device memory and matches
    Python's launch — a lost context would fail there."""
    import subprocess
    import sys

    if not hasattr(lib.lib, "fx_attention_kvcache"):
        pytest.skip(f"{GPU_BUNDLE} predates fx_attention_kvcache: relink it")
    r = subprocess.run([sys.executable, "-c", _HOST_POINTER_CHILD, str(GPU_BUNDLE / "lib" / "libfactory_bundle.so"),
                        case, str(GPU_BUNDLE)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "CONTEXT OK" in r.stdout, r.stdout + r.stderr
