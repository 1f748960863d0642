"""The Hopper GEMM split along K with the in-kernel fix-up (gemm/sm90_splitk.py; every tile split,
or only the last round's: the tail split) on the GPU
(skipped without one, or without such variants in the bundle): every split variant against float32
on fresh random data with NaN-poisoned outputs (tails in M, N and K, K not a multiple of the split,
parts with no k-block, a batch, M = 1..64), bitwise-identical results run to run (the fixed
summation order), and CUDA-graph replays with new data (the semaphores are zero again for every
launch)."""

import pytest

from conftest import needs_gpu

pytestmark = [needs_gpu, pytest.mark.gpu]

# (M, N, K, L): tails everywhere; K = 200 (4 k-blocks: with 6 or 7 parts some have none); K = 7000
# (110 k-blocks, a multiple of no split); a batch; the decode-sized rows.
# The tail split (form "tail"): more tiles than the grid holds at once with K off the tile (2048 x
# 2112 x 7000), a short K that caps the parts (k-tiles / 4), a batch past one round.
SHAPES = [(257, 136, 200, 1), (1000, 1032, 1016, 2), (512, 3072, 5120, 1), (300, 2112, 7000, 1),
          (1, 264, 1032, 1), (7, 2112, 1544, 1), (33, 520, 4096, 1), (64, 2112, 7168, 1),
          (2048, 2112, 7000, 1), (2100, 5376, 1000, 1), (1100, 2112, 3000, 3)]


@pytest.fixture(scope="module")
def bundle(gpu_bundle):
    from factory.runtime import Bundle

    b = Bundle.open(gpu_bundle)
    if not split_variants(b):
        pytest.skip("bundle has no workspace split-K GEMM for this GPU")
    return b


def split_variants(b) -> list[dict]:
    return [v for v in b.candidates("gemm") if v.get("workspace", {}).get("form") in ("tiles", "tail")]


def _operands(M, N, K, L, dtype="bf16"):
    import torch

    from factory import testing

    a = testing.gemm_operand(M, K, L, "k", dtype)
    b = testing.gemm_operand(N, K, L, "k", dtype)
    if L == 1:
        a, b = a[0], b[0]
    return a, b


def _ref(a, b):
    return a.float() @ b.float().transpose(-1, -2)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_split_variant_matches_float32(bundle, run_record, shape):
    import torch

    from factory import testing

    M, N, K, L = shape
    a, b = _operands(M, N, K, L)
    ref = _ref(a, b)
    for v in split_variants(bundle):
        out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        bundle.gemm(a, b, out, variant=v["name"])
        torch.cuda.synchronize()
        err = testing.rel_error(out, ref)
        nan = int(torch.isnan(out).sum())
        ok = nan == 0 and err < testing.TOLERANCE["bf16"]
        run_record.add(bundle, v["name"], [{"variant": v["name"], "shape": list(shape), "rel_err": err,
                                            "nan": nan, "tol": testing.TOLERANCE["bf16"], "ok": ok}])
        assert ok, (v["name"], shape, err, nan)


def test_results_are_bitwise_repeatable(bundle):
    """The last part sums the partials in part order whichever CTA arrives last: ten launches of
    one problem give the same bits."""
    import torch

    a, b = _operands(2048, 2112, 7168, 1)
    for v in split_variants(bundle):
        first = bundle.gemm(a, b, variant=v["name"])
        for _ in range(9):
            again = bundle.gemm(a, b, variant=v["name"])
            assert torch.equal(again.view(torch.int16), first.view(torch.int16)), v["name"]


def test_graph_replays_with_new_data(bundle):
    """Captured once, replayed with new inputs each time: a replay finds its semaphores at zero
    (the workspace is the graph's, zeroed in the graph before the kernel; the kernel also leaves
    them at zero) and every output is right."""
    import torch

    from factory import testing
    from factory.testing import capture_on_side_stream

    M, N, K = 300, 2112, 7000
    for v in split_variants(bundle):
        a, b = _operands(M, N, K, 1)
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        bundle.gemm(a, b, out, variant=v["name"])  # warm: load outside the capture
        torch.cuda.synchronize()
        g = capture_on_side_stream(lambda: bundle.gemm(a, b, out, variant=v["name"]))
        for _ in range(2):
            a.copy_(torch.randn_like(a, dtype=torch.float32))
            b.copy_(torch.randn_like(b, dtype=torch.float32))
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert not torch.isnan(out).any(), v["name"]
            assert testing.rel_error(out, _ref(a, b)) < testing.TOLERANCE["bf16"], v["name"]


def test_the_selection_splits_few_tile_problems(bundle):
    """Where the selection picks a split variant (wave count), its answer matches float32."""
    import torch

    from factory import testing

    picked = 0
    for M, N, K in ((512, 3072, 5120), (2048, 2112, 7168), (64, 2112, 7168), (3000, 5000, 7000)):
        a, b = _operands(M, N, K, 1)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        bundle.gemm(a, b, out)
        torch.cuda.synchronize()
        assert testing.rel_error(out, _ref(a, b)) < testing.TOLERANCE["bf16"], (M, N, K)
        name = next((v for k, v in bundle.selections.items() if k[2:5] == (M, N, K)), "")
        picked += "skw" in name
    print(f"split picks: {picked}")


def test_the_kernel_leaves_its_semaphores_zero(bundle):
    """Launched directly on one workspace zeroed once (the host library's callers may keep one per
    stream): after each of three launches with new data the semaphore words read zero and the
    output matches float32."""
    import torch

    from factory import testing
    from factory.runtime import gemm as rt

    M, N, K = 300, 2112, 7000
    for v in split_variants(bundle):
        spec = rt._workspace_spec(v, M, N, 0, 1)[0]
        ws = torch.zeros(spec[1][0], dtype=torch.float32, device="cuda")
        sems = rt.sem_words(v["workspace"], M, N, 1)
        for _ in range(3):
            a, b = _operands(M, N, K, 1)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            specs = [rt.rkl_spec(t, w) for t, w in ((a, "a"), (b, "b"), (out, "out"))]
            bundle.launch(v["name"], [*specs, (ws.data_ptr(), (ws.numel(),), (1,)),
                                      *rt.launch_scalars(bundle, v, 0)], checked=True, device=0)
            torch.cuda.synchronize()
            assert int(ws[:sems].view(torch.int32).abs().sum()) == 0, v["name"]
            assert testing.rel_error(out, _ref(a, b)) < testing.TOLERANCE["bf16"], v["name"]


DIRTY_CHILD = r"""
import sys
import torch
from factory import testing
from factory.runtime import Bundle
from factory.runtime import gemm as rt

b = Bundle.open(sys.argv[1])
M, N, K = 2048, 2112, 7000
for v in [v for v in b.candidates("gemm") if v.get("workspace", {}).get("form") in ("tiles", "tail")]:
    a = testing.gemm_operand(M, K, 1, "k", "bf16")[0]
    w = testing.gemm_operand(N, K, 1, "k", "bf16")[0]
    words = rt.workspace_words(v["workspace"], M, N, 1)
    for _ in range(2):
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        # a freed block of the workspace's size full of garbage: the allocator hands it back
        junk = torch.full((words,), 1.0e6, dtype=torch.float32, device="cuda")
        junk.view(torch.int32)[:64] = 7
        del junk
        b.gemm(a, w, out, variant=v["name"])
        torch.cuda.synchronize()
        err = testing.rel_error(out, a.float() @ w.float().t())
        print("ERR", v["name"], err, flush=True)
        assert err < testing.TOLERANCE["bf16"], (v["name"], err)
print("CONTEXT OK", flush=True)
"""


def test_semaphores_are_zeroed_in_a_reused_dirty_block(gpu_bundle, bundle):
    """The runtime zeroes the semaphores of every per-call workspace: a block freed full of
    garbage and handed back by the allocator still gives right results (in a child process with a
    time limit: a semaphore left dirty would make a part wait forever)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", DIRTY_CHILD, str(gpu_bundle)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "CONTEXT OK" in r.stdout, r.stdout + r.stderr
