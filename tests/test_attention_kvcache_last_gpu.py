"""Split-KV decode over a KV cache whose last split merges the others (manifest ``workspace`` form
"counters": every split writes its normalised O and LSE to the workspace and counts itself in an
arrival counter; the one that arrives last merges, in split order, and sets the counter back to 0).

On a GPU, each such variant of ``$FACTORY_BUNDLE`` by name against the float32 reference on the
gathered K/V: paged (pages of 16, 64 and 1) and dense caches, ragged lengths including 0 and 1
(splits with no key), GQA / MQA / MHA, seqlen_q 1 / 4 / 16 (several row blocks), NaN pages and
NaN-poisoned o and lse; the runtime's counter buffer read back all zero after every launch;
repeated launches bitwise equal (the merge order is fixed); a CUDA graph replayed with lengths,
block tables and q changed between replays (and twice back to back), the counters zero after
each replay; a capture before any eager call (its own words); two graphs replayed at the same time
on two streams beside eager launches, and two streams launching at once.  Skips without a GPU or
without such variants.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE  # noqa: E402
from test_attention_kvcache_gpu import CASES, make_cache, run_case  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    return Bundle.open(BUNDLE)


def last_entries(bundle, **want):
    from factory.runtime.kvcache import uses_counters

    es = [e for e in bundle.candidates("attention_kvcache") if uses_counters(e)
          and all(e.get(k) == v for k, v in want.items())]
    if not es:
        pytest.skip("no last-arrival-merge variant in the bundle")
    return es


def counters_zero():
    """Every counter word of the device (each stream's buffers and the graph words) is zero."""
    from factory.runtime import counters

    torch.cuda.synchronize()
    bufs = counters.buffers(torch.device("cuda", torch.cuda.current_device()))
    assert bufs, "no counter buffer was allocated"
    left = sum(int(b.count_nonzero()) for b in bufs)
    assert left == 0, f"{left} arrival counters left non-zero"


@pytest.mark.parametrize("page_size", (16, 64, 1, None))
def test_every_last_variant(bundle, page_size):
    gen = torch.Generator(device="cuda").manual_seed(17 + (page_size or 0))
    es = last_entries(bundle)
    es = [e for e in es if bool(e["paged"]) == (page_size is not None)]
    if not es:
        pytest.skip("no variant for this cache layout")
    # (B8 MQA 4k: the problem the split count is built for; a 64-key split keeps 4 tiles)
    cases = (CASES + [([4096] * 7 + [100], 16, 1, 1)]) if page_size in (16, None) else CASES[:2]
    with torch.no_grad():
        for e in es:
            for lens, hq, hkv, sq in cases:
                run_case(bundle, e, lens, hq, hkv, sq, page_size, gen)
                counters_zero()


def test_repeated_launches_bitwise_equal(bundle):
    gen = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():
        for e in last_entries(bundle, paged=True):
            d = e["head_dim"]
            lens = [4096, 1, 0, 2000, 4095, 64, 3000, 17]
            k, v, bt = make_cache(lens, 1, d, torch.bfloat16, 16, gen)
            if e.get("kv_dtype") == "e4m3":  # an e4m3 cache (unit descales)
                k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
            q = torch.randn(len(lens), 1, 16, d, device="cuda", generator=gen).to(torch.bfloat16)
            sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
            outs = [bundle.attention_kvcache(q, k, v, sl, block_table=bt, variant=e["name"], return_lse=True)
                    for _ in range(4)]
            for o, lse in outs[1:]:
                assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1]), e["name"]
            counters_zero()


def test_graph_replay_changed_lengths_counters_zero(bundle):
    from factory.testing import attention_kvcache_reference

    for e in last_entries(bundle, paged=True):
        gen = torch.Generator(device="cuda").manual_seed(3)
        b, hq, hkv, d, ps, max_pages, pool = 8, 16, 1, e["head_dim"], 16, 256, 2100
        k = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
        v = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
        if e.get("kv_dtype") == "e4m3":  # an e4m3 cache (unit descales)
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        q = torch.randn(b, 1, hq, d, device="cuda", generator=gen).to(torch.bfloat16)
        bt = torch.zeros(b, max_pages, dtype=torch.int32, device="cuda")
        sl = torch.full((b,), max_pages * ps, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        lse = torch.empty(b, hq, 1, device="cuda")

        def step():
            o, ls = bundle.attention_kvcache(q, k, v, sl, block_table=bt, out=out, variant=e["name"], return_lse=True)
            lse.copy_(ls)

        with torch.no_grad():
            step()  # loads the module, allocates the counters
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            for it in range(4):
                lens = torch.randint(0, max_pages * ps + 1, (b,), generator=gen, device="cuda").to(torch.int32)
                if it == 1:
                    lens[1], lens[2], lens[3] = 0, 1, 17  # splits with no key, one key
                if it == 3:
                    lens.fill_(max_pages * ps)
                sl.copy_(lens)
                bt.copy_(torch.randperm(pool, device="cuda", generator=gen)[: b * max_pages].view(b, max_pages))
                q.copy_(torch.randn(b, 1, hq, d, device="cuda", generator=gen))
                out.fill_(math.nan)
                lse.fill_(math.nan)
                g.replay()
                if it == 2:
                    g.replay()  # back to back: the second launch finds the counters the first left at 0
                counters_zero()
                ref, ref_lse = attention_kvcache_reference(q, k, v, sl, bt)
                what = f"{e['name']} replay {it}"
                assert not out.isnan().any() and not lse.isnan().any(), what
                assert ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < 1e-2, what
                full = ~torch.isinf(ref_lse)
                assert torch.equal(torch.isinf(lse), ~full), what
                assert (lse[full] - ref_lse[full]).abs().max().item() < 2e-2, what


def mqa_problems(bundle, n: int, seed: int):
    """The first bf16-cache paged last-arrival variant and ``n`` MQA problems (B8 H16/1, pages of 16,
    up to 4096 keys, disjoint block tables over one shared page pool): (entry, k, v, [(q,
    block_table, cache_seqlens)], float32 reference outputs).  Skips without such a variant."""
    from factory.testing import attention_kvcache_reference

    es = [e for e in last_entries(bundle, paged=True) if e.get("kv_dtype", "bf16") != "e4m3"]
    if not es:
        pytest.skip("no bf16-cache last-arrival variant")
    e = es[0]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, hq, hkv, d, ps, max_pages = 8, 16, 1, e["head_dim"], 16, 256
    pool = n * b * max_pages + 100
    k = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    perm = torch.randperm(pool, device="cuda", generator=gen)
    inputs = []
    for j in range(n):
        q = torch.randn(b, 1, hq, d, device="cuda", generator=gen).to(torch.bfloat16)
        bt = perm[j * b * max_pages:(j + 1) * b * max_pages].view(b, max_pages).to(torch.int32).contiguous()
        sl = torch.randint(1, max_pages * ps + 1, (b,), generator=gen, device="cuda").to(torch.int32)
        inputs.append((q, bt, sl))
    return e, k, v, inputs, [attention_kvcache_reference(q, k, v, sl, bt)[0] for q, bt, sl in inputs]


def test_capture_before_any_eager_call_in_subprocess(bundle):
    """A capture whose launch needs counters before any launch outside it allocated some: the
    capture takes words of its own (allocated and zeroed in the graph), the replays match the same
    call made eagerly afterwards, bit for bit (the merge order is fixed), twice in a row."""
    e = last_entries(bundle, paged=True)[0]
    src = textwrap.dedent(f"""
        import torch
        from factory.runtime import Bundle, counters
        b = Bundle.open({str(BUNDLE)!r})
        b._first_load({e['name']!r})
        q = torch.randn(2, 1, 16, {e['head_dim']}, device="cuda").bfloat16()
        k = torch.randn(40, 16, 1, {e['head_dim']}, device="cuda").bfloat16()
        bt = torch.arange(40, dtype=torch.int32, device="cuda").view(2, 20)
        sl = torch.tensor([320, 5], dtype=torch.int32, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.no_grad():
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    og = b.attention_kvcache(q, k, k, sl, block_table=bt, variant={e['name']!r})
            print("EAGER BUFFERS BEFORE", len(counters._BUFFERS))
            g.replay()
            g.replay()
            torch.cuda.synchronize()
            o = b.attention_kvcache(q, k, k, sl, block_table=bt, variant={e['name']!r})
            torch.cuda.synchronize()
        print("OK", bool(torch.isfinite(o).all()), torch.equal(o, og))
    """)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "EAGER BUFFERS BEFORE 0" in r.stdout and "OK True True" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_two_graphs_replayed_at_once(bundle):
    """Two graphs captured one after the other on one stream (which ran the same calls eagerly
    first, so its hot plan knows that stream's words), then replayed at the same time on two other
    streams, six rounds without waiting, beside eager launches on the capturing stream: each capture
    counts in words of its own, so every output of the last round matches float32 and every
    counter word is zero after."""
    e, k, v, inputs, refs = mqa_problems(bundle, 3, seed=29)
    cap, a, c = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    for variant in (e["name"], None):
        outs = [[torch.empty_like(inputs[j][0]) for _ in range(4)] for j in range(2)]
        graphs = []
        with torch.no_grad():
            cap.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(cap):
                for j in range(2):  # eager first on the capturing stream: the hot plan keeps its words
                    q, bt, sl = inputs[j]
                    bundle.attention_kvcache(q, k, v, sl, block_table=bt, variant=variant, out=outs[j][0])
                for j in range(2):
                    q, bt, sl = inputs[j]
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=cap):
                        for o in outs[j]:
                            bundle.attention_kvcache(q, k, v, sl, block_table=bt, variant=variant, out=o)
                    graphs.append(g)
            torch.cuda.synchronize()
            for o in outs[0] + outs[1]:
                o.fill_(math.nan)
            for st in (a, c, cap):
                st.wait_stream(torch.cuda.current_stream())
            eager = []
            for _ in range(6):
                with torch.cuda.stream(a):
                    graphs[0].replay()
                with torch.cuda.stream(c):
                    graphs[1].replay()
                with torch.cuda.stream(cap):
                    q, bt, sl = inputs[2]
                    eager.append(bundle.attention_kvcache(q, k, v, sl, block_table=bt, variant=variant))
            torch.cuda.synchronize()
        for j in range(2):
            for i, o in enumerate(outs[j]):
                err = ((o.float() - refs[j]).norm() / refs[j].norm()).item()
                assert err < 1e-2, f"{variant or 'pick'} graph {j} launch {i}: rel err {err}"
        for i, o in enumerate(eager):
            err = ((o.float() - refs[2]).norm() / refs[2].norm()).item()
            assert err < 1e-2, f"{variant or 'pick'} eager launch {i} beside the replays: rel err {err}"
        counters_zero()
        del graphs


def test_selection_takes_the_last_merge(bundle):
    """MQA H16/1 B8 over 4096 keys, page 16: where the bundle has the one-CTA-per-SM build at 16
    splits, the selection (C, through bundle.plan_kvcache) names it, and the call through the
    selection matches float32 on the checked path and then on the hot path (the same problem
    again), the counters zero after each."""
    es = [e for e in last_entries(bundle, paged=True, dtype="bf16", head_dim=128)
          if e["kv_splits"] == 16 and e.get("ctas_per_sm") == 1 and not e.get("pdl")]
    if not es:
        pytest.skip("no one-CTA-per-SM 16-split build")
    gen = torch.Generator(device="cuda").manual_seed(23)
    with torch.no_grad():
        for lens in ([4096] * 8, [4096] * 7 + [100]):  # (the second: the hot path, other lengths)
            run_case(bundle, es[0], lens, 16, 1, 1, 16, gen, by_name=False)
            counters_zero()


def test_two_streams_at_once(bundle):
    """Two streams launching the same last-arrival variant back to back without waiting for each
    other (checked path by name, then the hot path of the selection's pick): each stream counts in
    its own words, so every result matches float32 and every counter word is zero after."""
    from factory.runtime import counters

    e, k, v, inputs, refs = mqa_problems(bundle, 2, seed=11)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with torch.no_grad():
        for variant in (e["name"], None):
            for st in streams:
                st.wait_stream(torch.cuda.current_stream())
            outs = [[], []]
            for it in range(24):
                for j, st in enumerate(streams):
                    q, bt, sl = inputs[j]
                    with torch.cuda.stream(st):
                        outs[j].append(bundle.attention_kvcache(q, k, v, sl, block_table=bt, variant=variant))
            torch.cuda.synchronize()
            for j in range(2):
                for it, o in enumerate(outs[j]):
                    err = ((o.float() - refs[j]).norm() / refs[j].norm()).item()
                    assert err < 1e-2, f"{variant or 'pick'} stream {j} launch {it}: rel err {err}"
            handles = {st.cuda_stream for st in streams}
            dev = torch.device("cuda", torch.cuda.current_device())
            if variant is not None:  # (the selection's pick need not be a last-arrival build)
                assert all(counters.buffer(dev, h) is not None for h in handles)
            counters_zero()
