"""Without a GPU: the child-process harness of the multi-GPU tests (a hung child is killed with its
whole process group and the test fails), and the tensor-parallel Llama layer's sharding
(examples/tensor_parallel_llama.py) on the CPU in float32, two ranks as two threads whose
all-reduce is a sum through a barrier, against the unsplit layer."""

from __future__ import annotations

import re
import sys
import threading
import time
import types

import pytest

from children import run_child
from conftest import ROOT

torch = pytest.importorskip("torch")


def _state(pid: int) -> str:
    """The process's state letter from /proc ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_hung_child_is_killed_with_its_process_group():
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s") as e:
        run_child([sys.executable, "-c", "import subprocess, sys, time\n"
                   "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                   "print('grandchild', p.pid, flush=True)\ntime.sleep(600)"], timeout=3)
    pid = int(re.search(r"grandchild (\d+)", str(e.value)).group(1))
    for _ in range(50):  # (the kill is sent; give the kernel a moment to take the process down)
        if _state(pid) in ("", "Z", "X"):
            break
        time.sleep(0.1)
    assert _state(pid) in ("", "Z", "X"), f"the grandchild {pid} outlived the timeout: state {_state(pid)}"


def test_child_gets_multicast_off():
    r = run_child([sys.executable, "-c", "import os; print([os.environ[k] for k in ('NCCL_NVLS_ENABLE', "
                   "'TORCH_SYMM_MEM_DISABLE_MULTICAST', 'NVSHMEM_DISABLE_NVLS')])"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "['0', '1', '1']", r.stdout + r.stderr


@pytest.fixture(scope="module")
def tp():
    sys.path.insert(0, str(ROOT / "examples"))
    import tensor_parallel_llama

    return tensor_parallel_llama


def _weights(hidden=64, hq=8, hkv=2, hd=16, ffn=96):
    g = torch.Generator().manual_seed(0)

    def w(n, k):
        return torch.randn(n, k, generator=g) / k ** 0.5

    return types.SimpleNamespace(hq=hq, hkv=hkv, hd=hd, wqkv=w((hq + 2 * hkv) * hd, hidden), wo=w(hidden, hq * hd),
                                 wgu=w(2 * ffn, hidden), wdown=w(hidden, ffn), n1=torch.rand(hidden) + 0.5,
                                 n2=torch.rand(hidden) + 0.5)


def _split_run(tp, lb, wts, world, call):
    """``call(layer, rank)`` on every rank's SplitLayer in its own thread; the all-reduce sums the
    ranks' partials.  Returns each rank's output."""
    slots, outs, errors = [None] * world, [None] * world, []
    barrier = threading.Barrier(world)

    def run(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = sum(slots)
            barrier.wait()
            t.copy_(total)

        try:
            ref = lb.reference(tp.Shard(wts, rank, world))
            outs[rank] = call(tp.SplitLayer(ref.w, ref.mm, ref.attend, reduce), rank)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            barrier.abort()

    ts = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return outs


@pytest.mark.parametrize("world", [1, 2])
def test_split_layer_equals_the_unsplit_layer(tp, world):
    lb = tp.lb
    wts = _weights()
    full = lb.reference(wts)
    g = torch.Generator().manual_seed(1)
    lengths = [5, 11, 1, 7]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lengths])
    x = torch.randn(sum(lengths), 64, generator=g)
    want = full.prefill(x, pos, cu, max(lengths))
    for y in _split_run(tp, lb, wts, world, lambda L, r: L.prefill(x, pos, cu, max(lengths))):
        assert torch.allclose(y, want, rtol=1e-4, atol=1e-5)

    B, S = 3, 9
    xd = torch.randn(B, 64, generator=g)
    ck, cv = torch.randn(B, S + 1, 2, 16, generator=g), torch.randn(B, S + 1, 2, 16, generator=g)
    lens = torch.full((B,), S, dtype=torch.long)
    want = full.decode(xd, ck.clone(), cv.clone(), lens)

    def dec(L, rank):
        h = tp.Shard(wts, rank, world).kv_heads
        return L.decode(xd, ck[:, :, h].clone(), cv[:, :, h].clone(), lens)

    for y in _split_run(tp, lb, wts, world, dec):
        assert torch.allclose(y, want, rtol=1e-4, atol=1e-5)


def test_shard_refuses_heads_that_do_not_split(tp):
    with pytest.raises(SystemExit, match="do not split over 4"):
        tp.Shard(_weights(hkv=2), 0, 4)

