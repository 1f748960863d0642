"""Attention over a paged or dense KV cache (``bundle.attention_kvcache``) on a GPU, against the
float32 reference on the gathered K/V (``factory.testing.attention_kvcache_reference``).

Every attention_kvcache variant of the bundle launched by name: every page size, ragged lengths
(0, 1, a partly filled last page, several key tiles), GQA / MQA / MHA, seqlen_q 1 / 4 / 16, fp8 e4m3
caches with per-kv-head k_descale and a per-tensor v_descale where the bundle has them
(bottom-right causal); pages handed out in a shuffled order, the pool's unused pages and the
block table's unused entries pointing at NaN pages, NaN-poisoned o and lse.  The switch build:
a left window, softcap, sinks, each alone and together.  Selection through ``attention_kvcache``
over batch 1-64; a CUDA-graph replay with lengths and block tables changed between replays; a
bad block table refused under ``check_varlen=True`` in a subprocess that then still computes.
Skips without a GPU or without attention_kvcache variants in ``$FACTORY_BUNDLE``.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not b.candidates("attention_kvcache"):
        pytest.skip(f"{BUNDLE} has no attention_kvcache variant for this device")
    return b


def entries(bundle, **want):
    return [e for e in bundle.candidates("attention_kvcache") if all(e.get(k) == v for k, v in want.items())]


def make_cache(lens, hkv, d, dtype, page_size, gen, spare_pages=3):
    """(k_cache, v_cache, block_table) holding random K/V for sequences of ``lens`` keys: a paged
    pool (page_size given) with the pages dealt out in a shuffled order, or a dense
    (B, max, Hkv, D) cache (page_size None).  Every row no sequence uses is NaN, and the block
    table's unused entries point at a NaN page."""
    b = len(lens)
    if page_size is None:
        cap = max(max(lens), 1) + 5
        k = torch.full((b, cap, hkv, d), math.nan, dtype=dtype, device="cuda")
        v = k.clone()
        for i, n in enumerate(lens):
            k[i, :n] = torch.randn(n, hkv, d, device="cuda", generator=gen).to(dtype)
            v[i, :n] = torch.randn(n, hkv, d, device="cuda", generator=gen).to(dtype)
        return k, v, None
    need = [-(-n // page_size) for n in lens]
    max_pages = max(max(need), 1) + 1
    total = sum(need) + spare_pages
    k = torch.full((total, page_size, hkv, d), math.nan, dtype=dtype, device="cuda")
    v = k.clone()
    order = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
    nan_page = order[-1].item()
    bt = torch.full((b, max_pages), nan_page, dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(lens):
        pages = order[at: at + need[i]]
        at += need[i]
        bt[i, : need[i]] = pages
        for j, pg in enumerate(pages.tolist()):
            rows = min(page_size, n - j * page_size)
            k[pg, :rows] = torch.randn(rows, hkv, d, device="cuda", generator=gen).to(dtype)
            v[pg, :rows] = torch.randn(rows, hkv, d, device="cuda", generator=gen).to(dtype)
    return k, v, bt


def run_case(bundle, e, lens, hq, hkv, sq, page_size, gen, descales=("head", "tensor"), by_name=True, **opts):
    """``descales`` (fp8 caches): the (k, v) descale forms, each "head" (one per kv head),
    "tensor" (one element) or None (left out: 1); ``by_name=False``: through the selection (which
    must pick ``e``)."""
    from factory.testing import attention_kvcache_reference

    dtype, d = DT[e["dtype"]], e["head_dim"]
    k, v, bt = make_cache(lens, hkv, d, dtype, page_size, gen)
    if e.get("kv_dtype") == "e4m3":  # fp8 cache (NaN rows stay NaN) with its descales
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        for name, form in zip(("k_descale", "v_descale"), descales):
            if form is not None:
                opts[name] = torch.rand(hkv if form == "head" else 1, device="cuda", generator=gen) + 0.5
    q = torch.randn(len(lens), sq, hq, d, device="cuda", generator=gen).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, math.nan)
    if not by_name:
        chosen = bundle.plan_kvcache(batch=len(lens), seqlen_q=sq, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=dtype,
                                     kv_dtype=k.dtype, **({"max_seqlen_k": k.shape[1]} if bt is None else
                                                          {"page_size": page_size, "max_pages": bt.shape[1]}))
        assert chosen.variant == e["name"], (chosen.variant, e["name"])
    o, lse = bundle.attention_kvcache(q, k, v, seqlens, block_table=bt, return_lse=True, out=out,
                                      variant=e["name"] if by_name else None, **opts)
    assert o is out
    ref_o, ref_lse = attention_kvcache_reference(
        q, k, v, seqlens, bt, causal=True, scale=opts.get("softmax_scale"),
        window_size=opts.get("window_size", (-1, -1)), softcap=opts.get("softcap", 0.0), sinks=opts.get("sinks"),
        k_descale=opts.get("k_descale"), v_descale=opts.get("v_descale"))
    what = f"{e['name']} lens={lens} H{hq}/{hkv} Sq{sq} page={page_size} {sorted(opts)}"
    assert not o.isnan().any(), f"{what}: NaN in o"
    assert not lse.isnan().any(), f"{what}: NaN in lse"
    err = ((o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-6)).item()
    assert err < TOL[dtype], f"{what}: relative error {err:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{what}: -inf LSE rows differ"
    assert (o.transpose(1, 2)[empty] == 0).all(), f"{what}: rows with no key are not 0"
    if (~empty).any():
        lerr = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert lerr < 2e-2, f"{what}: LSE error {lerr:.2e}"


PAGE_SIZES = (1, 8, 16, 32, 64, 128, 256)
# (lens, Hq, Hkv, Sq)
CASES = [
    ([0, 1, 77, 1000], 32, 8, 1),      # empty, one key, partial pages, many tiles
    ([4109, 65], 16, 1, 1),            # MQA 16, a long one beside a short one
    ([300, 129, 64], 8, 8, 1),         # MHA
    ([999, 3, 513], 32, 8, 4),         # speculative: 4 queries, Sq > L for one sequence
    ([513, 20], 32, 8, 16),            # 64 rows: four row blocks
]


@pytest.mark.parametrize("page_size", (None,) + PAGE_SIZES)
def test_every_variant(bundle, page_size):
    gen = torch.Generator(device="cuda").manual_seed(7 + (page_size or 0))
    # (the decode family, seqlen_q <= 16, fp8 caches among them; the prefill families' variants:
    # tests/test_attention_kvcache_prefill_gpu.py)
    es = entries(bundle, family="sm90_decode", paged=page_size is not None)
    if not es:
        pytest.skip("no variant for this cache layout")
    with torch.no_grad():
        for e in es:
            cases = CASES if page_size in (None, 16) or e["kv_splits"] == 1 else CASES[:2]
            for lens, hq, hkv, sq in cases:
                run_case(bundle, e, lens, hq, hkv, sq, page_size, gen)


@pytest.mark.parametrize("opts", [
    dict(window_size=(100, 0)),
    dict(window_size=(0, -1)),
    dict(softcap=5.0),
    dict(sinks="rand"),
    dict(window_size=(37, 0), softcap=30.0, sinks="rand", softmax_scale=0.05),
])
def test_switches(bundle, opts):
    # The decode family's switch builds (dense q of 1-16 rows); the prefill families' switch builds
    # take packed or longer q and are run by tests/test_attention_kvcache_prefill_gpu.py.
    es = [e for e in bundle.candidates("attention_kvcache")
          if e.get("local") and e.get("softcap") and e.get("sinks") and e["family"] == "sm90_decode"]
    if not es:
        pytest.skip("no switch build")
    gen = torch.Generator(device="cuda").manual_seed(11)
    with torch.no_grad():
        for e in es:
            for page_size in ((16, 64, 1) if e["paged"] else (None,)):
                for lens, hq, hkv, sq in CASES[:2] + CASES[3:4]:
                    o = dict(opts)
                    if o.get("sinks") == "rand":
                        o["sinks"] = torch.randn(hq, device="cuda", generator=gen) * 2
                    run_case(bundle, e, lens, hq, hkv, sq, page_size, gen, **o)


@pytest.mark.parametrize("batch", (1, 4, 16, 64))
def test_selection(bundle, batch):
    if not entries(bundle, paged=True, dtype="bf16", head_dim=128):
        pytest.skip("no bf16 D128 paged variant")
    from factory.runtime.kvcache import plan

    gen = torch.Generator(device="cuda").manual_seed(batch)
    lens = [int(x) for x in torch.randint(0, 3000, (batch,), generator=gen.manual_seed(batch), device="cuda")]
    if batch > 1:
        lens[0] = 0
    k, v, bt = make_cache(lens, 8, 128, torch.bfloat16, 16, gen, spare_pages=1)
    q = torch.randn(batch, 1, 32, 128, device="cuda", generator=gen).to(torch.bfloat16)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    from factory.testing import attention_kvcache_reference

    with torch.no_grad():
        o = bundle.attention_kvcache(q, k, v, sl, block_table=bt)
        pl = plan(bundle, batch=batch, seqlen_q=1, heads_q=32, heads_kv=8, head_dim=128, max_pages=bt.shape[1],
                  page_size=16)
        o2 = bundle.attention_kvcache(q, k, v, sl, block_table=bt, plan=pl)
    ref, _ = attention_kvcache_reference(q, k, v, sl, bt)
    assert ((o.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < 1e-2
    assert torch.equal(o, o2)


def test_graph_replay_changed_lengths_and_tables(bundle):
    es = entries(bundle, family="sm90_decode", paged=True, dtype="bf16", head_dim=128)
    if not es:
        pytest.skip("no bf16 D128 paged variant")
    from factory.testing import attention_kvcache_reference

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, hq, hkv, d, ps, max_pages = 4, 32, 8, 128, 16, 40
    pool = 200
    k = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(pool, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(b, 1, hq, d, device="cuda", generator=gen).to(torch.bfloat16)
    bt = torch.zeros(b, max_pages, dtype=torch.int32, device="cuda")
    sl = torch.zeros(b, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    pl = bundle.plan_kvcache(batch=b, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d, max_pages=max_pages,
                             page_size=ps)
    with torch.no_grad():
        bundle.attention_kvcache(q, k, v, sl, block_table=bt, out=out, plan=pl)  # loads the module
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                bundle.attention_kvcache(q, k, v, sl, block_table=bt, out=out, plan=pl)
        torch.cuda.current_stream().wait_stream(s)
        for step in range(3):
            lens = torch.randint(0, max_pages * ps + 1, (b,), generator=gen, device="cuda").to(torch.int32)
            if step == 1:
                lens[1] = 0
            sl.copy_(lens)
            bt.copy_(torch.randperm(pool, device="cuda", generator=gen)[: b * max_pages].view(b, max_pages))
            q.copy_(torch.randn(b, 1, hq, d, device="cuda", generator=gen))
            out.fill_(math.nan)
            g.replay()
            torch.cuda.synchronize()
            ref, _ = attention_kvcache_reference(q, k, v, sl, bt)
            assert not out.isnan().any()
            assert ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() < 1e-2, f"replay {step}"


def test_bad_block_table_in_subprocess(bundle):
    """check_varlen=True refuses out-of-range page indices and lengths past the cache before any
    launch; the process then still computes."""
    src = textwrap.dedent(f"""
        import torch
        from factory.runtime import Bundle, InputError
        b = Bundle.open({str(BUNDLE)!r})
        q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(10, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
        bt = torch.tensor([[0, 1, 2], [3, 10**6, 5]], dtype=torch.int32, device="cuda")
        sl = torch.tensor([40, 40], dtype=torch.int32, device="cuda")
        for t, l in ((bt, sl), (bt.clamp(max=9), torch.tensor([40, 49], dtype=torch.int32, device="cuda"))):
            try:
                b.attention_kvcache(q, k, k, l, block_table=t, check_varlen=True)
                raise SystemExit("not refused")
            except InputError as e:
                print("refused:", e)
        o = b.attention_kvcache(q, k, k, sl, block_table=bt.clamp(max=9))
        torch.cuda.synchronize()
        assert not o.isnan().any()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("refused:") == 2 and r.stdout.strip().endswith("ok"), r.stdout


FP8_CASES = [
    ([0, 1, 77, 3000], 32, 8, 1),      # empty, one key, partial pages, many tiles
    ([4109, 65], 16, 1, 1),            # MQA 16
    ([999, 3, 513], 32, 8, 4),         # 4 queries
]


@pytest.mark.parametrize("descales", [("head", "tensor"), ("tensor", "head"), ("head", "head"), (None, None)],
                         ids=["k-head_v-tensor", "k-tensor_v-head", "both-head", "none"])
def test_fp8_cache_descale_forms(bundle, descales):
    """Every fp8 e4m3 decode variant by name over page sizes 1/16/64 and ragged lengths, with
    each form of k_descale / v_descale, against the float32 reference on the dequantised cache;
    then through the selection where it picks that variant, twice per problem (the second call
    through the per-problem hot path, on new data)."""
    es = [e for e in entries(bundle, kv_dtype="e4m3") if e.get("family") == "sm90_decode"]
    if not es:
        pytest.skip("no fp8 e4m3 decode variant in the bundle")
    gen = torch.Generator(device="cuda").manual_seed(41)
    for e in es:
        for ps in (1, 16, 64):
            for lens, hq, hkv, sq in FP8_CASES:
                run_case(bundle, e, lens, hq, hkv, sq, ps, gen, descales=descales)
    for e in es:  # the selection's own pick for a shape it gives this variant, if any
        for lens, hq, hkv in (([8192] * 8, 32, 8), ([32768], 32, 8), ([4096] * 8, 16, 1), ([512] * 128, 32, 8)):
            from factory.runtime import NoVariantError

            try:
                pl = bundle.plan_kvcache(batch=len(lens), seqlen_q=1, heads_q=hq, heads_kv=hkv,
                                         head_dim=e["head_dim"], dtype=DT[e["dtype"]], kv_dtype=torch.float8_e4m3fn,
                                         page_size=16, max_pages=max(lens) // 16 + 1)
            except NoVariantError:  # the split count the rule wants is not in this bundle
                continue
            if pl.variant == e["name"]:  # twice: the second call (new cache, same shapes) takes the hot path
                for _ in range(2):
                    run_case(bundle, e, lens, hq, hkv, 1, 16, gen, descales=descales, by_name=False)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_paged_decode_example(bundle, kv_dtype):
    """examples/paged_decode_llama.py (RoPE + cache write + paged attention in graphed decode
    steps) runs, and its own check passes: our loop's last step against the torch loop's."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "examples" / "paged_decode_llama.py"), "--bundle", str(BUNDLE),
                        "--batch", "4", "--min-len", "100", "--max-len", "600", "--steps", "4", "--kv-dtype", kv_dtype],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "tokens/s" in r.stdout, r.stdout + r.stderr
