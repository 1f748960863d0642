#!/usr/bin/env python3
"""A paged-KV decode loop for one Llama-3-8B attention layer (32 q heads, 8 kv heads, head_dim
128, bf16), as a server runs it: a page pool with a free list, one block table row per sequence,
sequences of mixed lengths, and each step (rotate this token's q and k, append its K/V into its
page, attend over the cache) captured once in a CUDA graph and replayed.  Prints tokens/s of the
loop built on ``bundle.rope_kvcache`` + ``bundle.attention_kvcache`` beside the same loop built
from torch ops (RoPE, index assignment into the pages, gather the pages into a dense (batch,
max_len) K/V, then SDPA with a key-padding mask), and checks one step of each against the other.

``--rope-prologue``: also the loop in which ``rope_kvcache`` rotates only k (q given with zero
heads) and ``attention_kvcache(..., rotary_cos_sin=)`` rotates q in its prologue (bf16 caches; the
bundle's ``attention_kvcache_rope`` builds, full tier).  Every loop's step starts from the same
unrotated q (a copy, as a server's QKV projection would write it).

``--kv-dtype fp8``: the pool holds float8_e4m3fn pages (vLLM's fp8 KV cache) with a per-kv-head
k scale and a per-tensor v scale: ``rope_kvcache`` writes ``e4m3(x / scale)`` and
``attention_kvcache`` reads with the same scales as its descales; the torch loop quantizes and
dequantizes with torch ops.

    python3 examples/paged_decode_llama.py --bundle artifacts/default [--batch 32] [--page-size 16]
        [--kv-dtype fp8] [--rope-prologue]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HQ, HKV, D = 32, 8, 128  # Llama-3-8B


class PagePool:
    """K and V pages (num_pages, page_size, kv_heads, head_dim) and a free list."""

    def __init__(self, num_pages: int, page_size: int, device="cuda", dtype=torch.bfloat16):
        self.k = torch.zeros(num_pages, page_size, HKV, D, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.page_size = page_size
        self.free = list(range(num_pages))[::-1]

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free):
            raise MemoryError("page pool exhausted")
        return [self.free.pop() for _ in range(n)]


def make_batch(pool: PagePool, lens: list[int], max_len: int, gen, scales=None):
    """Block tables for sequences of ``lens`` tokens that may grow to ``max_len``: every page a
    sequence will need is taken from the pool now, in pool order (so pages of a sequence are
    scattered), and its first ``len`` rows filled with random K/V (fp8 pools: quantized with
    ``scales`` = (k per kv head, v))."""
    ps = pool.page_size
    max_pages = -(-max_len // ps)
    bt = torch.zeros(len(lens), max_pages, dtype=torch.int32)
    for i, n in enumerate(lens):
        pages = pool.alloc(max_pages)
        bt[i] = torch.tensor(pages, dtype=torch.int32)
        for j in range(-(-n // ps)):
            rows = min(ps, n - j * ps)
            kr = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
            vr = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
            if scales is not None:
                kr, vr = quantize(kr, scales[0]), quantize(vr, scales[1])
            pool.k[pages[j], :rows] = kr
            pool.v[pages[j], :rows] = vr
    return bt.cuda()


def quantize(x, scale):
    """e4m3(x / scale), saturating, scale per kv head (HKV,) or one."""
    s = scale.reshape(-1)[:, None] if scale.numel() > 1 else scale
    return (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def dequantize(x, scale):
    s = scale.reshape(-1)[:, None] if scale.numel() > 1 else scale
    return (x.float() * s).to(torch.bfloat16)


def rope(x, pos, cos_sin):
    """Neox rotary embedding in place: x (B, H, D), pos (B,) int64, cos_sin (max_pos, D)."""
    cos, sin = cos_sin[pos][:, None, : D // 2], cos_sin[pos][:, None, D // 2:]
    x1, x2 = x[..., : D // 2].float(), x[..., D // 2:].float()
    x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype))


def slots(pool: PagePool, bt, lens):
    """Each sequence's next row as a slot (page · page_size + row), device-side: nothing read on
    the host, so the step can be a graph."""
    ps = pool.page_size
    b = torch.arange(bt.shape[0], device=bt.device)
    return bt[b, (lens // ps).long()].long() * ps + (lens % ps).long()


def append(pool: PagePool, slot, k_new, v_new, scales=None):
    """Write this step's K/V (B, Hkv, D) at ``slot`` of each sequence by index assignment."""
    ps = pool.page_size
    page, row = slot // ps, slot % ps
    if scales is not None:
        k_new, v_new = quantize(k_new, scales[0]), quantize(v_new, scales[1])
    pool.k[page, row] = k_new
    pool.v[page, row] = v_new


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=4096, help="longest context at the start")
    p.add_argument("--steps", type=int, default=64, help="decode steps per timed graph replay")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--rope-prologue", action="store_true",
                   help="also the loop that rotates q in the attention kernel's prologue")
    a = p.parse_args(argv)

    from factory.runtime import Bundle

    bundle = Bundle.open(a.bundle)
    gen = torch.Generator(device="cuda").manual_seed(0)
    lens0 = torch.randint(a.min_len, a.max_len + 1, (a.batch,), generator=gen, device="cuda").tolist()
    cap = a.max_len + a.steps + 1
    fp8 = a.kv_dtype == "fp8"
    scales = None
    if fp8:  # a per-kv-head k scale and a per-tensor v scale (randn data: |x| < ~5 -> codes < ~250)
        scales = (torch.linspace(0.015, 0.03, HKV, device="cuda"), torch.tensor([0.02], device="cuda"))
    pool = PagePool(a.batch * -(-cap // a.page_size) + 8, a.page_size,
                    dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
    bt = make_batch(pool, lens0, cap, gen, scales)
    lens = torch.tensor(lens0, dtype=torch.int32, device="cuda")
    q0 = torch.randn(a.batch, 1, HQ, D, device="cuda", generator=gen).to(torch.bfloat16)
    k0 = torch.randn(a.batch, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
    v_new = torch.randn_like(k0)
    q, k_new = q0.clone(), k0.clone()
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device="cuda").float() / D))  # Llama 3's rope theta
    ang = torch.arange(cap + 1, device="cuda").float()[:, None] * inv[None]
    cos_sin = torch.cat((ang.cos(), ang.sin()), dim=-1).contiguous()
    out = torch.empty_like(q)
    plan = bundle.plan_kvcache(batch=a.batch, seqlen_q=1, heads_q=HQ, heads_kv=HKV, head_dim=D,
                               max_pages=bt.shape[1], page_size=a.page_size,
                               kv_dtype=torch.float8_e4m3fn if fp8 else None)
    desc = dict(k_descale=scales[0], v_descale=scales[1]) if fp8 else {}
    wscale = dict(k_scale=scales[0], v_scale=scales[1]) if fp8 else {}
    print(f"{torch.cuda.get_device_name()}: B{a.batch} contexts {min(lens0)}-{max(lens0)} page {a.page_size}, "
          f"Llama-3-8B layer (H{HQ}/{HKV} D{D}), {a.kv_dtype} KV cache; variant {plan.variant}", flush=True)

    def ours():
        q.copy_(q0)
        slot = slots(pool, bt, lens)
        bundle.rope_kvcache(q.view(a.batch, HQ, D), k_new, v_new, lens.long(), cos_sin, pool.k, pool.v, slot,
                            **wscale)
        lens.add_(1)
        bundle.attention_kvcache(q, pool.k, pool.v, lens, block_table=bt, out=out, plan=plan, **desc)

    pos = torch.arange(bt.shape[1] * a.page_size, device="cuda")

    def prologue():
        q.copy_(q0)
        slot = slots(pool, bt, lens)
        bundle.rope_kvcache(q.view(a.batch, HQ, D)[:, :0], k_new, v_new, lens.long(), cos_sin, pool.k, pool.v, slot)
        lens.add_(1)
        bundle.attention_kvcache(q, pool.k, pool.v, lens, block_table=bt, out=out, plan=plan, rotary_cos_sin=cos_sin)

    def torch_loop():
        q.copy_(q0)
        slot = slots(pool, bt, lens)
        rope(q.view(a.batch, HQ, D), lens.long(), cos_sin)
        rope(k_new, lens.long(), cos_sin)
        append(pool, slot, k_new, v_new, scales)
        lens.add_(1)
        kd = pool.k[bt.long()].flatten(1, 2)  # (B, max_pages*ps, Hkv, D)
        vd = pool.v[bt.long()].flatten(1, 2)
        if fp8:
            kd, vd = dequantize(kd, scales[0]), dequantize(vd, scales[1])
        mask = (pos[None, :] < lens[:, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2),
                                           attn_mask=mask, enable_gqa=True)
        out.copy_(o.transpose(1, 2))

    results = {}
    loops = [("rope_kvcache + attention_kvcache", ours), ("torch (RoPE, gather + SDPA)", torch_loop)]
    if a.rope_prologue:
        if fp8:
            raise SystemExit("--rope-prologue: bf16 caches only")
        loops.append(("rope_kvcache (k) + attention (q rotated)", prologue))
    with torch.no_grad():
        for name, step in loops:
            lens.copy_(torch.tensor(lens0, dtype=torch.int32))
            q.copy_(q0)
            k_new.copy_(k0)
            step()  # loads the module / warms up outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                for _ in range(a.steps):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            times = []
            for _ in range(5):
                lens.copy_(torch.tensor(lens0, dtype=torch.int32))
                q.copy_(q0)
                k_new.copy_(k0)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.replay()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            t = sorted(times)[2]
            results[name] = (out.float().clone(), a.batch * a.steps / t)
            print(f"  {name:34s} {a.batch * a.steps / t:10.0f} tokens/s  ({t / a.steps * 1e6:.1f} µs per step "
                  f"incl. RoPE and the K/V append)", flush=True)
    (o1, r1), (o2, r2) = list(results.values())[:2]
    err = ((o1 - o2).norm() / o2.norm()).item()
    print(f"attention_kvcache / torch: {r1 / r2:.2f}x tokens/s; last step's outputs agree to {err:.1e} (rel. L2)")
    ok = err < (4e-2 if fp8 else 2e-2)
    if a.rope_prologue:
        o3, r3 = list(results.values())[2]
        err3 = ((o3 - o2).norm() / o2.norm()).item()
        print(f"q rotated in the prologue / rope_kvcache of q and k: {r3 / r1:.3f}x tokens/s; outputs agree with "
              f"torch's to {err3:.1e}")
        ok = ok and err3 < 2e-2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
