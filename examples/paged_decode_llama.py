#!/usr/bin/env python3
"""A paged-KV decode loop for one Llama-3-8B attention layer (32 q heads, 8 kv heads, head_dim
128, bf16), as a server runs it: a page pool with a free list, one block table row per sequence,
sequences of mixed lengths, and each step (append this token's K/V into its page, attend over the
cache) captured once in a CUDA graph and replayed.  Prints tokens/s of the loop built on
``bundle.attention_kvcache`` beside the same loop built from torch ops (gather the pages into a
dense (batch, max_len) K/V, then SDPA with a key-padding mask), and checks one step of each
against the other.

    python3 examples/paged_decode_llama.py --bundle artifacts/default [--batch 32] [--page-size 16]
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

    def __init__(self, num_pages: int, page_size: int, device="cuda"):
        self.k = torch.zeros(num_pages, page_size, HKV, D, dtype=torch.bfloat16, device=device)
        self.v = torch.zeros_like(self.k)
        self.page_size = page_size
        self.free = list(range(num_pages))[::-1]

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free):
            raise MemoryError("page pool exhausted")
        return [self.free.pop() for _ in range(n)]


def make_batch(pool: PagePool, lens: list[int], max_len: int, gen):
    """Block tables for sequences of ``lens`` tokens that may grow to ``max_len``: every page a
    sequence will need is taken from the pool now, in pool order (so pages of a sequence are
    scattered), and its first ``len`` rows filled with random K/V."""
    ps = pool.page_size
    max_pages = -(-max_len // ps)
    bt = torch.zeros(len(lens), max_pages, dtype=torch.int32)
    for i, n in enumerate(lens):
        pages = pool.alloc(max_pages)
        bt[i] = torch.tensor(pages, dtype=torch.int32)
        for j in range(-(-n // ps)):
            rows = min(ps, n - j * ps)
            pool.k[pages[j], :rows] = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
            pool.v[pages[j], :rows] = torch.randn(rows, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
    return bt.cuda()


def append(pool: PagePool, bt, lens, k_new, v_new):
    """Write this step's K/V (B, Hkv, D) at row ``lens[b]`` of each sequence (device-side index
    arithmetic: nothing read on the host, so the step can be a graph), then lens += 1."""
    ps = pool.page_size
    b = torch.arange(bt.shape[0], device=bt.device)
    page = bt[b, (lens // ps).long()].long()
    row = (lens % ps).long()
    pool.k[page, row] = k_new
    pool.v[page, row] = v_new
    lens += 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=4096, help="longest context at the start")
    p.add_argument("--steps", type=int, default=64, help="decode steps per timed graph replay")
    a = p.parse_args(argv)

    from factory.runtime import Bundle

    bundle = Bundle.open(a.bundle)
    gen = torch.Generator(device="cuda").manual_seed(0)
    lens0 = torch.randint(a.min_len, a.max_len + 1, (a.batch,), generator=gen, device="cuda").tolist()
    cap = a.max_len + a.steps + 1
    pool = PagePool(a.batch * -(-cap // a.page_size) + 8, a.page_size)
    bt = make_batch(pool, lens0, cap, gen)
    lens = torch.tensor(lens0, dtype=torch.int32, device="cuda")
    q = torch.randn(a.batch, 1, HQ, D, device="cuda", generator=gen).to(torch.bfloat16)
    k_new = torch.randn(a.batch, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
    v_new = torch.randn_like(k_new)
    out = torch.empty_like(q)
    plan = bundle.plan_kvcache(batch=a.batch, seqlen_q=1, heads_q=HQ, heads_kv=HKV, head_dim=D,
                               max_pages=bt.shape[1], page_size=a.page_size)
    print(f"{torch.cuda.get_device_name()}: B{a.batch} contexts {min(lens0)}-{max(lens0)} page {a.page_size}, "
          f"Llama-3-8B layer (H{HQ}/{HKV} D{D}); variant {plan.variant}", flush=True)

    def ours():
        append(pool, bt, lens, k_new, v_new)
        bundle.attention_kvcache(q, pool.k, pool.v, lens, block_table=bt, out=out, plan=plan)

    pos = torch.arange(bt.shape[1] * a.page_size, device="cuda")

    def torch_loop():
        append(pool, bt, lens, k_new, v_new)
        kd = pool.k[bt.long()].flatten(1, 2).transpose(1, 2)  # (B, Hkv, max_pages*ps, D)
        vd = pool.v[bt.long()].flatten(1, 2).transpose(1, 2)
        mask = (pos[None, :] < lens[:, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kd, vd, attn_mask=mask, enable_gqa=True)
        out.copy_(o.transpose(1, 2))

    results = {}
    with torch.no_grad():
        for name, step in (("attention_kvcache", ours), ("torch (gather + SDPA)", torch_loop)):
            lens.copy_(torch.tensor(lens0, dtype=torch.int32))
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
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.replay()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            t = sorted(times)[2]
            results[name] = (out.float().clone(), a.batch * a.steps / t)
            print(f"  {name:24s} {a.batch * a.steps / t:10.0f} tokens/s  ({t / a.steps * 1e6:.1f} µs per step "
                  f"incl. the K/V append)", flush=True)
    (o1, r1), (o2, r2) = results.values()
    err = ((o1 - o2).norm() / o2.norm()).item()
    print(f"attention_kvcache / torch: {r1 / r2:.2f}x tokens/s; last step's outputs agree to {err:.1e} (rel. L2)")
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
