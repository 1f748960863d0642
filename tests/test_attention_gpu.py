"""FlashAttention forward on a GPU, through a built bundle (builds nothing).

Opens the bundle at ``$FACTORY_BUNDLE`` (default ``artifacts/default``) and compares against a
float32 reference (GQA by index, bottom-right causal, LSE) and, where the semantics agree, torch
SDPA: our error against the fp32 reference must be small in absolute terms and not much worse than
SDPA's own.  Outputs and LSE are NaN-poisoned before launches that write into caller buffers, and
inputs sit inside NaN-filled storage where a kernel reading past a sequence would pick them up.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = Path(os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Relative L2 error against the fp32 reference.
TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not b.candidates("attention"):
        pytest.skip(f"{BUNDLE} has no attention variant for this device")
    return b


# --- reference ----------------------------------------------------------------------------------
def reference(q, k, v, causal, scale, batch_chunk: int = 16):
    """fp32 attention, (B, S, H, D) inputs; returns o (B, Sq, Hq, D) and lse (B, Hq, Sq).  Computed
    ``batch_chunk`` sequences at a time (a 256-sequence decode batch fits in memory)."""
    from factory.testing import attention_reference

    parts = [attention_reference(q[i:i + batch_chunk], k[i:i + batch_chunk], v[i:i + batch_chunk], causal, scale)
             for i in range(0, q.shape[0], batch_chunk)]
    return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])


def rel_err(x, ref):
    return ((x.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def check(o, lse, ref_o, ref_lse, dtype, what):
    assert not o.isnan().any(), f"{what}: NaN in o"
    assert not lse.isnan().any(), f"{what}: NaN in lse"
    e = rel_err(o, ref_o)
    assert e < TOL[dtype], f"{what}: relative error {e:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{what}: -inf LSE rows differ"
    # o is (B, S, H, D), the masks (B, H, S): rows with no visible key must be exactly 0.
    assert (o.transpose(1, 2)[empty] == 0).all(), f"{what}: rows with no key are not 0"
    if (~empty).any():
        lerr = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert lerr < 2e-2, f"{what}: LSE error {lerr:.2e}"


def rand(*shape, dtype, gen):
    return torch.randn(*shape, dtype=torch.float32, device="cuda", generator=gen).to(dtype)


def poisoned(shape, dtype, pad_rows, gen):
    """A (B, S, H, D) tensor whose storage continues with NaN rows after S in every batch."""
    b, s, h, d = shape
    big = torch.full((b, s + pad_rows, h, d), math.nan, dtype=dtype, device="cuda")
    big[:, :s] = rand(b, s, h, d, dtype=dtype, gen=gen)
    return big[:, :s]


# --- dense --------------------------------------------------------------------------------------
DENSE = [
    # (B, Sq, Sk, Hq, Hkv)
    (2, 256, 256, 8, 8),
    (1, 100, 300, 8, 2),     # Sq < Sk, GQA 4
    (2, 300, 100, 8, 1),     # Sq > Sk (causal: rows with no key), MQA 8
    (1, 1, 777, 4, 4),       # decode-like row
    (3, 129, 65, 4, 4),      # one past a tile
    (1, 1000, 1000, 2, 2),   # many key tiles (the cp.async ring wraps)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", DENSE, ids=lambda s: "x".join(map(str, s)))
def test_dense(bundle, dtype, d, causal, shape):
    b, sq, sk, hq, hkv = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((sq, sk, hq, hkv, d)) % 2**31)
    q = poisoned((b, sq, hq, d), dtype, 7, gen)
    k = poisoned((b, sk, hkv, d), dtype, 9, gen)
    v = poisoned((b, sk, hkv, d), dtype, 9, gen)
    scale = 1.0 / math.sqrt(d)
    o, lse = bundle.attention(q, k, v, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    ref_o, ref_lse = reference(q, k, v, causal, scale)
    check(o, lse, ref_o, ref_lse, dtype, f"dense {shape} d{d} causal={causal}")
    # SDPA's causal mask is top-left aligned: compare only where that agrees with ours.
    if not causal or sq == sk:
        sd = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
            enable_gqa=hq != hkv).transpose(1, 2)
        ours, theirs = rel_err(o, ref_o), rel_err(sd, ref_o)
        assert ours <= 2 * theirs + 1e-3, f"ours {ours:.2e} vs SDPA {theirs:.2e}"


def test_strided_qkv_and_scale(bundle):
    """q/k/v as views of one packed (B, S, 3, H, D) projection; a non-default scale."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    qkv = rand(2, 200, 3, 4, 128, dtype=torch.bfloat16, gen=gen)
    q, k, v = qkv.unbind(2)
    o, lse = bundle.attention(q, k, v, causal=True, softmax_scale=0.3, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, True, 0.3)
    check(o, lse, ref_o, ref_lse, torch.bfloat16, "packed qkv")


def test_poisoned_outputs(bundle):
    """Every element of o and lse is written, including rows with no visible key."""
    from factory.runtime.attention import _choose

    gen = torch.Generator(device="cuda").manual_seed(2)
    b, sq, sk, h, d = 2, 200, 70, 4, 64
    q, k, v = (rand(b, s, h, d, dtype=torch.bfloat16, gen=gen) for s in (sq, sk, sk))
    o = torch.full_like(q, math.nan)
    lse = torch.full((b, h, sq), math.nan, device="cuda")
    name, splits = _choose(bundle, "bf16", d, True, False, b * h * sq, (b, h, h, sq, sk))
    assert splits == 1  # (one key tile: nothing to split)
    bundle.launch(name, [q, k, v, o, lse, 0.125])
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, True, 0.125)
    assert torch.isinf(ref_lse).any()  # rows 0..129 see no key (bottom-right causal)
    check(o, lse, ref_o, ref_lse, torch.bfloat16, "poisoned")


# --- varlen -------------------------------------------------------------------------------------
VARLEN = [
    # (q lengths, k lengths, Hq, Hkv)
    ([1, 17, 128, 300, 64], [1, 17, 128, 300, 64], 8, 8),
    ([5, 200, 1, 129], [77, 64, 500, 3], 8, 2),
    ([40, 40], [0, 33], 4, 1),  # a sequence with no keys
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", range(len(VARLEN)))
def test_varlen(bundle, dtype, d, causal, case):
    lq, lk, hq, hkv = VARLEN[case]
    gen = torch.Generator(device="cuda").manual_seed(100 + case)
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tq, tk = sum(lq), sum(lk)
    # NaN tokens after the last sequence: a read past any k/v sequence end would show.
    q = rand(tq, hq, d, dtype=dtype, gen=gen)
    kbig = torch.full((tk + 16, hkv, d), math.nan, dtype=dtype, device="cuda")
    vbig = kbig.clone()
    kbig[:tk] = rand(tk, hkv, d, dtype=dtype, gen=gen)
    vbig[:tk] = rand(tk, hkv, d, dtype=dtype, gen=gen)
    k, v = kbig[:tk], vbig[:tk]
    o, lse = bundle.attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                              max_seqlen_q=max(lq), max_seqlen_k=max(lk), return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and lse.shape == (hq, tq)
    for i in range(len(lq)):
        qs, ks = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
        ref_o, ref_lse = reference(q[None, qs], k[None, ks], v[None, ks], causal, 1 / math.sqrt(d))
        check(o[None, qs], lse[None, :, qs], ref_o, ref_lse, dtype, f"varlen case {case} seq {i}")


def test_varlen_matches_dense(bundle):
    """One sequence through both paths: each matches float32, and they give the same bits."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (rand(1, 333, 4, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    cu = torch.tensor([0, 333], dtype=torch.int32, device="cuda")
    od, ld = bundle.attention(q, k, v, causal=True, return_lse=True)
    ov, lv = bundle.attention(q[0], k[0], v[0], causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, True, 1 / math.sqrt(128))
    check(od, ld, ref_o, ref_lse, torch.bfloat16, "dense")
    check(ov[None], lv[None], ref_o, ref_lse, torch.bfloat16, "varlen")
    assert torch.equal(od[0], ov)


def test_errors(bundle):
    bf = dict(dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(1, 8, 4, 128, **bf)
    with pytest.raises(ValueError, match="head_dim"):
        bundle.attention(torch.zeros(1, 8, 4, 96, **bf), *(torch.zeros(1, 8, 4, 96, **bf),) * 2)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        bundle.attention(q, *(torch.zeros(1, 8, 3, 128, **bf),) * 2)
    with pytest.raises(ValueError, match="aligned|multiples"):
        flat = torch.zeros(8 * 4 * 128 + 1, **bf)[1:].view(1, 8, 4, 128)
        bundle.attention(flat, q, q)


def test_cuda_graph_capture(bundle):
    """The launch path is capturable: a graph replay gives the eager result (varlen with
    max_seqlen_q given, so nothing syncs)."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (rand(300, 4, 64, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200)
    eager = bundle.attention(q, k, v, **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bundle.attention(q, k, v, **kw)  # warm up (loads the module) outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = bundle.attention(q, k, v, return_lse=True, **kw)
    q.copy_(rand(300, 4, 64, dtype=torch.bfloat16, gen=gen))
    out.fill_(math.nan)
    lse.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    for i in range(2):  # the replay against float32, sequence by sequence, for the new q
        s_ = slice(cu[i].item(), cu[i + 1].item())
        ref_o, ref_lse = reference(q[None, s_], k[None, s_], v[None, s_], True, 1 / math.sqrt(64))
        check(out[None, s_], lse[None, :, s_], ref_o, ref_lse, torch.bfloat16, f"graph replay, sequence {i}")
    assert torch.equal(out, bundle.attention(q, k, v, **kw))
    assert not torch.equal(out, eager)


def test_every_variant(bundle):
    """Every attention variant in the bundle runnable here (alternative tiles and stage counts
    too, not only the ones selection prefers), launched by name on shapes with tails, GQA and
    seqlen_q != seqlen_k."""
    from factory.runtime.attention import dense_workspace

    gen = torch.Generator(device="cuda").manual_seed(5)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    failures = []
    for e in bundle.candidates("attention"):
        if e.get("splits", 1) > 1:
            continue  # test_split_variants_by_name
        dtype, d, causal = dt[e["dtype"]], e["head_dim"], e["causal"]
        scale = 0.7 / math.sqrt(d)
        if not e["varlen"]:
            b, sq, sk, hq, hkv = 2, 333, 517, 6, 2
            q, k, v = (rand(b, s, h, d, dtype=dtype, gen=gen) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
            o = torch.full_like(q, math.nan)
            lse = torch.full((b, hq, sq), math.nan, device="cuda")
            bundle.launch(e["name"], [q, k, v, o, lse, *dense_workspace(torch, e, q), scale])
            ref_o, ref_lse = reference(q, k, v, causal, scale)
            pieces = [(o, lse, ref_o, ref_lse)]
        else:
            lq, lk, hq, hkv = [130, 1, 77], [64, 300, 77], 4, 4
            cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(ls)], dtype=torch.int32, device="cuda")
                          for ls in (lq, lk))
            q = rand(208, hq, d, dtype=dtype, gen=gen)
            k, v = (rand(441, hkv, d, dtype=dtype, gen=gen) for _ in range(2))
            o = torch.full_like(q, math.nan)
            lse = torch.full((hq, 208), math.nan, device="cuda")
            bundle.launch(e["name"], [q, k, v, o, lse, *dense_workspace(torch, e, q), cu_q, cu_k, scale, max(lq)])
            pieces = []
            for i in range(3):
                qs = slice(cu_q[i].item(), cu_q[i + 1].item())
                ks = slice(cu_k[i].item(), cu_k[i + 1].item())
                ref_o, ref_lse = reference(q[None, qs], k[None, ks], v[None, ks], causal, scale)
                pieces.append((o[None, qs], lse[None, :, qs], ref_o, ref_lse))
        torch.cuda.synchronize()
        for oo, ll, ro, rl in pieces:
            try:
                check(oo, ll, ro, rl, dtype, e["name"])
            except AssertionError as err:
                failures.append(str(err).splitlines()[0])
                break
    assert not failures, failures


# --- split-KV (flash-decoding) ------------------------------------------------------------------
DECODE = [
    # (B, Sq, Sk, Hq, Hkv)
    (1, 1, 1, 8, 8),          # one key
    (2, 1, 777, 32, 8),       # GQA 4, a key tail
    (8, 1, 4096, 32, 8),      # the bench's decode step (packed GQA, 4 splits)
    (1, 1, 16384, 32, 4),     # GQA 8, long keys (packed, 16 splits)
    (1, 1, 4096, 16, 16),     # no GQA: plain split-KV
    (1, 4, 4096, 16, 16),     # Sq 4
    (2, 4, 16384, 32, 8),     # Sq 4, GQA 4
    (1, 4, 777, 8, 1),        # MQA, short keys (no split)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s)))
def test_decode(bundle, dtype, d, causal, shape):
    """Decode shapes through bundle.attention (its split-KV choice), inputs in NaN-padded
    storage, twice (the second call takes the dense hot path)."""
    b, sq, sk, hq, hkv = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((b, sq, sk, hq, hkv, d)) % 2**31)
    q = poisoned((b, sq, hq, d), dtype, 3, gen)
    k = poisoned((b, sk, hkv, d), dtype, 9, gen)
    v = poisoned((b, sk, hkv, d), dtype, 9, gen)
    ref_o, ref_lse = reference(q, k, v, causal, 1.0 / math.sqrt(d))
    for attempt in ("first", "hot path"):
        o, lse = bundle.attention(q, k, v, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        assert o.shape == q.shape and lse.shape == (b, hq, sq)
        check(o, lse, ref_o, ref_lse, dtype, f"decode {shape} d{d} causal={causal} ({attempt})")


def _split_case(e, b, sq, sk, hq, hkv, gen):
    from factory.runtime.attention import split_workspace

    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[e["dtype"]]
    d = e["head_dim"]
    q = poisoned((b, sq, hq, d), dt, 3, gen)
    k = poisoned((b, sk, hkv, d), dt, 9, gen)
    v = poisoned((b, sk, hkv, d), dt, 9, gen)
    o = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda")
    ws = split_workspace(torch, q, e["splits"])
    for w in ws:
        w.fill_(math.nan)
    scale = 0.7 / math.sqrt(d)
    bundle_args = [q, k, v, o, lse, *ws, scale]
    ref_o, ref_lse = reference(q, k, v, e["causal"], scale)
    return bundle_args, (o, lse, ref_o, ref_lse, dt)


def test_split_variants_by_name(bundle):
    """Every split-KV variant launched by name with NaN-poisoned o, lse and workspace: causal
    rows with no key (Sq > Sk), splits with empty key ranges (few tiles, 16 splits), Sq 1 and 4,
    key tails; packed-GQA variants (Sq 1 only) with GQA 1/4/8 and a group larger than the tile."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    splits = [e for e in bundle.candidates("attention") if e.get("splits", 1) > 1]
    if not splits:
        pytest.skip("the bundle has no split-KV variant")
    failures = []
    for e in splits:
        if e.get("pack_gqa"):
            cases = [(2, 1, 777, 8, 2), (1, 1, 4096, 16, 2), (1, 1, 1, 4, 1), (1, 1, 300, 128, 1),
                     (3, 1, 129, 4, 4)]
        else:
            cases = [(1, 70, 40, 4, 2), (2, 4, 777, 8, 2), (1, 1, 4096, 4, 4), (2, 1, 1, 4, 1),
                     (1, 130, 1000, 2, 2)]
        for case in cases:
            args, (o, lse, ref_o, ref_lse, dt) = _split_case(e, *case, gen)
            bundle.launch(e["name"], args)
            torch.cuda.synchronize()
            try:
                check(o, lse, ref_o, ref_lse, dt, f"{e['name']} {case}")
            except AssertionError as err:
                failures.append(str(err).splitlines()[0])
    assert not failures, failures


def test_decode_graph_capture(bundle):
    """A split-KV decode step (two kernels and a workspace allocation) under CUDA-graph capture:
    replay with new q gives the eager result for the new q."""
    from factory.runtime.attention import _choose

    gen = torch.Generator(device="cuda").manual_seed(7)
    b, hq, hkv, sk, d = 8, 32, 8, 4096, 128
    e = {"name": _choose(bundle, "bf16", d, True, False, b * hq, (b, hq, hkv, 1, sk))[0]}
    q = rand(b, 1, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (rand(b, sk, hkv, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bundle.attention(q, k, v, causal=True)  # warm up (module load, choice) outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = bundle.attention(q, k, v, causal=True, return_lse=True)
    q.copy_(rand(b, 1, hq, d, dtype=torch.bfloat16, gen=gen))
    out.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, True, 1.0 / math.sqrt(d))
    check(out, lse, ref_o, ref_lse, torch.bfloat16, f"graph replay ({e['name']})")
    assert torch.equal(out, bundle.attention(q, k, v, causal=True))
