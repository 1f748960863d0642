#!/usr/bin/env python3
"""Tune a bundle's GEMM selection on the GPU present; writes BUNDLE/tuning.json.

For every shape bucket of the grid (runtime/tuning.py: M in powers of two with all M <= 16 one
decode bucket, N and K rounded to 3 significant bits) and every dtype asked for, time every
variant that fits the bucket's representative (largest) shape:

  0. skip variants the cost model (the selection's, Selector.estimate_us) puts over 5x behind the best (--all: none);
  1. screen: every variant, a CUDA graph of one call per input set (enough fresh input sets to
     exceed twice the L2), a few replays each (eager calls measured the host's ~25 us launch
     path instead of the GPU for every decode kernel, and dropped the fastest fp8 64x8192x8192
     candidate in v3);
  2. measure: the variants within 1.2x of the best screen time, and always the cost model's own
     pick, in 5 round-robin passes of graph replays over the candidates (order reversed every
     other pass) so that clock and power drift hits all of them alike; a candidate's time is the
     median over passes of its per-pass median.

The winner is the fastest graph median, unless the cost model's own pick measured within 3 % of
it (runtime/tuning.py pick_winner: single H100 runs differ by more than that; see
notes/gemm-sm90.md).  tuning.json records the device (name, SM count,
capability, driver), torch and CUDA versions, the manifest's sha256 and per bucket the winner and
every timing; ``Bundle`` uses it only where all of that matches (else the cost-model heuristic).
K-major operands only (the layouts the default tiers build); other layouts use the heuristic.

``--op attention``: dense attention buckets (runtime/tuning.py attention_bucket_key: dtype,
head_dim, causal, seqlen_q and seqlen_k rounded up to a power of two, batch x q-heads likewise).
Per bucket its representative problem (seqlen_q = seqlen_k = the bucket's bound, MHA) is timed the
same way (screen, then round-robin passes) on every single-pass variant of the bundle that takes it
(every loadable target; a bundle built with the "full" tier has the sm_90a family's alternative
tiles per head_dim, attention/sm90.py TUNE_CONFIGS), beside the loader's rule's own pick, which
stays unless another variant measures MARGIN faster.  Written under ``attention`` in tuning.json
(the GEMM buckets of a matching table are kept, and the other way round); the loader's attention
selection (and its C port) takes the bucket's winner after the split-KV / packed-GQA decode rules.

Buckets up to M = 128 where ``early_b`` variants fit (the decode tiles' twins that load B before
their PDL wait) also get a ``b_constant`` entry: those variants and the plain winner timed the same way; the
loader runs its winner for ``bundle.gemm(..., b_constant=True)``.  fp8 decode buckets (M <= 16)
also get a ``packed`` entry: the packed-weight decode variants on weights packed by
``bundle.pack_b``, without and with ``b_constant`` (runtime/packed.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.benchmark import LLM_NK, SQUARE, gemm_bytes, sets_for, time_interleaved  # noqa: E402
from factory.runtime import Bundle, InputError, NoVariantError, tuning  # noqa: E402
from factory.runtime.gemm import fitting_variants, rkl_spec  # noqa: E402
from factory.runtime.gemm import select as gemm_select  # noqa: E402

# Small problems first (the GPU is cool and its clocks steady; on the H100 the decode buckets timed
# right after the 8192^3 ones came out erratic), the buckets of the benchmark's M values before the
# ones between them, the squares last (a time budget stops before the least needed).
M_BUCKETS = [16, 64, 128, 512, 2048, 8192, 16384, 32, 256, 1024, 4096]
PAIRS = {"bf16": ("bf16", "bf16"), "f16": ("f16", "f16"), "e4m3": ("e4m3", "bf16")}
SCREEN_KEEP = 1.2
ROUNDS = 5
MARGIN = 0.03  # the model's pick stays unless a variant measures this much faster
MODEL_CUT = 5.0
B_CONST_MAX_M = 128  # the early_b variants are decode (swap) tiles: tuned for b_constant up to here


def grid(which: str) -> list[tuple[int, int, int]]:
    if which == "quick":
        return [(16, 4096, 4096), (4096, 4096, 4096)]
    shapes = [(m, n, k) for m in M_BUCKETS for n, k in LLM_NK]
    shapes += [tuning.bucket_shape(*s, 1)[:3] for s in SQUARE]
    return list(dict.fromkeys(shapes))


# Attention buckets: (seqlen, batch x heads); the representative problem's B x Hq comes from
# attention_shape.  "quick": one bucket per seqlen regime; "wide": the bench's wide grid (seqlen
# 512-16384, batch x heads 8 to 1024) with the work per call capped (ATTN_MAX_FLOP).
ATTN_GRIDS = {
    "quick": [(1024, 64), (4096, 32), (16384, 16)],
    "wide": [(s, bh) for s in (512, 1024, 2048, 4096, 8192, 16384) for bh in (8, 32, 128, 512, 1024)],
}
ATTN_HEAD_DIMS = (64, 128, 256)
ATTN_MAX_FLOP = 3e13  # 4·bh·S²·D per call: ~50 ms at 600 TFLOP/s


def attention_shape(s: int, bh: int) -> tuple[int, int, int, int]:
    """(B, Hq, Hkv, S) of a bucket's representative dense problem: 16 heads (32 from 512 batch x
    heads up), the batch the rest."""
    hq = 32 if bh >= 512 else min(bh, 16)
    return bh // hq, hq, hq, s


def attention_buckets(which: str, head_dims=ATTN_HEAD_DIMS) -> list[tuple[int, bool, int, int]]:
    """(head_dim, causal, seqlen, batch x heads) per bucket, long sequences last."""
    out = []
    for s, bh in ATTN_GRIDS[which]:
        for d in head_dims:
            for causal in (False, True):
                if 4.0 * bh * s * s * d / (2 if causal else 1) <= ATTN_MAX_FLOP:
                    out.append((d, causal, s, bh))
    return out


_RULE = {}


def rule_bundle(bundle):
    """``bundle`` opened for this device's SM count under no device name: the host library's
    selection without any tuning table (the rule's own pick, which a table entry must beat)."""
    if id(bundle) not in _RULE:
        _RULE[id(bundle)] = Bundle.open(bundle.path, capability=bundle.capability,
                                        device={"name": None, "sm_count": bundle.device_info()["sm_count"]})
    return _RULE[id(bundle)]


def tune_attention_bucket(bundle, dt: str, d: int, causal: bool, s: int, bh: int, l2: int) -> dict | None:
    """Time every single-pass dense variant that takes the bucket's representative problem beside
    the rule's pick; None when the rule takes a split-KV variant (then the decode rule decides and
    a table entry would never be read)."""
    import torch

    from factory.runtime.attention import _choose, dense_workspace

    b, hq, hkv, sq = attention_shape(s, bh)
    cands = bundle.candidates("attention")
    name, splits = _choose(rule_bundle(bundle), dt, d, causal, False, b * hq * sq, (b, hq, hkv, sq, sq))
    if splits > 1:
        return None
    rule = bundle.manifest["variants"][name]
    fits = [e for e in cands if e["dtype"] == dt and e["head_dim"] == d and bool(e["causal"]) == causal
            and not e["varlen"] and e.get("splits", 1) == 1 and sq >= e.get("min_seqlen_q", 0)]
    tdt = testing.torch_dtype(dt)
    n_sets = min(4, sets_for(4 * b * sq * hq * d * 2, l2))
    sets = [(torch.randn(b, sq, hq, d, device="cuda").to(tdt), torch.randn(b, sq, hkv, d, device="cuda").to(tdt),
             torch.randn(b, sq, hkv, d, device="cuda").to(tdt)) for _ in range(n_sets)]
    outs = [(torch.empty_like(q), torch.empty(b, hq, sq, device="cuda")) for q, _, _ in sets]
    scale = d ** -0.5
    calls = {e["name"]: (lambda i, n=e["name"], w=dense_workspace(torch, e, sets[0][0]):
                         bundle.launch(n, [*sets[i], *outs[i], *w, scale])) for e in fits}
    screened, timed = screen_then_time(calls, n_sets, rule["name"])
    winner = tuning.pick_winner(timed, rule["name"], MARGIN)
    sets = outs = calls = None
    torch.cuda.empty_cache()
    flop = 4.0 * b * hq * sq * sq * d / (2 if causal else 1)
    return {"key": tuning.attention_bucket_key(dt, d, causal, sq, sq, b * hq), "shape": [b, hq, hkv, sq, sq, d],
            "winner": winner, "fastest": min(timed, key=timed.get), "rule_pick": rule["name"],
            "timings_us": {n: round(t * 1e6, 2) for n, t in timed.items()},
            "screen_us": {n: round(t * 1e6, 2) for n, t in screened.items()},
            "tflops": {n: round(flop / t / 1e12, 1) for n, t in timed.items()}, "input_sets": n_sets}


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def tune_bucket(bundle, M, N, K, dt: str, l2: int, everything: bool = False) -> dict:
    import torch

    ab, c = PAIRS[dt]
    n_sets = sets_for(gemm_bytes(M, N, K, ab), l2)
    A, B, C = testing.gemm_input_sets(n_sets, M, N, K, ab, c, poison=False)
    one = torch.ones(1, device="cuda")
    kw = {"scale_a": one, "scale_b": one} if ab == "e4m3" else {}
    scales = [(one.data_ptr(), (1,), (1,))] * 2 if kw else []
    fits, am, bm = fitting_variants(bundle, rkl_spec(A[0], "a"), rkl_spec(B[0], "b"), rkl_spec(C[0], "c"),
                                    ab, c, scales)
    # the selection's own pick without a table (the rule a table entry must beat)
    model_pick = gemm_select(rule_bundle(bundle), rkl_spec(A[0], "a"), rkl_spec(B[0], "b"), rkl_spec(C[0], "c"),
                             ab, c, scales)
    try:
        model = {v["name"]: bundle.selector.estimate_us(v["name"], M, N, K, 1) for v in fits}
    except InputError:  # a family without a cost model (sm80): nothing to screen by
        model = {}
    if model and not everything:  # the cost model is never off by 5x: do not spend seconds on hopeless tiles
        fits = [v for v in fits if model[v["name"]] <= MODEL_CUT * min(model.values()) or v["name"] == model_pick]
    calls = {v["name"]: (lambda i, n=v["name"]: bundle.gemm(A[i], B[i], C[i], variant=n, **kw)) for v in fits}
    screened, timed = screen_then_time(calls, n_sets, model_pick)
    # A candidate whose measured median is well off its own screen means the GPU changed state
    # under us (seen on the H100 right after the 8192^3 buckets: a split-K variant screened at
    # 57 us, then replayed at 229 us): measure those again, and keep the faster median.
    odd = [n for n in timed if timed[n] > 1.3 * screened[n]]
    if odd:
        again = time_interleaved({n: calls[n] for n in odd}, n_sets, rounds=ROUNDS, max_reps=8)
        timed.update({n: min(timed[n], again[n]) for n in odd})
    winner = tuning.pick_winner(timed, model_pick, MARGIN)
    const = tune_b_constant(bundle, A, B, C, kw, scales, ab, c, winner, n_sets) if M <= B_CONST_MAX_M else None
    packed = tune_packed(bundle, A, B, C, kw, n_sets) if ab == "e4m3" and M <= 16 else None
    A = B = C = None  # free before the next bucket (the lambdas hold the names)
    torch.cuda.empty_cache()
    return {"key": tuning.bucket_key(ab, c, am, bm, M, N, K, 1), "shape": [M, N, K, 1], "winner": winner,
            "fastest": min(timed, key=timed.get), "model_pick": model_pick,
            "timings_us": {n: round(t * 1e6, 2) for n, t in timed.items()},
            "screen_us": {n: round(t * 1e6, 2) for n, t in screened.items()},
            "model_us": {n: round(t, 2) for n, t in model.items()}, "input_sets": n_sets,
            **({"b_constant": const} if const else {}), **({"packed": packed} if packed else {})}


def tune_packed(bundle, A, B, C, kw, n_sets) -> dict | None:
    """fp8 decode buckets: the packed-weight decode variants on B packed once (``pack_b``), timed
    like every candidate here: ``winner`` among the plain ones, ``b_constant_winner`` among all
    (early_b ones included), each beside the selection rule's own pick (runtime/packed.py), which
    stays unless another variant measures MARGIN faster.  None when no decode variant fits."""
    from factory.runtime.packed import fitting, launch_specs, select_packed

    P = [bundle.pack_b(b) for b in B]
    M, K = A[0].shape
    N = B[0].shape[0]
    specs = launch_specs(A[0], P[0], C[0], [(kw["scale_a"].data_ptr(), (1,), (1,))] * 2)
    try:
        fits = fitting(bundle, specs, M, N, K)
    except NoVariantError:
        return None
    rule = {bc: select_packed(rule_bundle(bundle), specs, M, N, K, bc) for bc in (False, True)}
    calls = {v["name"]: (lambda i, n=v["name"]: bundle.gemm(A[i], P[i], C[i], variant=n, **kw)) for v in fits}
    screened, timed = screen_then_time(calls, n_sets, rule[True])
    for bc in (False, True):  # the rule's picks are always measured
        if rule[bc] not in timed:
            timed.update(time_interleaved({rule[bc]: calls[rule[bc]]}, n_sets, rounds=ROUNDS, max_reps=8))
    plain = {n: t for n, t in timed.items() if not bundle.manifest["variants"][n]["config"].get("early_b")}
    return {"winner": tuning.pick_winner(plain, rule[False], MARGIN),
            "b_constant_winner": tuning.pick_winner(timed, rule[True], MARGIN),
            "rule": rule[False], "rule_b_constant": rule[True],
            "timings_us": {n: round(t * 1e6, 2) for n, t in timed.items()},
            "screen_us": {n: round(t * 1e6, 2) for n, t in screened.items()}}


def screen_then_time(calls: dict, n_sets: int, always: str) -> tuple[dict, dict]:
    """Screen every candidate (a few graph replays each), then time those within SCREEN_KEEP of
    the best screen, and ``always``, in ROUNDS round-robin passes: (screen, timed) seconds."""
    screened = time_interleaved(calls, n_sets, rounds=1, budget_s=0.01, max_reps=5)
    best = min(screened.values())
    keep = [n for n, t in sorted(screened.items(), key=lambda kv: kv[1]) if t <= SCREEN_KEEP * best or n == always]
    return screened, time_interleaved({n: calls[n] for n in keep}, n_sets, rounds=ROUNDS, max_reps=8)


def tune_b_constant(bundle, A, B, C, kw, scales, ab, c, winner, n_sets) -> dict | None:
    """For a constant B: the bucket's early_b variants (they stream B before the previous kernel
    has finished), each timed in graphs of back-to-back calls of itself like every candidate here,
    beside the plain winner.  The winner stays unless an early_b variant measures MARGIN faster;
    None when no early_b variant fits."""
    try:
        fits = fitting_variants(bundle, rkl_spec(A[0], "a"), rkl_spec(B[0], "b"), rkl_spec(C[0], "c"), ab, c,
                                scales, early_b=True)[0]
    except NoVariantError:
        return None
    calls = {n: (lambda i, n=n: bundle.gemm(A[i], B[i], C[i], variant=n, **kw))
             for n in [v["name"] for v in fits] + [winner]}
    screened, timed = screen_then_time(calls, n_sets, winner)
    return {"winner": tuning.pick_winner(timed, winner, MARGIN),
            "timings_us": {n: round(t * 1e6, 2) for n, t in timed.items()},
            "screen_us": {n: round(t * 1e6, 2) for n, t in screened.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--op", default="gemm", choices=["gemm", "attention"])
    p.add_argument("--dtypes", nargs="+", default=None, choices=sorted(PAIRS),
                   help="default: bf16 e4m3 (gemm), bf16 (attention)")
    p.add_argument("--grid", default=None, choices=["bench", "quick", "wide"],
                   help="gemm: bench (default) or quick; attention: quick (default) or wide")
    p.add_argument("--head-dims", nargs="+", type=int, default=list(ATTN_HEAD_DIMS), help="attention only")
    p.add_argument("--shapes", nargs="+", default=None, metavar="MxNxK",
                   help="gemm: these problems' buckets instead of a grid (e.g. one bucket's neighbours)")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting new buckets after this long")
    p.add_argument("--all", action="store_true", help=f"screen even variants the cost model puts "
                   f"{MODEL_CUT}x behind the best")
    p.add_argument("--fresh", action="store_true", help="drop the buckets of an existing matching tuning.json")
    a = p.parse_args()
    import torch

    t0 = time.time()
    bundle = Bundle.open(a.bundle)
    dev = bundle.device_info()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    prev, why = tuning.load(bundle.path, dev)
    attention = a.op == "attention"
    a.dtypes = a.dtypes or (["bf16"] if attention else ["bf16", "e4m3"])
    a.grid = a.grid or ("quick" if attention else "bench")
    if (a.grid == "wide") != attention and a.grid != "quick":
        p.error(f"--grid {a.grid} is not a {a.op} grid")
    # The other op's buckets of a matching table are kept as they are; this op's unless --fresh.
    old = {} if prev is None else prev.data
    buckets = {} if prev is None or (a.fresh and not attention) else dict(old.get("buckets", {}))
    attn_buckets = {} if prev is None or (a.fresh and attention) else dict(old.get("attention", {}))
    print(f"tuning {bundle.path} on {dev['name']} ({dev['sm_count']} SMs); previous table: {why}", flush=True)
    data = {
        "schema": tuning.SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": {"name": dev["name"], "sm_count": dev["sm_count"], "capability": list(bundle.capability),
                   "driver": driver_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
        "manifest_sha256": tuning.manifest_sha256(bundle.path),
        "method": {"screen": "graph replays (one call per input set), up to 5 per variant",
                   "model_cut": None if a.all else MODEL_CUT,
                   "measure": f"median of per-pass graph-replay medians, {ROUNDS} round-robin passes (variants within "
                              f"{SCREEN_KEEP}x of the best screen, and the cost model's pick)",
                   "winner": f"fastest, unless the cost model's pick is within {MARGIN:.0%}",
                   "rotating_input_sets": "enough to exceed 2x L2", "grid": a.grid},
        "buckets": buckets,  # filled in below, written after every bucket
        "attention": attn_buckets,
    }
    if attention:
        data["attention_method"] = {
            "screen": "graph replays (one call per input set), up to 5 per variant",
            "measure": f"median of per-pass graph-replay medians, {ROUNDS} round-robin passes (variants "
                       f"within {SCREEN_KEEP}x of the best screen, and the rule's pick)",
            "winner": f"fastest, unless the loader's rule's pick is within {MARGIN:.0%}",
            "problem": "seqlen_q = seqlen_k = the bucket's bound, MHA, B x Hq = the bucket's bound",
            "grid": a.grid}
        del data["method"]
        if prev is not None and "method" in old:
            data["method"] = old["method"]
        return tune_attention(bundle, a, data, attn_buckets, l2, t0)
    if "attention_method" in old:
        data["attention_method"] = old["attention_method"]
    done = 0
    shapes = grid(a.grid)
    if a.shapes:
        shapes = [tuning.bucket_shape(*map(int, s.split("x")), 1)[:3] for s in a.shapes]
        data["method"]["grid"] = "shapes: " + " ".join(a.shapes)
    for M, N, K in shapes:
        if time.time() - t0 > a.budget_s:
            print(f"budget of {a.budget_s} s spent: stopping before {M}x{N}x{K}", flush=True)
            break
        for dt in a.dtypes:
            tb = time.time()
            try:
                r = tune_bucket(bundle, M, N, K, dt, l2, a.all)
            except Exception as e:  # noqa: BLE001 - e.g. no variant of this dtype: skip the bucket
                print(f"{dt} {M}x{N}x{K}: skipped ({type(e).__name__}: {e})", flush=True)
                continue
            key = r.pop("key")
            buckets[key] = r
            done += 1
            tuning.write(bundle.path, data)  # a time-out keeps what was measured
            t = r["timings_us"]
            second = sorted(t.values())[1] if len(t) > 1 else float("nan")
            bc = r.get("b_constant")
            print(f"{dt:>4} {M:>6} {N:>6} {K:>6}  {t[r['winner']]:>9.1f} us (next {second:>9.1f}, "
                  f"{len(r['screen_us'])} screened, {len(t)} timed, {time.time() - tb:4.1f} s)  "
                  f"{r['winner'].replace('gemm_', '')}"
                  + (f"  [b_constant: {bc['timings_us'][bc['winner']]:.1f} us {bc['winner'].replace('gemm_', '')}]"
                     if bc else "")
                  + (f"  [packed: {pk['timings_us'][pk['winner']]:.1f} us, with b_constant "
                     f"{pk['timings_us'][pk['b_constant_winner']]:.1f} us {pk['b_constant_winner'].replace('gemm_', '')}]"
                     if (pk := r.get("packed")) else ""), flush=True)
    path = tuning.write(bundle.path, data)
    print(f"wrote {path}: {len(buckets)} buckets ({done} measured now) in {time.time() - t0:.0f} s", flush=True)
    compile_in(bundle.path)
    return 0


def compile_in(path) -> None:
    """The selection reads the table compiled into the host library: relink it where the
    toolchain is here (else say how)."""
    try:
        from factory.compiler.link import relink

        print(f"relinked: {relink(path)['tuning']}", flush=True)
    except Exception as e:  # noqa: BLE001 - no toolchain on this machine
        print(f"the table is not compiled in yet ({type(e).__name__}: {e}): run python -m factory link {path}",
              flush=True)


def tune_attention(bundle, a, data: dict, buckets: dict, l2: int, t0: float) -> int:
    done = 0
    for d, causal, s, bh in attention_buckets(a.grid, tuple(a.head_dims)):
        if time.time() - t0 > a.budget_s:
            print(f"budget of {a.budget_s} s spent: stopping before D{d} S{s} bh{bh}", flush=True)
            break
        for dt in a.dtypes:
            tb = time.time()
            try:
                r = tune_attention_bucket(bundle, dt, d, causal, s, bh, l2)
            except NoVariantError as e:
                print(f"{dt} D{d} S{s} bh{bh}: skipped ({e})"[:160], flush=True)
                continue
            if r is None:
                print(f"{dt} D{d} S{s} bh{bh}: the split-KV rule decides; not tuned", flush=True)
                continue
            key = r.pop("key")
            buckets[key] = r
            done += 1
            tuning.write(bundle.path, data)  # a time-out keeps what was measured
            t = r["timings_us"]
            rule = t.get(r["rule_pick"], float("nan"))
            print(f"{dt:>4} D{d:<3} {'causal' if causal else 'full  '} S{s:>5} bh{bh:>4}  {t[r['winner']]:>9.1f} us "
                  f"({r['tflops'][r['winner']]:6.1f} TF/s; rule's pick {rule:9.1f} us, {len(t)} timed, "
                  f"{time.time() - tb:4.1f} s)  {r['winner'].replace('attention_', '')}", flush=True)
    path = tuning.write(bundle.path, data)
    print(f"wrote {path}: {len(buckets)} attention buckets ({done} measured now) in {time.time() - t0:.0f} s",
          flush=True)
    compile_in(bundle.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
