"""The decode-attention family (``factory/attention/decode.py``) on a GPU, through a built bundle.

Every decode variant of the bundle launched by name against float32 (GQA 4 and 8, MHA, MQA,
contexts 1 to 4109 with tails, seqlen_q 1..16 with bottom-right causal masking, rows with no
visible key, a KV cache whose rows past the context are NaN, NaN-poisoned o, lse and workspace);
``bundle.attention`` choosing the family by the decode rule (runtime/attention.py) for seqlen_q
1..16 and batch 1/16/64/256; one cluster-merged and one kernel-merged step under CUDA-graph
capture.  Skips without a GPU or without decode variants in ``$FACTORY_BUNDLE``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE, check, poisoned, rand, reference  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DT = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not [e for e in b.candidates("attention") if e.get("decode_rows")]:
        pytest.skip(f"{BUNDLE} has no decode-attention variant for this device")
    return b


def decode_entries(bundle):
    return [e for e in bundle.candidates("attention") if e.get("decode_rows")]


# (B, Sq, Sk, Hq, Hkv): causal (bottom-right) for Sq > 1; Sq 1 is the same either way.
CASES = [
    (2, 1, 1, 32, 8),        # one key
    (2, 1, 777, 32, 8),      # GQA 4, a key tail
    (3, 1, 4109, 32, 8),     # many tiles, a tail (every split non-empty)
    (2, 1, 300, 32, 32),     # MHA: one row of 16
    (1, 1, 2000, 8, 1),      # MQA 8
    (1, 1, 1500, 64, 8),     # GQA 8
    (2, 4, 999, 32, 8),      # speculative: 4 queries x 4 heads = one full row block
    (1, 16, 513, 32, 8),     # 64 rows: four row blocks
    (2, 16, 100, 16, 16),    # MHA, 16 queries
    (1, 3, 2, 32, 8),        # Sq > Sk: rows with no visible key
    (2, 5, 65, 8, 2),        # 20 rows: a second, partial row block
    (1, 2, 1, 4, 4),         # one key, the first query sees none
]


def _run(bundle, e, b, sq, sk, hq, hkv, gen):
    from factory.runtime.attention import split_workspace

    dt, d = DT[e["dtype"]], e["head_dim"]
    q = poisoned((b, sq, hq, d), dt, 3, gen)
    k = poisoned((b, sk, hkv, d), dt, 64, gen)  # a KV cache: NaN rows past the context
    v = poisoned((b, sk, hkv, d), dt, 64, gen)
    o = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device="cuda")
    ws = list(split_workspace(torch, q, e["splits"])) if e.get("splits", 1) > 1 else []
    for w in ws:
        w.fill_(math.nan)
    scale = 0.9 / math.sqrt(d)
    bundle.launch(e["name"], [q, k, v, o, lse, *ws, scale])
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, True, scale)
    return o, lse, ref_o, ref_lse, dt


def test_every_decode_variant(bundle):
    gen = torch.Generator(device="cuda").manual_seed(11)
    failures = []
    for e in decode_entries(bundle):
        for case in CASES:
            o, lse, ref_o, ref_lse, dt = _run(bundle, e, *case, gen)
            try:
                check(o, lse, ref_o, ref_lse, dt, f"{e['name']} {case}")
            except AssertionError as err:
                failures.append(str(err).splitlines()[0])
    assert not failures, failures


# bundle.attention: (B, Sq, Sk, Hq, Hkv) over the rule's regimes (one split, cluster, second kernel)
CHOSEN = [(b, 1, sk, 32, 8) for b in (1, 16, 64, 256) for sk in (512, 4096)] + [
    (1, 1, 32768, 32, 8), (1, 1, 1024, 32, 32), (4, 4, 8192, 32, 8), (1, 16, 4096, 32, 8),
    (2, 8, 3000, 16, 2), (64, 2, 700, 32, 32)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("shape", CHOSEN, ids=lambda s: "x".join(map(str, s)))
def test_attention_chooses_decode(bundle, dtype, d, shape):
    """bundle.attention (causal, seqlen_q <= 16) runs a decode-family variant and matches float32,
    twice (the second call takes the hot path)."""
    from factory.runtime.attention import _choose

    b, sq, sk, hq, hkv = shape
    gen = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31)
    q = poisoned((b, sq, hq, d), DT[dtype], 3, gen)
    k = poisoned((b, sk, hkv, d), DT[dtype], 9, gen)
    v = poisoned((b, sk, hkv, d), DT[dtype], 9, gen)
    name, _ = _choose(bundle, dtype, d, True, False, b * hq * sq, (b, hq, hkv, sq, sk))
    assert bundle.manifest["variants"][name].get("family") == "sm90_decode", f"{shape}: picked {name}"
    ref_o, ref_lse = reference(q, k, v, True, 1.0 / math.sqrt(d))  # (by batch chunks: B 256 fits)
    for attempt in ("first", "hot path"):
        o, lse = bundle.attention(q, k, v, causal=True, return_lse=True)
        torch.cuda.synchronize()
        check(o, lse, ref_o, ref_lse, DT[dtype], f"{name} {shape} ({attempt})")


@pytest.mark.parametrize("splits", ["cluster", "kernel"])
def test_decode_graph_capture(bundle, splits):
    """A cluster-merged and a kernel-merged (workspace + PDL combine) decode step captured in a
    CUDA graph: replay with new q gives the eager result for it."""
    from factory.runtime.attention import _choose

    gen = torch.Generator(device="cuda").manual_seed(12)
    b, hq, hkv, d = 1, 32, 8, 128

    def kind(sk):
        e = bundle.manifest["variants"][_choose(bundle, "bf16", d, True, False, b * hq, (b, hq, hkv, 1, sk))[0]]
        return e, e.get("decode_rows") and e["kv_splits"] >= 2 and (e["cluster"][0] > 1) == (splits == "cluster")

    # The context where the rule merges splits this way (a cluster for short contexts, a second
    # kernel for long ones); none at all is a selection regression.
    sk = next((sk for sk in (2048, 4096, 1024, 8192, 16384, 32768) if kind(sk)[1]), None)
    assert sk is not None, f"no context of a B1 H32/8 decode step picks a {splits}-merged decode variant"
    name = kind(sk)[0]["name"]
    q = rand(b, 1, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (rand(b, sk, hkv, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bundle.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = bundle.attention(q, k, v, causal=True, return_lse=True)
        out2 = bundle.attention(q, k, v, causal=True)  # back to back: PDL overlap inside the graph
    q.copy_(rand(b, 1, hq, d, dtype=torch.bfloat16, gen=gen))
    out.fill_(math.nan)
    out2.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, True, 1.0 / math.sqrt(d))
    check(out, lse, ref_o, ref_lse, torch.bfloat16, f"graph replay ({name})")
    assert torch.equal(out, out2)
    assert torch.equal(out, bundle.attention(q, k, v, causal=True))
