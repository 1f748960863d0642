"""Grouped GEMM (runtime/grouped.py) on a GPU: the selected variant against float32 and against
torch._grouped_mm, CUDA-graph capture replayed with new routing, out-of-range routing values in a
child process (the process and its CUDA context must survive), checks that refuse before launch.
Every variant by name against float32 is in tests/test_every_variant_gpu.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import GPU_BUNDLE, ROOT, gpu_marks

pytestmark = gpu_marks()
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    b = Bundle.open(GPU_BUNDLE)
    if not b.candidates("gemm_grouped"):
        pytest.skip(f"no gemm_grouped variant for this GPU ({b.describe_contents('gemm_grouped')})")
    return b


def _contig(E, N, K, counts, extra=0):
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    a = torch.randn(sum(counts) + extra, K, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    return a, b, offs


def _close(out, ref):
    owned = ~torch.isnan(ref)
    err = (out[owned].float() - ref[owned]).abs().max().item() if owned.any() else 0.0
    scale = ref[owned].abs().max().item() if owned.any() else 1.0
    return err <= 2e-2 * scale + 1e-3 and not (~torch.isnan(out[~owned])).any().item()


@pytest.mark.parametrize("E,N,K,counts", [
    (8, 4096, 7168, [512, 0, 1, 700, 129, 127, 3000, 64]),
    (64, 7168, 2048, [0] * 40 + [33] * 24),
    (128, 1536, 4096, [1] * 128),
])
def test_contiguous_selected_variant(bundle, E, N, K, counts):
    from factory.runtime import grouped

    a, b, offs = _contig(E, N, K, counts, extra=5)
    out = torch.full((a.shape[0], N), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.grouped_gemm(a, b, offs=offs, out=out)
    assert _close(out, grouped.reference(a, b, offs=offs))


def test_matches_torch_grouped_mm(bundle):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    a, b, offs = _contig(16, 2048, 1024, [64 * ((i * 7) % 5) for i in range(16)])
    ours = bundle.grouped_gemm(a, b, offs=offs)
    theirs = torch._grouped_mm(a, b, offs=offs)
    assert (ours.float() - theirs.float()).abs().max().item() <= 2e-2 * theirs.float().abs().max().item()


def test_masked_selected_variant(bundle):
    from factory.runtime import grouped

    E, max_m, N, K = 32, 96, 2048, 7168
    a = torch.randn(E, max_m, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    mm = torch.randint(0, max_m + 1, (E,), dtype=torch.int32, device="cuda")
    mm[:4] = torch.tensor([0, 1, max_m, 65], dtype=torch.int32)
    out = torch.full((E, max_m, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.grouped_gemm(a, b, masked_m=mm, out=out, expected_m=8)
    assert _close(out, grouped.reference(a, b, masked_m=mm))


def test_graph_capture_replays_new_routing(bundle):
    """One capture, replayed after the routing (offs / masked_m) changed in place: no host sync,
    the device counts are read at every replay."""
    from factory.runtime import grouped

    E, N, K, M = 16, 1024, 2048, 2048
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.full((E,), M, dtype=torch.int32, device="cuda")
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    am = torch.randn(E, 64, K, device="cuda", dtype=torch.bfloat16)
    mm = torch.zeros(E, dtype=torch.int32, device="cuda")
    outm = torch.empty(E, 64, N, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: loads the modules, fills the selection caches
        bundle.grouped_gemm(a, b, offs=offs, out=out)
        bundle.grouped_gemm(am, b, masked_m=mm, out=outm, expected_m=4)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.grouped_gemm(a, b, offs=offs, out=out)
        bundle.grouped_gemm(am, b, masked_m=mm, out=outm, expected_m=4)
    for trial in range(3):
        counts = torch.randint(0, 2 * M // E, (E,))
        counts[trial] = 0
        new = counts.cumsum(0).clamp(max=M).to(torch.int32)
        offs.copy_(new)
        mm.copy_(torch.randint(0, 65, (E,), dtype=torch.int32))
        out.fill_(float("nan"))
        outm.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert _close(out, grouped.reference(a, b, offs=offs))
        assert _close(outm, grouped.reference(am, b, masked_m=mm))


_CHILD = r"""
import sys, torch
from factory.runtime import Bundle
from factory.runtime import grouped
bundle = Bundle.open(sys.argv[1])
E, N, K, M = 8, 512, 512, 300
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
for offs in ([100, 50, 400, 2**31 - 1, 0, 300, -5, 10**9], [2**31 - 1] * 8, [-1] * 8):
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.grouped_gemm(a, b, offs=torch.tensor(offs, dtype=torch.int32, device="cuda"), out=out)
    torch.cuda.synchronize()
am = torch.randn(E, 40, K, device="cuda", dtype=torch.bfloat16)
for mm in ([2**31 - 1] * 8, [-2**31] * 8, [41, 40, 39, -1, 0, 1, 10**9, 7]):
    out = torch.full((E, 40, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    m = torch.tensor(mm, dtype=torch.int32, device="cuda")
    bundle.grouped_gemm(am, b, masked_m=m, out=out)
    torch.cuda.synchronize()
    ref = grouped.reference(am, b, masked_m=m)
    owned = ~torch.isnan(ref)
    if owned.any():
        assert (out[owned].float() - ref[owned]).abs().max().item() < 0.5
    assert not (~torch.isnan(out[~owned])).any().item()
o = torch.tensor([10, 40, 40, 100, 150, 200, 290, 300], dtype=torch.int32, device="cuda")
out = bundle.grouped_gemm(a, b, offs=o)
torch.cuda.synchronize()
assert (out.float() - grouped.reference(a, b, offs=o)).abs().max().item() < 0.5
x = torch.randn(64, 64, device="cuda")
assert torch.allclose(x @ x, (x.double() @ x.double()).float(), atol=1e-3)
print("OK")
"""


def test_out_of_range_routing_leaves_the_process_usable():
    """Offsets past M, decreasing, negative; masked counts past max_m or negative: the rows are
    clamped to the tensors, nothing outside a and out is touched, the context survives."""
    r = subprocess.run([sys.executable, "-c", _CHILD, str(GPU_BUNDLE)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]


def test_refusals_before_launch(bundle):
    from factory.runtime.errors import InputError, NoVariantError

    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32, device="cuda")
    bad = [
        dict(offs=offs.cpu()),  # routing on the host
        dict(offs=offs.long()),
        dict(offs=offs[:3]),
        dict(offs=offs, masked_m=offs),
        dict(),
        dict(offs=offs, out=torch.empty(64, 128, device="cuda", dtype=torch.float16)),
        dict(offs=offs, out=torch.empty(64, 127, device="cuda", dtype=torch.bfloat16)),
        dict(offs=offs, out=a[:, :128]),  # aliases a
    ]
    for kw in bad:
        with pytest.raises(InputError):
            bundle.grouped_gemm(a, b, **kw)
    with pytest.raises(InputError):  # N-major b
        bundle.grouped_gemm(a, torch.randn(4, 256, 128, device="cuda", dtype=torch.bfloat16), offs=offs)
    with pytest.raises((InputError, NoVariantError)):  # K not whole 16-byte rows
        bundle.grouped_gemm(a[:, :250], b[:, :250], offs=offs)
    assert bundle.grouped_gemm(a, b, offs=offs).shape == (64, 128)  # still works
