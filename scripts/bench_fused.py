"""The fused glue ops beside the torch sequences they replace, same run, CUDA-graph replays
(``factory.benchmark.time_interleaved``: fresh random inputs, several input sets so the working set
outgrows L2, medians).

* ``rms_norm`` (plain, + residual, + residual + fp8 quantization with per-row scales) for Llama
  hidden sizes and token counts, against the unfused torch sequence (``residual += x``; float32
  norm; weight; amax; scale; divide; cast) and, with ``--compile``, the same sequence under
  ``torch.compile``; the memory floor is the bytes the op must move over the measured copy
  bandwidth.
* ``rope_kvcache`` (Llama-3-8B: 32 q heads, 8 kv heads, head_dim 128, pages of 16) against the
  torch sequence of vLLM's reference path: rotate q and k (gather cos/sin by position, halves,
  multiply, concatenate, copy back in place), then scatter k and v into the paged caches.

    python3 scripts/bench_fused.py --bundle BUNDLE [--compile] [--out DIR]

Writes ``fused.json`` (every row) under ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from factory import benchmark  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

EPS = 1e-6
FP8 = torch.float8_e4m3fn


def torch_rmsnorm(x, w, residual=None, quant=False):
    if residual is not None:
        residual.add_(x)
        x = residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w
    if not quant:
        return y
    amax = y.abs().amax(-1, keepdim=True).float()
    scale = torch.clamp(amax / 448.0, min=1.0 / (448.0 * 512.0))
    return (y.float() / scale).clamp(-448.0, 448.0).to(FP8), scale


def torch_rope_cache(q, k, v, pos, cos_sin, kc, vc, slots):
    r = cos_sin.shape[1]
    cs = cos_sin[pos]
    cos, sin = cs[:, None, : r // 2], cs[:, None, r // 2:]
    for t in (q, k):
        x1, x2 = t[..., : r // 2].float(), t[..., r // 2: r].float()
        t[..., :r].copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    kc.view(-1, *kc.shape[2:])[slots] = k
    vc.view(-1, *vc.shape[2:])[slots] = v


def show(row):
    size = f"M={row['M']} N={row['N']} {row['mode']}" if row["op"] == "rms_norm" else f"T={row['T']}"
    extra = f" compiled {row['compiled_us']:.1f}" if "compiled_us" in row else ""
    print(f"{row['op']} {size}: fused {row['fused_us']:.1f} us, torch {row['torch_us']:.1f}{extra}, "
          f"floor {row['floor_us']:.1f} ({100 * row['of_floor']:.0f} %), {row['vs_torch']:.2f}x torch", flush=True)


def bench_rmsnorm(b, bw, compile_):
    rows = []
    comp = torch.compile(torch_rmsnorm) if compile_ else None
    for n in (2048, 4096, 8192, 16384):
        w = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        for m in (1, 16, 64, 512, 2048, 8192):
            sets = benchmark.sets_for(m * n * 2 * 3, 50 << 20)
            xs = [torch.randn(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
            rs = [torch.randn(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
            for mode in ("plain", "residual", "residual_fp8"):
                res = mode != "plain"
                quant = mode == "residual_fp8"
                calls = {
                    "fused": lambda i: b.rms_norm(xs[i], w, EPS, residual=rs[i] if res else None,
                                                  quantize=FP8 if quant else None),
                    "torch": lambda i: torch_rmsnorm(xs[i], w, rs[i] if res else None, quant),
                }
                if comp is not None and m in (16, 8192) and n == 4096:
                    calls["compiled"] = lambda i: comp(xs[i], w, rs[i] if res else None, quant)
                t = benchmark.time_interleaved(calls, sets)
                moved = m * n * 2 * (2 + (2 if res else 0)) - (m * n if quant else 0) + n * 2 + (4 * m if quant else 0)
                floor = moved / bw
                row = {"op": "rms_norm", "mode": mode, "M": m, "N": n, "bytes": moved, "floor_us": floor * 1e6,
                       **{f"{k}_us": v * 1e6 for k, v in t.items()},
                       "of_floor": floor / t["fused"], "vs_torch": t["torch"] / t["fused"]}
                if "compiled" in t:
                    row["vs_compiled"] = t["compiled"] / t["fused"]
                rows.append(row)
                show(row)
    return rows


def bench_rope(b, bw):
    rows = []
    hq, hkv, d, ps = 32, 8, 128, 16
    maxpos = 8192
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    ang = torch.arange(maxpos, device="cuda").float()[:, None] * inv[None]
    cos_sin = torch.cat((ang.cos(), ang.sin()), dim=-1).contiguous()
    for t_ in (1, 16, 64, 512, 2048, 8192):
        pages = -(-t_ // ps) * 2 + 4
        sets = benchmark.sets_for(t_ * (hq + 2 * hkv) * d * 2 * 3, 50 << 20)
        mk = lambda *s: torch.randn(*s, dtype=torch.bfloat16, device="cuda")  # noqa: E731
        qs = [mk(t_, hq, d) for _ in range(sets)]
        ks = [mk(t_, hkv, d) for _ in range(sets)]
        vs = [mk(t_, hkv, d) for _ in range(sets)]
        kc = [mk(pages, ps, hkv, d) for _ in range(sets)]
        vc = [mk(pages, ps, hkv, d) for _ in range(sets)]
        pos = [torch.randint(0, maxpos, (t_,), device="cuda") for _ in range(sets)]
        slots = [torch.randperm(pages * ps, device="cuda")[:t_] for _ in range(sets)]
        calls = {
            "fused": lambda i: b.rope_kvcache(qs[i], ks[i], vs[i], pos[i], cos_sin, kc[i], vc[i], slots[i]),
            "torch": lambda i: torch_rope_cache(qs[i], ks[i], vs[i], pos[i], cos_sin, kc[i], vc[i], slots[i]),
        }
        t = benchmark.time_interleaved(calls, sets)
        moved = t_ * d * 2 * (2 * hq + 2 * hkv + hkv + 2 * hkv) + t_ * (16 + d * 4)
        floor = moved / bw
        row = {"op": "rope_kvcache", "T": t_, "Hq": hq, "Hkv": hkv, "D": d, "bytes": moved, "floor_us": floor * 1e6,
               **{f"{k}_us": v * 1e6 for k, v in t.items()}, "of_floor": floor / t["fused"],
               "vs_torch": t["torch"] / t["fused"]}
        rows.append(row)
        show(row)
    return rows


def host_us(fn, n=2000):
    """Host microseconds per eager call (nothing synchronised inside the loop)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def host_costs(b):
    x, r = (torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    q, k, v = (torch.randn(16, h, 128, dtype=torch.bfloat16, device="cuda") for h in (32, 8, 8))
    kc, vc = (torch.zeros(8, 16, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    pos, sl = torch.arange(16, device="cuda"), torch.arange(16, device="cuda")
    cs = torch.randn(64, 128, device="cuda")
    out = {"rms_norm_residual_fp8": host_us(lambda: b.rms_norm(x, w, EPS, residual=r, quantize=FP8)),
           "rms_norm": host_us(lambda: b.rms_norm(x, w, EPS)),
           "rope_kvcache": host_us(lambda: b.rope_kvcache(q, k, v, pos, cs, kc, vc, sl)),
           "torch_rms_norm_residual_fp8": host_us(lambda: torch_rmsnorm(x, w, r, True)),
           "torch_rope_cache": host_us(lambda: torch_rope_cache(q, k, v, pos, cs, kc, vc, sl))}
    print(json.dumps({"host_us": out}), flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--compile", action="store_true", help="also time the torch sequence under torch.compile")
    p.add_argument("--out", default=benchmark.default_out("fused"))
    p.add_argument("--only", choices=("rms_norm", "rope_kvcache"))
    a = p.parse_args()
    b = Bundle.open(a.bundle)
    t0 = time.time()
    with torch.inference_mode():
        bw = benchmark.copy_bandwidth(1 << 30)
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
        rows = []
        hosts = host_costs(b)
        if a.only in (None, "rms_norm"):
            rows += bench_rmsnorm(b, bw, a.compile)
        if a.only in (None, "rope_kvcache"):
            rows += bench_rope(b, bw)
    os.makedirs(a.out, exist_ok=True)
    out = {"device": torch.cuda.get_device_name(), "copy_bw_tbs": bw / 1e12, "torch": torch.__version__,
           "command": "python3 scripts/bench_fused.py " + " ".join(sys.argv[1:]), "seconds": time.time() - t0, "host_us": hosts,
           "rows": rows}
    Path(a.out, "fused.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}/fused.json ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
