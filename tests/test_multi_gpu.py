"""Several GPUs: one process driving two devices (the device guard, threads, capture and preload on
either device, the C API on the second device), and tensor parallelism over NCCL (the examples
under torchrun).  The tests that need two devices skip below two; the single-GPU path of the
tensor-parallel example runs on one.

Every child process (tests/children.py) runs under a hard limit in its own process group: on
timeout the whole group (torchrun and its workers) is killed and the test fails, so a hang cannot
stall the run; each rendezvous takes a fresh free port."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading

import pytest

from children import free_port, python, run_child
from conftest import GPU_BUNDLE, ROOT, gpu_marks

torch = pytest.importorskip("torch")

pytestmark = gpu_marks()
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

CHILD_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


def torchrun(n: int, script: str, *args: str) -> subprocess.CompletedProcess:
    return run_child([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                      "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                      str(ROOT / "examples" / script), "--bundle", str(GPU_BUNDLE), *args], CHILD_TIMEOUT_S)


def _check(bundle, device):
    a = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    w = torch.randn(384, 512, device=device, dtype=torch.bfloat16)
    c = bundle.gemm(a, w)
    ref = a.float() @ w.float().T
    assert c.device == a.device and float((c.float() - ref).norm() / ref.norm()) < 1e-2


def test_tensor_parallel_example_single_gpu_path():
    r = torchrun(1, "tensor_parallel_mlp.py", "--tokens", "1024", "--iters", "5")
    assert r.returncode == 0 and "world 1: rel err" in r.stdout and "tokens/s" in r.stdout, r.stdout + r.stderr
    assert "world 1: process group destroyed" in r.stdout, r.stdout + r.stderr


@two_gpus
def test_other_device_is_refused_then_runs_under_its_guard(bundle):
    from factory.runtime import InputError

    a = torch.randn(64, 256, device="cuda:1", dtype=torch.bfloat16)
    with torch.cuda.device(0), pytest.raises(InputError, match="current device is cuda:0"):
        bundle.gemm(a, a)
    with torch.cuda.device(1):
        _check(bundle, "cuda:1")
    _check(bundle, "cuda:0")  # and the first device still works


@two_gpus
def test_two_threads_on_two_devices(bundle):
    errors = []

    def work(dev):
        try:
            torch.cuda.set_device(dev)
            for _ in range(20):
                _check(bundle, f"cuda:{dev}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@two_gpus
def test_capture_and_replay_on_the_second_device(bundle):
    with torch.cuda.device(1):
        bundle.preload(("gemm",))
        a = torch.randn(256, 512, device="cuda:1", dtype=torch.bfloat16)
        w = torch.randn(384, 512, device="cuda:1", dtype=torch.bfloat16)
        bundle.gemm(a, w)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            c = bundle.gemm(a, w)
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        ref = a.float() @ w.float().T
        assert float((c.float() - ref).norm() / ref.norm()) < 1e-2


@two_gpus
def test_preload_on_one_device_serves_capture_on_either():
    """A fresh process preloads under cuda:0 only, then captures GEMMs (a persistent sm_90a shape
    and a decode shape) and an attention on cuda:1 and on cuda:0 with no eager call before: the
    capture must not need a module load on either device, and the replays must be right."""
    r = python(CHILD_TIMEOUT_S, f"""
        import torch
        from factory.runtime import Bundle
        b = Bundle.open({str(GPU_BUNDLE)!r})
        with torch.cuda.device(0):
            n = b.preload(("gemm", "attention"))
        print("preloaded", n)
        for dev in (1, 0):
            with torch.cuda.device(dev):
                a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
                x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
                q = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(2, 256, 2, 128, device="cuda", dtype=torch.bfloat16)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                g = torch.cuda.CUDAGraph()
                with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                    c, d, o = b.gemm(a, w), b.gemm(x, w), b.attention(q, k, k, causal=True)
                torch.cuda.current_stream().wait_stream(s)
                for t in (a, x, q, k):
                    t.copy_(torch.randn_like(t))
                g.replay()
                torch.cuda.synchronize()
                ref_o = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2).float(), k.transpose(1, 2).float(), k.transpose(1, 2).float(),
                    is_causal=True, enable_gqa=True).transpose(1, 2)
                errs = [float((y.float() - r).norm() / r.norm())
                        for y, r in ((c, a.float() @ w.float().T), (d, x.float() @ w.float().T), (o, ref_o))]
                assert c.device.index == dev and max(errs) < 2e-2, (dev, errs)
                print(f"cuda:{{dev}} captured without eager calls, replay errors {{errs}}")
                del g
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.count("captured without eager calls") == 2 and "OK" in r.stdout, \
        r.stdout + r.stderr


@two_gpus
def test_c_api_on_the_second_device(bundle):
    """fx_device_query(1) and fx_gemm / fx_attention on cuda:1's stream with cuda:1 current: the
    same output as the Python loader on that device and right against float32, persistent grid cap
    asked of cuda:1."""
    import c_selection as cs
    import test_c_api_gpu as capi

    lib = cs.CLib(GPU_BUNDLE / "lib" / "libfactory_bundle.so")
    if not hasattr(lib.lib, "fx_gemm"):
        pytest.skip("the host library predates the C selection")

    with torch.cuda.device(1):
        dev = capi._device(lib)  # fx_device_query(current device = 1) against torch's properties
        assert torch.cuda.current_device() == 1
        g = torch.Generator(device="cuda:1").manual_seed(3)
        for M, N, K in ((4096, 4096, 512), (4, 4096, 4096)):
            a = torch.randn(M, K, device="cuda:1", generator=g).bfloat16()
            b = torch.randn(N, K, device="cuda:1", generator=g).bfloat16()
            c = torch.full((M, N), float("nan"), device="cuda:1", dtype=torch.bfloat16)
            sel = capi._fx_gemm(lib, dev, a, b, c)
            c_py = bundle.gemm(a, b)
            assert c.device.index == 1 and capi._rel(c, a.float() @ b.float().T) < 2e-2, sel.name
            assert capi._rel(c, c_py.float()) < 1e-2, sel.name
            pers = bundle.manifest["variants"][sel.name.decode()].get("persistent")
            if pers:  # the driver's answer for cuda:1 (fx_select.c asks per device)
                sms = torch.cuda.get_device_properties(1).multi_processor_count
                assert 0 < sel.max_clusters <= sms // pers["cluster_ctas"], (sel.name, sel.max_clusters)
        B, S, Hq, Hkv, D = 2, 512, 16, 4, 128
        q = torch.randn(B, S, Hq, D, device="cuda:1", generator=g).bfloat16()
        k = torch.randn(B, S, Hkv, D, device="cuda:1", generator=g).bfloat16()
        v = torch.randn(B, S, Hkv, D, device="cuda:1", generator=g).bfloat16()
        o = torch.full_like(q, float("nan"))
        lse = torch.empty(B, Hq, S, dtype=torch.float32, device="cuda:1")
        p = cs.AttentionProblem(1, 0, B, S, S, Hq, Hkv, D, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                cs.I64x3(*q.stride()[:3]), cs.I64x3(*k.stride()[:3]), cs.I64x3(*v.stride()[:3]),
                                cs.I64x3(*o.stride()[:3]), lse.data_ptr(), (ctypes.c_int64 * 2)(Hq * S, S),
                                None, None, 0, 1, 0.0)
        sel = capi._attention(lib, dev, p)
        o_py = bundle.attention(q, k, v, causal=True)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=True,
            enable_gqa=True).transpose(1, 2)
        assert capi._rel(o, ref) < 2e-2 and capi._rel(o, o_py.float()) < 1e-2, sel.name


@two_gpus
def test_c_api_refuses_another_devices_stream_or_pointers():
    """fx_gemm / fx_attention run on the current device: a stream or a pointer of the other device
    (or host memory) is FX_ERR_INPUT with nothing launched, never a silent no-op or a fault (cuda:1
    pointers on the default stream with cuda:0 current once returned success and left c
    unwritten); the process then runs correct GEMMs on both devices.  (torch's default stream is
    the handle 0 on every device, which means the current device's: a stream of another device
    needs a created stream.)"""
    r = python(CHILD_TIMEOUT_S, f"""
        import ctypes, torch
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import c_selection as cs
        lib = cs.CLib({str(GPU_BUNDLE / "lib" / "libfactory_bundle.so")!r})
        dev = cs.Device()
        assert lib.lib.fx_device_query(1, ctypes.byref(dev)) == 0

        def gemm(a_dev, c_dev, stream):
            a = torch.randn(256, 512, device=a_dev).bfloat16()
            b = torch.randn(384, 512, device=a_dev).bfloat16()
            c = torch.zeros(256, 384, device=c_dev, dtype=torch.bfloat16)
            p = cs.GemmProblem(1, 1, 256, 384, 512, 1, a.data_ptr(), cs.I64x3(512, 1, 0), b.data_ptr(),
                               cs.I64x3(512, 1, 0), c.data_ptr(), cs.I64x3(384, 1, 0), None, None, 0)
            rc = lib.lib.fx_gemm(ctypes.byref(dev), ctypes.byref(p), None, ctypes.c_uint64(0),
                                 ctypes.c_void_p(stream), None)
            msg = lib.lib.fx_last_error_message().decode()
            torch.cuda.synchronize(0), torch.cuda.synchronize(1)
            ref = a.float() @ b.float().T
            return rc, msg, float((c.float().cpu() - ref.cpu()).norm() / ref.norm().cpu())

        # Created streams: torch's default stream is handle 0 on every device (the current device's).
        s0, s1 = torch.cuda.Stream(device=0).cuda_stream, torch.cuda.Stream(device=1).cuda_stream
        with torch.cuda.device(0):
            for what, args, want in (("cuda:1 stream", ("cuda:1", "cuda:1", s1), "stream belongs to device 1"),
                                     ("cuda:1 pointers", ("cuda:1", "cuda:1", s0), "is on device 1"),
                                     ("one cuda:1 pointer", ("cuda:0", "cuda:1", s0), "c is on device 1"),
                                     ("host memory", ("cpu", "cpu", s0), "not device memory")):
                rc, msg, err = gemm(*args)
                print(what, "->", rc, msg)
                assert rc == cs.FX_ERR_INPUT and want in msg, (what, rc, msg)
        with torch.cuda.device(1):
            rc, msg, err = gemm("cuda:1", "cuda:1", s1)
            assert rc == 0 and err < 1e-2, (rc, msg, err)
        with torch.cuda.device(0):
            rc, msg, err = gemm("cuda:0", "cuda:0", s0)
            assert rc == 0 and err < 1e-2, (rc, msg, err)
        print("OK after")
    """)
    assert r.returncode == 0 and "OK after" in r.stdout, r.stdout + r.stderr


@two_gpus
def test_tensor_parallel_example_on_two_gpus():
    """Computes the block and then exits: the graph with the captured all-reduce is freed before
    the process group is torn down (with it alive the teardown never returns)."""
    r = torchrun(2, "tensor_parallel_mlp.py", "--tokens", "1024", "--iters", "5")
    assert r.returncode == 0 and "world 2: rel err" in r.stdout, r.stdout + r.stderr
    assert "world 2: process group destroyed" in r.stdout, r.stdout + r.stderr


@two_gpus
def test_tensor_parallel_llama_layer_on_two_gpus():
    """The Llama layer split over two GPUs (heads and MLP, two all-reduces) equals the unsplit layer
    and the torch-ops layer, prefill (ragged varlen) and decode, eager and replayed from a graph."""
    r = torchrun(2, "tensor_parallel_llama.py", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world 2: all 2 cases match the unsplit layer; process group destroyed" in r.stdout, r.stdout + r.stderr
