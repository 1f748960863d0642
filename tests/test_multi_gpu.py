"""Several GPUs in one process, and tensor parallelism over NCCL (issue 17).  The tests that need
two devices skip below two; the single-GPU path of the tensor-parallel example runs on one."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from conftest import GPU_BUNDLE, ROOT, gpu_marks

torch = pytest.importorskip("torch")

pytestmark = gpu_marks()
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


def _check(bundle, device):
    a = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    w = torch.randn(384, 512, device=device, dtype=torch.bfloat16)
    c = bundle.gemm(a, w)
    ref = a.float() @ w.float().T
    assert c.device == a.device and float((c.float() - ref).norm() / ref.norm()) < 1e-2


def _torchrun(n: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                           str(ROOT / "examples" / "tensor_parallel_mlp.py"), "--bundle", str(GPU_BUNDLE),
                           "--tokens", "1024", "--iters", "5"], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_tensor_parallel_example_single_gpu_path():
    r = _torchrun(1)
    assert r.returncode == 0 and "world 1: rel err" in r.stdout and "tokens/s" in r.stdout, r.stdout + r.stderr


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
def test_tensor_parallel_example_on_two_gpus():
    r = _torchrun(2)
    assert r.returncode == 0 and "world 2: rel err" in r.stdout, r.stdout + r.stderr
