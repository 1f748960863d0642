"""Fused GEMM epilogues on the GPU (runtime/epilogue.py): every epilogue variant of the bundle by
name (each field alone and together, tails, a batch, graph replay), the selection's choice at the
Llama-3-8B layer's shapes and at odd edges, the in-place residual, the torch op, and bad inputs
refused before any launch (in a child process, which then still runs a good call).  References:
float32 products of the same operands, then bias, silu(gate)·up, residual in float32; outputs
NaN-poisoned."""

import pytest

from conftest import gpu_marks

pytestmark = gpu_marks()

HIDDEN, INTER = 4096, 14336
# (fields, M, N_out, K): o_proj / down_proj with the residual, gate_up with silu_mul, prefill and decode.
LLAMA = [(("residual",), m, HIDDEN, HIDDEN) for m in (1, 16, 64, 512, 2048)] + \
        [(("residual",), m, HIDDEN, INTER) for m in (1, 64, 2048)] + \
        [(("silu_mul",), m, INTER, HIDDEN) for m in (1, 16, 64, 512, 2048)]
# Edges: M from 1, M and N_out past a tile, N_out not a multiple of 64 (a padded gate/up block), K tails.
EDGES = [(1, 8, 64), (7, 200, 48), (129, 136, 1000), (300, 1000, 4096), (1000, 1032, 1016)]
COMBOS = [("bias",), ("residual",), ("silu_mul",), ("bias", "residual"), ("bias", "silu_mul"),
          ("silu_mul", "residual"), ("bias", "silu_mul", "residual")]


@pytest.fixture(scope="module")
def bundle():
    from conftest import GPU_BUNDLE
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


def _epilogue_entries(bundle):
    out = [v for v in bundle.candidates("gemm") if v.get("epilogue")]
    if not out:
        pytest.skip("no fused-epilogue gemm for this GPU in the bundle")
    return out


def _have(bundle, fields) -> bool:
    return any(v.get("epilogue") == list(fields) for v in _epilogue_entries(bundle))


def _run(bundle, fields, M, n_out, K, L=1):
    import torch

    from factory import testing

    if not _have(bundle, fields):
        pytest.skip(f"no {'+'.join(fields)} variant in the bundle")
    a, b, kw, ref, oshape = testing.epilogue_problem(fields, M, n_out, K, L)
    out = torch.full(oshape, float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.gemm(a, b, out, **kw)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), (fields, M, n_out, K)
    err = testing.rel_error(out, ref)
    assert err < testing.TOLERANCE["bf16"], (fields, M, n_out, K, err)
    # The new-output form selects the same way and gives the same values (silu_mul without out or
    # residual takes I = N / 2: the same I only when I is a multiple of 64).
    if "silu_mul" in fields and "residual" not in fields and n_out % 64:
        return
    got = bundle.gemm(a, b, **kw)
    torch.cuda.synchronize()
    assert got.shape == oshape and testing.rel_error(got, ref) < testing.TOLERANCE["bf16"]


def test_every_epilogue_variant_by_name(bundle, run_record):
    from factory import testing

    for e in _epilogue_entries(bundle):
        results = testing.smoke_gemm(bundle, e) + [testing.check_graph_capture(bundle, e)]
        run_record.add(bundle, e["name"], results)
        for r in results:
            assert r["ok"], r


@pytest.mark.parametrize("fields,M,n_out,K", LLAMA)
def test_llama_shapes_selected(bundle, fields, M, n_out, K):
    _run(bundle, fields, M, n_out, K)


@pytest.mark.parametrize("fields", COMBOS, ids="+".join)
@pytest.mark.parametrize("M,n_out,K", EDGES)
def test_fields_alone_and_together_at_edges(bundle, fields, M, n_out, K):
    _run(bundle, fields, M, n_out, K)


def test_batched(bundle):
    _run(bundle, ("residual",), 130, 264, 200, L=3)


def test_in_place_residual(bundle):
    """``out=h, residual=h``: out = a·bᵀ + h in place (o_proj / down_proj into the residual stream)."""
    import torch

    from factory import testing

    if not _have(bundle, ("residual",)):
        pytest.skip("no residual variant")
    for M, N, K in ((1, 4096, 4096), (129, 1000, 1016), (2048, 4096, 4096)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float().t() + h.float()
        got = bundle.gemm(a, b, h, residual=h)
        torch.cuda.synchronize()
        assert got is h and testing.rel_error(h, ref) < testing.TOLERANCE["bf16"], (M, N, K)
        # A second call on the hot path: h += a·bᵀ again.
        ref2 = a.float() @ b.float().t() + h.float()
        bundle.gemm(a, b, h, residual=h)
        torch.cuda.synchronize()
        assert testing.rel_error(h, ref2) < testing.TOLERANCE["bf16"]


def test_pack_gate_up_matches_vllm_silu_and_mul(bundle):
    """A stacked [gate; up] weight (vLLM's MergedColumnParallelLinear), packed once: the fused call
    equals silu(x·gateᵀ)·(x·upᵀ) as silu_and_mul computes it on the unfused product."""
    import torch
    import torch.nn.functional as F

    from factory import testing
    from factory.runtime.epilogue import pack_gate_up

    if not _have(bundle, ("silu_mul",)):
        pytest.skip("no silu_mul variant")
    M, I, K = 77, 1000, 512
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * I, K, device="cuda", dtype=torch.bfloat16)
    y = x.float() @ w.float().t()
    ref = F.silu(y[:, :I]) * y[:, I:]
    out = torch.full((M, I), float("nan"), device="cuda", dtype=torch.bfloat16)
    bundle.gemm(x, pack_gate_up(w), out, activation="silu_mul")
    torch.cuda.synchronize()
    assert testing.rel_error(out, ref) < testing.TOLERANCE["bf16"]


def test_graph_capture_selected(bundle):
    """The selected variants inside one captured graph (a layer's o_proj + gate_up), replayed on
    new data in the same buffers."""
    import torch

    from factory import testing

    if not (_have(bundle, ("residual",)) and _have(bundle, ("silu_mul",))):
        pytest.skip("needs residual and silu_mul variants")
    M = 16
    a1, b1, kw1, _, _ = testing.epilogue_problem(("residual",), M, HIDDEN, HIDDEN)
    a2, b2, kw2, _, _ = testing.epilogue_problem(("silu_mul",), M, INTER, HIDDEN)
    o1 = bundle.gemm(a1, b1, **kw1)
    o2 = bundle.gemm(a2, b2, **kw2)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o1 = bundle.gemm(a1, b1, **kw1)
        o2 = bundle.gemm(a2, b2, **kw2)
    n1, n2 = testing.epilogue_problem(("residual",), M, HIDDEN, HIDDEN), testing.epilogue_problem(("silu_mul",), M, INTER, HIDDEN)
    for dst, src in ((a1, n1[0]), (b1, n1[1]), (kw1["residual"], n1[2]["residual"]), (a2, n2[0]), (b2, n2[1])):
        dst.copy_(src)
    o1.fill_(float("nan"))
    o2.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert testing.rel_error(o1, n1[3]) < testing.TOLERANCE["bf16"]
    assert testing.rel_error(o2, n2[3]) < testing.TOLERANCE["bf16"]


def test_torch_op_and_compile(bundle):
    import torch

    from factory import testing

    if not _have(bundle, ("residual",)):
        pytest.skip("no residual variant")
    ops = bundle.torch_ops()
    a, b, kw, ref, _ = testing.epilogue_problem(("residual",), 64, 1024, 512)
    got = ops.gemm_epilogue(a, b, None, kw["residual"])
    torch.cuda.synchronize()
    assert testing.rel_error(got, ref) < testing.TOLERANCE["bf16"]
    f = torch.compile(lambda x, w, r: bundle.gemm(x, w, residual=r), fullgraph=True)
    got = f(a, b, kw["residual"])
    torch.cuda.synchronize()
    assert testing.rel_error(got, ref) < testing.TOLERANCE["bf16"]


def test_bad_inputs_refused_before_launch():
    """Each bad call raises InputError / NoVariantError (no launch), in a child process that then
    runs a good call and checks its values: the CUDA context survived."""
    from children import python
    from conftest import GPU_BUNDLE

    r = python(300, f"""
        import torch
        from factory import testing
        from factory.runtime import Bundle
        from factory.runtime.errors import InputError, NoVariantError
        bundle = Bundle.open({str(GPU_BUNDLE)!r})
        bf = dict(device="cuda", dtype=torch.bfloat16)
        a, b = torch.randn(64, 256, **bf), torch.randn(512, 256, **bf)
        out = torch.empty(64, 512, **bf)
        big = torch.empty(64 * 512 + 8, **bf)
        bad = [
            dict(bias=torch.randn(511, **bf)),                               # bias shape
            dict(bias=torch.randn(512, device="cuda", dtype=torch.float16)),  # bias dtype
            dict(bias=torch.randn(1024, **bf)[::2]),                          # bias stride
            dict(bias=torch.randn(512, dtype=torch.bfloat16)),                # bias on the CPU
            dict(residual=torch.randn(64, 511, **bf)),                        # residual shape
            dict(residual=torch.randn(512, 64, **bf).t()),                    # residual layout
            dict(residual=big[:64 * 512].view(64, 512), out=big[8:64 * 512 + 8].view(64, 512)),  # overlap, not in place
            dict(activation="gelu"),
            dict(activation="silu_mul", out=torch.empty(64, 100, **bf)),      # b not packed for 100 outputs
            dict(bias=torch.randn(512, **bf), out=out, residual=None, variant="no_such_variant"),
            dict(residual=torch.randn(64, 512, **bf), out_dtype=torch.float8_e4m3fn),  # e4m3 out with a residual
            dict(out_dtype=torch.float8_e4m3fn, scale_out=torch.empty(3, 64, device="cuda").t()),  # scale_out shape
            dict(out_dtype=torch.float8_e4m3fn, scale_out=torch.empty(64, 4, device="cuda")),  # not M-major
            dict(scale_out=torch.empty(8, 64, device="cuda").t()[:, :4]),       # scale_out without an e4m3 out
        ]
        for i, kw in enumerate(bad):
            o = kw.pop("out", None)
            try:
                bundle.gemm(a, b, o, **kw)
            except (InputError, NoVariantError) as e:
                print("refused", i, type(e).__name__, str(e)[:80])
            else:
                raise SystemExit("case %d was not refused" % i)
        a2, b2, kw, ref, _ = testing.epilogue_problem(("residual",), 64, 512, 256)
        got = bundle.gemm(a2, b2, **kw)
        torch.cuda.synchronize()
        assert testing.rel_error(got, ref) < testing.TOLERANCE["bf16"]
        print("GOOD")
    """)
    assert r.returncode == 0 and "GOOD" in r.stdout, r.stdout + r.stderr


# --- e4m3 output with a scale per row and 128 columns (fp8_groups) -----------------------------------
def _e4m3_ordinal(q):
    """Sign-magnitude e4m3 codes as integers in value order (+0 and -0 both 0)."""
    import torch

    u = q.view(torch.uint8).to(torch.int32)
    return torch.where(u >= 128, -(u - 128), u)


def _e4m3_steps(out, ref) -> int:
    """The largest distance in e4m3 steps between two code tensors, one step less where both codes
    lie within 16 codes of zero (below 2^-5 of the unit, 1/14336 of the group's largest value):
    there an e4m3 step (2^-9 of the scale) is smaller than the fp32 accumulation's error of the
    group's large products (H100, 2048x14336x4096 silu_mul: ~3e-3 of the scale, found at values
    1/10000 of their group's amax, two steps off torch's codes; the scales agree to 1e-5)."""
    import torch

    a, b = _e4m3_ordinal(out), _e4m3_ordinal(ref)
    d = (a - b).abs()
    return int(torch.where((a.abs() <= 16) & (b.abs() <= 16), (d - 1).clamp(min=0), d).max().item())


def _groups_ref(acc):
    """torch's quantisation of float32 values per row and 128 columns: (codes, scales)."""
    import torch

    from factory.runtime.epilogue import FP8_GROUP, FP8_MAX, FP8_MIN_SCALE

    M, n = acc.shape
    ng = -(-n // FP8_GROUP)
    pad = torch.zeros(M, ng * FP8_GROUP, device=acc.device)
    pad[:, :n] = acc
    g = pad.view(M, ng, FP8_GROUP)
    scale = (g.abs().amax(dim=2) / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    q = (g / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(M, -1)[:, :n]
    return q, scale


def _fp8_groups_entries(bundle):
    return [v for v in _epilogue_entries(bundle) if "fp8_groups" in (v.get("epilogue") or [])]


@pytest.mark.parametrize("M,n_out,K", [(1, 14336, 4096), (37, 208, 1000), (300, 1008, 512), (2048, 14336, 4096)])
def test_fp8_groups_codes_within_one_step(bundle, M, n_out, K):
    """SiLU(gate)·up (or the plain product) quantised per row and 128 columns in the epilogue:
    codes within one e4m3 step of torch's quantisation of the float32 result, scales within 1 %,
    NaN-poisoned outputs and scales all written, selected and by name.  (Every fp8_groups
    variant's run record comes from test_every_epilogue_variant_by_name.)"""
    import torch

    from factory import testing

    entries = [e for e in _fp8_groups_entries(bundle) if e["dtypes"]["a"] == "bf16"]
    if not entries:
        pytest.skip("no bf16 fp8_groups variant in the bundle")
    for e in entries + [None]:  # each by name, then the selection's choice for the first one's fields
        fields = tuple(f for f in (e or entries[0])["epilogue"] if f != "fp8_groups")
        a, b, kw, acc, _ = testing.epilogue_problem(fields, M, n_out, K)
        q_ref, s_ref = _groups_ref(acc)
        out = torch.full((M, n_out), float("nan"), device="cuda").to(torch.float8_e4m3fn)
        from factory.runtime.epilogue import new_scale_out

        so = new_scale_out(a, M, n_out).fill_(float("nan"))
        got, so2 = bundle.gemm(a, b, out, scale_out=so, variant=e["name"] if e else None, **kw)
        torch.cuda.synchronize()
        assert got is out and so2 is so
        assert not torch.isnan(so).any() and not torch.isnan(out.float()).any(), (e, M, n_out)
        assert ((so - s_ref).abs() / s_ref).max() < 1e-2, (e, M, n_out)
        d = _e4m3_steps(out, q_ref)
        assert d <= 1, (e, M, n_out, d)
        deq = out.float() * so.repeat_interleave(128, dim=1)[:, :n_out]
        assert testing.rel_error(deq, acc) < 4e-2
        # The new-output form: (out, scale_out) with scale_out in the block-scaled GEMM's layout
        # (silu_mul takes I = N / 2 without out: the same I only for whole gate/up blocks).
        if "silu_mul" in fields and n_out % 64:
            continue
        got, s3 = bundle.gemm(a, b, out_dtype=torch.float8_e4m3fn, **kw)
        torch.cuda.synchronize()
        assert s3.stride() == (1, -(-M // 4) * 4) and _e4m3_steps(got, q_ref) <= 1


def test_fp8_groups_feed_the_block_scaled_gemm(bundle):
    """gate/up + SiLU·up written as e4m3 with 1x128 scales, then the down projection reads it as
    block-scaled a (scale_a = the epilogue's scale_out, no conversion): against float32."""
    import torch

    from factory import testing
    from factory.runtime import fp8
    from factory.runtime.epilogue import pack_gate_up

    if not (_have(bundle, ("silu_mul", "fp8_groups"))
            and any(v.get("scale_mode") == "block" for v in bundle.candidates("gemm"))):
        pytest.skip("needs a silu_mul + fp8_groups variant and a block-scaled gemm")
    M, I, H = 256, 1024, 512
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    wgu = torch.randn(2 * I, H, device="cuda", dtype=torch.bfloat16) / H ** 0.5
    wd = torch.randn(H, I, device="cuda") / I ** 0.5
    wq, ws = fp8.quantize_blockwise(wd, (128, 128))
    q, sq = bundle.gemm(x, pack_gate_up(wgu), activation="silu_mul", out_dtype=torch.float8_e4m3fn)
    y = bundle.gemm(q, wq, scale_a=sq, scale_b=ws)
    torch.cuda.synchronize()
    h = x.float() @ wgu.float().t()
    ref = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ fp8.dequantize_blockwise(wq, ws).t()
    err = testing.rel_error(y, ref)
    assert err < 5e-2, err


def _rows_ref(acc):
    """torch's row-wise quantisation of float32 values: (codes, scales (M, 1))."""
    import torch

    from factory.runtime.epilogue import FP8_MAX, FP8_MIN_SCALE

    s = (acc.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    return (acc / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s


@pytest.mark.parametrize("M,n", [(1, 16), (37, 272), (300, 4096), (129, 14336), (64, 16384)])
def test_fp8_rows_codes_within_one_step(bundle, run_record, M, n):
    """bundle.fp8_rows on torch's group codes (rows whose groups differ in magnitude by up to 2^12,
    a zero group, a zero row): the row scale equals torch's row-wise scale, the codes are within one
    e4m3 step of torch's row-wise quantisation of the float32 values; into a NaN-poisoned out and
    in place; then torch._scaled_mm's row-wise product from (codes, scale) against float32."""
    import torch

    if not bundle.candidates("fp8_rows"):
        pytest.skip("no fp8_rows variant in the bundle")
    gen = torch.Generator(device="cuda").manual_seed(M * 131 + n)
    ng = -(-n // 128)
    mag = 2.0 ** torch.randint(-6, 7, (M, ng), device="cuda", generator=gen).float()
    x = torch.randn(M, n, device="cuda", generator=gen) * mag.repeat_interleave(128, dim=1)[:, :n]
    if ng > 1:
        x[:, 128:256] = 0.0
    x[M // 2] = 0.0
    qg, sg = _groups_ref(x)
    from factory.runtime.epilogue import new_scale_out

    gs = new_scale_out(x, M, n)
    gs.copy_(sg)
    q_ref, s_ref = _rows_ref(x)
    out = torch.full((M, n), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    got, s = bundle.fp8_rows(qg, gs, out=out)
    torch.cuda.synchronize()
    assert got is out and s.shape == (M, 1) and not torch.isnan(out.float()).any()
    assert torch.equal(s, s_ref), (s - s_ref).abs().max()
    steps = (_e4m3_ordinal(out) - _e4m3_ordinal(q_ref)).abs().max().item()
    deq = out.float() * s
    err = ((deq - x).abs().max() / x.abs().max().clamp_min(1e-30)).item()
    # One e4m3 step at the top binade is 32 / 448 of the row's amax: within one step of torch's
    # codes is at most 1.5 steps from the exact value.
    tol = 1.5 * 32 / 448
    ok = steps <= 1 and err < tol
    run_record.add(bundle, bundle.selections[("fp8_rows", ("e4m3", n))],
                   [{"rel_err": err, "tol": tol, "ok": ok}])
    assert steps <= 1, steps
    assert err < tol, err
    q2, s2 = bundle.fp8_rows(qg, gs, out=qg)  # in place
    torch.cuda.synchronize()
    assert q2 is qg and torch.equal(qg.view(torch.uint8), out.view(torch.uint8)) and torch.equal(s2, s)
    if n % 16 == 0 and M % 16 == 0 and hasattr(torch, "_scaled_mm"):
        w = torch.randn(256, n, device="cuda", generator=gen)
        sw = (w.abs().amax(dim=1, keepdim=True) / 448.0).t().contiguous()
        wq = (w / sw.t()).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(out, wq.t(), scale_a=s, scale_b=sw, out_dtype=torch.bfloat16)
        from factory import testing

        assert testing.rel_error(y, x @ w.t()) < 6e-2


@pytest.mark.parametrize("M,n_out,K,silu", [(1, 14336, 4096, True), (37, 208, 1000, False),
                                             (256, 14336, 4096, True), (2048, 14336, 4096, True)])
def test_gemm_row_scales(bundle, M, n_out, K, silu):
    """gemm(..., out_dtype=e4m3, row_scales=True): the group epilogue then fp8_rows in place;
    codes within one e4m3 step of torch's row-wise quantisation of the float32 result, the row
    scale within 1 %, a graph replay on new data, and torch._scaled_mm's row-wise down projection
    from it against float32."""
    import torch

    from factory import testing

    fields = ("silu_mul",) if silu else ()
    if not bundle.candidates("fp8_rows") or not _have(bundle, (*fields, "fp8_groups")):
        pytest.skip("needs fp8_rows and a fp8_groups variant")
    a, b, kw, acc, _ = testing.epilogue_problem(fields, M, n_out, K)
    if silu and n_out % 64:
        pytest.skip("silu_mul without out takes I = N / 2")
    q, s = bundle.gemm(a, b, out_dtype=torch.float8_e4m3fn, row_scales=True, **kw)
    torch.cuda.synchronize()
    q_ref, s_ref = _rows_ref(acc)
    assert q.shape == (M, n_out) and s.shape == (M, 1)
    assert ((s - s_ref).abs() / s_ref).max() < 1e-2
    assert _e4m3_steps(q, q_ref) <= 1
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q3, s3 = bundle.gemm(a, b, out_dtype=torch.float8_e4m3fn, row_scales=True, **kw)
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    h = a.float() @ b.float().t()
    q_ref2, _ = _rows_ref(testing.silu_mul_ref(h, n_out) if silu else h)
    assert _e4m3_steps(q3, q_ref2) <= 1
    if M % 16 == 0:
        w = torch.randn(512, n_out, device="cuda") / n_out ** 0.5
        sw = (w.abs().amax(dim=1, keepdim=True) / 448.0).t().contiguous()
        wq = (w / sw.t()).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(q, wq.t(), scale_a=s, scale_b=sw, out_dtype=torch.bfloat16)
        assert testing.rel_error(y, acc @ w.t()) < 6e-2
