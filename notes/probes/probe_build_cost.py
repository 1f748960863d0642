#!/usr/bin/env python3
"""Probe (no GPU): where a bundle's build time and bytes go, and which variants the loader's own
selection rules never pick on any device it may meet.

  python3 notes/probes/probe_build_cost.py BUNDLE [--problems N] [--json OUT]

1. Per (target, family, op): variants, the sum of ``compile_seconds`` (the manifest's: cute.compile
   alone, as measured when that variant entered the compile cache, so concurrency of the build it
   came from inflates some), bytes of its files; the slowest variants.
2. The bundle's bytes per directory (cubin/, obj/ and lib/ each hold every cubin once).
3. Reachability: ``bundle.gemm`` / ``bundle.attention`` on a simulated bundle (meta tensors, a
   recording launcher: tests/c_selection.py) over random and grid problems, on every device class
   the targets serve (capability, SM count), without a tuning table.  A variant never picked is
   not thereby useless: tune.py may measure it the winner on a GPU we have (9.0), portability
   builds (sm_90) are the proof of the sm_8x source on the H100 (smoke.py runs them by name), and
   ``variant=`` callers may name any.  The list says where selection alone cannot reach.

Answer on the default bundle: notes/blackwell.md, "Build time".
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# (capability, SMs, label): A100, A10, L4, RTX 4090, H100 SXM, H100 PCIe, B200, B300, RTX 5090
DEVICES = [((8, 0), 108, "A100"), ((8, 6), 72, "A10"), ((8, 9), 58, "L4"), ((8, 9), 128, "RTX 4090"),
           ((9, 0), 132, "H100 SXM"), ((9, 0), 114, "H100 PCIe"), ((10, 0), 148, "B200"),
           ((10, 3), 148, "B300"), ((12, 0), 170, "RTX 5090")]


def gemm_grid() -> list[dict]:
    out = []
    for ab, c in (("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32"), ("f16", "f32"), ("e4m3", "bf16")):
        for am, bm in (("k", "k"), ("m", "k"), ("k", "n"), ("m", "n")):
            if ab == "e4m3" and (am, bm) != ("k", "k"):
                continue
            for M in (1, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
                for N, K in ((1024, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336),
                             (28672, 4096), (8192, 8192), (57344, 8192), (8192, 28672), (2048, 2048), (512, 512)):
                    for L in (1, 4):
                        out.append(dict(ab=ab, c=c, M=M, N=N, K=K, L=L, a_major=am, b_major=bm, pad_a=0, pad_b=0,
                                        pad_c=0, b_constant=False, a_off=0, b_off=0, c_off=0))
                        out.append(dict(out[-1], b_constant=True))
    return out


def reachability(bundle_path: Path, n_random: int) -> dict[str, set]:
    import c_selection as cs

    gemm_ps = gemm_grid() + cs.gemm_problems(seed=7, n=n_random)
    attn_ps = cs.attention_problems(seed=7, n_dense=n_random, n_varlen=n_random // 3)
    picked: dict[str, set] = collections.defaultdict(set)
    for cc, sms, label in DEVICES:
        b = cs.open_simulated(bundle_path, cc, sms, f"planned {label}")
        for p in gemm_ps:
            a, w, c = cs.gemm_tensors(p)
            r = cs.py_gemm(b, p, a, w, c)
            if r[0] == "ok":
                picked[r[1]].add(label)
        for p in attn_ps:
            if p["q_off"]:
                continue
            q, k, v, _ = cs.attention_tensors(p)
            r = cs.py_attention(b, p, q, k, v)
            if r[0] == "ok":
                picked[r[1]].add(label)
    return picked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--problems", type=int, default=1500, help="random problems of each op (plus the GEMM grid)")
    ap.add_argument("--json", help="write the tables here")
    a = ap.parse_args()
    bundle = Path(a.bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    vs = m["variants"]
    groups = collections.defaultdict(lambda: [0, 0.0, 0])
    for v in vs.values():
        g = groups[(v["target"], v["family"], v["op"])]
        g[0] += 1
        g[1] += v.get("compile_seconds") or 0.0
        g[2] += sum(f["bytes"] for f in v["files"].values())
    total_s = sum(g[1] for g in groups.values())
    print(f"{len(vs)} variants, sum of compile_seconds {total_s:.0f} s")
    print("target   family  op         n   compile_s  share  MB (cubin+obj+h)")
    for k, g in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{k[0]:8} {k[1]:7} {k[2]:9} {g[0]:3} {g[1]:10.1f} {g[1] / total_s:6.1%} {g[2] / 1e6:7.2f}")
    print("slowest:", ", ".join(f"{v['name']} {v['compile_seconds']:.1f}" for v in
                                sorted(vs.values(), key=lambda v: -(v.get("compile_seconds") or 0))[:8]))
    dirs = collections.Counter()
    for p in bundle.rglob("*"):
        if p.is_file():
            dirs[p.relative_to(bundle).parts[0] if len(p.relative_to(bundle).parts) > 1 else p.name] += p.stat().st_size
    print("bytes:", ", ".join(f"{d} {b / 1e6:.1f} MB" for d, b in dirs.most_common()))
    dup = collections.defaultdict(list)
    for n, v in vs.items():
        dup[v["files"]["cubin"]["sha256"]].append(n)
    print("identical cubins under different names:", [x for x in dup.values() if len(x) > 1] or "none")

    picked = reachability(bundle, a.problems)
    never = [n for n in vs if n not in picked]
    by = collections.defaultdict(lambda: [0, 0.0, 0])
    for n in never:
        v = vs[n]
        g = by[(v["target"], v["family"], v["op"])]
        g[0] += 1
        g[1] += v.get("compile_seconds") or 0.0
        g[2] += sum(f["bytes"] for f in v["files"].values())
    print(f"never picked by the loader's rules on {len(DEVICES)} device classes: {len(never)} variants, "
          f"{sum(g[1] for g in by.values()):.0f} s of compile, {sum(g[2] for g in by.values()) / 1e6:.1f} MB")
    for k, g in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k[0]:8} {k[1]:7} {k[2]:9} {g[0]:3} {g[1]:7.1f} s {g[2] / 1e6:6.2f} MB")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "groups": {"/".join(k): g for k, g in groups.items()}, "dirs": dict(dirs),
            "never_picked": {n: {"target": vs[n]["target"], "family": vs[n]["family"],
                                 "compile_seconds": vs[n].get("compile_seconds")} for n in never},
            "picked_on": {n: sorted(d) for n, d in picked.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
