"""Grouped GEMM (runtime/grouped.py) on a GPU: the selected variant against float32 and against
torch._grouped_mm, CUDA-graph capture replayed with new routing, out-of-range routing values in a
child process (the process and its CUDA context must survive), checks that refuse before launch.
fp8 forms (row and block scales, both layouts): every fp8 variant by name against float32 of the
dequantized operands at K and N edges, empty and one-token groups, NaN-poisoned outputs; the
selected ones under CUDA-graph replay; bad scales refused before launch.
Every variant by name against float32 is in tests/test_every_variant_gpu.py (its run record)."""

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
    # N and K off the tile (520, 1040), 256 experts, two thirds empty, one with 2000 rows: skewed.
    (256, 520, 1040, [2000 if i == 77 else (0 if i % 3 else 1 + i % 4) for i in range(256)]),
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


def test_fx_gemm_grouped_matches_python(bundle):
    """The C entry (fx_gemm_grouped, through ctypes) on both layouts: Python's variant and output
    bit for bit; an output overlapping an input is refused before launch."""
    import ctypes

    from factory.runtime.manifest import sha256_file
    from factory.runtime.selector import DTYPE, Device, GroupedProblem, Selection, _I64x3, load

    path = GPU_BUNDLE / "lib" / "libfactory_bundle.so"
    lib = load(path, sha256_file(path))
    if not hasattr(lib, "fx_gemm_grouped"):
        pytest.skip(f"{path} predates fx_gemm_grouped: relink it (python -m factory link)")
    lib.fx_last_error_message.restype = ctypes.c_char_p
    dev = Device()
    assert lib.fx_device_query(torch.cuda.current_device(), ctypes.byref(dev)) == 0
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    E, N, K = 12, 1000, 1096
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    for masked in (0, 1):
        if masked:
            a = torch.randn(E, 70, K, device="cuda", dtype=torch.bfloat16)
            grp = torch.tensor([0, 1, 70, 69, 5, 64, 65, 3, 0, 0, 2, 33], dtype=torch.int32, device="cuda")
            c = torch.full((E, 70, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            M, ast, cst = 70, (a.stride(1), 1, a.stride(0)), (c.stride(1), 1, c.stride(0))
            ref = bundle.grouped_gemm(a, b, masked_m=grp, out=torch.full_like(c, float("nan")))
        else:
            counts = torch.tensor([0, 1, 300, 129, 0, 64, 1, 7, 0, 200, 128, 3])
            a = torch.randn(int(counts.sum()), K, device="cuda", dtype=torch.bfloat16)
            grp = counts.cumsum(0).to(torch.int32).cuda()
            c = torch.full((a.shape[0], N), float("nan"), device="cuda", dtype=torch.bfloat16)
            M, ast, cst = a.shape[0], (K, 1, 0), (N, 1, 0)
            ref = bundle.grouped_gemm(a, b, offs=grp, out=torch.full_like(c, float("nan")))
        p = GroupedProblem(DTYPE["bf16"], DTYPE["bf16"], masked, M, N, K, E, a.data_ptr(), _I64x3(*ast), b.data_ptr(),
                           _I64x3(b.stride(2), b.stride(1), b.stride(0)), c.data_ptr(), _I64x3(*cst),
                           None if masked else grp.data_ptr(), grp.data_ptr() if masked else None, 0)
        sel = Selection()
        rc = lib.fx_gemm_grouped(ctypes.byref(dev), ctypes.byref(p), stream, ctypes.byref(sel))
        assert rc == 0, lib.fx_last_error_message()
        torch.cuda.synchronize()
        assert torch.equal(c.isnan(), ref.isnan()) and torch.equal(c.nan_to_num(), ref.nan_to_num()), sel.name
        p.c = a.data_ptr()  # out over a: FX_ERR_INPUT, nothing launched
        before = a.clone()
        assert lib.fx_gemm_grouped(ctypes.byref(dev), ctypes.byref(p), stream, ctypes.byref(sel)) == -1
        torch.cuda.synchronize()
        assert b"overlaps" in lib.fx_last_error_message() and torch.equal(a, before)


def test_moe_example_checks():
    """examples/moe_experts.py --check: a top-8 MoE experts block (prefill against torch._grouped_mm,
    decode through one CUDA graph replayed with new routing against float32)."""
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "moe_experts.py"), "--bundle", str(GPU_BUNDLE), "--check",
                        "--experts", "16", "--tokens", "512", "--decode-tokens", "16"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-3000:]


# --- fp8 (e4m3 a and b, row or block scales, bf16 out) ---------------------------------------------
def _fp8_variants(bundle, form=None, layout=None):
    return [v["name"] for v in bundle.candidates("gemm_grouped") if v["dtypes"]["a"] == "e4m3"
            and (form is None or v.get("scale_mode") == form) and (layout is None or v.get("grouped") == layout)]


def _fp8_problem(form, E, N, K, counts=None, max_m=None, extra=0):
    """Quantized operands of the form (runtime/fp8.py grouped quantizers): contiguous when
    ``counts`` is given (plus ``extra`` rows no group owns), else masked with capacity max_m."""
    from factory.runtime import fp8

    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
    qb, sb = fp8.quantize_grouped_b(w, form)
    if counts is not None:
        x = torch.randn(sum(counts) + extra, K, device="cuda", dtype=torch.bfloat16)
        grp = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    else:
        x = torch.randn(E, max_m, K, device="cuda", dtype=torch.bfloat16)
        grp = torch.randint(0, max_m + 1, (E,), dtype=torch.int32, device="cuda")
        grp[:4] = torch.tensor([0, 1, max_m, 65 % (max_m + 1)], dtype=torch.int32)
    qa, sa = fp8.quantize_grouped_a(x, form)
    return qa, qb.transpose(1, 2), grp, sa, sb


def _fp8_close(out, ref):
    """bf16 output of the fp8 product against float32 of the dequantized operands: 1e-2 of the
    largest value; NaN-poisoned rows no group owns stay NaN."""
    owned = ~torch.isnan(ref)
    if not owned.any():
        return not (~torch.isnan(out)).any().item()
    err = (out[owned].float() - ref[owned]).abs().max().item()
    return (err <= 1e-2 * ref[owned].abs().max().item() + 1e-3 and not torch.isnan(out[owned]).any().item()
            and not (~torch.isnan(out[~owned])).any().item())


# K and N edges: K a multiple of 16 but not of 128 (a partial last scale block), one k-block, N not
# a multiple of 128 (a partial n-block); empty and one-token experts, a skewed one.
_FP8_CONTIG = [
    (8, 4096, 7168, [512, 0, 1, 700, 129, 127, 1500, 64]),
    (6, 136, 208, [0, 1, 129, 0, 300, 1]),
    (4, 264, 128, [1, 0, 255, 64]),
    (16, 520, 1040, [0] * 10 + [1, 2, 3, 130, 0, 17]),
]


@pytest.mark.parametrize("form", ["block", "row"])
def test_fp8_contiguous_every_variant(bundle, form):
    from factory.runtime import grouped

    names = _fp8_variants(bundle, form, "contig")
    if not names:
        pytest.skip(f"no contiguous {form}-scaled fp8 gemm_grouped variant here")
    for name in names:
        for E, N, K, counts in _FP8_CONTIG:
            a, b, offs, sa, sb = _fp8_problem(form, E, N, K, counts=counts, extra=7)
            out = torch.full((a.shape[0], N), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, b, offs=offs, out=out, scale_a=sa, scale_b=sb, variant=name)
            torch.cuda.synchronize()
            assert _fp8_close(out, grouped.reference(a, b, offs=offs, scale_a=sa, scale_b=sb)), (name, E, N, K)


@pytest.mark.parametrize("form", ["block", "row"])
def test_fp8_masked_every_variant(bundle, form):
    from factory.runtime import grouped

    names = _fp8_variants(bundle, form, "masked")
    if not names:
        pytest.skip(f"no masked {form}-scaled fp8 gemm_grouped variant here")
    for name in names:
        for E, N, K, max_m in ((32, 2048, 7168, 96), (8, 136, 208, 70), (4, 264, 128, 1)):
            a, b, mm, sa, sb = _fp8_problem(form, E, N, K, max_m=max_m)
            out = torch.full((E, max_m, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, b, masked_m=mm, out=out, scale_a=sa, scale_b=sb, variant=name)
            torch.cuda.synchronize()
            assert _fp8_close(out, grouped.reference(a, b, masked_m=mm, scale_a=sa, scale_b=sb)), (name, E, N, K)


def test_fp8_selected_and_graph_replay(bundle):
    """The selection's fp8 choice per form and layout, then one CUDA graph of both layouts replayed
    with new routing (device counts only, no host sync)."""
    from factory.runtime import grouped

    if not _fp8_variants(bundle):
        pytest.skip("no fp8 gemm_grouped variant here")
    for form in ("block", "row"):
        if not _fp8_variants(bundle, form, "contig") or not _fp8_variants(bundle, form, "masked"):
            continue
        E, N, K, M = 8, 1024, 2048, 2048
        a, b, offs, sa, sb = _fp8_problem(form, E, N, K, counts=[M // E] * E)
        am, _, mm, sam, _ = _fp8_problem(form, E, N, K, max_m=64)
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        outm = torch.empty(E, 64, N, dtype=torch.bfloat16, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            bundle.grouped_gemm(a, b, offs=offs, out=out, scale_a=sa, scale_b=sb)
            bundle.grouped_gemm(am, b, masked_m=mm, out=outm, scale_a=sam, scale_b=sb, expected_m=4)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            bundle.grouped_gemm(a, b, offs=offs, out=out, scale_a=sa, scale_b=sb)
            bundle.grouped_gemm(am, b, masked_m=mm, out=outm, scale_a=sam, scale_b=sb, expected_m=4)
        for trial in range(2):
            counts = torch.randint(0, 2 * M // E, (E,))
            counts[trial] = 0
            offs.copy_(counts.cumsum(0).clamp(max=M).to(torch.int32))
            mm.copy_(torch.randint(0, 65, (E,), dtype=torch.int32))
            out.fill_(float("nan"))
            outm.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert _fp8_close(out, grouped.reference(a, b, offs=offs, scale_a=sa, scale_b=sb)), form
            assert _fp8_close(outm, grouped.reference(am, b, masked_m=mm, scale_a=sam, scale_b=sb)), form


def test_fp8_refusals_before_launch(bundle):
    """Bad scales (form, dtype, device, layout, alignment) raise InputError before any launch; a
    good call works after them."""
    from factory.runtime.errors import InputError

    if not _fp8_variants(bundle, "block", "contig"):
        pytest.skip("no contiguous block-scaled fp8 gemm_grouped variant here")
    a, b, offs, sa, sb = _fp8_problem("block", 4, 256, 512, counts=[16, 0, 1, 47])
    raw = torch.empty(4 * 64 + 1, device="cuda")
    bad = [
        dict(scale_a=sa),                                   # scale_b missing
        dict(scale_a=sa.cpu(), scale_b=sb),                 # on the host
        dict(scale_a=sa, scale_b=sb.double()),
        dict(scale_a=sa.contiguous(), scale_b=sb),          # K-major scale_a
        dict(scale_a=raw[1:].as_strided((64, 4), (1, 64)), scale_b=sb),  # not 16-byte aligned
        dict(scale_a=sa, scale_b=sb.transpose(1, 2).contiguous().transpose(1, 2)),
        dict(scale_a=sa[:10], scale_b=sb),
        dict(scale_a=sa, scale_b=sb, out=torch.empty(64, 256, device="cuda", dtype=torch.float16)),
    ]
    for kw in bad:
        with pytest.raises(InputError):
            bundle.grouped_gemm(a, b, offs=offs, **kw)
    with pytest.raises(InputError):  # bf16 operands with scales
        bundle.grouped_gemm(a.bfloat16(), b.bfloat16(), offs=offs, scale_a=sa, scale_b=sb)
    assert bundle.grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb).dtype == torch.bfloat16


def test_fx_gemm_grouped_fp8_matches_python(bundle):
    """The C entry with block and row scales (scale_mode, pointers, strides {m, kb, group} /
    {n | nb, kb, group}): Python's output bit for bit; a misaligned block scale_a is refused."""
    import ctypes

    from factory.runtime.manifest import sha256_file
    from factory.runtime.selector import DTYPE, Device, GroupedProblem, Selection, _I64x3, load

    if not _fp8_variants(bundle):
        pytest.skip("no fp8 gemm_grouped variant here")
    path = GPU_BUNDLE / "lib" / "libfactory_bundle.so"
    lib = load(path, sha256_file(path))
    lib.fx_last_error_message.restype = ctypes.c_char_p
    dev = Device()
    assert lib.fx_device_query(torch.cuda.current_device(), ctypes.byref(dev)) == 0
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    E, N, K = 6, 520, 1040
    for form, mode in (("block", 2), ("row", 1)):
        if not _fp8_variants(bundle, form, "contig"):
            continue
        a, b, offs, sa, sb = _fp8_problem(form, E, N, K, counts=[0, 1, 300, 129, 0, 64])
        ref = bundle.grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb)
        c = torch.full_like(ref, float("nan"))
        p = GroupedProblem(DTYPE["e4m3"], DTYPE["bf16"], 0, a.shape[0], N, K, E, a.data_ptr(), _I64x3(K, 1, 0),
                           b.data_ptr(), _I64x3(b.stride(2), b.stride(1), b.stride(0)), c.data_ptr(), _I64x3(N, 1, 0),
                           offs.data_ptr(), None, 0)
        p.scale_mode, p.scale_a, p.scale_b = mode, sa.data_ptr(), sb.data_ptr()
        if form == "block":
            p.scale_a_stride = _I64x3(sa.stride(0), sa.stride(1), 0)
            p.scale_b_stride = _I64x3(sb.stride(1), sb.stride(2), sb.stride(0))
        else:
            p.scale_a_stride = _I64x3(1, 0, 0)
            p.scale_b_stride = _I64x3(sb.stride(1), 0, sb.stride(0))
        sel = Selection()
        rc = lib.fx_gemm_grouped(ctypes.byref(dev), ctypes.byref(p), stream, ctypes.byref(sel))
        assert rc == 0, lib.fx_last_error_message()
        torch.cuda.synchronize()
        assert torch.equal(c.isnan(), ref.isnan()) and torch.equal(c.nan_to_num(), ref.nan_to_num()), sel.name
        if form == "block":
            p.scale_a = sa.data_ptr() + 4  # not 16-byte aligned: FX_ERR_INPUT, nothing launched
            assert lib.fx_gemm_grouped(ctypes.byref(dev), ctypes.byref(p), stream, ctypes.byref(sel)) == -1
            assert b"16-byte" in lib.fx_last_error_message()


def test_moe_example_fp8_checks(bundle):
    """examples/moe_experts.py --fp8 block --check: the prefill projections in fp8 against the
    bf16 layer."""
    if not _fp8_variants(bundle, "block", "contig"):
        pytest.skip("no contiguous block-scaled fp8 gemm_grouped variant here")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "moe_experts.py"), "--bundle", str(GPU_BUNDLE), "--check",
                        "--fp8", "block", "--experts", "16", "--tokens", "512", "--decode-tokens", "16"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-3000:]


# Out-of-range routing for the fp8 forms, every fp8 variant by name: the scale tensors are read per
# owned row and k-block, so offsets past M (or negative, or decreasing) and masked counts past the
# capacity must clamp the scale reads as they clamp a and out.  K 208 (a partial last scale block)
# and N 264 (a partial n-block).
_CHILD_FP8 = r"""
import sys, torch
from factory.runtime import Bundle, fp8, grouped
bundle = Bundle.open(sys.argv[1])
E, N, K, M, CAP = 8, 264, 208, 300, 40
w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
seen = 0
for v in bundle.candidates("gemm_grouped"):
    form = v.get("scale_mode")
    if v["dtypes"]["a"] != "e4m3" or not form:
        continue
    seen += 1
    qb, sb = fp8.quantize_grouped_b(w, form)
    b = qb.transpose(1, 2)
    if v["grouped"] == "contig":
        a, sa = fp8.quantize_grouped_a(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), form)
        for offs in ([100, 50, 400, 2**31 - 1, 0, 300, -5, 10**9], [2**31 - 1] * 8, [-1] * 8, [0] * 7 + [M + 1]):
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, b, offs=torch.tensor(offs, dtype=torch.int32, device="cuda"), out=out,
                                scale_a=sa, scale_b=sb, variant=v["name"])
            torch.cuda.synchronize()
    else:
        a, sa = fp8.quantize_grouped_a(torch.randn(E, CAP, K, device="cuda", dtype=torch.bfloat16), form)
        for mm in ([2**31 - 1] * 8, [-2**31] * 8, [41, 40, 39, -1, 0, 1, 10**9, 7]):
            m = torch.tensor(mm, dtype=torch.int32, device="cuda")
            out = torch.full((E, CAP, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            bundle.grouped_gemm(a, b, masked_m=m, out=out, scale_a=sa, scale_b=sb, variant=v["name"])
            torch.cuda.synchronize()
            ref = grouped.reference(a, b, masked_m=m, scale_a=sa, scale_b=sb)
            owned = ~torch.isnan(ref)
            if owned.any():
                err = (out[owned].float() - ref[owned]).abs().max().item()
                assert err <= 1e-2 * ref[owned].abs().max().item() + 1e-3, (v["name"], mm, err)
            assert not (~torch.isnan(out[~owned])).any().item(), (v["name"], mm)
assert seen, "no fp8 gemm_grouped variant"
a, sa = fp8.quantize_grouped_a(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), "block")
qb, sb = fp8.quantize_grouped_b(w, "block")
o = torch.tensor([0, 1, 40, 100, 150, 200, 290, 300], dtype=torch.int32, device="cuda")
out = bundle.grouped_gemm(a, qb.transpose(1, 2), offs=o, scale_a=sa, scale_b=sb)
torch.cuda.synchronize()
ref = grouped.reference(a, qb.transpose(1, 2), offs=o, scale_a=sa, scale_b=sb)
assert (out.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item() + 1e-3
x = torch.randn(64, 64, device="cuda")
assert torch.allclose(x @ x, (x.double() @ x.double()).float(), atol=1e-3)
print("OK", seen)
"""


def test_fp8_out_of_range_routing_leaves_the_process_usable(bundle):
    """fp8 (row and block scales), every variant by name: offsets past M, negative, decreasing;
    masked counts past the capacity or negative.  Rows and their scale reads are clamped (masked:
    owned rows match float32, the rest stay NaN), then the process computes correctly."""
    if not _fp8_variants(bundle):
        pytest.skip("no fp8 gemm_grouped variant here")
    r = subprocess.run([sys.executable, "-c", _CHILD_FP8, str(GPU_BUNDLE)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().split()[0] == "OK", r.stdout[-1000:] + r.stderr[-3000:]
