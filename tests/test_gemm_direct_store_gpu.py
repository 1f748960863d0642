"""Hopper GEMM tiles that store the output from registers (``direct_store``: no TMA store clips
the tile's edges, the kernel's own predicates do): every such variant of the bundle by name writes
its output view and nothing else.  The output is a view with a padded row stride inside a
NaN-filled buffer with spare rows; tails in M and N (not multiples of the tile), a batch.
References: float32 products (fp8: of the dequantized operands with row scales)."""

import pytest

from conftest import gpu_marks

pytestmark = gpu_marks()

# (M, N, K, L): tails in M and N, one tile, several waves of tiles, a batch (bf16; the row-scaled
# fp8 form is 2-D and runs these with L = 1).
SHAPES = [(257, 136, 200, 1), (1000, 1032, 1016, 2), (128, 128, 128, 1), (2300, 3080, 512, 1)]


@pytest.fixture(scope="module")
def bundle():
    from conftest import GPU_BUNDLE
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


def _direct(bundle):
    out = [v for v in bundle.candidates("gemm") if v.get("config", {}).get("direct_store")]
    if not out:
        pytest.skip("no direct_store gemm for this GPU in the bundle")
    return out


def _problem(entry, M, N, K, L):
    import torch

    from factory import testing

    if entry["dtypes"]["a"] == "e4m3":  # row scales: 2-D problems, K in 16-byte rows
        a, b, scales, ref = testing.fp8_scaled_problem("row", M, N, -(-K // 16) * 16)
        return a, b, scales, ref, 1
    lead = (L,) if L > 1 else ()
    a = torch.randn(*lead, M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(*lead, N, K, device="cuda").to(torch.bfloat16)
    return a, b, {}, a.float() @ b.float().transpose(-1, -2), L


@pytest.mark.parametrize("M,N,K,L", SHAPES)
def test_direct_store_writes_only_the_output_view(bundle, run_record, M, N, K, L):
    import torch

    from factory import testing

    for e in _direct(bundle):
        a, b, scales, ref, n_l = _problem(e, M, N, K, L)
        lead = (n_l,) if n_l > 1 else ()
        pad_rows, ld = 9, N + 24  # spare rows below, a row stride 24 columns wider than N
        buf = torch.full((*lead, M + pad_rows, ld), float("nan"), dtype=torch.bfloat16, device="cuda")
        out = buf[..., :M, :N]
        bundle.gemm(a, b, out, variant=e["name"], **scales)
        torch.cuda.synchronize()
        err = testing.rel_error(out, ref)
        ok = bool(not torch.isnan(out).any() and err < testing.TOLERANCE[e["dtypes"]["a"]])
        run_record.add(bundle, e["name"], [{"variant": e["name"], "shape": [M, N, K, L], "rel_err": err,
                                            "tol": testing.TOLERANCE[e["dtypes"]["a"]], "ok": ok}])
        assert ok, (e["name"], M, N, K, L, err)
        assert torch.isnan(buf[..., :M, N:]).all(), (e["name"], "wrote past the last column")
        assert torch.isnan(buf[..., M:, :]).all(), (e["name"], "wrote past the last row")
