"""The ops' hot path (runtime/loader.py ``FixedLaunch``, ``_hot_launch`` in runtime/attention.py
and runtime/gemm.py) on this GPU-less machine: a problem key seen before launches with argument
bytes packed once, writing only the data pointers and the stream per call.  Shown here on a
simulated bundle whose launchers copy the packed arguments they are given: the hot path hands the
kernel the same bytes as the checked path (``Binder.bind``) for the same tensors, refuses what
the checked path refuses (alignment, autograd, the current device), and keeps threads apart."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest
import torch

from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime.loader import Binder

H100 = {"name": "planned H100", "sm_count": 132}


class Copier:
    """Launchers that record (variant, the packed argument bytes, the calling thread)."""

    def __init__(self, bundle):
        self.bundle, self.launched = bundle, []

    def launcher(self, name):
        size = self.bundle.binder(name).size

        def fn(argv):
            self.launched.append((name, ctypes.string_at(argv[0], size), threading.get_ident()))
            return 0

        return fn


@pytest.fixture
def sim(test_bundle, monkeypatch):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.rec = Copier(b)
    b.simulate(b.rec)
    b._raw = lambda i: 0xABC0  # a stream handle the packed bytes must carry
    b.current = -1  # the simulated current device (a test switches it)
    b._cur = lambda: b.current
    binds = []
    real = Binder.bind
    monkeypatch.setattr(Binder, "bind", lambda self, *a, **k: (binds.append(self.name), real(self, *a, **k))[1])
    b.binds = binds
    return b


def bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def misaligned(t):
    """``t``'s shape and strides, its data pointer 2 bytes past 16-byte alignment."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype)
    return flat[1:1 + t.numel()].view(t.shape).copy_(t)


def checked_bytes(b, name, args):
    """What ``Binder.bind`` packs for ``args`` (the checked path's bytes)."""
    argv, buf = b.binder(name).bind(args, 0xABC0, None, True)
    return ctypes.string_at(argv[0], b.binder(name).size)


def test_attention_hot_path_packs_what_the_checked_path_packs(sim):
    q, k, v = bf(1, 128, 8, 64), bf(1, 128, 8, 64), bf(1, 128, 8, 64)
    o, lse = sim.attention(q, k, v, return_lse=True)  # checked path: selected, bound, cached
    assert sim.binds and len(sim.hot_attention) == 1
    name, first, _ = sim.rec.launched[-1]
    scale = 64 ** -0.5
    assert first == checked_bytes(sim, name, [q, k, v, o, lse, scale])
    sim.binds.clear()
    for _ in range(3):  # new tensors, same key: hot path, no binder
        q, k, v = bf(1, 128, 8, 64), bf(1, 128, 8, 64), bf(1, 128, 8, 64)
        o, lse = sim.attention(q, k, v, return_lse=True)
        assert o.shape == q.shape and o.stride() == q.stride() and o.dtype == q.dtype
        assert lse.shape == (1, 8, 128) and lse.is_contiguous() and lse.dtype == torch.float32
        hot_name, hot, _ = sim.rec.launched[-1]
        assert hot_name == name and hot == checked_bytes(sim, name, [q, k, v, o, lse, scale])
    assert sim.binds == [name] * 3  # (only checked_bytes bound)
    # without return_lse (the LSE is written all the same, into a tensor dropped after the launch)
    at = sim.binder(name).offsets[4]  # lse's data pointer
    for _ in range(2):
        q, k, v = bf(1, 128, 8, 64), bf(1, 128, 8, 64), bf(1, 128, 8, 64)
        o = sim.attention(q, k, v)
        assert o.shape == q.shape and o.stride() == q.stride() and o.dtype == q.dtype
        got = sim.rec.launched[-1][1]
        lse_spec = (int.from_bytes(got[at:at + 8], "little"), (1, 8, 128), (8 * 128, 128, 1))
        assert lse_spec[0] % 16 == 0 and got == checked_bytes(sim, name, [q, k, v, o, lse_spec, scale])
    # strided views (a fused QKV projection) and a given scale: their own key, the same bytes
    qkv = bf(2, 64, 3, 8, 64)
    for _ in range(2):
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        o, lse = sim.attention(q, k, v, softmax_scale=0.25, causal=False, return_lse=True)
        assert o.is_contiguous()  # empty_like of a view with gaps: compact
        assert sim.rec.launched[-1][1] == checked_bytes(sim, name, [q, k, v, o, lse, 0.25])
        qkv = bf(2, 64, 3, 8, 64)
    assert len(sim.hot_attention) == 2


def test_attention_without_lse_writes_it_into_the_bundles_scratch(sim, monkeypatch):
    """A hot call without ``return_lse`` allocates only o: the kernel's LSE goes to one buffer per
    device that the bundle keeps (the same pointer every call); an LSE larger than that buffer is
    allocated per call."""
    from factory.runtime import attention as attn

    def lse_ptr():
        name, got, _ = sim.rec.launched[-1]
        at = sim.binder(name).offsets[4]
        return int.from_bytes(got[at:at + 8], "little")

    q = bf(1, 128, 8, 64)
    sim.attention(q, q, q)  # checked path: cached
    ptrs = set()
    for _ in range(3):
        q = bf(1, 128, 8, 64)
        sim.attention(q, q, q)
        ptrs.add(lse_ptr())
    (buf,) = sim.scratch.values()
    assert ptrs == {buf.data_ptr()} and buf.numel() * 4 == attn.LSE_SCRATCH_BYTES
    _, lse = sim.attention(q, q, q, return_lse=True)  # with return_lse: its own tensor
    assert lse_ptr() == lse.data_ptr() != buf.data_ptr()
    monkeypatch.setattr(attn, "LSE_SCRATCH_BYTES", 1024)  # a smaller buffer: B1 H8 S128 does not fit
    sim.hot_attention.clear()
    ptrs = set()
    for _ in range(3):
        q = bf(1, 128, 8, 64)
        o = sim.attention(q, q, q)
        assert o.shape == q.shape
        ptrs.add(lse_ptr())
    assert buf.data_ptr() not in ptrs and len(sim.scratch) == 1


def test_gemm_hot_path_packs_what_the_checked_path_packs(sim):
    from factory.runtime.gemm import fp8_scales, launch_scalars, rkl_spec

    def expect(name, a, w, out, scales=()):
        entry = sim.manifest["variants"][name]
        return checked_bytes(sim, name, [rkl_spec(a, "a"), rkl_spec(w, "b"), rkl_spec(out, "c"), *scales,
                                         *launch_scalars(sim, entry)])

    for alloc in (False, True):
        for i in range(3):
            a, w = bf(256, 512), bf(384, 512)
            out = None if alloc else torch.empty(256, 384, dtype=torch.bfloat16)
            r = sim.gemm(a, w, out)
            assert r.shape == (256, 384) and r.dtype == torch.bfloat16 and r.is_contiguous()
            name, got, _ = sim.rec.launched[-1]
            assert "persistent" in sim.manifest["variants"][name]  # sm_90a: the grid cap is a packed scalar
            assert got == expect(name, a, w, r)
    e4 = torch.float8_e4m3fn
    for scales in ((torch.tensor([0.5]), torch.tensor([2.0])), (None, None), (torch.tensor([0.5]), None)):
        for i in range(3):
            a, w = torch.randn(256, 512).to(e4), torch.randn(384, 512).to(e4)
            r = sim.gemm(a, w, scale_a=scales[0], scale_b=scales[1])
            name, got, _ = sim.rec.launched[-1]
            specs, keep = fp8_scales(sim, a, *scales, -1)
            assert got == expect(name, a, w, r, specs)
    assert len(sim.hot_gemm) == 5


def test_packed_hot_path_packs_what_the_checked_path_packs(sim):
    from factory.runtime.gemm import fp8_scales
    from factory.runtime.packed import launch_specs

    e4 = torch.float8_e4m3fn
    p = sim.pack_b(torch.randn(256, 2048).to(e4))
    for scales in ((torch.tensor([0.5]), torch.tensor([2.0])), (None, None)):
        for b_constant in (False, True):
            for i in range(3):
                a = torch.randn(4, 2048).to(e4)
                out = None if i % 2 else torch.empty(4, 256, dtype=torch.bfloat16)
                r = sim.gemm(a, p, out, scale_a=scales[0], scale_b=scales[1], b_constant=b_constant)
                assert r.shape == (4, 256) and r.dtype == torch.bfloat16 and (out is None or r is out)
                name, got, _ = sim.rec.launched[-1]
                assert sim.manifest["variants"][name]["family"] == "decode"
                assert name.endswith("_eb") == b_constant
                assert got == checked_bytes(sim, name, launch_specs(a, p, r, fp8_scales(sim, a, *scales, -1)[0]))
    assert len(sim.hot_gemm) == 8


def test_split_k_workspace_is_allocated_per_call(sim):
    name = "gemm_sm90_bf16_obf16_ak_bk_t64x128x32_w2x2_sk4"
    ws_arg = next(i for i, (a, *_) in enumerate(sim.binder(name).plan) if a.name not in ("a", "b", "c"))
    at = sim.binder(name).offsets[ws_arg]
    seen = []
    for i in range(3):
        a, w, out = bf(64, 1024), bf(128, 1024), torch.empty(64, 128, dtype=torch.bfloat16)
        sim.gemm(a, w, out, variant=name)
        got = sim.rec.launched[-1][1]
        from factory.runtime.gemm import rkl_spec

        ws = int.from_bytes(got[at:at + 8], "little")
        seen.append(ws)
        want = checked_bytes(sim, name, [rkl_spec(a, "a"), rkl_spec(w, "b"), rkl_spec(out, "c"),
                                         (ws, (64, 128, 4), (128, 1, 64 * 128))])
        assert got == want and ws % 16 == 0
    assert len(sim.hot_gemm) == 1


def test_hot_path_refuses_what_the_checked_path_refuses(sim):
    q = bf(1, 64, 4, 64)
    sim.attention(q, q, q)
    n = len(sim.rec.launched)
    with pytest.raises(InputError, match="q: data pointer must be 16-byte aligned"):
        sim.attention(misaligned(q), q, q)
    with pytest.raises(InputError, match="attention: q require grad"):
        sim.attention(q.clone().requires_grad_(), q, q)
    with torch.no_grad():
        sim.attention(q.clone().requires_grad_(), q, q)  # allowed: launched
    sim.current = 3  # the caller switched devices (the tensors' "device" is -1)
    with pytest.raises(InputError, match="the tensors are on cuda:-1 but the current device is cuda:3"):
        sim.attention(q, q, q)
    assert len(sim.rec.launched) == n + 1
    sim.current = -1
    a, w, out = bf(256, 512), bf(384, 512), torch.empty(256, 384, dtype=torch.bfloat16)
    sim.gemm(a, w, out)
    n = len(sim.rec.launched)
    with pytest.raises(NoVariantError, match="aligned"):  # (no variant takes a misaligned a)
        sim.gemm(misaligned(a), w, out)
    with pytest.raises(InputError, match="gemm: a require grad"):
        sim.gemm(a.clone().requires_grad_(), w, out)
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        sim.gemm([1], w, out)
    with pytest.raises(InputError, match="one-element torch.Tensor"):
        sim.gemm(a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), scale_a=2.0)
    assert len(sim.rec.launched) == n
    sim.gemm(a, w, out)  # the misaligned call did not replace the cached launch
    assert sim.rec.launched[-1][0] == sim.rec.launched[n - 1][0]


def test_threads_write_their_own_argument_buffers(sim):
    """Two threads launching one problem key at once: each launch carries its own pointers (the
    buffers are per thread; a shared one would be rewritten while the other thread's launcher
    reads it — the native launcher runs without the GIL)."""
    q0 = bf(1, 64, 4, 64)
    sim.attention(q0, q0, q0)
    name = sim.rec.launched[-1][0]
    mine, bad, count = {}, [], []

    def slow(argv):  # reads q's pointer, lets the other thread run, reads it again
        before = int.from_bytes(ctypes.string_at(argv[0], 8), "little")
        time.sleep(0)
        after = int.from_bytes(ctypes.string_at(argv[0], 8), "little")
        if before != after or before != mine.get(threading.get_ident(), before):
            bad.append((before, after, mine.get(threading.get_ident())))
        count.append(1)
        return 0

    sim.hot_attention.clear()
    sim._launchers[name] = slow
    sim.attention(q0, q0, q0)  # re-made with the slow launcher

    def work(t):
        mine[threading.get_ident()] = t.data_ptr()
        for _ in range(300):
            sim.attention(t, t, t)

    ts = [threading.Thread(target=work, args=(bf(1, 64, 4, 64),)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad, bad[:3]
    assert len(count) == 601


def launched_lse(sim, heads, rows):
    """The (B=1, heads, rows) LSE spec of the last launch, its pointer read from the packed bytes."""
    name, got, _ = sim.rec.launched[-1]
    at = sim.binder(name).offsets[4]
    return int.from_bytes(got[at:at + 8], "little"), (1, heads, rows), (heads * rows, rows, 1)


def test_attention_out_plan_packs_what_the_checked_path_packs(sim):
    """``out=``: o is written into the given tensor (returned as is, nothing allocated for it);
    the plan of that key packs the checked path's bytes; out=None and out= of another layout
    are keys of their own."""
    scale = 64 ** -0.5
    for i in range(3):
        q, k, v = bf(1, 128, 8, 64), bf(1, 128, 8, 64), bf(1, 128, 8, 64)
        out = torch.empty_like(q)
        o, lse = sim.attention(q, k, v, return_lse=True, out=out)
        assert o is out and lse.shape == (1, 8, 128)
        name, got, _ = sim.rec.launched[-1]
        assert got == checked_bytes(sim, name, [q, k, v, out, lse, scale])
        assert sim.attention(q, k, v, out=out) is out
    assert len(sim.hot_attention) == 1 and sim.binds.count(name) == 1 + 3  # (3 by checked_bytes)
    wide = torch.empty(1, 128, 8, 128, dtype=torch.bfloat16)[..., :64]  # out with row gaps: its own key
    for _ in range(2):
        assert sim.attention(q, k, v, out=wide) is wide
        assert sim.rec.launched[-1][1] == checked_bytes(sim, name, [q, k, v, wide, launched_lse(sim, 8, 128), scale])
    sim.attention(q, k, v)
    assert len(sim.hot_attention) == 3


def test_attention_out_refused_before_any_launch(sim):
    """A bad ``out`` raises InputError on the first call and on a call whose key has a plan: the
    plan checks the pointers' alignment and overlap per call and hands over to the checked path."""
    q, k, v = bf(1, 64, 4, 64), bf(1, 64, 4, 64), bf(1, 64, 4, 64)
    n = len(sim.rec.launched)
    for bad, why in ((bf(1, 64, 4, 32), "shape"), (torch.empty(1, 64, 4, 64), "dtype"),
                     (bf(1, 1, 1, 64).expand(1, 64, 4, 64), "overlapping elements"),
                     (misaligned(q), "out: data pointer must be 16-byte aligned"),
                     (bf(1, 64, 4, 128)[..., ::2], "head_dim must be contiguous"),
                     (q, "out overlaps q"), (v, "out overlaps v"), ([1], "out must be a tensor")):
        with pytest.raises(InputError, match=why):
            sim.attention(q, k, v, out=bad)
    assert len(sim.rec.launched) == n
    out = torch.empty_like(q)
    sim.attention(q, k, v, out=out)
    sim.attention(q, k, v, out=out)  # the plan's call
    n = len(sim.rec.launched)
    flat = bf(2 * q.numel())  # out half over k: the same layouts, so the plan's key
    lo, hi = flat[:q.numel()].view(q.shape), flat[q.numel() // 2:][:q.numel()].view(q.shape)
    with pytest.raises(InputError, match="out overlaps k"):
        sim.attention(q, lo, v, out=hi)
    with pytest.raises(InputError, match="out overlaps v"):
        sim.attention(q, k, hi, out=lo)
    with pytest.raises(InputError, match="out overlaps q"):
        sim.attention(hi, k, v, out=lo)
    with pytest.raises(InputError, match="out: data pointer must be 16-byte aligned"):
        sim.attention(q, k, v, out=misaligned(q))
    with pytest.raises(InputError, match="out= is not available for fp8"):
        sim.attention(q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), out=out)
    assert len(sim.rec.launched) == n


def test_attention_plan_misses_on_a_new_stride_dtype_or_device(sim, monkeypatch):
    """A launch plan serves only its key: new strides (same shapes), another dtype or another
    device take the checked path (which validates them and, where they are fine, makes their own
    plan; the test bundle has no fp16 kernel, a device that is not the current one is refused)."""
    q = bf(1, 64, 4, 64)
    sim.attention(q, q, q)
    sim.binds.clear()
    t = bf(1, 4, 64, 64).transpose(1, 2)  # q's shape, other strides
    assert t.shape == q.shape and t.stride() != q.stride()
    sim.attention(t, q, q)
    name = sim.rec.launched[-1][0]
    assert sim.binds == [name] and len(sim.hot_attention) == 2
    got = sim.rec.launched[-1][1]
    o_at = sim.binder(name).offsets[3]
    o_spec = (int.from_bytes(got[o_at:o_at + 8], "little"), t.shape, torch.empty_like(t).stride())
    assert got == checked_bytes(sim, name, [t, q, q, o_spec, launched_lse(sim, 4, 64), 0.125])
    n = len(sim.rec.launched)
    h = q.half()
    try:
        sim.attention(h, h, h)
    except NoVariantError:
        pass  # (the checked path's refusal: no fp16 kernel for this device in the bundle)
    else:
        assert len(sim.hot_attention) == 3 and sim.rec.launched[-1][0] != name
        n += 1
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 1)  # the same tensors "on cuda:1"
    with pytest.raises(InputError, match="cuda:1 but the current device is cuda:-1"):
        sim.attention(q, q, q)
    assert len(sim.rec.launched) == n
