"""What bench.py, bench_attention.py, tune.py and the probes share: the benchmark's shape grid,
the timers (CUDA events around bursts of CUDA-graph replays), the bandwidth and launch floors, and
where raw results go.  Needs torch and a GPU at call time; never the DSL.

Raw output (JSON, logs, charts) goes to ``--out``, by default under ``$FACTORY_RESULTS`` or
``<tmp>/kernel-factory``: never into the tree.  A note keeps only a summary (``summarise``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

SQUARE = [(n, n, n) for n in (2048, 4096, 8192)]
# Llama projections (N, K): 3-8B qkv, o, gate+up, down; 3-70B qkv, o, gate+up, down.
LLM_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
LLM_M = [1, 16, 64, 128, 512, 2048, 8192, 16384]


def default_out(stem: str) -> str:
    """Where a benchmark writes its raw output unless told (``--out``): outside the tree."""
    root = os.environ.get("FACTORY_RESULTS") or str(Path(tempfile.gettempdir()) / "kernel-factory")
    return str(Path(root) / stem)


def sets_for(bytes_per_set: int, l2: int) -> int:
    return max(1, min(8, -(-2 * l2 // max(1, bytes_per_set))))


def timed_replays(g, reps: int, burst: int, n_sets: int) -> list[float]:
    """Seconds per call over ``reps`` samples of ``burst`` back-to-back replays of graph ``g``,
    all enqueued before one synchronisation, behind an untimed replay: the GPU never waits for
    the host to submit the next replay (a lone replay between two events on the H100 carries
    ~18 µs of graph-launch latency: an empty kernel measured 18-20 µs that way, 2.3-2.5 µs in
    graphs of 8)."""
    import torch

    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    g.replay()
    ev[0].record()
    for j in range(reps):
        for _ in range(burst):
            g.replay()
        ev[j + 1].record()
    ev[-1].synchronize()
    return [ev[j].elapsed_time(ev[j + 1]) / 1e3 / burst / n_sets for j in range(reps)]


def one_replay_s(g) -> float:
    """Seconds of one replay of graph ``g`` between two events (warm-up; sets the sample sizes)."""
    import torch

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3


def burst_for(first_s: float) -> int:
    """Replays per sample: enough for ~100 µs of GPU work (a sample then outlasts the host's
    submission of the next), at most 20."""
    return int(max(1, min(20, 100e-6 / max(first_s, 1e-7))))


def capture(fn_per_set, n_sets: int, stream=None):
    """A CUDA graph of one call per input set, after one eager call per set outside capture
    (module load, library heuristics)."""
    import torch

    for i in range(n_sets):
        fn_per_set(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = stream if stream is not None else torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for i in range(n_sets):
                fn_per_set(i)
    return g


def time_graph(fn_per_set, n_sets: int, replays: int | None = None, budget_s: float = 0.4) -> float:
    """Median seconds per call, from replays of a graph holding one call per input set.  Without
    ``replays``: as many as fit ``budget_s`` of GPU time (7 to 40)."""
    g = capture(fn_per_set, n_sets)
    first = one_replay_s(g)
    if replays is None:
        replays = int(max(7, min(40, budget_s / max(first, 1e-6))))
    times = timed_replays(g, replays, burst_for(first), n_sets)
    del g
    return statistics.median(times)


def time_interleaved(calls: dict, n_sets: int, rounds: int = 3, budget_s: float = 0.05,
                     max_reps: int = 20, warm_s: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each of ``calls`` (name -> fn(input set)): one CUDA graph per
    callable (one call per input set), replayed in ``rounds`` passes over all of them, the order
    reversed every other pass, so that clock, power and memory-state drift during the run falls
    on every candidate alike (on the H100 a kernel timed right after a new weight tensor was
    allocated, or after a long compute-bound run, came out up to 15 % slow whichever came first).
    Per pass ``reps`` samples (3 to ``max_reps`` within ``budget_s``), each a burst of back-to-back
    replays (``timed_replays``); the estimate is the median over passes of each pass's median."""
    import torch

    graphs, samples = {}, {}
    s = torch.cuda.Stream()
    for name, fn in calls.items():
        graphs[name], samples[name] = capture(fn, n_sets, s), []
    torch.cuda.synchronize()
    # Warm-up: replay all graphs in turn for ``warm_s`` before sampling.  Right after new weights
    # are allocated and filled, the first ~10 ms of replays run up to 15 % slow on the H100 (ours
    # and cuBLAS alike: notes/results/probe_decode_m1_v2.log); a server's weights are long-lived.
    t_warm = time.perf_counter()
    while True:
        for g in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        if time.perf_counter() - t_warm >= warm_s:
            break
    reps, bursts = {}, {}
    order = list(graphs)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            g = graphs[name]
            if name not in reps:  # the first replay is a warm-up that sets the counts
                first = one_replay_s(g)
                bursts[name] = burst_for(first)
                reps[name] = int(max(3, min(max_reps, budget_s / max(first * bursts[name], 1e-6))))
            samples[name] += timed_replays(g, reps[name], bursts[name], n_sets)
    del graphs
    # Median of the per-pass medians: a pass that ran while the clocks were low (the H100's vary
    # by up to 15 % over a tuning run) moves one value of each candidate's estimate, not a block.
    return {name: statistics.median(statistics.median(v[i * reps[name]:(i + 1) * reps[name]])
                                    for i in range(rounds)) for name, v in samples.items()}


def time_eager(fn_per_set, n_sets: int, iters: int = 10) -> float:
    import torch

    for i in range(n_sets):
        fn_per_set(i)
    torch.cuda.synchronize()
    times = []
    for r in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn_per_set(r % n_sets)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), graph-replay median."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = time_graph(lambda i: dst.copy_(src), 1, replays=20)
    src = dst = None
    torch.cuda.empty_cache()
    return 2 * nbytes / t


def read_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bandwidth of a read-only stream (a sum over 1 GiB) in bytes/s: a GEMM that streams its
    weights writes next to nothing, so it can beat the copy figure (seen: 1x57344x8192)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    out = torch.empty((), dtype=torch.float32, device="cuda")
    t = time_graph(lambda i: torch.sum(src, dim=0, dtype=torch.float32, out=out), 1, replays=20)
    src = None
    torch.cuda.empty_cache()
    return nbytes / t


def launch_latency() -> dict[int, float]:
    """Seconds per call of a one-element kernel, timed like a GEMM row with n input sets (a graph
    of n calls, CUDA events around each replay, divided by n), for n = 1..8: the part of any
    measured kernel time that no bandwidth or FLOP rate accounts for."""
    import torch

    x = torch.zeros(1, device="cuda")
    return {n: time_graph(lambda i: x.add_(1.0), n, replays=50) for n in range(1, 9)}


def gemm_bytes(M, N, K, dtype: str) -> int:
    e = 1 if dtype == "e4m3" else 2
    return (M * K + N * K) * e + M * N * 2



# --- a chart without matplotlib -------------------------------------------------------------------
_COLORS = {"tab:red": (214, 39, 40), "tab:blue": (31, 119, 180), "tab:green": (44, 160, 44),
           "tab:gray": (127, 127, 127)}


def write_png(path, width: int, height: int, rgb: bytes) -> None:
    """An 8-bit RGB PNG from ``rgb`` (rows top to bottom, 3 bytes a pixel): zlib and struct only."""
    import struct
    import zlib

    if len(rgb) != width * height * 3:
        raise ValueError(f"{len(rgb)} bytes for {width}x{height} RGB")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\0" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def bar_chart_png(path, series: list[list[float]], colors: list[str], bar_px: int = 6, height: int = 240) -> None:
    """Grouped bars (one group per x position, one bar per series, heights scaled to the largest
    value) on white with a baseline, no text: what bench_attention.py draws where matplotlib is
    missing (its JSON holds the numbers)."""
    n = max((len(s) for s in series), default=0)
    group = bar_px * len(series) + bar_px
    width, top = max(1, n * group + bar_px), max([v for s in series for v in s if v == v] + [1e-30])
    img = bytearray(b"\xff" * (width * height * 3))
    for j, s in enumerate(series):
        color = bytes(_COLORS.get(colors[j], (0, 0, 0)))
        for i, v in enumerate(s):
            h = int(round((height - 2) * max(0.0, v if v == v else 0.0) / top))
            x0 = bar_px + i * group + j * bar_px
            for y in range(height - 1 - h, height - 1):
                row = (y * width + x0) * 3
                img[row:row + 3 * bar_px] = color * bar_px
    base = (height - 1) * width * 3
    img[base:base + width * 3] = b"\0" * (width * 3)
    write_png(path, width, height, bytes(img))


# --- the summary a note keeps ---------------------------------------------------------------------
RUN_KEYS = ("device", "torch", "cuda", "date", "selection", "epochs", "copy_bandwidth_tbs", "read_bandwidth_tbs")
TABLE_KEYS = ("dtype", "ceiling_tflops", "geomean_ratio", "min_ratio", "geomean_eager_ratio", "decode_shapes",
              "decode_within_10pct")
ROW_KEYS = ("M", "N", "K", "ours_us", "ref_us", "ratio", "ours_tflops", "floor_us")
# Decode rows only: bundle.gemm(..., b_constant=True) where it runs another variant, and packed weights.
DECODE_KEYS = ("ours_bconst_us", "ours_packed_us", "ours_packed_plain_us")


def _round(x):
    """A row's number: 3 decimals under 10 (ratios, decode µs), 2 under 100, 1 under 1000, else
    none; NaN -> None."""
    if not isinstance(x, float):
        return x
    if x != x:
        return None
    return round(x, 3 if abs(x) < 10 else 2 if abs(x) < 100 else 1 if abs(x) < 1000 else None)


def _round_all(x):
    """A run's or table's figures (geomeans, bandwidths): 4 decimals."""
    if isinstance(x, dict):
        return {k: _round_all(v) for k, v in x.items()}
    return round(x, 4) if isinstance(x, float) else x


def summarise(raw: dict, /, **provenance) -> dict:
    """The part of bench.py's raw JSON that a note keeps (a few KB): the run (device, versions,
    selection, bandwidths), per dtype the geomeans and decode counts, per shape ours and the
    reference in µs, their ratio, our TFLOP/s and the floor, and for decode shapes the times with
    ``b_constant=True`` and on packed weights where the run has them.  ``provenance`` (e.g. where
    the raw file is) goes first."""
    tables = raw.get("tables") or [{"dtype": raw["rows"][0]["dtype"], "geomean_ratio": raw.get("geomean_ratio"),
                                    "rows": raw["rows"]}]
    out = {**provenance, **{k: _round_all(raw[k]) for k in RUN_KEYS if k in raw}, "tables": []}
    for t in tables:
        table = {**{k: _round_all(t[k]) for k in TABLE_KEYS if k in t}, "columns": list(ROW_KEYS),
                 "rows": [[_round(r.get(k)) for k in ROW_KEYS] for r in t["rows"]]}
        dec = [r for r in t["rows"] if any(k in r for k in DECODE_KEYS)]
        if dec:
            cols = ["M", "N", "K"] + [k for k in DECODE_KEYS if any(k in r for r in dec)]
            table["decode"] = {"columns": cols, "rows": [[_round(r.get(k)) for k in cols] for r in dec]}
        out["tables"].append(table)
    return out


def compact_json(x, indent: str = "") -> str:
    """JSON that puts anything short (a table row, a small dict) on one line and the rest one item
    per line (lists of short items a line's worth at a time): a diff or a grep then reads one row at
    a time, and a table costs little more than CSV."""
    import json

    flat = json.dumps(x, ensure_ascii=False, separators=(",", ":"))
    if len(flat) + len(indent) <= 110 or not isinstance(x, (dict, list)) or not x:
        return flat
    inner = indent + " "
    if isinstance(x, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {compact_json(v, inner)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    parts = [compact_json(v, inner) for v in x]
    if max(map(len, parts)) <= 30 and all("\n" not in p for p in parts):  # short items: pack them
        lines, line = [], ""
        for part in parts:
            if line and len(inner) + len(line) + len(part) + 1 > 110:
                lines.append(inner + line)
                line = ""
            line += ("," if line else "") + part
        parts = [p.strip() for p in lines + [inner + line]]
    return "[\n" + ",\n".join(inner + p for p in parts) + f"\n{indent}]"


def dump_summary(summary: dict) -> str:
    return compact_json(summary) + "\n"
