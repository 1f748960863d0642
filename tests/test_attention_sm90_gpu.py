"""The Hopper attention family on an H100, through a built bundle (builds nothing): every sm_90a
attention variant by name against float32 (dense and packed variable-length), and
``bundle.attention`` choosing it for prefill.

Opens ``$FACTORY_BUNDLE`` (default ``artifacts/default``).  Inputs sit inside NaN-filled storage
(a TMA box reading past a sequence would pick NaN up), outputs and LSE are NaN-poisoned, causal
masks are bottom-right aligned (Sq > Sk leaves rows with no key: o = 0, lse = -inf).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (B, Sq, Sk, Hq, Hkv): tails of every tile size, GQA 1/3/4/8, Sq != Sk both ways, one query,
# a row block past Sq, many key tiles.
SHAPES = [
    (2, 256, 256, 8, 8),
    (1, 100, 300, 8, 2),
    (2, 300, 100, 8, 1),
    (1, 1, 777, 4, 4),
    (3, 129, 65, 4, 4),
    (2, 333, 517, 6, 2),
    (1, 1000, 1000, 2, 2),
    (1, 200, 70, 3, 1),
]


@pytest.fixture(scope="module")
def bundle(gpu_bundle):
    from factory.runtime import Bundle

    b = Bundle.open(gpu_bundle)
    if not any(e["target"] == "sm_90a" for e in b.candidates("attention")):
        pytest.skip(f"{gpu_bundle} has no sm_90a attention variant runnable here (needs an H100)")
    return b


def _poisoned(shape, dtype, pad, gen):
    b, s, h, d = shape
    big = torch.full((b, s + pad, h, d), math.nan, dtype=dtype, device="cuda")
    big[:, :s] = torch.randn(b, s, h, d, generator=gen, device="cuda").to(dtype)
    return big[:, :s]


def _check(o, lse, q, k, v, causal, scale, what):
    from factory.testing import TOLERANCE, attention_reference, rel_error

    ref_o, ref_lse = attention_reference(q, k, v, causal, scale)
    assert not o.isnan().any() and not lse.isnan().any(), f"{what}: NaN in o or lse"
    err = rel_error(o, ref_o)
    tol = TOLERANCE["bf16" if q.dtype == torch.bfloat16 else "f16"]
    assert err < tol, f"{what}: relative error {err:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{what}: -inf LSE rows differ"
    assert (o.transpose(1, 2)[empty] == 0).all(), f"{what}: rows with no key are not 0"
    if (~empty).any():
        lerr = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert lerr < 2e-2, f"{what}: LSE error {lerr:.2e}"


# Packed batches: (q lengths, k lengths, Hq, Hkv): a one-token sequence, tails, a sequence with no
# keys (o = 0, lse = -inf), Sq != Sk per sequence, GQA.
VARLEN = [
    ([1, 17, 130, 300, 64], [1, 17, 130, 300, 64], 8, 8),
    ([5, 200, 1, 129], [77, 64, 500, 3], 8, 2),
    ([40, 40], [0, 33], 4, 1),
]


def _varlen_case(bundle, e, lq, lk, hq, hkv, gen, failures):
    """Launch a varlen variant by name on a packed batch whose k/v storage continues with NaN
    tokens, o and lse NaN-poisoned; check every sequence."""
    from factory.runtime.attention import dense_workspace

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[e["dtype"]]
    d, scale = e["head_dim"], 0.7 / math.sqrt(e["head_dim"])
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32,
                               device="cuda") for ls in (lq, lk))
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, hq, d, generator=gen, device="cuda").to(dtype)
    kv = torch.full((2, tk + 16, hkv, d), math.nan, dtype=dtype, device="cuda")
    kv[:, :tk] = torch.randn(2, tk, hkv, d, generator=gen, device="cuda").to(dtype)
    k, v = kv[0, :tk], kv[1, :tk]
    o = torch.full_like(q, math.nan)
    lse = torch.full((hq, tq), math.nan, device="cuda")
    # (a dynamic variant's tile counters after lse: dense_workspace)
    bundle.launch(e["name"], [q, k, v, o, lse, *dense_workspace(torch, e, q), cu_q, cu_k, scale, max(lq)])
    torch.cuda.synchronize()
    for i in range(len(lq)):
        qs = slice(cu_q[i].item(), cu_q[i + 1].item())
        ks = slice(cu_k[i].item(), cu_k[i + 1].item())
        try:
            _check(o[None, qs], lse[None, :, qs], q[None, qs], k[None, ks], v[None, ks],
                   e["causal"], scale, f"{e['name']} {(lq, lk)} sequence {i}")
        except AssertionError as err:
            failures.append(str(err).splitlines()[0])


def _launch_each(bundle, entries, shapes, varlen_shapes, gen):
    """Launch each entry by name on every dense shape (or packed varlen batch) with NaN-poisoned
    outputs and check it against float32; one assertion listing every failure."""
    from factory.runtime.attention import dense_workspace

    dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    failures = []
    for e in entries:
        if e["varlen"]:
            for lq, lk, hq, hkv in varlen_shapes:
                _varlen_case(bundle, e, lq, lk, hq, hkv, gen, failures)
            continue
        dtype, d, causal = dt[e["dtype"]], e["head_dim"], e["causal"]
        scale = 0.7 / math.sqrt(d)
        for b, sq, sk, hq, hkv in shapes:
            q = _poisoned((b, sq, hq, d), dtype, 7, gen)
            k = _poisoned((b, sk, hkv, d), dtype, 9, gen)
            v = _poisoned((b, sk, hkv, d), dtype, 9, gen)
            o = torch.full_like(q, math.nan)
            lse = torch.full((b, hq, sq), math.nan, device="cuda")
            bundle.launch(e["name"], [q, k, v, o, lse, *dense_workspace(torch, e, q), scale])
            torch.cuda.synchronize()
            try:
                _check(o, lse, q, k, v, causal, scale, f"{e['name']} {(b, sq, sk, hq, hkv)}")
            except AssertionError as err:
                failures.append(str(err).splitlines()[0])
    assert not failures, failures


def test_every_sm90a_variant(bundle):
    """Every sm_90a attention variant in the bundle, launched by name on every shape (dense) or
    packed batch (varlen)."""
    gen = torch.Generator(device="cuda").manual_seed(90)
    entries = [e for e in bundle.candidates("attention") if e["target"] == "sm_90a"]
    _launch_each(bundle, entries, SHAPES, VARLEN, gen)


# More query tiles than a persistent grid has CTAs (132 at most), so each CTA walks several tiles
# through its Q (and O) slabs; the second one with causal query tiles that see no key between
# tiles that do (Sq > Sk: rows 0..2499 have no key).  Varlen: a virtual grid of the longest
# sequence's tiles (most slots empty), sequences of 1 to 2100 tokens, Sq > Sk in one.
MANY_TILES = [(2, 2100, 2100, 8, 2), (1, 4000, 1500, 8, 8)]
MANY_TILES_VARLEN = [([1500, 30, 2100, 700, 1], [1500, 30, 2100, 700, 1], 8, 2),
                     ([1900, 900, 64], [600, 900, 3000], 8, 8)]


def test_persistent_variants_walk_many_tiles(bundle):
    """Every persistent sm_90a variant by name on problems of 200-350 query tiles: each CTA's
    later tiles reuse its Q slabs (head_dim 256: O leaves through them too)."""
    gen = torch.Generator(device="cuda").manual_seed(91)
    entries = [e for e in bundle.candidates("attention") if e["target"] == "sm_90a"
               and (e.get("tile_scheduler") or {}).get("persistent")]
    if not entries:
        pytest.skip("no persistent sm_90a attention variant in the bundle")
    _launch_each(bundle, entries, MANY_TILES, MANY_TILES_VARLEN, gen)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_bundle_attention_uses_sm90a_for_prefill(bundle, d, causal):
    """``bundle.attention`` on a prefill shape picks an sm_90a variant where the bundle has one
    for the problem, and its result (first call and hot path) matches float32."""
    from factory.runtime.attention import _choose

    cands = bundle.candidates("attention")
    if not any(c["target"] == "sm_90a" and c["head_dim"] == d and c["causal"] == causal
               and c["dtype"] == "bf16" for c in cands):
        pytest.skip("no bf16 sm_90a variant for this problem in the bundle")
    e = bundle.manifest["variants"][_choose(bundle, "bf16", d, causal, False, 2 * 8 * 700, (2, 8, 2, 700, 900))[0]]
    assert e["target"] == "sm_90a", e["name"]
    gen = torch.Generator(device="cuda").manual_seed(d + causal)
    q = _poisoned((2, 700, 8, d), torch.bfloat16, 5, gen)
    k = _poisoned((2, 900, 2, d), torch.bfloat16, 5, gen)
    v = _poisoned((2, 900, 2, d), torch.bfloat16, 5, gen)
    for attempt in ("first", "hot path"):
        o, lse = bundle.attention(q, k, v, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        _check(o, lse, q, k, v, causal, d ** -0.5, f"{e['name']} via bundle.attention ({attempt})")
