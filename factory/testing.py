"""References, inputs and tolerances in one place, for smoke.py, bench.py and the GPU tests.

Every check draws fresh random inputs, poisons the output with NaN first, and compares against a
float32 reference by ‖out − ref‖ / ‖ref‖.  Needs torch; never the DSL.
"""

from __future__ import annotations

import math

# Relative-error bounds (‖out − ref‖ / ‖ref‖ against float32 on the same, already-quantised inputs).
# bf16/fp16 operands and outputs: the bound.  fp8: the reference uses the e4m3 values the
# kernel saw, so only accumulation order and the bf16 output rounding remain: same bound.
TOLERANCE = {"bf16": 1e-2, "f16": 1e-2, "e4m3": 1e-2}

# (M, N, K, L): tails in every dimension (N and K stay multiples of 8 for 16-byte rows), a batch,
# decode-like M = 1, and a full-size tile grid.
GEMM_SHAPES = [(257, 136, 200, 1), (1, 264, 1032, 1), (64, 128, 64, 3), (1000, 1032, 1016, 2), (2048, 2048, 2048, 1)]


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "e4m3": torch.float8_e4m3fn}[name]


def rel_error(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def gemm_operand(rows: int, k: int, batch: int, major: str, dtype: str, device="cuda"):
    """A (batch, rows, k) tensor with the given contiguous mode ("k", or "m"/"n" for rows)."""
    import torch

    shape = (batch, rows, k) if major == "k" else (batch, k, rows)
    x = torch.randn(shape, device=device, dtype=torch.float32)
    if dtype == "e4m3":
        x = (x * 4).to(torch.float8_e4m3fn)
    else:
        x = x.to(torch_dtype(dtype))
    return x if major == "k" else x.transpose(1, 2)


def legal_gemm_shape(shape, entry) -> tuple[int, int, int, int]:
    """Round a shape up to the variant's divisibility contract (M for M-major A, N, K)."""
    div = entry["signature"]["divisibility"]
    M, N, K, L = shape
    up = lambda x, d: -(-x // d) * d  # noqa: E731
    return up(M, div.get("M", 1)), up(N, div.get("N", 1)), up(K, div.get("K", 1)), L


def check_gemm(bundle, entry, shape, device="cuda") -> dict:
    import torch

    M, N, K, L = legal_gemm_shape(shape, entry)
    d, lay = entry["dtypes"], entry["layout"]
    a = gemm_operand(M, K, L, lay["a"], d["a"], device)
    b = gemm_operand(N, K, L, lay["b"], d["b"], device)
    out = torch.full((L, M, N), float("nan"), dtype=torch_dtype(d["c"]), device=device)
    scales = {}
    ref_scale = 1.0
    if d["a"] == "e4m3":
        sa, sb = torch.rand(1, device=device) + 0.5, torch.rand(1, device=device) + 0.5
        scales = {"scale_a": sa, "scale_b": sb}
        ref_scale = float(sa * sb)
    bundle.gemm(a, b, out, variant=entry["name"], **scales)
    torch.cuda.synchronize()
    ref = torch.matmul(a.float(), b.float().transpose(1, 2)) * ref_scale
    nan = int(torch.isnan(out).sum())
    err = rel_error(out, ref) if nan == 0 else math.inf
    tol = TOLERANCE[d["a"]]
    return {"variant": entry["name"], "shape": [M, N, K, L], "rel_err": err, "nan": nan, "tol": tol,
            "ok": nan == 0 and err < tol}


def smoke_gemm(bundle, entry, device="cuda") -> list[dict]:
    return [check_gemm(bundle, entry, s, device) for s in GEMM_SHAPES]


def check_graph_capture(bundle, entry, device="cuda") -> dict:
    """The launcher must work under CUDA-graph capture (torch's capture stream) and on replay."""
    import torch

    M, N, K, L = legal_gemm_shape((384, 256, 512, 1), entry)
    d, lay = entry["dtypes"], entry["layout"]
    a = gemm_operand(M, K, L, lay["a"], d["a"], device)
    b = gemm_operand(N, K, L, lay["b"], d["b"], device)
    out = torch.full((L, M, N), float("nan"), dtype=torch_dtype(d["c"]), device=device)
    bundle.gemm(a, b, out, variant=entry["name"])  # warm-up: module load happens outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.gemm(a, b, out, variant=entry["name"])
    out.fill_(float("nan"))
    a.copy_(gemm_operand(M, K, L, lay["a"], d["a"], device))  # new data, same buffers
    g.replay()
    torch.cuda.synchronize()
    ref = torch.matmul(a.float(), b.float().transpose(1, 2))
    err = rel_error(out, ref)
    nan = int(torch.isnan(out).sum())
    return {"variant": entry["name"] + " [graph replay]", "shape": [M, N, K, L], "rel_err": err, "nan": nan,
            "tol": TOLERANCE[d["a"]], "ok": nan == 0 and err < TOLERANCE[d["a"]]}
