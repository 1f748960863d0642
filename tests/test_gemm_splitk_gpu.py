"""The Hopper GEMM split along K with the in-kernel fix-up (gemm/sm90_splitk.py; every tile split,
or only the last round's: the tail split) on the GPU
(skipped without one, or without such variants in the bundle): every split variant against float32
on fresh random data with NaN-poisoned outputs (tails in M, N and K, K not a multiple of the split,
parts with no k-block, a batch, M = 1..64), bitwise-identical results run to run (the fixed
summation order), CUDA-graph replays with new data (the semaphores are zero again for every
launch), and the per-stream workspaces (runtime/workspaces.py): problems of different tile counts
back to back on one stream, on two streams at once, in one capture and beside eager launches."""

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
    if not split_variants(b) and not split_variants(b, "e4m3"):
        pytest.skip("bundle has no workspace split-K GEMM for this GPU")
    return b


def split_variants(b, ab="bf16") -> list[dict]:
    return [v for v in b.candidates("gemm") if v.get("workspace", {}).get("form") in ("tiles", "tail")
            and v["dtypes"]["a"] == ab]


@pytest.fixture()
def bf16_splits(bundle):
    if not split_variants(bundle):
        pytest.skip("bundle has no bfloat16 workspace split-K GEMM for this GPU")
    return split_variants(bundle)


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
def test_every_split_variant_matches_float32(bundle, bf16_splits, run_record, shape):
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


def test_results_are_bitwise_repeatable(bundle, bf16_splits):
    """The last part sums the partials in part order whichever CTA arrives last: ten launches of
    one problem give the same bits."""
    import torch

    a, b = _operands(2048, 2112, 7168, 1)
    for v in split_variants(bundle):
        first = bundle.gemm(a, b, variant=v["name"])
        for _ in range(9):
            again = bundle.gemm(a, b, variant=v["name"])
            assert torch.equal(again.view(torch.int16), first.view(torch.int16)), v["name"]


def test_graph_replays_with_new_data(bundle, bf16_splits):
    """Captured once, replayed with new inputs each time: a replay finds its semaphores at zero
    (the workspace is the capture's, its zero region filled at the start of the graph; the kernel
    also leaves them at zero) and every output is right."""
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


def test_the_selection_splits_few_tile_problems(bundle, bf16_splits):
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


def test_the_kernel_leaves_its_semaphores_zero(bundle, bf16_splits):
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


# Problems of few and of many output tiles (semaphore regions of 32 and more words) for the
# per-stream workspaces' tests.
MIXED = [(64, 2112, 7168), (2048, 2112, 7000), (300, 2112, 7000), (1100, 5376, 3000)]


def _mixed_problems():
    import torch

    probs = []
    for M, N, K in MIXED:
        a, b = _operands(M, N, K, 1)
        probs.append((a, b, torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda"), _ref(a, b)))
    return probs


def _zero_regions_clean():
    import torch

    from factory.runtime import workspaces

    for t in workspaces.held():
        assert int(t[:workspaces.ZERO_WORDS].view(torch.int32).abs().sum()) == 0


@pytest.mark.parametrize("zero_words", [None, 32], ids=["pooled", "past-the-zero-region"])
def test_mixed_problems_back_to_back_share_the_stream_workspace(gpu_bundle, bundle, bf16_splits, zero_words,
                                                                monkeypatch):
    """Problems of 1 to ~180 output tiles, each split variant, twice round without a wait between
    launches: the stream's one workspace serves them all (a larger problem's semaphores never land
    on a smaller one's partial tiles), every output matches float32, and the zero region reads zero
    afterwards.  With a zero region of 32 words, the problems of more tiles take a workspace of
    their own per launch (the fallback) beside the pooled ones."""
    import torch

    from factory import testing
    from factory.runtime import Bundle, workspaces

    if zero_words is not None:
        monkeypatch.setattr(workspaces, "ZERO_WORDS", zero_words)
    workspaces.release()
    fresh = Bundle.open(gpu_bundle)  # plans made under this zero region
    try:
        for v in split_variants(fresh):
            probs = _mixed_problems()
            for _ in range(2):
                for a, b, out, _ in probs:
                    out.fill_(float("nan"))
                    fresh.gemm(a, b, out, variant=v["name"])
            torch.cuda.synchronize()
            for a, b, out, ref in probs:
                assert testing.rel_error(out, ref) < testing.TOLERANCE["bf16"], v["name"]
            _zero_regions_clean()
    finally:
        torch.cuda.synchronize()
        workspaces.release()


def test_two_streams_at_once_keep_their_own_workspaces(bundle, bf16_splits):
    """The same problems launched alternately on two streams with no wait: each stream's launches
    use that stream's buffer; all outputs right, both zero regions clean."""
    import torch

    from factory import testing
    from factory.runtime import workspaces

    v = split_variants(bundle)[0]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    runs = [_mixed_problems(), _mixed_problems()]
    torch.cuda.synchronize()
    for _ in range(3):
        for i, (a, b, out, _) in enumerate(runs[0]):
            for s, probs in zip(streams, runs):
                with torch.cuda.stream(s):
                    pa, pb, po, _ = probs[i]
                    bundle.gemm(pa, pb, po, variant=v["name"])
    torch.cuda.synchronize()
    for probs in runs:
        for a, b, out, ref in probs:
            assert testing.rel_error(out, ref) < testing.TOLERANCE["bf16"], v["name"]
    bufs = {t.data_ptr() for t in workspaces.held(torch.device("cuda", 0))}
    assert len(bufs) >= 2
    _zero_regions_clean()


def test_one_capture_of_growing_problems_beside_eager_launches(bundle, bf16_splits):
    """One graph holds a few-tile problem, then a many-tile one, then the few-tile one again (the
    capture's buffer grows within the capture); it is replayed on its stream while the same
    problems run eagerly on another, twice with new data: all outputs right."""
    import torch

    from factory import testing
    from factory.testing import capture_on_side_stream

    v = split_variants(bundle)[0]
    graph_probs, eager_probs = _mixed_problems(), _mixed_problems()
    order = [0, 1, 2, 3, 0]
    for i in order:  # warm (loads outside the capture)
        a, b, out, _ = graph_probs[i]
        bundle.gemm(a, b, out, variant=v["name"])
    torch.cuda.synchronize()
    g = capture_on_side_stream(lambda: [bundle.gemm(*graph_probs[i][:3], variant=v["name"]) for i in order])
    side = torch.cuda.Stream()
    for _ in range(2):
        for probs in (graph_probs, eager_probs):
            for a, b, out, _ in probs:
                a.copy_(torch.randn_like(a, dtype=torch.float32))
                b.copy_(torch.randn_like(b, dtype=torch.float32))
                out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        with torch.cuda.stream(side):
            for i in order:
                bundle.gemm(*eager_probs[i][:3], variant=v["name"])
        torch.cuda.synchronize()
        for probs in (graph_probs, eager_probs):
            for a, b, out, _ in probs:
                assert testing.rel_error(out, _ref(a, b)) < testing.TOLERANCE["bf16"], v["name"]
    _zero_regions_clean()


RELEASE_CHILD = r"""
import sys
import torch
from factory import testing
from factory.runtime import Bundle, workspaces

b = Bundle.open(sys.argv[1])
M, N, K = 2048, 2112, 7000
for v in [v for v in b.candidates("gemm") if v.get("workspace", {}).get("form") in ("tiles", "tail")
          and v["dtypes"]["a"] == "bf16"]:
    a = testing.gemm_operand(M, K, 1, "k", "bf16")[0]
    w = testing.gemm_operand(N, K, 1, "k", "bf16")[0]
    for _ in range(2):
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        b.gemm(a, w, out, variant=v["name"])
        # the buffer given back to the allocator, a block of its size filled with garbage: the
        # next launch's new buffer is zeroed when made
        workspaces.release()
        junk = torch.full((1 << 22,), 1.0e6, dtype=torch.float32, device="cuda")
        junk.view(torch.int32)[:1 << 16] = 7
        del junk
        torch.cuda.synchronize()
        err = testing.rel_error(out, a.float() @ w.float().t())
        print("ERR", v["name"], err, flush=True)
        assert err < testing.TOLERANCE["bf16"], (v["name"], err)
print("CONTEXT OK", flush=True)
"""


def test_released_workspaces_come_back_zeroed(gpu_bundle, bundle, bf16_splits):
    """``workspaces.release()`` between launches, the allocator's blocks dirtied: the next launch's
    buffer is zeroed when made and every result is right (in a child process with a time limit: a
    semaphore left dirty would make a part wait forever)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", RELEASE_CHILD, str(gpu_bundle)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "CONTEXT OK" in r.stdout, r.stdout + r.stderr


# fp8 e4m3 tail splits (fast accumulation; row or per-tensor scales applied after the parts' sum):
# problems past one round whose last round is split (2048 x 2112 leaves 4-22 cluster tiles in the
# last round, in 8 / 3 parts on 128x128 / 128x192 tiles), K off the 128-element tile, a short K
# that caps the parts (k-tiles / 4), a ragged M and N, under one round, and 66 cluster tiles of
# 128x128 exactly (one round, nothing split).
FP8_SHAPES = [(2048, 2112, 7168), (2048, 2112, 7008), (4100, 2104, 4096), (1100, 5376, 1008), (300, 2112, 7168),
              (1536, 1408, 2048)]


@pytest.fixture()
def fp8_splits(bundle):
    if not split_variants(bundle, "e4m3"):
        pytest.skip("bundle has no fp8 tail-split GEMM for this GPU")
    return split_variants(bundle, "e4m3")


def _fp8_problem(v, M, N, K):
    """(a, b, scales, float32 reference) in the variant's scale form (row, or one scale each)."""
    import torch

    from factory import testing

    if v.get("scale_mode") == "row":
        return testing.fp8_scaled_problem("row", M, N, K)
    a, b, _, _ = testing.fp8_scaled_problem("row", M, N, K)
    sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
    return a, b, {"scale_a": sa, "scale_b": sb}, (a.float() @ b.float().t()) * (sa * sb)


@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_fp8_tail_variant_matches_float32(bundle, fp8_splits, run_record, shape):
    import torch

    from factory import testing

    M, N, K = shape
    for v in fp8_splits:
        a, b, scales, ref = _fp8_problem(v, M, N, K)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        bundle.gemm(a, b, out, variant=v["name"], **scales)
        torch.cuda.synchronize()
        err = testing.rel_error(out, ref)
        nan = int(torch.isnan(out).sum())
        ok = nan == 0 and err < testing.TOLERANCE["e4m3"]
        run_record.add(bundle, v["name"], [{"variant": v["name"], "shape": [M, N, K, 1], "rel_err": err,
                                            "nan": nan, "tol": testing.TOLERANCE["e4m3"], "ok": ok}])
        assert ok, (v["name"], shape, err, nan)


def test_fp8_tail_is_bitwise_repeatable_and_captures(bundle, fp8_splits):
    """The fp8 tail's fixed part order: ten launches give the same bits; a captured launch replayed
    with new operands and scales matches float32."""
    import torch

    from factory import testing
    from factory.testing import capture_on_side_stream

    M, N, K = 2048, 2112, 7168
    for v in fp8_splits:
        a, b, scales, ref = _fp8_problem(v, M, N, K)
        first = bundle.gemm(a, b, variant=v["name"], **scales)
        for _ in range(9):
            again = bundle.gemm(a, b, variant=v["name"], **scales)
            assert torch.equal(again.view(torch.int16), first.view(torch.int16)), v["name"]
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        bundle.gemm(a, b, out, variant=v["name"], **scales)
        torch.cuda.synchronize()
        g = capture_on_side_stream(lambda: bundle.gemm(a, b, out, variant=v["name"], **scales))
        for _ in range(2):
            a2, b2, s2, ref2 = _fp8_problem(v, M, N, K)
            a.copy_(a2)
            b.copy_(b2)
            for k in scales:
                scales[k].copy_(s2[k])
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert not torch.isnan(out).any(), v["name"]
            assert testing.rel_error(out, ref2) < testing.TOLERANCE["e4m3"], v["name"]
