"""The dynamic persistent Hopper attention variants (tiles taken from a global counter) on an
H100, through a built bundle (builds nothing): each by name against float32 with NaN-poisoned
outputs on grids of every size (fewer tiles than CTAs, ragged query tails, GQA, Sq != Sk; varlen:
packed batches whose virtual grid has empty slots, sequences of no query or no key), its
tile counters read back zero after every launch, repeated launches bitwise-equal, a CUDA graph
of several launches replayed (counters zero after it), back-to-back launches on one stream.

Opens ``$FACTORY_BUNDLE`` (default ``artifacts/default``); skips where it has no such variant.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (B, Sq, Sk, Hq, Hkv): one tile, fewer tiles than SMs, ragged tails, GQA, Sq > Sk (key-less
# query tiles) and Sq < Sk, many rounds of tiles per CTA.
SHAPES = [
    (1, 100, 100, 1, 1),
    (2, 333, 517, 6, 2),
    (3, 777, 777, 5, 5),
    (1, 2500, 1000, 8, 2),
    (4, 1024, 1500, 16, 4),
    (8, 512, 512, 32, 32),
]


@pytest.fixture(scope="module")
def entries(gpu_bundle):
    from factory.runtime import Bundle
    from factory.runtime.attention import uses_tile_counters

    b = Bundle.open(gpu_bundle)
    es = [e for e in b.candidates("attention") if e["target"] == "sm_90a" and uses_tile_counters(e)
          and not e["varlen"]]
    if not es:
        pytest.skip(f"{gpu_bundle} has no dynamic sm_90a attention variant runnable here (needs an H100)")
    return b, es


@pytest.fixture(scope="module")
def varlen_entries(gpu_bundle):
    from factory.runtime import Bundle
    from factory.runtime.attention import uses_tile_counters

    b = Bundle.open(gpu_bundle)
    es = [e for e in b.candidates("attention") if e["target"] == "sm_90a" and uses_tile_counters(e) and e["varlen"]]
    if not es:
        pytest.skip(f"{gpu_bundle} has no dynamic varlen sm_90a attention variant runnable here (needs an H100)")
    return b, es


def _inputs(e, shape, gen):
    b, sq, sk, hq, hkv = shape
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[e["dtype"]]
    d = e["head_dim"]

    def padded(s, h, pad):
        big = torch.full((b, s + pad, h, d), math.nan, dtype=dt, device="cuda")
        big[:, :s] = torch.randn(b, s, h, d, generator=gen, device="cuda").to(dt)
        return big[:, :s]

    return padded(sq, hq, 7), padded(sk, hkv, 9), padded(sk, hkv, 9)


def _launch(bundle, e, q, k, v, o, lse, scale):
    from factory.runtime.attention import tile_counters

    bundle.launch(e["name"], [q, k, v, o, lse, tile_counters(q.device, torch.cuda.current_stream().cuda_stream), scale])


def _counters_zero(what):
    from factory.runtime import counters

    torch.cuda.synchronize()

    left = sum(int(b.count_nonzero()) for b in counters.buffers(torch.device("cuda", torch.cuda.current_device())))
    assert left == 0, f"{what}: {left} counter words left non-zero"


def test_dynamic_variants_match_float32(entries):
    """Every dynamic variant by name on every shape: o and LSE against float32 (rows with no key:
    o = 0, lse = -inf), the counters zero after each launch."""
    from factory.testing import TOLERANCE, attention_reference, rel_error

    bundle, es = entries
    gen = torch.Generator(device="cuda").manual_seed(27)
    failures = []
    for e in es:
        scale = 0.7 / math.sqrt(e["head_dim"])
        for shape in SHAPES:
            q, k, v = _inputs(e, shape, gen)
            o = torch.full_like(q, math.nan)
            lse = torch.full((shape[0], shape[3], shape[1]), math.nan, device="cuda")
            _launch(bundle, e, q, k, v, o, lse, scale)
            _counters_zero(f"{e['name']} {shape}")
            ref_o, ref_lse = attention_reference(q, k, v, e["causal"], scale)
            what = f"{e['name']} {shape}"
            if o.isnan().any() or lse.isnan().any():
                failures.append(f"{what}: NaN in o or lse")
                continue
            err = rel_error(o, ref_o)
            empty = torch.isinf(ref_lse)
            if err >= TOLERANCE[e["dtype"]]:
                failures.append(f"{what}: relative error {err:.2e}")
            if not torch.equal(torch.isinf(lse) & (lse < 0), empty) or not (o.transpose(1, 2)[empty] == 0).all():
                failures.append(f"{what}: rows with no key differ")
            elif (~empty).any() and (lse[~empty] - ref_lse[~empty]).abs().max().item() >= 2e-2:
                failures.append(f"{what}: LSE error")
    assert not failures, failures


def test_dynamic_repeat_graph_and_stream(entries):
    """Per variant: five launches bitwise-equal to the first; a CUDA graph of three launches (two
    problems) replayed twice gives the eager results and leaves the counters zero; twenty
    back-to-back launches of alternating problems on one stream, then one synchronisation, each
    output equal to its eager result."""
    bundle, es = entries
    gen = torch.Generator(device="cuda").manual_seed(28)
    for e in es:
        scale = 0.7 / math.sqrt(e["head_dim"])
        probs = []
        for shape in ((4, 1024, 1500, 16, 4), (2, 333, 517, 6, 2)):
            q, k, v = _inputs(e, shape, gen)
            o = torch.full_like(q, math.nan)
            lse = torch.full((shape[0], shape[3], shape[1]), math.nan, device="cuda")
            _launch(bundle, e, q, k, v, o, lse, scale)
            _counters_zero(e["name"])
            probs.append((q, k, v, o, lse, o.clone(), lse.clone()))
        q, k, v, o, lse, o0, l0 = probs[0]
        for i in range(5):
            o.fill_(math.nan)
            _launch(bundle, e, q, k, v, o, lse, scale)
            _counters_zero(f"{e['name']} repeat {i}")
            assert torch.equal(o, o0) and torch.equal(lse, l0), f"{e['name']}: launch {i + 2} differs from the first"

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for j in (0, 1, 0):
                    pq, pk, pv, po, pl, _, _ = probs[j]
                    _launch(bundle, e, pq, pk, pv, po, pl, scale)
        torch.cuda.current_stream().wait_stream(s)
        for r in range(2):
            for p in probs:
                p[3].fill_(math.nan)
            g.replay()
            _counters_zero(f"{e['name']} graph replay {r}")
            for p in probs:
                assert torch.equal(p[3], p[5]) and torch.equal(p[4], p[6]), f"{e['name']}: graph replay {r} differs"
        del g

        outs = [torch.full_like(probs[i % 2][3], math.nan) for i in range(20)]
        for i in range(20):
            pq, pk, pv, _, pl, _, _ = probs[i % 2]
            _launch(bundle, e, pq, pk, pv, outs[i], pl, scale)
        _counters_zero(f"{e['name']} back-to-back")
        for i in range(20):
            assert torch.equal(outs[i], probs[i % 2][5]), f"{e['name']}: back-to-back launch {i} differs"


def _replay_at_once(make_call, n_probs=3, what=""):
    """Graphs of problems 0 and 1 captured one after the other on one stream (after eager calls on
    it), replayed at the same time on two other streams for six rounds beside eager calls of problem
    2 on the capturing stream; returns (eager results of 0 and 1, the graphs' outputs, the eager
    outputs of 2 beside the replays, problem 2's result alone)."""
    cap, a, c = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    cap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cap):
        want = [make_call(j)() for j in range(n_probs)]
        calls = [make_call(j) for j in range(2)]
        graphs, outs = [], []
        for j in range(2):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=cap):
                outs.append([calls[j]() for _ in range(3)])
            graphs.append(g)
    torch.cuda.synchronize()
    _counters_zero(f"{what} after capture")
    for o in outs[0] + outs[1]:
        o.fill_(math.nan)
    for st in (a, c, cap):
        st.wait_stream(torch.cuda.current_stream())
    beside = []
    for _ in range(6):
        with torch.cuda.stream(a):
            graphs[0].replay()
        with torch.cuda.stream(c):
            graphs[1].replay()
        with torch.cuda.stream(cap):
            beside.append(make_call(2)())
    torch.cuda.synchronize()
    _counters_zero(f"{what} after concurrent replays")
    for j in range(2):
        for i, o in enumerate(outs[j]):
            assert torch.equal(o, want[j]), f"{what}: graph {j} launch {i} differs from its eager result"
    for i, o in enumerate(beside):
        assert torch.equal(o, want[2]), f"{what}: eager launch {i} beside the replays differs"
    del graphs


def test_two_graphs_replayed_at_once(entries):
    """Two graphs replayed at the same time on two streams, beside eager launches on a third (the
    stream that captured them, after eager calls there): each capture takes tiles from counters of
    its own, so every output equals its eager result and the counters end zero.  By name (the
    checked path) for every dynamic variant, and through the selection's hot path where it picks
    a dynamic variant (B32 H32 S512 causal)."""
    bundle, es = entries
    gen = torch.Generator(device="cuda").manual_seed(31)
    shapes = ((4, 1024, 1500, 16, 4), (8, 512, 512, 32, 32), (2, 333, 517, 6, 2))
    for e in es:
        scale = 0.7 / math.sqrt(e["head_dim"])
        probs = [_inputs(e, sh, gen) for sh in shapes]

        def by_name(j, e=e, scale=scale, probs=probs):
            q, k, v = probs[j]
            lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda")

            def call():
                o = torch.empty_like(q)
                _launch(bundle, e, q, k, v, o, lse, scale)
                return o
            return call

        with torch.no_grad():
            _replay_at_once(by_name, what=e["name"])
    from factory.runtime.attention import _choose
    from factory.runtime.errors import NoVariantError

    for d in (64, 128):
        try:
            name = _choose(bundle, "bf16", d, True, False, 32 * 32 * 512, (32, 32, 32, 512, 512))[0]
        except NoVariantError:  # (a bundle of dynamic builds alone: nothing for the selection to start from)
            continue
        if not name.endswith("_dy"):
            continue
        qkv = [tuple(torch.randn(b, s, h, d, generator=gen, device="cuda").bfloat16() for _ in range(3))
               for b, s, h in ((32, 512, 32), (32, 512, 32), (16, 512, 32))]

        def hot(j, qkv=qkv):
            q, k, v = qkv[j]
            return lambda: bundle.attention(q, k, v, True)

        with torch.no_grad():
            _replay_at_once(hot, what=f"selection {name}")


# Packed batches (query lengths, key lengths, Hq, Hkv): sequences of 0 and 1 tokens, ragged
# tails, Sq != Sk (causal: query rows with no key), the longest sequence many query tiles long so
# that most of the virtual grid's slots (query tiles of the longest sequence x heads x sequences)
# are empty, GQA.
VARLEN = [
    ([2100, 5, 1000, 0, 333, 1500], [2100, 5, 1200, 7, 200, 1500], 8, 2),
    ([1, 17, 130, 300, 64], [1, 17, 130, 300, 64], 8, 8),
    ([40, 40, 3000], [0, 33, 3000], 4, 1),
    ([512] * 24, [512] * 24, 16, 16),
]


def _varlen_problem(e, case, gen):
    import itertools

    lq, lk, hq, hkv = case
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[e["dtype"]]
    d = e["head_dim"]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(ls)], dtype=torch.int32, device="cuda") for ls in (lq, lk))
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, hq, d, generator=gen, device="cuda").to(dt)
    kv = torch.full((2, tk + 16, hkv, d), math.nan, dtype=dt, device="cuda")
    kv[:, :tk] = torch.randn(2, tk, hkv, d, generator=gen, device="cuda").to(dt)
    return q, kv[0, :tk], kv[1, :tk], cu_q, cu_k


def _launch_varlen(bundle, e, q, k, v, o, lse, cu_q, cu_k, max_q, scale):
    from factory.runtime.attention import tile_counters

    bundle.launch(e["name"], [q, k, v, o, lse, tile_counters(q.device, torch.cuda.current_stream().cuda_stream),
                              cu_q, cu_k, scale, max_q])


def test_dynamic_varlen_match_float32(varlen_entries):
    """Every dynamic varlen variant by name on packed batches whose virtual grid has empty slots
    (the producer passes them over): each sequence's o and LSE against its own float32 reference
    (rows with no key: o = 0, lse = -inf), no NaN, the counters zero after each launch."""
    import itertools

    from factory.testing import TOLERANCE, attention_reference, rel_error

    bundle, es = varlen_entries
    gen = torch.Generator(device="cuda").manual_seed(29)
    failures = []
    for e in es:
        scale = 0.7 / math.sqrt(e["head_dim"])
        for case in VARLEN:
            lq, lk = case[:2]
            q, k, v, cu_q, cu_k = _varlen_problem(e, case, gen)
            o = torch.full_like(q, math.nan)
            lse = torch.full((q.shape[1], q.shape[0]), math.nan, device="cuda")
            _launch_varlen(bundle, e, q, k, v, o, lse, cu_q, cu_k, max(lq), scale)
            what = f"{e['name']} {lq} {lk}"
            _counters_zero(what)
            if o.isnan().any() or lse.isnan().any():
                failures.append(f"{what}: NaN in o or lse")
                continue
            for a, n, c, m in zip(itertools.accumulate([0, *lq]), lq, itertools.accumulate([0, *lk]), lk):
                if n == 0:
                    continue
                ref_o, ref_lse = attention_reference(q[None, a:a + n], k[None, c:c + m], v[None, c:c + m],
                                                     e["causal"], scale)
                so, sl = o[None, a:a + n], lse[None, :, a:a + n]
                empty = torch.isinf(ref_lse)
                if (~empty).any() and rel_error(so, ref_o) >= TOLERANCE[e["dtype"]]:
                    failures.append(f"{what} sequence at {a}: relative error {rel_error(so, ref_o):.2e}")
                if not torch.equal(torch.isinf(sl) & (sl < 0), empty) or not (so.transpose(1, 2)[empty] == 0).all():
                    failures.append(f"{what} sequence at {a}: rows with no key differ")
                elif (~empty).any() and (sl[~empty] - ref_lse[~empty]).abs().max().item() >= 2e-2:
                    failures.append(f"{what} sequence at {a}: LSE error")
    assert not failures, failures


def test_dynamic_varlen_repeat_and_graph(varlen_entries):
    """Per dynamic varlen variant: five launches bitwise-equal to the first, a CUDA graph of three
    launches (two packed batches) replayed twice equal to the eager results, the counters zero."""
    bundle, es = varlen_entries
    gen = torch.Generator(device="cuda").manual_seed(30)
    for e in es:
        scale = 0.7 / math.sqrt(e["head_dim"])
        probs = []
        for case in VARLEN[:2]:
            q, k, v, cu_q, cu_k = _varlen_problem(e, case, gen)
            o = torch.full_like(q, math.nan)
            lse = torch.full((q.shape[1], q.shape[0]), math.nan, device="cuda")
            args = (q, k, v, o, lse, cu_q, cu_k, max(case[0]))
            _launch_varlen(bundle, e, *args, scale)
            _counters_zero(e["name"])
            probs.append((args, o.clone(), lse.clone()))
        (q, k, v, o, lse, cu_q, cu_k, mq), o0, l0 = probs[0]
        for i in range(5):
            o.fill_(math.nan)
            _launch_varlen(bundle, e, q, k, v, o, lse, cu_q, cu_k, mq, scale)
            _counters_zero(f"{e['name']} repeat {i}")
            assert torch.equal(o, o0) and torch.equal(lse, l0), f"{e['name']}: launch {i + 2} differs from the first"
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for j in (0, 1, 0):
                    _launch_varlen(bundle, e, *probs[j][0], scale)
        torch.cuda.current_stream().wait_stream(s)
        for r in range(2):
            for p in probs:
                p[0][3].fill_(math.nan)
            g.replay()
            _counters_zero(f"{e['name']} graph replay {r}")
            for p in probs:
                assert torch.equal(p[0][3], p[1]) and torch.equal(p[0][4], p[2]), \
                    f"{e['name']}: graph replay {r} differs"
        del g
