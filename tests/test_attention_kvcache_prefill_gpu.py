"""Prefill attention over a KV cache (``attention_kvcache``) on a GPU: the sm80 family
(factory/attention/sm80.py, cp.async row gathers) and the sm90a family (factory/attention/sm90.py,
TMA page boxes of 16-64 rows or cp.async row gathers, window/softcap/sink switch builds).

Every sm80- and sm90-family kvcache variant of ``$FACTORY_BUNDLE`` is launched by name against the float32
reference on gathered K/V (factory.testing.attention_kvcache_reference): every page size the
variant takes (1 to 256) for paged caches, ragged lengths with 0 and 1 keys and partly filled last
pages, seqlen_q from 1 to a few hundred (rows with no visible key where Sq > L), GQA and MQA, the
window, softcap and sink switches where the variant has them, fp8 e4m3 caches with per-kv-head
descales, dense and packed (varlen) q, windows that skip whole key tiles, a CUDA-graph replay
after lengths, block table and cache changed.  Unused pages, rows past each sequence and the
caller's o/lse are NaN: a read past a sequence or a row left unwritten shows.  Skips without a GPU
or without such variants in the bundle.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE, check  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn}


def open_bundle(entries, what: str):
    """``$FACTORY_BUNDLE`` opened, or a skip where it is missing or ``entries(bundle)`` is empty."""
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not entries(b):
        pytest.skip(f"{BUNDLE} has no {what} for this device")
    return b


@pytest.fixture(scope="module")
def bundle():
    return open_bundle(_entries, "sm80/sm90-family attention_kvcache variant")


def _entries(b):
    # (builds with e4m3 q: tests/test_attention_kvcache_fp8_prefill_gpu.py)
    return [e for e in b.candidates("attention_kvcache") if e["family"] in ("sm80", "sm90") and e["dtype"] != "e4m3"]


def make_cache(lengths, ps, hkv, d, kv_dtype, paged, gen):
    """(k_cache, v_cache, block_table) holding ``lengths[b]`` random keys per sequence; paged:
    pages in a shuffled order with NaN pages between them (every page in use is followed in memory
    by a NaN page: a copy that ran past a page's end shows), NaN rows past each sequence's end in
    its last page, table entries past a sequence pointing at a NaN page; dense: (B, Smax) with NaN
    rows past each length."""
    b = len(lengths)
    if paged:
        need = [-(-n // ps) for n in lengths]
        mp = max(need + [1]) + 1
        total = sum(need) + b + 3  # spare NaN pages
        order = 2 * torch.randperm(total, generator=torch.Generator().manual_seed(total))
        total *= 2  # the odd pages: NaN
        table = torch.empty((b, mp), dtype=torch.int32)
        nan_page = int(order[-1])
        at = 0
        for i, n in enumerate(need):
            table[i, :n] = order[at:at + n]
            table[i, n:] = nan_page
            at += n
        shape = (total, ps, hkv, d)
    else:
        table = torch.zeros((b, 1), dtype=torch.int32)
        shape = (b, max(lengths + [1]) + 5, hkv, d)
    caches = []
    for _ in range(2):
        c = torch.full(shape, math.nan, dtype=torch.float32, device="cuda")
        for i, n in enumerate(lengths):
            x = torch.randn(n, hkv, d, device="cuda", generator=gen)
            if paged:
                rows = c[table[i, : -(-n // ps)].long().cuda()].reshape(-1, hkv, d)
                rows[:n] = x
                c[table[i, : -(-n // ps)].long().cuda()] = rows.reshape(-1, ps, hkv, d)
            else:
                c[i, :n] = x
        caches.append(c.to(DT[kv_dtype]))
    return caches[0], caches[1], table.cuda()


def run_case(bundle, e, lengths, sqs, hq, hkv, ps, *, window=(-1, -1), softcap=0.0, seed=0):
    from factory.testing import attention_kvcache_reference

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt, d, kvt = DT[e["dtype"]], e["head_dim"], e["kv_dtype"]
    fp8 = kvt == "e4m3"
    b = len(lengths)
    k_cache, v_cache, table = make_cache(lengths, ps, hkv, d, kvt, e["paged"], gen)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    sinks = (torch.randn(hq, device="cuda", generator=gen) if e["sinks"]
             else torch.zeros(hq, device="cuda"))
    descale = (torch.rand(2, hkv, device="cuda", generator=gen) + 0.5 if fp8
               else torch.ones(2, hkv, device="cuda"))
    if not e["local"]:
        window = (-1, -1)
    if not e["softcap"]:
        softcap = 0.0
    scale = 0.9 / math.sqrt(d)
    ref = dict(causal=e["causal"], scale=scale, window_size=window, softcap=softcap,
               sinks=sinks if e["sinks"] else None,
               k_descale=descale[0] if fp8 else None, v_descale=descale[1] if fp8 else None)
    tail = [sinks, *(descale if fp8 else [descale]), scale, softcap, window[0], window[1]]  # (fp8: its rows)
    if e["varlen"]:
        cu = torch.tensor([0, *itertools.accumulate(sqs)], dtype=torch.int32, device="cuda")
        tq = int(cu[-1])
        q = torch.randn(tq + 3, hq, d, device="cuda", generator=gen).to(dt)[:tq]
        o = torch.full_like(q, math.nan)
        lse = torch.full((hq, tq), math.nan, device="cuda")
        bundle.launch(e["name"], [q, k_cache, v_cache, o, lse, table, seqlens, cu, *tail, max(sqs)])
        torch.cuda.synchronize()
        for i in range(b):
            s0, s1 = int(cu[i]), int(cu[i + 1])
            if s1 == s0:
                continue
            if e["paged"]:
                kc, vc, tb = k_cache, v_cache, table[i:i + 1]
            else:
                kc, vc, tb = k_cache[i:i + 1], v_cache[i:i + 1], None
            r_o, r_lse = attention_kvcache_reference(q[None, s0:s1], kc, vc, seqlens[i:i + 1], tb, **ref)
            check(o[None, s0:s1], lse[None, :, s0:s1], r_o, r_lse, dt,
                  f"{e['name']} seq {i} L={lengths[i]} Sq={s1 - s0} PS={ps}")
    else:
        sq = sqs
        q = torch.randn(b, sq + 2, hq, d, device="cuda", generator=gen).to(dt)[:, :sq]
        o = torch.full_like(q, math.nan)
        lse = torch.full((b, hq, sq), math.nan, device="cuda")
        bundle.launch(e["name"], [q, k_cache, v_cache, o, lse, table, seqlens, *tail])
        torch.cuda.synchronize()
        r_o, r_lse = attention_kvcache_reference(q, k_cache, v_cache, seqlens,
                                                 table if e["paged"] else None, **ref)
        check(o, lse, r_o, r_lse, dt, f"{e['name']} L={lengths} Sq={sq} PS={ps}")


# (lengths, Sq (dense) or per-sequence Sq (varlen), Hq, Hkv)
CASES = [
    ([0, 1, 300], 37, [37, 5, 200], 8, 2),            # empty and one-key sequences, a tail
    ([129, 1000], 300, [300, 1], 4, 1),               # MQA; Sq > L: rows with no key
    ([2049, 1536, 777], 129, [129, 64, 333], 8, 8),   # MHA, many key tiles
]
PAGE_SIZES = (1, 8, 16, 32, 64, 128, 256)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_kvcache_prefill(bundle, ps, case):
    lengths, sq, sqs, hq, hkv = CASES[case]
    ran = 0
    for e in _entries(bundle):
        if not e["paged"] and ps != PAGE_SIZES[0]:
            continue  # a dense cache has no page size: once
        if e["paged"] and ps not in e["page_sizes"]:
            continue
        run_case(bundle, e, lengths, sqs if e["varlen"] else sq, hq, hkv, ps,
                 window=(100, 0) if e["causal"] else (70, 33), softcap=1.5, seed=ps * 10 + case)
        ran += 1
    assert ran


def test_kvcache_window_sides(bundle):
    """Left-only, right-only and both window sides, and windows wider than the sequence."""
    ran = 0
    for e in _entries(bundle):
        if not e["local"]:
            continue
        for w in ((0, -1), (-1, 0), (5, 300), (5000, 5000), (1, 1)):
            run_case(bundle, e, [300, 1, 64], [64, 7, 130] if e["varlen"] else 64, 8, 2, 16,
                     window=w, softcap=0.0, seed=sum(w))  # softcap 0: off, on a softcap variant too
            ran += 1
    if not ran:
        pytest.skip("no variant with the window switch")


def test_kvcache_selection(bundle):
    """bundle.attention_kvcache serves seqlen_q > 16 from these families, and its result
    matches the reference."""
    if not hasattr(bundle, "attention_kvcache"):
        pytest.skip("this runtime has no attention_kvcache")
    from factory.testing import attention_kvcache_reference

    e = next((e for e in _entries(bundle) if e["paged"] and e["causal"] and not e["varlen"]
              and e["kv_dtype"] == e["dtype"] and not (e["local"] or e["softcap"] or e["sinks"])), None)
    if e is None:
        pytest.skip("no plain paged causal variant")
    gen = torch.Generator(device="cuda").manual_seed(7)
    dt, d = DT[e["dtype"]], e["head_dim"]
    lengths = [500, 1200]
    k_cache, v_cache, table = make_cache(lengths, 16, 2, d, e["kv_dtype"], True, gen)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 100, 8, d, device="cuda", generator=gen).to(dt)
    o, lse = bundle.attention_kvcache(q, k_cache, v_cache, seqlens, block_table=table, causal=True,
                                      return_lse=True)
    torch.cuda.synchronize()
    r_o, r_lse = attention_kvcache_reference(q, k_cache, v_cache, seqlens, table, causal=True)
    check(o, lse, r_o, r_lse, dt, "attention_kvcache Sq=100")


def test_kvcache_window_skips_tiles(bundle):
    """Windows narrower than a key tile over long caches: the query tiles' key ranges start
    past the first tiles (those are neither loaded nor read), with softcap and sinks on; every
    page size the variant takes."""
    ran = 0
    for e in _entries(bundle):
        if not (e["local"] and e["paged"]):
            continue
        for ps in e["page_sizes"]:
            run_case(bundle, e, [1700, 3, 900], [200, 3, 41] if e["varlen"] else 160, 8, 2, ps,
                     window=(37, 0), softcap=5.0, seed=ps)
            ran += 1
    if not ran:
        pytest.skip("no paged variant with the window switch")


def captured(bundle, name, args):
    """A CUDA graph of one launch of variant ``name`` (its module loaded by a launch before the
    capture)."""
    bundle.launch(name, args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        bundle.launch(name, args)
    torch.cuda.synchronize()
    return g


def test_kvcache_prefill_graph_replay(bundle):
    """One launch captured in a CUDA graph, replayed after the lengths, the block table and the
    cached values changed in place: each replay matches the reference of what the buffers then
    hold (the kernel reads lengths and the table on the device)."""
    from factory.testing import attention_kvcache_reference

    ran = 0
    for e in _entries(bundle):
        if not e["paged"] or e["varlen"] or e["kv_dtype"] != e["dtype"]:
            continue
        ps = e["page_sizes"][0]
        gen = torch.Generator(device="cuda").manual_seed(ps)
        dt, d, hq, hkv, sq = DT[e["dtype"]], e["head_dim"], 8, 2, 96
        first, second = [400, 1000], [1300, 97]
        k1, v1, t1 = make_cache(first, ps, hkv, d, e["kv_dtype"], True, gen)
        k2, v2, t2 = make_cache(second, ps, hkv, d, e["kv_dtype"], True, gen)
        # one pool for both: the larger cache's shape; the second's pages written over it later
        pages = max(k1.shape[0], k2.shape[0])
        kc = torch.full((pages, ps, hkv, d), math.nan, device="cuda").to(dt)
        vc = torch.full_like(kc, math.nan)
        mp = max(t1.shape[1], t2.shape[1])
        table = torch.zeros(2, mp, dtype=torch.int32, device="cuda")
        seqlens = torch.zeros(2, dtype=torch.int32, device="cuda")

        def load(k, v, t, lengths):
            kc.fill_(math.nan)
            vc.fill_(math.nan)
            kc[: k.shape[0]] = k
            vc[: v.shape[0]] = v
            table.zero_()
            table[:, : t.shape[1]] = t
            seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))

        q = torch.randn(2, sq, hq, d, device="cuda", generator=gen).to(dt)
        o = torch.full_like(q, math.nan)
        lse = torch.full((2, hq, sq), math.nan, device="cuda")
        sinks = torch.randn(hq, device="cuda", generator=gen) if e["sinks"] else torch.zeros(hq, device="cuda")
        window = (300, 0) if e["local"] else (-1, -1)
        softcap = 7.0 if e["softcap"] else 0.0
        args = [q, kc, vc, o, lse, table, seqlens, sinks, torch.ones(2, hkv, device="cuda"),
                0.8 / math.sqrt(d), softcap, *window]
        load(k1, v1, t1, first)
        g = captured(bundle, e["name"], args)
        for lengths, (k, v, t) in ((second, (k2, v2, t2)), (first, (k1, v1, t1))):
            load(k, v, t, lengths)
            o.fill_(math.nan)
            lse.fill_(math.nan)
            g.replay()
            torch.cuda.synchronize()
            r_o, r_lse = attention_kvcache_reference(
                q, kc, vc, seqlens, table, causal=e["causal"], scale=0.8 / math.sqrt(d), window_size=window,
                softcap=softcap, sinks=sinks if e["sinks"] else None)
            check(o, lse, r_o, r_lse, dt, f"{e['name']} graph replay L={lengths} PS={ps}")
        ran += 1
    assert ran


@pytest.mark.parametrize("kv_dtype,d", [("e4m3", 128), ("bf16", 256)])
def test_kvcache_prefill_public_api(bundle, kv_dtype, d):
    """bundle.attention_kvcache on chunked-prefill problems the sm90 family's fp8-cache and head_dim
    256 builds serve (where the bundle has them): the plan names the variant the call runs; packed
    and dense q, page sizes 16 and 64; fp8 with k_descale per kv head and v_descale per tensor,
    and through the hot path (a second call on new values)."""
    from factory.testing import attention_kvcache_reference

    mine = [e for e in _entries(bundle) if e["family"] == "sm90" and e["kv_dtype"] == kv_dtype
            and e["head_dim"] == d and e["dtype"] == "bf16" and e["causal"]]
    if not mine:
        pytest.skip(f"no sm90-family bf16 causal build with a {kv_dtype} cache at head_dim {d}")
    fp8 = kv_dtype == "e4m3"
    gen = torch.Generator(device="cuda").manual_seed(d)
    hq, hkv = 8, 2
    for varlen in sorted({e["varlen"] for e in mine}):
        for ps in (16, 64):
            lengths, sqs = [700, 65], [200, 65]
            pl = bundle.plan_kvcache(batch=2, seqlen_q=max(sqs), heads_q=hq, heads_kv=hkv, head_dim=d,
                                     max_pages=-(-max(lengths) // ps) + 1, page_size=ps,
                                     kv_dtype=DT[kv_dtype], varlen_q=varlen)
            e = bundle.manifest["variants"][pl.variant]
            assert e["family"] == "sm90" and e["kv_dtype"] == kv_dtype and e["head_dim"] == d, pl.variant
            for call in range(2):  # the second call on new values: the hot path
                k_cache, v_cache, table = make_cache(lengths, ps, hkv, d, kv_dtype, True, gen)
                seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
                kd = torch.rand(hkv, device="cuda", generator=gen) + 0.5 if fp8 else None
                vd = torch.rand(1, device="cuda", generator=gen) + 0.5 if fp8 else None
                ref = dict(causal=True, k_descale=kd, v_descale=vd.expand(hkv) if fp8 else None)
                if varlen:
                    cu = torch.tensor([0, sqs[0], sum(sqs)], dtype=torch.int32, device="cuda")
                    q = torch.randn(sum(sqs), hq, d, device="cuda", generator=gen).to(torch.bfloat16)
                    o, lse = bundle.attention_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                                      k_descale=kd, v_descale=vd, return_lse=True,
                                                      cu_seqlens_q=cu, max_seqlen_q=max(sqs))
                    torch.cuda.synchronize()
                    for i in range(2):
                        s0, s1 = int(cu[i]), int(cu[i + 1])
                        r_o, r_lse = attention_kvcache_reference(q[None, s0:s1], k_cache, v_cache, seqlens[i:i + 1],
                                                                 table[i:i + 1], **ref)
                        check(o[None, s0:s1], lse[None, :, s0:s1], r_o, r_lse, torch.bfloat16,
                              f"{pl.variant} seq {i} PS={ps} call {call}")
                else:
                    q = torch.randn(2, sqs[0], hq, d, device="cuda", generator=gen).to(torch.bfloat16)
                    o, lse = bundle.attention_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                                      k_descale=kd, v_descale=vd, return_lse=True)
                    torch.cuda.synchronize()
                    r_o, r_lse = attention_kvcache_reference(q, k_cache, v_cache, seqlens, table, **ref)
                    check(o, lse, r_o, r_lse, torch.bfloat16, f"{pl.variant} PS={ps} call {call}")


@pytest.mark.parametrize("form", ["dense", "decode", "packed", "dense-odd"])
def test_attention_window_softcap_sinks(bundle, form):
    """bundle.attention with FlashAttention's window_size / softcap and gpt-oss sinks (run by the
    attention_kvcache switch builds over k and v viewed as pages) against the float32 reference,
    dense (Sk a multiple of 64, and 1000: pages of 8), decode and packed sequences."""
    from factory.runtime import NoVariantError
    from factory.testing import attention_kvcache_reference

    gen = torch.Generator(device="cuda").manual_seed(3)
    hq, hkv, d = 32, 8, 128
    bf = dict(device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(hq, device="cuda", generator=gen)
    opts = dict(window_size=(200, 0), softcap=30.0, sinks=sinks)
    try:
        if form == "packed":
            lq, lk = [130, 1, 40], [900, 1, 2000]
            cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            q = torch.randn(sum(lq), hq, d, generator=gen, **bf)
            k, v = torch.randn(sum(lk), hkv, d, generator=gen, **bf), torch.randn(sum(lk), hkv, d, generator=gen, **bf)
            o, lse = bundle.attention(q, k, v, True, None, cu_q, cu_k, max(lq), max(lk), return_lse=True, **opts)
            for i in range(len(lq)):
                qs, ks = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
                lens = torch.tensor([lk[i]], dtype=torch.int32, device="cuda")
                ro, rl = attention_kvcache_reference(q[None, qs], k[None, ks], v[None, ks], lens, **opts)
                assert ((o[qs].float() - ro[0]).abs().max() / ro.abs().max()).item() < 2e-2, i
                assert (lse[:, qs] - rl[0]).abs().max().item() < 1e-2, i
            return
        b, sq, sk = {"dense": (2, 300, 1024), "decode": (4, 1, 2048), "dense-odd": (2, 300, 1000)}[form]
        q = torch.randn(b, sq, hq, d, generator=gen, **bf)
        k, v = torch.randn(b, sk, hkv, d, generator=gen, **bf), torch.randn(b, sk, hkv, d, generator=gen, **bf)
        o, lse = bundle.attention(q, k, v, True, None, return_lse=True, **opts)
    except NoVariantError as e:
        pytest.skip(str(e))
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    ro, rl = attention_kvcache_reference(q, k, v, lens, **opts)
    assert ((o.float() - ro).abs().max() / ro.abs().max()).item() < 2e-2
    assert (lse - rl).abs().max().item() < 1e-2
    o2 = bundle.attention(q, k, v, True, None, **opts)  # again, through the kvcache hot path
    assert torch.equal(o2, o)
