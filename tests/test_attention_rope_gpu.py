"""GPU tests of the rotary prologue of the KV-cache decode kernel (``attention_kvcache(...,
rotary_cos_sin=)``, the ``attention_kvcache_rope`` builds) and of ``rope_kvcache`` with q left out
(q of zero heads), against float32 references, NaN-poisoned outputs.  Run with FACTORY_BUNDLE at a
bundle holding the attention_kvcache, attention_kvcache_rope and rope_kvcache ops (sm_90)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import BUNDLE  # noqa: E402
from test_attention_kvcache_gpu import make_cache  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROPE_OP, OP = "attention_kvcache_rope", "attention_kvcache"


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    if not (BUNDLE / "manifest.json").exists():
        pytest.skip(f"no bundle at {BUNDLE} (set FACTORY_BUNDLE)")
    b = Bundle.open(BUNDLE)
    if not b.candidates(ROPE_OP):
        pytest.skip(f"{BUNDLE} has no {ROPE_OP} variant for this device")
    return b


def cos_sin_table(n: int, r: int, gen) -> torch.Tensor:
    """(n, r) float32: r/2 cosines then r/2 sines of random angles (not a frequency ladder: every
    column's angle matters)."""
    ang = torch.rand(n, r // 2, device="cuda", generator=gen) * 2 * math.pi
    return torch.cat([ang.cos(), ang.sin()], dim=1).contiguous()


def rotate(x: torch.Tensor, cs: torch.Tensor, pos: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """float32 rotary embedding of x (..., D) at positions ``pos`` (x's leading shape) clamped into
    the table; the first R = cs.shape[1] columns rotated."""
    r = cs.shape[1]
    c, s = cs[pos.clamp(0, cs.shape[0] - 1)].float().split(r // 2, dim=-1)
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)  # over the heads
    x = x.float().clone()
    if interleaved:
        a, b = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., : r // 2].clone(), x[..., r // 2: r].clone()
        x[..., : r // 2], x[..., r // 2: r] = a * c - b * s, b * c + a * s
    return x


def plain_of(name: str) -> str:
    return OP + name.removeprefix(ROPE_OP).removesuffix("_gptj")


# (lens, Hq, Hkv, Sq, rotary_dim, table rows): the last case has positions past the table (its last row)
CASES = [([1, 37, 300], 32, 8, 1, 128, 4096), ([200, 5], 32, 8, 4, 128, 4096), ([77, 1000], 16, 2, 1, 64, 4096),
         ([300, 130], 32, 8, 1, 128, 100)]


@pytest.mark.parametrize("case", CASES, ids=[f"L{c[0][-1]}-H{c[1]}/{c[2]}-Sq{c[3]}-R{c[4]}-T{c[5]}" for c in CASES])
def test_rotary_prologue_every_variant(bundle, case, run_record):
    from factory.testing import attention_kvcache_reference

    lens, hq, hkv, sq, r, rows = case
    gen = torch.Generator(device="cuda").manual_seed(7)
    for e in bundle.candidates(ROPE_OP):
        il = e["rope"] == "interleaved"
        dtype = torch.bfloat16 if e["dtype"] == "bf16" else torch.float16
        d = e["head_dim"]
        k, v, bt = make_cache(lens, hkv, d, dtype, 16, gen)
        q = torch.randn(len(lens), sq, hq, d, device="cuda", generator=gen).to(dtype)
        q0 = q.clone()
        cs = cos_sin_table(rows, r, gen)
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out = torch.full_like(q, math.nan)
        o, lse = bundle.attention_kvcache(q, k, v, seqlens, block_table=bt, return_lse=True, out=out,
                                          variant=plain_of(e["name"]), rotary_cos_sin=cs, rotary_interleaved=il)
        assert o is out and torch.equal(q, q0), "q must not be written"
        pos = (seqlens.long() - sq)[:, None] + torch.arange(sq, device="cuda")[None, :]  # (B, Sq)
        qr = rotate(q, cs, pos, il).to(dtype)  # the kernel rotates in float32 and rounds to q's dtype
        ref_o, ref_lse = attention_kvcache_reference(qr, k, v, seqlens, bt, causal=True)
        what = f"{e['name']} {case}"
        err = ((o.float() - ref_o).norm() / ref_o.norm()).item()
        run_record.add(bundle, e["name"], [{"rel_err": err, "tol": 1e-2, "ok": err < 1e-2}])
        assert not o.isnan().any(), f"{what}: NaN in o"
        assert err < 1e-2, f"{what}: relative error {err:.2e}"
        lerr = (lse - ref_lse).abs().max().item()
        assert lerr < 2e-2, f"{what}: LSE error {lerr:.2e}"
        # and not the unrotated q's attention (the rotation is applied at all)
        un_o, _ = attention_kvcache_reference(q, k, v, seqlens, bt, causal=True)
        assert ((o.float() - un_o).norm() / un_o.norm()).item() > 5e-2, f"{what}: q looks unrotated"


def same(a, b) -> bool:
    """Bit-equal, NaN rows (the caches' unused rows) included."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_two_forms_of_a_decode_step_agree_in_a_graph(bundle):
    """One decode step in both forms: rope_kvcache rotating q and k + attention, and rope_kvcache
    with q of zero heads (k only) + attention rotating q in its prologue: the same caches, the same
    output within bf16 rounding; then both captured in CUDA graphs and replayed on new data."""
    if not bundle.candidates("rope_kvcache"):
        pytest.skip("no rope_kvcache variant")
    gen = torch.Generator(device="cuda").manual_seed(3)
    b, hq, hkv, d, ps, ctx = 4, 32, 8, 128, 16, 700
    dt = torch.bfloat16
    k0, v0, bt = make_cache([ctx - 1] * b, hkv, d, dt, ps, gen, spare_pages=b)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    pos = (lens - 1).long()
    slot = bt.gather(1, (pos // ps)[:, None].int()).long()[:, 0] * ps + pos % ps
    cs = cos_sin_table(8192, d, gen)
    caches = [(k0.clone(), v0.clone()) for _ in range(2)]
    q, k, v = (torch.randn(b, h, d, device="cuda", generator=gen).to(dt) for h in (hq, hkv, hkv))
    qa, ka, kc = q.clone(), k.clone(), k.clone()  # (k is rotated in place: one copy per form)
    outs = [torch.full((b, 1, hq, d), math.nan, dtype=dt, device="cuda") for _ in range(2)]

    def sep():
        bundle.rope_kvcache(qa, ka, v, pos, cs, *caches[0], slot)
        bundle.attention_kvcache(qa.view(b, 1, hq, d), *caches[0], lens, block_table=bt, out=outs[0])

    def pro():
        bundle.rope_kvcache(q[:, :0], kc, v, pos, cs, *caches[1], slot)
        bundle.attention_kvcache(q.view(b, 1, hq, d), *caches[1], lens, block_table=bt, out=outs[1],
                                 rotary_cos_sin=cs)

    sep()
    pro()
    assert torch.equal(qa, q) is False and torch.equal(ka, kc)  # q rotated by the first form only
    assert same(caches[0][0], caches[1][0]) and same(caches[0][1], caches[1][1])
    assert not outs[1].isnan().any()
    err = ((outs[1].float() - outs[0].float()).norm() / outs[0].float().norm()).item()
    assert err < 1e-2, err
    # graphs of both forms, replayed on new q/k/v
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g1, stream=s):
            sep()
        with torch.cuda.graph(g2, stream=s):
            pro()
    for _ in range(2):
        q.copy_(torch.randn(b, hq, d, device="cuda", generator=gen))
        k.copy_(torch.randn(b, hkv, d, device="cuda", generator=gen))
        v.copy_(torch.randn(b, hkv, d, device="cuda", generator=gen))
        qa.copy_(q), ka.copy_(k), kc.copy_(k)
        for o in outs:
            o.fill_(math.nan)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert same(caches[0][0], caches[1][0]) and same(caches[0][1], caches[1][1])
        err = ((outs[1].float() - outs[0].float()).norm() / outs[0].float().norm()).item()
        assert err < 1e-2, err
