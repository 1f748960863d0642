"""``bundle.attention_kvcache``'s hot path (runtime/kvcache.py ``_hot_launch``) on this GPU-less
machine, through a simulated bundle whose launchers copy the packed arguments: a problem seen
before launches with the bytes the checked path (``Binder.bind``) packs for the same tensors and
the same stand-ins (block table, sinks, descales), whatever the cache lengths and block table
hold; it refuses what the checked path refuses; options, layouts and plans key their own
launches; a variant merged through a workspace gets a new workspace per call."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import kvcache
from factory.runtime.loader import Binder

H100 = {"name": "planned H100", "sm_count": 132}
STREAM = 0xABC0


class Copier:
    def __init__(self, bundle):
        self.bundle, self.launched, self.peek = bundle, [], None

    def launcher(self, name):
        size = self.bundle.binder(name).size

        def fn(argv):
            got = ctypes.string_at(argv[0], size)
            self.launched.append((name, got, threading.get_ident()))
            if self.peek is not None:  # (what a pointer points at, while the launch holds it)
                self.peek(name, got)
            return 0

        return fn


@pytest.fixture
def sim(test_bundle, monkeypatch):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not any(e.get("family") == "sm90_decode" for e in b.candidates("attention_kvcache")):
        pytest.skip("the test bundle has no attention_kvcache decode variant")
    b.rec = Copier(b)
    b.simulate(b.rec)
    b._raw = lambda i: STREAM
    b.current = -1
    b._cur = lambda: b.current
    binds = []
    real = Binder.bind
    monkeypatch.setattr(Binder, "bind", lambda self, *a, **k: (binds.append(self.name), real(self, *a, **k))[1])
    b.binds = binds
    return b


def bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def packed(b, name, args):
    argv, _ = b.binder(name).bind(args, STREAM, None, True)
    return ctypes.string_at(argv[0], b.binder(name).size)


def ptr_at(b, name, got, i):
    at = b.binder(name).offsets[i]
    return int.from_bytes(got[at:at + 8], "little")


def expect(b, name, got, q, k, v, o, sl, bt=None, sinks=None, k_descale=None, v_descale=None, scale=None,
           softcap=0.0, window=(-1, -1)):
    """The checked path's bytes for these tensors, with the lse (and workspace) pointers the
    launch carried (they are allocated per call)."""
    e = b.manifest["variants"][name]
    splits = int(e.get("splits", 1))
    bsz, sq, hq, d = q.shape
    hkv = k.shape[2]
    lse = (ptr_at(b, name, got, 4), (bsz, hq, sq), (hq * sq, sq, 1))
    args = [q, k, v, o, lse]
    if splits > 1:
        w = ptr_at(b, name, got, 5)
        n = splits * bsz * hq * sq
        args += [(w, (splits, bsz, hq, sq, d), (bsz * hq * sq * d, hq * sq * d, sq * d, d, 1)),
                 (w + n * d * 4, (splits, bsz, hq, sq), (bsz * hq * sq, hq * sq, sq, 1))]
    args += [bt if bt is not None else kvcache._dummy("table", q.device, 1).expand(bsz, 1), sl,
             sinks if sinks is not None else kvcache._dummy("sinks", q.device, hq)]
    if e["kv_dtype"] == "e4m3":  # the caller's tensors as they are (a unit factor where left out)
        for t in (k_descale, v_descale):
            if t is None:
                args.append((kvcache._dummy("descale", q.device, 1).data_ptr(), (hkv,), (0,)))
            else:
                args.append((t.data_ptr(), (hkv,), (0,) if t.numel() == 1 else (t.stride(-1),)))
    else:
        args.append(kvcache._dummy("descale", q.device, hkv))
    args += [scale if scale is not None else d ** -0.5, softcap, window[0], window[1]]
    return packed(b, name, args)


def paged(bsz=2, hq=32, hkv=8, d=128, ps=16, pages=20, mp=8, dtype=torch.bfloat16):
    q = bf(bsz, 1, hq, d)
    k, v = bf(pages, ps, hkv, d).to(dtype), bf(pages, ps, hkv, d).to(dtype)
    bt = torch.randint(0, pages, (bsz, mp), dtype=torch.int32)
    sl = torch.randint(0, mp * ps, (bsz,), dtype=torch.int32)
    return q, k, v, sl, bt


def test_hot_path_packs_what_the_checked_path_packs(sim):
    q, k, v, sl, bt = paged()
    sim.attention_kvcache(q, k, v, sl, block_table=bt)  # checked: selected, bound, cached
    assert len(sim.hot_kvcache) == 1 and sim.binds
    name = sim.rec.launched[-1][0]
    sim.binds.clear()
    for i in range(3):  # new tensors and contents, the same key: no binder, the same bytes
        q, k, v, sl, bt = paged()
        o, lse = sim.attention_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
        assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 32, 1) and lse.dtype == torch.float32
        got = sim.rec.launched[-1][1]
        assert sim.rec.launched[-1][0] == name and ptr_at(sim, name, got, 4) == lse.data_ptr()
        assert got == expect(sim, name, got, q, k, v, o, sl, bt)
    assert sim.binds == [name] * 3  # (only expect() bound)
    # out=, a dense cache, the switches with sinks: each its own key, the same bytes as checked
    out = torch.empty_like(q)
    dense = bf(2, 300, 8, 128)
    sinks = torch.randn(32)
    for i in range(2):
        assert sim.attention_kvcache(q, k, v, sl, block_table=bt, out=out) is out
        got = sim.rec.launched[-1][1]
        assert got == expect(sim, sim.rec.launched[-1][0], got, q, k, v, out, sl, bt)
        o = sim.attention_kvcache(q, dense, dense, sl)
        n2, got = sim.rec.launched[-1][:2]
        assert "paged" not in n2 and got == expect(sim, n2, got, q, dense, dense, o, sl)
        o = sim.attention_kvcache(q, k, v, sl, block_table=bt, window_size=(64, 0), softcap=30.0, sinks=sinks,
                                  softmax_scale=0.1)
        n3, got = sim.rec.launched[-1][:2]
        assert n3.endswith("_win_cap_sink")
        assert got == expect(sim, n3, got, q, k, v, o, sl, bt, sinks=sinks, scale=0.1, softcap=30.0, window=(64, 0))
        sinks = torch.randn(32)
    assert len(sim.hot_kvcache) == 4
    # chunked prefill (seqlen_q 64: a prefill family's variant, where the bundle has one)
    for i in range(3):
        q, k, v, sl, bt = paged()
        q = bf(2, 64, 32, 128)
        try:
            o = sim.attention_kvcache(q, k, v, sl, block_table=bt)
        except NoVariantError:
            break
        n4, got = sim.rec.launched[-1][:2]
        assert sim.manifest["variants"][n4]["family"] != "sm90_decode"
        assert got == expect(sim, n4, got, q, k, v, o, sl, bt)


def test_fp8_descales_and_workspace_per_call(sim):
    e4 = torch.float8_e4m3fn
    if not any(e.get("kv_dtype") == "e4m3" and e["dtype"] == "bf16" for e in sim.candidates("attention_kvcache")):
        pytest.skip("no bf16-q fp8-cache variant in the test bundle")
    seen_desc = []

    def peek(name, got):  # the k_descale and v_descale pointers the kernel would read, and what they hold
        args = sim.binder(name).sig.args
        ptrs = [ptr_at(sim, name, got, args.index(next(a for a in args if a.name == n)))
                for n in ("k_descale", "v_descale")]
        seen_desc.append([(p, torch.frombuffer(bytearray(ctypes.string_at(p, 4)), dtype=torch.float32).item())
                          for p in ptrs])

    sim.rec.peek = peek
    for kd, vd in ((torch.rand(8) + 0.5, torch.rand(1) + 0.5), (None, None), (torch.rand(1), None),
                   (None, torch.rand(8)), (torch.rand(2, 8)[1], torch.rand(1, 1)), (torch.rand(8, 2)[:, 1], None)):
        for i in range(2):
            q, k, v, sl, bt = paged(dtype=e4)
            kd, vd = (None if t is None else t + 0.25 if t.is_contiguous() else t.add_(0.25)
                      for t in (kd, vd))  # new values per call (a strided view stays one)
            o = sim.attention_kvcache(q, k, v, sl, block_table=bt, k_descale=kd, v_descale=vd)
            name, got = sim.rec.launched[-1][:2]
            assert "_ce4m3_" in name
            assert got == expect(sim, name, got, q, k, v, o, sl, bt, k_descale=kd, v_descale=vd)
            for t, (ptr, first) in zip((kd, vd), seen_desc[-1]):  # no copy: the caller's own pointer
                assert (ptr == t.data_ptr()) if t is not None else (first == 1.0)
    sim.rec.peek = None
    # one sequence, a long capacity: the workspace-merged split (a new workspace per call)
    if not any(e.get("splits", 1) > 1 and e.get("dtype") == "bf16" and e.get("head_dim") == 128
               and e.get("kv_dtype") == "bf16" and e.get("paged") for e in sim.candidates("attention_kvcache")):
        pytest.skip("no workspace split in the test bundle")
    seen = set()
    for i in range(3):
        q, k, v, sl, bt = paged(bsz=1, hkv=1, hq=16, mp=512)
        o = sim.attention_kvcache(q, k, v, sl, block_table=bt)
        name, got = sim.rec.launched[-1][:2]
        assert sim.manifest["variants"][name].get("splits", 1) > 1
        assert got == expect(sim, name, got, q, k, v, o, sl, bt)
        seen.add(ptr_at(sim, name, got, 5))
    assert len(seen) >= 1 and all(w % 16 == 0 for w in seen)


def test_hot_path_refuses_what_the_checked_path_refuses(sim):
    q, k, v, sl, bt = paged()
    sim.attention_kvcache(q, k, v, sl, block_table=bt)
    n = len(sim.rec.launched)
    mis = torch.empty(q.numel() + 8, dtype=q.dtype)[1:1 + q.numel()].view(q.shape).copy_(q)
    with pytest.raises(InputError, match="q: data pointer must be 16-byte aligned"):
        sim.attention_kvcache(mis, k, v, sl, block_table=bt)
    with pytest.raises(InputError, match="require grad"):
        sim.attention_kvcache(q.clone().requires_grad_(), k, v, sl, block_table=bt)
    sim.current = 3
    with pytest.raises(InputError, match="current device is cuda:3"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt)
    sim.current = -1
    with pytest.raises(InputError, match="block_table must be int32"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt.long())
    # check_varlen reads the contents on the host: never the hot path
    bad = bt.clone()
    bad[0, 0] = 999
    sl2 = torch.full((2,), 5, dtype=torch.int32)
    with pytest.raises(InputError, match="page index outside"):
        sim.attention_kvcache(q, k, v, sl2, block_table=bad, check_varlen=True)
    assert len(sim.rec.launched) == n
    with torch.no_grad():
        sim.attention_kvcache(q.clone().requires_grad_(), k, v, sl, block_table=bt)
    assert len(sim.rec.launched) == n + 1
    # a plan keys its own launch, and a call that is not the planned problem is refused
    pl = sim.plan_kvcache(batch=2, seqlen_q=1, heads_q=32, heads_kv=8, head_dim=128, page_size=16, max_pages=8)
    sim.attention_kvcache(q, k, v, sl, block_table=bt, plan=pl)
    sim.attention_kvcache(q, k, v, sl, block_table=bt, plan=pl)
    assert sim.rec.launched[-1][0] == pl.variant
    with pytest.raises(InputError, match="not the planned one"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt[:, :4].contiguous(), plan=pl)
