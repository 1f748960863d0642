"""``scripts/bench_attention.py --grid targets`` (also ``scripts/bench.py attention --grid targets``):
the attention speed targets, measured in one process beside every torch SDPA backend on the same
values and beside published figures.

* bf16 table: B1 H16 S16384 D128 and D256 (non-causal, causal), the Llama GQA 64/8 D128 16k
  problem, and the small B1 H8 S512 D64 problem (non-causal, causal) whose targets are in µs per
  call (graph replay, and eager per synchronised call).
* fp8 table: e4m3 q/k/v with per-(batch, kv head) descales, D64/D128/D256 non-causal and causal at
  B1 H16 S16384, GQA 64/8 D128 and packed sequences (where the bundle has the variants): ours
  through ``bundle.attention(..., q_descale=, k_descale=, v_descale=)`` with V as K (``bshd``) and
  V pre-transposed (``bhds``), beside torch's bf16 backends on the de-scaled values (torch SDPA
  has no fp8 path), with FlashAttention-3's error figures (RMSE and max abs against float32 of the
  de-scaled inputs).

Timing: one CUDA graph per callable (5 calls per graph for the small problem), replayed in
interleaved passes (``factory.benchmark.time_interleaved``), medians; eager: CUDA events around
one call then a synchronisation (``time_eager``), and for the small problem the host's wall time
per synchronised call.  Fresh random inputs per row; outputs NaN-poisoned before the checked call
and compared with float32 on the last query rows (all rows where they fit).  A row whose variant
the bundle lacks is kept with the reason, never filled in.  Writes ``OUT.json`` and ``OUT.png``;
:func:`targets_table` builds the table and the verdicts from timings alone (tested without a GPU).
"""

from __future__ import annotations

import math
import statistics
import time

# Published forward figures (TFLOP/s), as data: who, what, where, and where it was published.
PUBLISHED = [
    dict(who="cuDNN 9.19", dtype="bf16", head_dim=128, causal=False, gqa=True, tflops=702, device="H200",
         shape="Llama GQA Hq64/Hkv8 D128 S16384",
         source="NVIDIA, cuDNN 9.19 SDPA forward performance (Llama GQA 64/8, head_dim 128, 16k), H200"),
    dict(who="cuDNN 9.19", dtype="bf16", head_dim=128, causal=True, gqa=True, tflops=673, device="H200",
         shape="Llama GQA Hq64/Hkv8 D128 S16384",
         source="NVIDIA, cuDNN 9.19 SDPA forward performance (Llama GQA 64/8, head_dim 128, 16k), H200"),
    dict(who="FA3", dtype="fp16", head_dim=128, causal=False, gqa=False, tflops=648, device="H100 SXM5",
         shape="B1 H16 S16384 D128",
         source="Shah et al., FlashAttention-3 (arXiv:2407.08608), forward speed, head dim 128, seqlen 16k"),
    dict(who="FA3", dtype="fp16", head_dim=256, causal=False, gqa=False, tflops=756, device="H100 SXM5",
         shape="B1 H8 S16384 D256",
         source="Shah et al., FlashAttention-3 (arXiv:2407.08608), forward speed, head dim 256, seqlen 16k"),
    dict(who="FA3", dtype="fp16", head_dim=256, causal=True, gqa=False, tflops=642, device="H100 SXM5",
         shape="B1 H8 S16384 D256",
         source="Shah et al., FlashAttention-3 (arXiv:2407.08608), forward speed, head dim 256, causal, seqlen 16k"),
    dict(who="FA3", dtype="e4m3", head_dim=128, causal=False, gqa=False, tflops=1008, device="H100 SXM5",
         shape="B1 H16 S16384 D128",
         source="Shah et al., FlashAttention-3 (arXiv:2407.08608), FP8 forward speed, head dim 128, seqlen 16k"),
    dict(who="FA3", dtype="e4m3", head_dim=256, causal=False, gqa=False, tflops=1171, device="H100 SXM5",
         shape="B1 H8 S16384 D256",
         source="Shah et al., FlashAttention-3 (arXiv:2407.08608), FP8 forward speed, head dim 256, seqlen 16k"),
    dict(who="cuDNN 9.19", dtype="e4m3", head_dim=128, causal=False, gqa=True, tflops=1055, device="H200",
         shape="Llama GQA Hq64/Hkv8 D128 S16384",
         source="NVIDIA, cuDNN 9.19 SDPA fp8 forward performance (Llama GQA 64/8, head_dim 128, 16k), H200"),
    dict(who="cuDNN 9.19", dtype="e4m3", head_dim=128, causal=True, gqa=True, tflops=1010, device="H200",
         shape="Llama GQA Hq64/Hkv8 D128 S16384",
         source="NVIDIA, cuDNN 9.19 SDPA fp8 forward performance (Llama GQA 64/8, head_dim 128, 16k), H200"),
]

S16K = 16384
# Rows: id, (B, Hq, Hkv, Sq, Sk, D, causal), form ("dense" / "varlen": B packed sequences), targets.
BF16_ROWS = [
    dict(id="d128", shape=(1, 16, 16, S16K, S16K, 128, False), target_tflops=720),
    dict(id="d128c", shape=(1, 16, 16, S16K, S16K, 128, True), target_tflops=690),
    dict(id="d256", shape=(1, 16, 16, S16K, S16K, 256, False)),
    dict(id="d256c", shape=(1, 16, 16, S16K, S16K, 256, True)),
    dict(id="gqa", shape=(1, 64, 8, S16K, S16K, 128, False)),
    dict(id="gqac", shape=(1, 64, 8, S16K, S16K, 128, True)),
    dict(id="seed", shape=(1, 8, 8, 512, 512, 64, False), target_graph_us=5.0, target_eager_us=10.0),
    dict(id="seedc", shape=(1, 8, 8, 512, 512, 64, True), target_graph_us=5.0, target_eager_us=10.0),
]
FP8_ROWS = [
    dict(id="f8d64", shape=(1, 16, 16, S16K, S16K, 64, False)),
    dict(id="f8d64c", shape=(1, 16, 16, S16K, S16K, 64, True)),
    dict(id="f8d128", shape=(1, 16, 16, S16K, S16K, 128, False), target_tflops=1050),
    dict(id="f8d128c", shape=(1, 16, 16, S16K, S16K, 128, True)),
    dict(id="f8d256", shape=(1, 16, 16, S16K, S16K, 256, False), target_tflops=1150),
    dict(id="f8d256c", shape=(1, 16, 16, S16K, S16K, 256, True)),
    dict(id="f8gqa", shape=(1, 64, 8, S16K, S16K, 128, False)),
    dict(id="f8varlen", shape=(8, 16, 16, 2048, 2048, 128, False), form="varlen"),
]
TORCH_NO_FP8 = ("torch SDPA has no fp8 path: torch's columns run its bf16 backends on the de-scaled values "
                "(q·q_descale, k·k_descale, v·v_descale rounded to bf16), the same FLOPs")
RATIO = "best torch time / ours >= 1.0"
TORCH_BACKENDS = ("flash", "cudnn", "efficient", "math", "sdpa")  # sdpa: torch's own choice


def flops(shape) -> float:
    """4·B·Hq·(visible query-key pairs)·D; causal is bottom-right aligned (Sq = Sk here: half)."""
    b, hq, _, sq, sk, d, causal = shape[:7]
    pairs = sq * sk - (sq * (sq - 1) / 2 if causal and sq == sk else 0)
    return 4.0 * b * hq * pairs * d


def label(spec: dict) -> str:
    b, hq, hkv, sq, _, d, causal = spec["shape"]
    h = f"H{hq}" if hq == hkv else f"H{hq}/{hkv}"
    form = f" varlen {b}x{sq}" if spec.get("form") == "varlen" else ""
    return f"B{b} {h} S{sq} D{d}{' causal' if causal else ''}{form}"


def published_for(dtype: str, spec: dict) -> list[dict]:
    """The published figures of the same head_dim, mask and (dense vs GQA) problem: bf16 rows take
    bf16/fp16 figures, fp8 rows e4m3 ones."""
    b, hq, hkv, sq, _, d, causal = spec["shape"]
    if sq < 8192 or spec.get("form") == "varlen":
        return []
    kinds = ("bf16", "fp16") if dtype == "bf16" else ("e4m3",)
    return [p for p in PUBLISHED if p["dtype"] in kinds and p["head_dim"] == d and p["causal"] == causal
            and p["gqa"] == (hq != hkv)]


def targets_table(dtype: str, specs: list[dict], measured: dict[str, dict]) -> list[dict]:
    """The table and its verdicts from timings alone (no GPU).  ``measured[id]``: ``ours_us`` (graph
    replay µs per call, None where ours did not run), ``torch_us`` {backend: µs or None},
    ``ours_eager_us`` (optional), ``skipped`` (a reason, optional).  Per row: ours and the best
    torch backend in TFLOP/s, best torch time / ours, the published figures, and one verdict per
    target: TFLOP/s >= target, graph µs <= target, eager µs <= target, and not slower than the
    best torch backend (ratio >= 1.0); ``met`` is True only when every verdict of the row is."""
    out = []
    for spec in specs:
        m = measured.get(spec["id"], {})
        fl = flops(spec["shape"])
        row = {"id": spec["id"], "dtype": dtype, "label": label(spec), "flops": fl,
               "published": [{k: p[k] for k in ("who", "dtype", "tflops", "device", "shape")}
                             for p in published_for(dtype, spec)]}
        ours = m.get("ours_us")
        if m.get("skipped") or ours is None:
            row.update(skipped=m.get("skipped") or "ours did not run", met=None, verdicts=[])
            out.append(row)
            continue
        torch_us = {k: v for k, v in (m.get("torch_us") or {}).items() if v is not None}
        best = min(torch_us, key=torch_us.get) if torch_us else None
        row.update(ours_us=ours, ours_tflops=fl / ours / 1e6, best_torch=best,
                   best_torch_us=torch_us.get(best), best_torch_tflops=fl / torch_us[best] / 1e6 if best else None,
                   ratio=torch_us[best] / ours if best else None)
        verdicts = []
        if spec.get("target_tflops") is not None:
            verdicts.append({"what": f"TFLOP/s >= {spec['target_tflops']}", "value": row["ours_tflops"],
                             "met": row["ours_tflops"] >= spec["target_tflops"]})
        if spec.get("target_graph_us") is not None:
            verdicts.append({"what": f"graph µs <= {spec['target_graph_us']}", "value": ours,
                             "met": ours <= spec["target_graph_us"]})
        if spec.get("target_eager_us") is not None:
            eager = m.get("ours_eager_us")
            verdicts.append({"what": f"eager µs per synchronised call <= {spec['target_eager_us']}", "value": eager,
                             "met": eager is not None and eager <= spec["target_eager_us"]})
        if best is not None:
            verdicts.append({"what": RATIO, "value": row["ratio"], "met": row["ratio"] >= 1.0})
        row["verdicts"] = verdicts
        row["met"] = all(v["met"] for v in verdicts) if verdicts else None
        if m.get("ours_eager_us") is not None:
            row["ours_eager_us"] = m["ours_eager_us"]
        out.append(row)
    return out


# --- on the GPU --------------------------------------------------------------------------------------
def _check_rows(sq: int, b: int, hq: int, sk: int) -> int:
    """How many of the last query rows the float32 reference covers (~1 GB of scores at most)."""
    return min(sq, 256, max(16, 2 ** 28 // max(1, b * hq * sk)))


def _err(o, ref) -> dict:
    d = (o.float() - ref).abs()
    return {"rel": float((o.float() - ref).norm() / ref.norm().clamp_min(1e-30)),
            "rmse": float(((o.float() - ref) ** 2).mean().sqrt()), "max_abs": float(d.max()),
            "nan": bool(o.isnan().any())}


def _torch_calls(torch, qt, kt, vt, causal: bool, gqa: bool, n_scores: int) -> tuple[dict, dict]:
    """Each torch SDPA backend as fn(input set) on (B, H, S, D) views; the math backend only where
    its score matrix (bf16) stays under 2 GB (else a reason)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    bes = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH, "sdpa": None}
    calls, skipped = {}, {}
    for name, be in bes.items():
        if name == "math" and n_scores > 2 ** 30:
            skipped[name] = f"not timed: its score matrix alone is {n_scores * 2 / 2 ** 30:.0f} GiB"
            continue

        def fn(_i, be=be):
            if be is None:
                return sdpa(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
            with sdpa_kernel([be]):
                return sdpa(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
        calls[name] = fn
    return calls, skipped


def _try_torch(torch, calls: dict, skipped: dict, ref, rows: int, first: bool = False) -> dict:
    """One call of each backend (outside any graph): a backend that refuses the problem is dropped
    with its error; the others' error against ``ref`` is recorded (on the last ``rows`` query rows,
    or ``first``: on batch entry 0 whole)."""
    errs = {}
    for name in list(calls):
        try:
            o = calls[name](0).transpose(1, 2)
            torch.cuda.synchronize()
            errs[name] = _err(o[:1] if first else o[:, -rows:], ref)["rel"]
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            skipped[name] = f"{type(e).__name__}: {str(e)[:100]}"
            del calls[name]
    return errs


def _time(calls: dict, n_sets: int, rounds: int, eager_iters: int = 10) -> tuple[dict, dict]:
    from factory.benchmark import time_eager, time_interleaved

    graph = {k: v * 1e6 for k, v in time_interleaved(calls, n_sets, rounds=rounds, budget_s=0.1, max_reps=20).items()}
    eager = {k: time_eager(fn, 1, eager_iters) * 1e6 for k, fn in calls.items()}
    return graph, eager


def _wall_per_synced_call(torch, fn, iters: int = 300) -> float:
    """Median host wall µs of one call followed by a synchronisation (after 20 warm calls)."""
    for _ in range(20):
        fn(0)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(0)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def measure_bf16(bundle, spec: dict, rounds: int) -> dict:
    import torch

    from factory import testing
    from factory.runtime import NoVariantError

    b, hq, hkv, sq, sk, d, causal = spec["shape"]
    q = torch.randn(b, sq, hq, d, device="cuda").bfloat16()
    k = torch.randn(b, sk, hkv, d, device="cuda").bfloat16()
    v = torch.randn(b, sk, hkv, d, device="cuda").bfloat16()
    rows = _check_rows(sq, b, hq, sk)
    ref = testing.attention_reference(q[:, -rows:], k, v, causal, d ** -0.5)[0]
    m = {"checked_rows": rows}
    o = torch.full_like(q, math.nan)
    try:
        bundle.attention(q, k, v, causal=causal, out=o)
    except NoVariantError as e:
        return {"skipped": f"no variant: {str(e)[:160]}"}
    torch.cuda.synchronize()
    m["ours_err"] = _err(o[:, -rows:], ref)
    m["ours_variant"] = _chosen(bundle, q, k, causal)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    tcalls, skipped = _torch_calls(torch, qt, kt, vt, causal, hq != hkv, b * hq * sq * sk)
    m["torch_rel_err"] = _try_torch(torch, tcalls, skipped, ref, rows)
    m["torch_skipped"] = skipped
    calls = {"ours": lambda _i: bundle.attention(q, k, v, causal=causal), **tcalls}
    small = sq * sk <= 1 << 20
    graph, eager = _time(calls, 5 if small else 1, rounds)
    m["ours_us"], m["ours_eager_us"] = graph.pop("ours"), eager.pop("ours")
    m["torch_us"], m["torch_eager_us"] = graph, eager
    for name in TORCH_BACKENDS:
        m["torch_us"].setdefault(name, None)
    if small:  # host wall time per synchronised call (the eager server's figure)
        m["ours_wall_us"] = _wall_per_synced_call(torch, calls["ours"])
        m["torch_wall_us"] = {n: _wall_per_synced_call(torch, fn) for n, fn in tcalls.items()}
    ok = not m["ours_err"]["nan"] and m["ours_err"]["rel"] < 2e-2
    m["ours_ok"] = ok
    if not ok:
        m["skipped"] = f"ours failed its check against float32: {m['ours_err']}"
    return m


def _chosen(bundle, q, k, causal) -> str | None:
    try:
        from factory.runtime.attention import _choose

        b, sq, hq, d = q.shape
        return _choose(bundle, "bf16", d, causal, False, b * hq * sq, (b, hq, k.shape[2], sq, k.shape[1]))[0]
    except Exception:  # noqa: BLE001 - the name is informative only
        return None


def _quantize(torch, x, hkv: int):
    """x (B, S, H, D) float32 -> (e4m3, descale (B, Hkv) float32): per (batch, kv head group) amax
    scaled to 448."""
    b, s, h, d = x.shape
    amax = x.abs().reshape(b, s, hkv, h // hkv, d).amax(dim=(1, 3, 4)).clamp_min(1e-6)  # (B, Hkv)
    ds = (amax / 448.0).float().contiguous()
    rep = ds.repeat_interleave(h // hkv, dim=1)[:, None, :, None]
    return (x / rep).to(torch.float8_e4m3fn), ds


def measure_fp8(bundle, spec: dict, rounds: int) -> dict:
    import torch

    from factory import testing
    from factory.runtime import NoVariantError
    from factory.runtime.attention_fp8 import choose

    b, hq, hkv, sq, sk, d, causal = spec["shape"]
    varlen = spec.get("form") == "varlen"
    x = [torch.randn(b, s, h, d, device="cuda") for s, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    (q8, qd), (k8, kd), (v8, vd) = (_quantize(torch, t, hkv) for t in x)
    x = None
    rep = hq // hkv
    qf = q8.float() * qd.repeat_interleave(rep, dim=1)[:, None, :, None]
    kf, vf = (t.float() * s[:, None, :, None] for t, s in ((k8, kd), (v8, vd)))
    scale = d ** -0.5
    m = {"torch_note": TORCH_NO_FP8}
    layouts = ("bshd",) if varlen else ("bshd", "bhds")
    names = {}
    for lay in layouts:
        try:
            names[lay] = choose(bundle, d, causal, lay, (b, sq, sk, hq, hkv), varlen=varlen)
        except NoVariantError as e:
            m[f"ours_{lay}_skipped"] = f"no variant: {str(e)[:160]}"
    if not names:
        return {"skipped": "; ".join(v for k, v in m.items() if k.endswith("_skipped")), "torch_note": TORCH_NO_FP8}
    m["variants"] = {lay: n for lay, (n, _) in names.items()}
    if varlen:  # sequence 0 whole against float32
        ref = testing.attention_reference(qf[:1], kf[:1], vf[:1], causal, scale)[0]
        rows = sq
    else:
        rows = _check_rows(sq, b, hq, sk)
        ref = testing.attention_reference(qf[:, -rows:], kf, vf, causal, scale)[0]
    m["checked_rows"] = rows
    vt8 = v8.permute(0, 2, 3, 1).contiguous()  # (B, Hkv, D, Sk): Sk a multiple of 16 here
    ins = {"bshd": v8, "bhds": vt8}
    if varlen:
        cu = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device="cuda")
        qp, kp, vp = (t.reshape(b * sq, t.shape[2], d) for t in (q8, k8, v8))
    calls, m["ours_err"], m["api_equals_by_name"] = {}, {}, {}
    for lay, (name, vl) in names.items():
        # by name, o NaN-poisoned: the cubin the API picks, checked
        if varlen:
            o = torch.full((b * sq, hq, d), math.nan, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(hq, b * sq, device="cuda")
            bundle.launch(name, [qp, kp, vp, o, lse, cu, cu, qd, kd, vd, scale, sq])
            o = o.view(b, sq, hq, d)

            def api(_i):
                return bundle.attention(qp, kp, vp, causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=sq,
                                        q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            o = torch.full((b, sq, hq, d), math.nan, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(b, hq, sq, device="cuda")
            bundle.launch(name, [q8, k8, ins[vl], o, lse, qd, kd, vd, scale])

            def api(_i, vin=ins[lay], lay=lay):
                return bundle.attention(q8, k8, vin, causal, q_descale=qd, k_descale=kd, v_descale=vd, v_layout=lay)
        torch.cuda.synchronize()
        m["ours_err"][lay] = _err(o[:1] if varlen else o[:, -rows:], ref)
        m["api_equals_by_name"][lay] = bool(torch.equal(api(0).view(o.shape), o))
        calls[f"ours_{lay}"] = api
    # the bf16 kernel on the de-scaled values (FA3 reports the fp8 error beside a 16-bit kernel's)
    qb, kb, vb = qf.bfloat16(), kf.bfloat16(), vf.bfloat16()
    qf = kf = vf = None
    try:
        if varlen:
            ob = bundle.attention(qb[:1], kb[:1], vb[:1], causal=causal)
        else:
            ob = bundle.attention(qb, kb, vb, causal=causal)[:, -rows:]
        m["bf16_ours_err"] = _err(ob, ref)
    except Exception as e:  # noqa: BLE001
        m["bf16_ours_err"] = f"{type(e).__name__}: {str(e)[:100]}"
    qt, kt, vt = (t.transpose(1, 2) for t in (qb, kb, vb))
    tcalls, skipped = _torch_calls(torch, qt, kt, vt, causal, hq != hkv, b * hq * sq * sk)
    m["torch_rel_err"] = _try_torch(torch, tcalls, skipped, ref, rows, first=varlen)
    m["torch_skipped"] = skipped
    graph, eager = _time({**calls, **tcalls}, 1, rounds)
    lay_us = {lay: graph.pop(f"ours_{lay}") for lay in names}
    lay_eager = {lay: eager.pop(f"ours_{lay}") for lay in names}
    m["ours_layout_us"], m["ours_layout_eager_us"] = lay_us, lay_eager
    # (the GPU tests' bound: P rounded to e4m3 alone gives ~2.5 % relative error)
    ok = {lay: not e["nan"] and e["rel"] < 5e-2 and m["api_equals_by_name"][lay] for lay, e in m["ours_err"].items()}
    m["ours_ok"] = ok
    good = [lay for lay in lay_us if ok[lay]]
    if not good:
        m["skipped"] = f"ours failed its check against float32: {m['ours_err']}"
        return m
    # "ours": the faster checked layout (each is the loader's pick for its v_layout)
    m["ours_layout"] = min(good, key=lay_us.get)
    m["ours_us"], m["ours_eager_us"] = lay_us[m["ours_layout"]], lay_eager[m["ours_layout"]]
    m["torch_us"], m["torch_eager_us"] = graph, eager
    for name in TORCH_BACKENDS:
        m["torch_us"].setdefault(name, None)
    return m


def run_table(bundle, dtype: str, specs: list[dict], rounds: int, log=print) -> tuple[list[dict], dict]:
    import torch

    measure = measure_bf16 if dtype == "bf16" else measure_fp8
    measured = {}
    for spec in specs:
        try:
            measured[spec["id"]] = measure(bundle, spec, rounds)
        except torch.cuda.OutOfMemoryError as e:
            measured[spec["id"]] = {"skipped": f"out of memory: {str(e)[:100]}"}
        except Exception as e:  # noqa: BLE001 - the row says what failed; the other rows still run
            import traceback

            traceback.print_exc()
            measured[spec["id"]] = {"skipped": f"error: {type(e).__name__}: {str(e)[:160]}"}
        torch.cuda.empty_cache()
        mm = measured[spec["id"]]
        log(f"{dtype} {label(spec)}: " + (f"skipped ({mm['skipped']})" if mm.get("skipped") else
            f"ours {mm['ours_us']:.1f} µs ({flops(spec['shape']) / mm['ours_us'] / 1e6:.1f} TF/s"
            f"{', ' + mm['ours_layout'] if mm.get('ours_layout') else ''}), torch " +
            ", ".join(f"{k} {v:.1f}" for k, v in mm["torch_us"].items() if v is not None)))
    return targets_table(dtype, specs, measured), measured


def _fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def print_table(table: list[dict], log=print) -> None:
    for r in table:
        if r.get("skipped"):
            log(f"  {r['label']:34s} skipped: {r['skipped']}")
            continue
        pub = ", ".join(f"{p['who']} {p['tflops']} ({p['device']})" for p in r["published"]) or "-"
        ver = "; ".join(f"{v['what']}: {'met' if v['met'] else 'NOT met'}" for v in r["verdicts"])
        log(f"  {r['label']:34s} ours {_fmt(r['ours_us'])} µs {_fmt(r['ours_tflops'])} TF/s | best torch "
            f"{r['best_torch']} {_fmt(r['best_torch_tflops'])} TF/s | best/ours {_fmt(r['ratio'], 3)} | "
            f"published {pub} | {ver}")


def chart_targets(tables: dict[str, list[dict]], path, title: str) -> str:
    """``path`` (PNG): per row grouped bars of ours, the best torch backend and the best published
    figure (TFLOP/s), one panel per table; the µs-target rows in a panel of their own (ours, best
    torch, target).  matplotlib where installed, else factory.benchmark.bar_chart_png (bars only)."""
    big = {k: [r for r in t if not r.get("skipped") and not any("µs" in v["what"] for v in r["verdicts"])]
           for k, t in tables.items()}
    small = [r for t in tables.values() for r in t if not r.get("skipped") and any("µs" in v["what"] for v in r["verdicts"])]
    pub = lambda r: max((p["tflops"] for p in r["published"]), default=0.0)  # noqa: E731
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from factory.benchmark import bar_chart_png

        rows = [r for t in big.values() for r in t]
        bar_chart_png(path, [[r["ours_tflops"] for r in rows], [r["best_torch_tflops"] or 0.0 for r in rows],
                             [float(pub(r)) for r in rows]], ["tab:red", "tab:gray", "tab:blue"])
        return "bar_chart_png"
    panels = [(k, v) for k, v in big.items() if v] + ([("µs", small)] if small else [])
    widths = [max(2, len(v)) for _, v in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.0 + 1.05 * sum(widths), 4.8),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, (kind, rows) in zip(axes[0], panels):
        n, w = len(rows), 0.27
        if kind == "µs":
            series = [("ours (graph)", "tab:red", [r["ours_us"] for r in rows]),
                      ("best torch (graph)", "tab:gray", [r["best_torch_us"] or 0 for r in rows]),
                      ("ours eager, synchronised", "tab:orange", [r.get("ours_eager_us") or 0 for r in rows])]
            ax.set_ylabel("µs per call")
            for i, r in enumerate(rows):
                for v in r["verdicts"]:
                    if "µs" in v["what"]:
                        ax.hlines(float(v["what"].split()[-1]), i - 0.45, i + 0.45, lw=1.0,
                                  color="k" if "graph" in v["what"] else "tab:orange", ls="--")
        else:
            series = [("ours", "tab:red", [r["ours_tflops"] for r in rows]),
                      ("best torch", "tab:gray", [r["best_torch_tflops"] or 0 for r in rows]),
                      ("published (best)", "tab:blue", [pub(r) for r in rows])]
            ax.set_ylabel("TFLOP/s")
            for i, r in enumerate(rows):
                for v in r["verdicts"]:
                    if v["what"].startswith("TFLOP/s"):
                        ax.hlines(float(v["what"].split()[-1]), i - 0.45, i + 0.45, color="k", lw=1.0, ls="--")
        for j, (name, color, ys) in enumerate(series):
            bars = ax.bar([i + (j - 1) * w for i in range(n)], ys, w, color=color, label=name)
            for bar, y in zip(bars, ys):
                if y:
                    ax.annotate(f"{y:.0f}" if kind != "µs" else f"{y:.1f}", (bar.get_x() + w / 2, y),
                                ha="center", va="bottom", fontsize=5.5, rotation=90)
        ax.set_xticks(list(range(n)), [r["label"].replace(" S16384", " 16k") for r in rows], rotation=60,
                      ha="right", fontsize=6.5)
        ax.set_title({"bf16": "bf16", "e4m3": "fp8 e4m3 (torch: bf16 on de-scaled values)"}.get(kind, "small problem"),
                     fontsize=8)
        ax.set_ylim(0, 1.3 * max([y for _, _, ys in series for y in ys] + [1.0]))
        ax.legend(fontsize=6, loc="upper left", ncol=1 if kind == "µs" else 3)
    fig.suptitle(title + "  (dashed: target)", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return "matplotlib"


def wide_summary(rows: list[dict]) -> dict:
    """The wide grid's rows (bench_attention's, its own timing) summed up: geomean of best torch /
    ours and the rows under 1.0."""
    r = [x["ratio_vs_best_sdpa"] for x in rows]
    return {"shapes": len(r), "geomean": statistics.geometric_mean(r), "under_1": sum(x < 1.0 for x in r),
            "min": min(r), "targets": {"geomean": 1.15, "under_1": 0}}


def summary(raws: list[dict]) -> dict:
    """What a note keeps of one or more runs (each the JSON :func:`main` wrote), a few KB: per row
    ours and the best torch backend (TFLOP/s, or µs for the small problem), best torch time / ours
    and each verdict (1 met, 0 not; in the order of ``verdicts``, the ratio's last), one value per
    run; fp8 rows add ours' V layout per run (``v``) and FlashAttention-3's error figures of the
    first run (``err``: RMSE, max abs against float32 of the de-scaled inputs)."""
    first = raws[0]
    out = {"device": first["device"], "torch": first["torch"], "cudnn": first.get("cudnn"), "date": first["date"],
           "commit": first.get("commit"), "runs": len(raws), "torch_note_fp8": TORCH_NO_FP8,
           "published_columns": ["who", "dtype", "head_dim", "causal", "gqa", "tflops", "device"],
           "published": [[p[k] for k in ("who", "dtype", "head_dim", "causal", "gqa", "tflops", "device")]
                         for p in PUBLISHED],
           "sources": {"FA3": "Shah et al., FlashAttention-3 (arXiv:2407.08608), forward speed figures, H100 SXM5, "
                              "seqlen 16k, H·D = 2048", "cuDNN 9.19": PUBLISHED[0]["source"]},
           "columns": ["id", "unit", "ours", "best torch", "torch", "best torch / ours", "verdicts met"],
           "verdicts": {"every row (last)": RATIO}, "rows": [], "skipped": {}}
    for kind in ("bf16", "e4m3"):
        for i, r in enumerate(first["tables"].get(kind, [])):
            rs = [raw["tables"][kind][i] for raw in raws]
            if any(x.get("skipped") for x in rs):
                out["skipped"][r["id"]] = next(x["skipped"] for x in rs if x.get("skipped"))
                continue
            us = any("µs" in v["what"] for v in r["verdicts"])
            nd = 2 if us else 0
            ours = [round(x["ours_us"] if us else x["ours_tflops"], nd) for x in rs]
            best = [round(x["best_torch_us"] if us else x["best_torch_tflops"], nd) for x in rs]
            if len(r["verdicts"]) > 1:
                out["verdicts"][r["id"]] = [v["what"] for v in r["verdicts"][:-1]]
            names = [x["best_torch"] for x in rs]
            row = [r["id"], "µs" if us else "TF/s", ours, names[0] if len(set(names)) == 1 else names, best, [round(x["ratio"], 3) for x in rs],
                   [[int(v["met"]) for v in x["verdicts"]] for x in rs]]
            extra = {}
            if us:
                extra["eager_us"] = [round(x["ours_eager_us"], 1) for x in rs]
            m = [raw["measured"][kind][r["id"]] for raw in raws]
            if m[0].get("ours_layout"):
                extra["v"] = ",".join(x.get("ours_layout") or "-" for x in m)
                e = (m[0].get("ours_err") or {}).get(m[0]["ours_layout"])
                if e:  # RMSE, max abs against float32 of the de-scaled inputs
                    extra["err"] = [float(f"{e['rmse']:.3g}"), float(f"{e['max_abs']:.3g}")]
            out["rows"].append(row + ([extra] if extra else []))
    return out


def main(a, wide_rows=None) -> int:
    """``--grid targets``: both tables (``--tables``), optionally the wide grid's summary
    (``--wide``: ``wide_rows(bundle, dtype, budget)`` gives the wide grid's rows; bench_attention
    passes its own grid runner, this module does not import it); ``--from-json RAW.json ...``: no
    GPU, the chart and the note's summary of runs already made (the summary to ``--summary PATH``)."""
    import json
    import os
    from pathlib import Path

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        raws = [json.loads(Path(p).read_text()) for p in a.from_json]
        how = chart_targets(raws[0]["tables"], Path(str(out) + ".png"), _title(raws[0]))
        print(f"wrote {out}.png ({how})")
        if a.summary:
            from factory.benchmark import dump_summary

            Path(a.summary).write_text(dump_summary(summary(raws)))
            print(f"wrote {a.summary}")
        return 0
    import torch

    from factory.runtime import Bundle

    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    raw = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d"),
           "commit": os.environ.get("FACTORY_COMMIT"), "bundle": str(a.bundle), "rounds": a.rounds,
           "timing": "graph replay (5 calls per graph for S <= 1024, else 1), interleaved passes, medians; "
                     "eager: CUDA events around one call and its synchronisation, median of 10",
           "torch_note_fp8": TORCH_NO_FP8, "published": PUBLISHED, "tables": {}, "measured": {}}
    print(f"{raw['device']}, torch {raw['torch']}, cuDNN {raw['cudnn']}", flush=True)
    for kind in a.tables:
        dtype, specs = ("bf16", BF16_ROWS) if kind == "bf16" else ("e4m3", FP8_ROWS)
        table, measured = run_table(bundle, dtype, specs, a.rounds, log=lambda s: print(s, flush=True))
        raw["tables"][dtype], raw["measured"][dtype] = table, measured
        print(f"{dtype} table:")
        print_table(table)
        Path(str(out) + ".json").write_text(json.dumps(raw, indent=1))  # (what ran survives a later failure)
    if a.wide:
        raw["wide"] = wide_summary(wide_rows(bundle, "bf16", a.budget))
        print(f"wide grid: {raw['wide']}", flush=True)
    Path(str(out) + ".json").write_text(json.dumps(raw, indent=1))
    how = chart_targets(raw["tables"], Path(str(out) + ".png"), _title(raw))
    print(f"wrote {out}.json and {out}.png ({how})", flush=True)
    return 0


def _title(raw: dict) -> str:
    return f"attention targets on {raw['device']} (torch {raw['torch']}, cuDNN {raw.get('cudnn')}), {raw['date']}"
