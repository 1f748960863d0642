"""Chunked prefill over a paged e4m3 KV cache with fp8 WGMMAs (factory/attention/sm90_kvcache_fp8.py)
on a GPU: every such variant of ``$FACTORY_BUNDLE`` (e4m3 q, ``q_descale`` (B, Hkv)) launched by
name against float32 attention of the de-scaled inputs (testing.attention_kvcache_reference on
q·q_descale and the cache times k_descale / v_descale): every page size the variant takes, ragged
lengths with 0 and 1 keys and partly filled last pages, Sq above L (rows with no key), GQA, MQA and
MHA, dense and packed q, q_descale per (sequence, kv head) and as a zero-stride per-tensor view,
and a CUDA-graph replay after the lengths, the block table and the cache changed.  Unused pages,
rows past each sequence and the caller's o/lse are NaN.  Tolerance: the fp8 forward's (5e-2
relative, P in e4m3).  Skips without a GPU or without such variants."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from test_attention_kvcache_prefill_gpu import CASES, captured, make_cache, open_bundle  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL, LSE_TOL = 5e-2, 5e-2


@pytest.fixture(scope="module")
def bundle():
    return open_bundle(_entries, "attention_kvcache variant with e4m3 q")


def _entries(b):
    return [e for e in b.candidates("attention_kvcache") if e["dtype"] == "e4m3"]


def check(o, lse, ref_o, ref_lse, what):
    from factory.testing import rel_error

    assert not o.isnan().any(), f"{what}: NaN in o"
    assert not lse.isnan().any(), f"{what}: NaN in lse"
    err = rel_error(o, ref_o)
    assert err < TOL, f"{what}: relative error {err:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{what}: -inf LSE rows differ"
    assert (o.transpose(1, 2)[empty] == 0).all(), f"{what}: rows with no key are not 0"
    if (~empty).any():
        lerr = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert lerr < LSE_TOL, f"{what}: LSE error {lerr:.2e}"


def run_case(bundle, e, lengths, sqs, hq, hkv, ps, *, seed=0, per_tensor_q=False):
    from factory.testing import attention_kvcache_reference, dequantize_q

    gen = torch.Generator(device="cuda").manual_seed(seed)
    d, b, f8 = e["head_dim"], len(lengths), torch.float8_e4m3fn
    k_cache, v_cache, table = make_cache(lengths, ps, hkv, d, "e4m3", True, gen)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if per_tensor_q:
        q_descale = (torch.rand(1, 1, device="cuda", generator=gen) + 0.5).expand(b, hkv)
    else:
        q_descale = torch.rand(b, hkv, device="cuda", generator=gen) + 0.5
    kv_descale = torch.rand(2, hkv, device="cuda", generator=gen) + 0.5
    scale = 0.9 / math.sqrt(d)
    ref = dict(causal=e["causal"], scale=scale, k_descale=kv_descale[0], v_descale=kv_descale[1])
    if per_tensor_q:  # (v_descale per tensor too: a zero-stride view)
        kv_descale[1] = kv_descale[1, :1].clone()
        tail = [torch.zeros(hq, device="cuda"), q_descale, kv_descale[0], kv_descale[1, :1].expand(hkv), scale, 0.0,
                -1, -1]
    else:
        tail = [torch.zeros(hq, device="cuda"), q_descale, kv_descale[0], kv_descale[1], scale, 0.0, -1, -1]
    if e["varlen"]:
        cu = torch.tensor([0, *itertools.accumulate(sqs)], dtype=torch.int32, device="cuda")
        tq = int(cu[-1])
        q = (torch.randn(tq + 3, hq, d, device="cuda", generator=gen) * 2).to(f8)[:tq]
        o = torch.full((tq, hq, d), math.nan, dtype=torch.bfloat16, device="cuda")
        lse = torch.full((hq, tq), math.nan, device="cuda")
        bundle.launch(e["name"], [q, k_cache, v_cache, o, lse, table, seqlens, cu, *tail, max(sqs)])
        torch.cuda.synchronize()
        for i in range(b):
            s0, s1 = int(cu[i]), int(cu[i + 1])
            if s1 == s0:
                continue
            qf = dequantize_q(q[None, s0:s1], q_descale[i:i + 1])
            r_o, r_lse = attention_kvcache_reference(qf, k_cache, v_cache, seqlens[i:i + 1], table[i:i + 1], **ref)
            check(o[None, s0:s1], lse[None, :, s0:s1], r_o, r_lse,
                  f"{e['name']} seq {i} L={lengths[i]} Sq={s1 - s0} PS={ps}")
    else:
        sq = sqs
        q = (torch.randn(b, sq + 2, hq, d, device="cuda", generator=gen) * 2).to(f8)[:, :sq]
        o = torch.full((b, sq, hq, d), math.nan, dtype=torch.bfloat16, device="cuda")
        lse = torch.full((b, hq, sq), math.nan, device="cuda")
        bundle.launch(e["name"], [q, k_cache, v_cache, o, lse, table, seqlens, *tail])
        torch.cuda.synchronize()
        r_o, r_lse = attention_kvcache_reference(dequantize_q(q, q_descale), k_cache, v_cache, seqlens, table, **ref)
        check(o, lse, r_o, r_lse, f"{e['name']} L={lengths} Sq={sq} PS={ps}")


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ps", (16, 32, 64, 128, 256))
def test_fp8_prefill(bundle, ps, case):
    lengths, sq, sqs, hq, hkv = CASES[case]
    ran = 0
    for e in _entries(bundle):
        if ps in e["page_sizes"]:
            run_case(bundle, e, lengths, sqs if e["varlen"] else sq, hq, hkv, ps, seed=ps * 10 + case,
                     per_tensor_q=case == 1)
            ran += 1
    assert ran


def test_fp8_prefill_graph_replay(bundle):
    """One launch captured in a CUDA graph, replayed after the lengths, the block table and the
    cached values changed in place: each replay matches the reference of what the buffers hold."""
    from factory.testing import attention_kvcache_reference, dequantize_q

    ran = 0
    for e in _entries(bundle):
        if e["varlen"]:
            continue
        ps = e["page_sizes"][0]
        gen = torch.Generator(device="cuda").manual_seed(ps)
        d, hq, hkv, sq = e["head_dim"], 8, 2, 96
        first, second = [400, 1000], [1300, 97]
        k1, v1, t1 = make_cache(first, ps, hkv, d, "e4m3", True, gen)
        k2, v2, t2 = make_cache(second, ps, hkv, d, "e4m3", True, gen)
        pages = max(k1.shape[0], k2.shape[0])
        kc = torch.full((pages, ps, hkv, d), math.nan, device="cuda").to(torch.float8_e4m3fn)
        vc = kc.clone()
        mp = max(t1.shape[1], t2.shape[1])
        table = torch.zeros(2, mp, dtype=torch.int32, device="cuda")
        seqlens = torch.zeros(2, dtype=torch.int32, device="cuda")

        def load(k, v, t, lengths):
            kc.view(torch.uint8).fill_(0x7F)  # e4m3 NaN
            vc.view(torch.uint8).fill_(0x7F)
            kc[: k.shape[0]] = k
            vc[: v.shape[0]] = v
            table.zero_()
            table[:, : t.shape[1]] = t
            seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))

        q = (torch.randn(2, sq, hq, d, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
        o = torch.full((2, sq, hq, d), math.nan, dtype=torch.bfloat16, device="cuda")
        lse = torch.full((2, hq, sq), math.nan, device="cuda")
        q_descale = torch.rand(2, hkv, device="cuda", generator=gen) + 0.5
        kv_descale = torch.rand(2, hkv, device="cuda", generator=gen) + 0.5
        args = [q, kc, vc, o, lse, table, seqlens, torch.zeros(hq, device="cuda"), q_descale, kv_descale[0],
                kv_descale[1], 0.8 / math.sqrt(d), 0.0, -1, -1]
        load(k1, v1, t1, first)
        g = captured(bundle, e["name"], args)
        for lengths, (k, v, t) in ((second, (k2, v2, t2)), (first, (k1, v1, t1))):
            load(k, v, t, lengths)
            o.fill_(math.nan)
            lse.fill_(math.nan)
            g.replay()
            torch.cuda.synchronize()
            r_o, r_lse = attention_kvcache_reference(
                dequantize_q(q, q_descale), kc, vc, seqlens, table, causal=e["causal"], scale=0.8 / math.sqrt(d),
                k_descale=kv_descale[0], v_descale=kv_descale[1])
            check(o, lse, r_o, r_lse, f"{e['name']} graph replay L={lengths} PS={ps}")
        ran += 1
    assert ran


def test_fp8_prefill_public_api(bundle):
    """bundle.attention_kvcache with float8_e4m3fn q and q_descale over an e4m3 cache (per-tensor,
    per-kv-head and per-(sequence, kv head) q_descale; dense and packed q; pages of 16 and 64): the
    plan names the variant the call runs, o is bfloat16 and matches the reference; the torch op and a
    second call (the hot path) give the same o."""
    from factory.testing import attention_kvcache_reference, dequantize_q

    if not hasattr(bundle, "plan_kvcache"):
        pytest.skip("this runtime has no plan_kvcache")
    f8, hq, hkv, d = torch.float8_e4m3fn, 8, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    ran = 0
    for varlen in sorted({e["varlen"] for e in _entries(bundle) if e["causal"]}):
        for ps, qd_shape in ((16, (1,)), (64, (hkv,)), (64, (2, hkv))):
            if not any(ps in e["page_sizes"] and e["varlen"] == varlen for e in _entries(bundle)):
                continue
            lengths, sqs = [700, 65], [200, 65]
            kc, vc, table = make_cache(lengths, ps, hkv, d, "e4m3", True, gen)
            seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
            q_descale = torch.rand(*qd_shape, device="cuda", generator=gen) + 0.5
            kd, vd = torch.rand(hkv, device="cuda", generator=gen) + 0.5, torch.rand(1, device="cuda") + 0.5
            sq = max(sqs)
            q = (torch.randn(2, sq, hq, d, device="cuda", generator=gen) * 2).to(f8)
            kw = dict(block_table=table, causal=True, q_descale=q_descale, k_descale=kd, v_descale=vd,
                      return_lse=True)
            plan = bundle.plan_kvcache(batch=2, seqlen_q=sq, heads_q=hq, heads_kv=hkv, head_dim=d,
                                       max_pages=table.shape[1], page_size=ps, dtype=f8, kv_dtype=f8,
                                       varlen_q=varlen)
            if varlen:
                qp = q.reshape(2 * sq, hq, d)
                cu = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device="cuda")
                o, lse = bundle.attention_kvcache(qp, kc, vc, seqlens, cu_seqlens_q=cu, max_seqlen_q=sq, **kw)
                o = o.view(2, sq, hq, d)
                lse = lse.view(hq, 2, sq).transpose(0, 1)
            else:
                o, lse = bundle.attention_kvcache(q, kc, vc, seqlens, plan=plan, **kw)
                o2, _ = bundle.torch_ops().attention_kvcache(q, kc, vc, seqlens, table, True, None, -1, -1, 0.0,
                                                             None, kd, vd, None, None, q_descale)
                o3, lse3 = bundle.attention_kvcache(q, kc, vc, seqlens, plan=plan, **kw)  # the hot path
                assert torch.equal(o, o2) and torch.equal(o, o3) and torch.equal(lse, lse3)
            assert o.dtype == torch.bfloat16 and "_e4m3_" in plan.variant and ps in bundle.manifest[
                "variants"][plan.variant]["page_sizes"]
            torch.cuda.synchronize()
            qd = q_descale.reshape(-1) if q_descale.dim() == 1 else q_descale
            qd = qd.expand(hkv).expand(2, hkv) if qd.numel() == 1 else (qd.expand(2, hkv) if qd.dim() == 1 else qd)
            r_o, r_lse = attention_kvcache_reference(dequantize_q(q, qd), kc, vc, seqlens, table, causal=True,
                                                     k_descale=kd, v_descale=vd)
            check(o, lse, r_o, r_lse, f"public api varlen={varlen} PS={ps} q_descale {qd_shape}")
            ran += 1
    assert ran
