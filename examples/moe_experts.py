#!/usr/bin/env python3
"""The routed experts of a DeepSeek-V3-style mixture-of-experts layer (hidden 7168, 256 experts of
intermediate 2048, top-8 routing, SiLU-gated) with the bundle's grouped GEMM, beside the same layer
from ``torch._grouped_mm``: one launch per projection for all experts, the routing never read on
the host.

    python3 examples/moe_experts.py --bundle artifacts/default             # prefill + decode timing
    python3 examples/moe_experts.py --bundle ... --check --experts 32      # correctness only, small
    python3 examples/moe_experts.py --bundle ... --fp8 block                # prefill in fp8 (DeepSeek-V3 scales)

Prefill (``--tokens``): the routed rows sorted by expert (contiguous layout, ``offs``). Decode
(``--decode-tokens``): each expert's rows in a fixed-capacity buffer (masked layout, ``masked_m``)
so one CUDA graph serves every routing; the graph is captured once and replayed with new routing.
``--fp8 block`` (or ``row``): the prefill projections in float8_e4m3fn, weights quantized once per
128x128 block (or per output channel), activations per 1x128 (or per row) before each projection.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from factory.runtime import Bundle  # noqa: E402

HIDDEN, INTER = 7168, 2048


class Experts:
    """Weights stored as the checkpoints store them: w_gate_up (E, 2·INTER, HIDDEN), w_down (E,
    HIDDEN, INTER); the grouped GEMMs take their (E, K, N) transposes (views, no copy)."""

    def __init__(self, experts: int, hidden: int, inter: int, device="cuda"):
        g = torch.Generator(device=device).manual_seed(0)
        bf = torch.bfloat16
        self.gate_up = torch.randn(experts, 2 * inter, hidden, device=device, generator=g, dtype=bf) * hidden ** -0.5
        self.down = torch.randn(experts, hidden, inter, device=device, generator=g, dtype=bf) * inter ** -0.5
        self.E, self.inter = experts, inter


def route(x, experts: int, top_k: int, gen):
    """Top-k routing of random logits: (expert of each routed row sorted, its token, its weight)."""
    logits = torch.randn(x.shape[0], experts, device=x.device, generator=gen)
    w, idx = logits.softmax(-1).topk(top_k, dim=-1)
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)[order]
    counts = torch.bincount(flat, minlength=experts)
    return counts, token, w.flatten()[order]


def experts_ours(bundle, ex: Experts, xs, offs):
    h = bundle.grouped_gemm(xs, ex.gate_up.transpose(1, 2), offs=offs)
    g, u = h.chunk(2, dim=-1)
    return bundle.grouped_gemm((F.silu(g) * u).contiguous(), ex.down.transpose(1, 2), offs=offs)


class Fp8Experts:
    """The experts' weights quantized once (runtime/fp8.py quantize_grouped_b): (E, N, K) e4m3 and
    their scales in ``form`` ("block": per 128x128, "row": per output channel)."""

    def __init__(self, ex: Experts, form: str):
        from factory.runtime import fp8

        self.form = form
        self.gate_up, self.s_gate_up = fp8.quantize_grouped_b(ex.gate_up, form)
        self.down, self.s_down = fp8.quantize_grouped_b(ex.down, form)


def experts_fp8(bundle, fx: Fp8Experts, xs, offs):
    """The prefill projections in fp8: activations quantized per 1x128 block (or row) before each."""
    from factory.runtime import fp8

    qa, sa = fp8.quantize_grouped_a(xs, fx.form)
    h = bundle.grouped_gemm(qa, fx.gate_up.transpose(1, 2), offs=offs, scale_a=sa, scale_b=fx.s_gate_up)
    g, u = h.chunk(2, dim=-1)
    qh, sh = fp8.quantize_grouped_a((F.silu(g) * u).contiguous(), fx.form)
    return bundle.grouped_gemm(qh, fx.down.transpose(1, 2), offs=offs, scale_a=sh, scale_b=fx.s_down)


def experts_torch(ex: Experts, xs, offs):
    h = torch._grouped_mm(xs, ex.gate_up.transpose(1, 2), offs=offs)
    g, u = h.chunk(2, dim=-1)
    return torch._grouped_mm((F.silu(g) * u).contiguous(), ex.down.transpose(1, 2), offs=offs)


def experts_masked(bundle, ex: Experts, xm, masked_m, expected_m):
    h = bundle.grouped_gemm(xm, ex.gate_up.transpose(1, 2), masked_m=masked_m, expected_m=expected_m)
    g, u = h.chunk(2, dim=-1)
    return bundle.grouped_gemm((F.silu(g) * u).contiguous(), ex.down.transpose(1, 2), masked_m=masked_m,
                               expected_m=expected_m)


def moe(x, counts, token, weight, fn):
    """Sorted rows through the experts, weighted and summed back per token."""
    xs = x[token]
    offs = counts.cumsum(0).to(torch.int32)
    y = fn(xs, offs)
    out = torch.zeros_like(x, dtype=torch.float32)
    out.index_add_(0, token, y.float() * weight[:, None])
    return out.to(x.dtype)


def graph_ms(fn, reps=10):
    """(median ms of ``reps`` replays, the graph) of ``fn`` captured once (after a warm-up call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts), g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=32, help="rows per expert in the decode buffer")
    ap.add_argument("--check", action="store_true", help="correctness only")
    ap.add_argument("--fp8", choices=("block", "row"), help="also the prefill projections in fp8 with these scales")
    args = ap.parse_args()
    bundle = Bundle.open(args.bundle)
    ex = Experts(args.experts, HIDDEN, INTER)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ok = True

    # Prefill: contiguous layout.
    x = torch.randn(args.tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    counts, token, weight = route(x, args.experts, args.top_k, gen)
    ours = moe(x, counts, token, weight, lambda xs, offs: experts_ours(bundle, ex, xs, offs))
    ref = moe(x, counts, token, weight, lambda xs, offs: experts_torch(ex, xs, offs))
    err = (ours.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    ok &= err < 2e-2
    print(f"prefill {args.tokens} tokens x top-{args.top_k} over {args.experts} experts: max rel. difference "
          f"vs torch._grouped_mm {err:.2e}")

    fx = None
    if args.fp8:
        # fp8 against the bf16 layer: quantization error only (e4m3 keeps 3 mantissa bits), a
        # wrong product would differ by the output's own size.
        fx = Fp8Experts(ex, args.fp8)
        y8 = moe(x, counts, token, weight, lambda xs, offs: experts_fp8(bundle, fx, xs, offs))
        err8 = (y8.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
        ok &= err8 < 0.1 and not torch.isnan(y8).any().item()
        print(f"prefill in fp8 ({args.fp8} scales): max rel. difference vs the bf16 torch._grouped_mm layer {err8:.2e}")

    # Decode: masked layout, one graph replayed with new routing.
    E, cap, T = args.experts, args.capacity, args.decode_tokens
    xm = torch.zeros(E, cap, HIDDEN, device="cuda", dtype=torch.bfloat16)
    mm = torch.zeros(E, dtype=torch.int32, device="cuda")
    expected = max(1, T * args.top_k // E)
    out = {}

    def step():
        out["y"] = experts_masked(bundle, ex, xm, mm, expected)

    ms = graph = None
    for trial in range(2):  # the second routing replays the graph captured with the first
        xd = torch.randn(T, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
        c, tok, _ = route(xd, E, args.top_k, gen)
        first = c.cumsum(0) - c
        pos = torch.arange(tok.numel(), device="cuda") - first.repeat_interleave(c)  # rank within its expert
        expert = torch.arange(E, device="cuda").repeat_interleave(c)
        keep = pos < cap  # past the capacity: dropped, as capacity-bound servers do
        xm.zero_()
        xm[expert[keep], pos[keep]] = xd[tok[keep]]
        mm.copy_(c.clamp(max=cap).to(torch.int32))
        if trial == 0:
            ms, graph = graph_ms(step)  # captures `step` and replays it
        else:
            graph.replay()
        torch.cuda.synchronize()
        y, rows = out["y"], mm.tolist()
        for e in range(E):
            n = rows[e]
            if n:
                a = xm[e, :n].float()
                h = F.silu(a @ ex.gate_up[e, :INTER].float().T) * (a @ ex.gate_up[e, INTER:].float().T)
                r = h.to(torch.bfloat16).float() @ ex.down[e].float().T
                ok &= (y[e, :n].float() - r).abs().max().item() <= 3e-2 * max(r.abs().max().item(), 1e-6)
    print(f"decode {T} tokens, capacity {cap} rows per expert: one graph replay {ms:.3f} ms "
          f"(masked layout, routing read on the device)")
    if not args.check:
        xs, offs = x[token], counts.cumsum(0).to(torch.int32)
        tp, _ = graph_ms(lambda: experts_ours(bundle, ex, xs, offs))
        tt, _ = graph_ms(lambda: experts_torch(ex, xs, offs))
        print(f"prefill experts (gate_up + SiLU + down), graph replay: ours {tp:.3f} ms, torch._grouped_mm "
              f"{tt:.3f} ms ({tt / tp:.2f}x)")
        if fx is not None:
            t8, _ = graph_ms(lambda: experts_fp8(bundle, fx, xs, offs))
            print(f"prefill experts in fp8 ({args.fp8} scales, activation quantization in torch included): "
                  f"{t8:.3f} ms")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
