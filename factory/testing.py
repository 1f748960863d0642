"""References, inputs and tolerances in one place, for smoke.py, bench.py and the GPU tests.

Every check draws fresh random inputs, poisons the output with NaN first, and compares against a
float32 reference by ‖out − ref‖ / ‖ref‖.  Needs torch; never the DSL.
"""

from __future__ import annotations

import itertools
import math

# Relative-error bounds (‖out − ref‖ / ‖ref‖ against float32 on the same, already-quantised inputs).
# bf16/fp16 operands and outputs: 1 % (the bound every kernel family is held to).  fp8: the reference uses the e4m3 values the
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


def gemm_inputs(M: int, N: int, K: int, dtype: str, out: str = "bf16", *, poison: bool = True, device="cuda"):
    """One K-major GEMM problem: a (M, K) and b (N, K) of ``dtype`` and an (M, N) output of ``out``
    dtype, NaN-poisoned unless ``poison=False`` (then left uninitialised)."""
    import torch

    a = gemm_operand(M, K, 1, "k", dtype, device)[0]
    b = gemm_operand(N, K, 1, "k", dtype, device)[0]
    c = torch.empty((M, N), dtype=torch_dtype(out), device=device)
    return a, b, c.fill_(float("nan")) if poison else c


def gemm_input_sets(n: int, M: int, N: int, K: int, dtype: str, out: str = "bf16", *, poison: bool = True,
                    device="cuda"):
    """``n`` fresh problems of one shape (a bench rotates over them to defeat the L2): lists A, B, C."""
    sets = [gemm_inputs(M, N, K, dtype, out, poison=poison, device=device) for _ in range(n)]
    return tuple(list(x) for x in zip(*sets))


def legal_gemm_shape(shape, entry) -> tuple[int, int, int, int]:
    """Round a shape up to the variant's divisibility contract (M for M-major A, N, K)."""
    div = entry["signature"]["divisibility"]
    M, N, K, L = shape
    up = lambda x, d: -(-x // d) * d  # noqa: E731
    return up(M, div.get("M", 1)), up(N, div.get("N", 1)), up(K, div.get("K", 1)), L


def variant_problem(entry, shape, device="cuda"):
    """``shape`` rounded up to the variant's contract, operands in its dtypes and layouts, and a
    NaN-poisoned output: ((M, N, K, L), a, b, out)."""
    import torch

    M, N, K, L = legal_gemm_shape(shape, entry)
    d, lay = entry["dtypes"], entry["layout"]
    a = gemm_operand(M, K, L, lay["a"], d["a"], device)
    b = gemm_operand(N, K, L, lay["b"], d["b"], device)
    out = torch.full((L, M, N), float("nan"), dtype=torch_dtype(d["c"]), device=device)
    return (M, N, K, L), a, b, out


def fp8_scaled_problem(mode: str, M: int, N: int, K: int, device="cuda"):
    """A 2-D fp8 problem in scale form ``mode`` ("row" or "block", runtime/fp8.py) quantized from
    random float32 data: (a, b, {"scale_a", "scale_b"}, float32 reference of the dequantized
    operands' product)."""
    import torch

    from .runtime import fp8

    xa = torch.randn(M, K, device=device) * (1 + torch.rand(M, 1, device=device) * 8)
    xb = torch.randn(N, K, device=device) * (1 + torch.rand(1, K, device=device) * 4)
    if mode == "row":
        (a, sa), (b, sb) = fp8.quantize_rowwise(xa), fp8.quantize_rowwise(xb)
        ref = fp8.dequantize_rowwise(a, sa) @ fp8.dequantize_rowwise(b, sb).t()
    else:
        (a, sa), (b, sb) = fp8.quantize_blockwise(xa, (1, 128)), fp8.quantize_blockwise(xb, (128, 128))
        ref = fp8.dequantize_blockwise(a, sa) @ fp8.dequantize_blockwise(b, sb).t()
    return a, b, {"scale_a": sa, "scale_b": sb}, ref


def check_gemm(bundle, entry, shape, device="cuda") -> dict:
    import torch

    d = entry["dtypes"]
    mode = entry.get("scale_mode") or "tensor"
    if mode != "tensor":  # row / block scales: 2-D problems
        M, N, K, _ = legal_gemm_shape(shape, entry)
        a, b, scales, ref = fp8_scaled_problem(mode, M, N, K, device)
        out = torch.full((M, N), float("nan"), dtype=torch_dtype(d["c"]), device=device)
        bundle.gemm(a, b, out, variant=entry["name"], **scales)
        torch.cuda.synchronize()
        return _judge(entry["name"], [M, N, K, 1], out, ref, TOLERANCE[d["a"]])
    (M, N, K, L), a, b, out = variant_problem(entry, shape, device)
    scales = {}
    ref_scale = 1.0
    if d["a"] == "e4m3":
        sa, sb = torch.rand(1, device=device) + 0.5, torch.rand(1, device=device) + 0.5
        scales = {"scale_a": sa, "scale_b": sb}
        ref_scale = float(sa * sb)
    bundle.gemm(a, b, out, variant=entry["name"], **scales)
    torch.cuda.synchronize()
    ref = torch.matmul(a.float(), b.float().transpose(1, 2)) * ref_scale
    return _judge(entry["name"], [M, N, K, L], out, ref, TOLERANCE[d["a"]])


# Split-K (decode) variants: L = 1 only; long K so every split has work, and short K so some
# splits have none (their partial must still be written as zeros).
SPLIT_K_SHAPES = [(257, 136, 200, 1), (1, 264, 1032, 1), (16, 4096, 4096, 1), (64, 1024, 14336, 1)]


# Packed-weight decode variants: M up to 16; N and K rounded up to the variant's contract.
DECODE_SHAPES = [(1, 4096, 4096, 1), (16, 4096, 4096, 1), (5, 2048, 8192, 1), (16, 6144, 14336, 1), (3, 96, 2048, 1)]


def check_gemm_packed(bundle, entry, shape, device="cuda") -> dict:
    import torch

    M, N, K, _ = legal_gemm_shape(shape, entry)  # (its N: rows per CTA, K: k_multiple)
    a, b, out = gemm_inputs(M, N, K, "e4m3", device=device)
    sa, sb = torch.rand(1, device=device) + 0.5, torch.rand(1, device=device) + 0.5
    bundle.gemm(a, bundle.pack_b(b), out, scale_a=sa, scale_b=sb, variant=entry["name"])
    torch.cuda.synchronize()
    return _judge(entry["name"], [M, N, K, 1], out, (a.float() @ b.float().t()) * float(sa * sb), TOLERANCE["e4m3"])


def _judge(name: str, shape: list, out, ref, tol: float) -> dict:
    """One smoke result: NaN count and relative error of ``out`` against ``ref``."""
    import torch

    nan = int(torch.isnan(out).sum())
    err = rel_error(out, ref) if nan == 0 else math.inf
    return {"variant": name, "shape": shape, "rel_err": err, "nan": nan, "tol": tol, "ok": nan == 0 and err < tol}


# Fused epilogues (M, N_out, K, L): tails in M and N_out, N_out not a multiple of 64 (silu_mul:
# a padded last gate/up block), a batch, several tiles.
EPILOGUE_SHAPES = [(257, 136, 200, 1), (1, 264, 1032, 1), (64, 128, 64, 3), (1000, 1000, 1016, 2)]
# e4m3 outputs (fp8_groups): N_out a multiple of 16 (16-byte rows), partial last groups and
# gate/up blocks, 2-D.
FP8_GROUPS_SHAPES = [(257, 144, 200, 1), (1, 272, 1032, 1), (64, 128, 64, 1), (1000, 1008, 1016, 1)]


def silu_mul_ref(acc, n_out: int):
    """silu(gate)·up of a float32 product whose last mode is in ``pack_gate_up``'s row order."""
    import torch

    from .runtime.epilogue import unpack_gate_up

    g, u = unpack_gate_up(acc.movedim(-1, 0), n_out)
    return (torch.nn.functional.silu(g) * u).movedim(0, -1)


def epilogue_problem(fields, M, n_out, K, L=1, ab="bf16", c="bf16", scale_mode="tensor", device="cuda"):
    """Random operands of a fused-epilogue GEMM (``fields`` of bias, silu_mul, residual) and its
    float32 reference: (a, b, kwargs for ``bundle.gemm``, reference, output shape).  b is in
    ``pack_gate_up``'s form for silu_mul; fp8 operands come with per-tensor or row scales."""
    import torch

    from .runtime.epilogue import pack_gate_up

    lead = (L,) if L > 1 else ()
    silu = "silu_mul" in fields
    ct = torch_dtype(c)
    a = torch.randn(*lead, M, K, device=device)
    w = torch.randn(*lead, 2 * n_out if silu else n_out, K, device=device)
    if silu:
        w = torch.stack([pack_gate_up(x) for x in w]) if L > 1 else pack_gate_up(w)
    N = w.shape[-2]
    kw = {"activation": "silu_mul"} if silu else {}
    sa = sb = None
    if ab == "e4m3":
        a, w = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        if scale_mode == "row":
            sa, sb = torch.rand(M, device=device) + 0.5, torch.rand(N, device=device) + 0.5
        else:
            sa, sb = torch.rand(1, device=device) + 0.5, torch.rand(1, device=device) + 0.5
        kw.update(scale_a=sa, scale_b=sb)
    else:
        a, w = a.to(torch_dtype(ab)), w.to(torch_dtype(ab))
    acc = torch.matmul(a.float(), w.float().transpose(-1, -2))
    if sa is not None:
        acc = acc * (sa[:, None] * sb[None, :] if scale_mode == "row" else sa * sb)
    if "bias" in fields:
        kw["bias"] = torch.randn(N, device=device).to(ct)
        acc = acc + kw["bias"].float()
    if silu:
        acc = silu_mul_ref(acc, n_out)
    if "residual" in fields:
        kw["residual"] = torch.randn(*lead, M, n_out, device=device).to(ct)
        acc = acc + kw["residual"].float()
    return a, w, kw, acc, (*lead, M, n_out)


# e4m3 outputs with a scale per row and 128 columns (``fp8_groups``): the decoded output against
# float32 (each element within half an e4m3 step, 2^-4 relative, of the exact value).
FP8_OUT_TOLERANCE = 4e-2


def decode_fp8_groups(out, scale_out):
    """float32 values of an e4m3 output and its (M, ceil(N/128)) scales."""
    return out.float() * scale_out.repeat_interleave(128, dim=1)[:, :out.shape[1]]


def check_gemm_epilogue(bundle, entry, shape, device="cuda") -> dict:
    """One fused-epilogue variant by name on ``shape`` (M, N_out, K, L), NaN-poisoned output (an
    e4m3 output with group scales: 2-D, decoded against float32)."""
    import torch

    d = entry["dtypes"]
    mode = entry.get("scale_mode") or "tensor"
    M, n_out, K, L = shape
    quant = "fp8_groups" in entry["epilogue"]
    if mode != "tensor" or quant:
        L = 1
    fields = [f for f in entry["epilogue"] if f != "fp8_groups"]
    a, b, kw, ref, oshape = epilogue_problem(fields, M, n_out, K, L, d["a"], "bf16" if quant else d["c"], mode, device)
    out = torch.full(oshape, float("nan"), device=device).to(torch_dtype(d["c"]))
    got = bundle.gemm(a, b, out, variant=entry["name"], **kw)
    torch.cuda.synchronize()
    if quant:
        return _judge(entry["name"], [M, n_out, K, L], decode_fp8_groups(*got), ref, FP8_OUT_TOLERANCE)
    return _judge(entry["name"], [M, n_out, K, L], out, ref, TOLERANCE[d["a"]])


def check_graph_capture_epilogue(bundle, entry, device="cuda") -> dict:
    """A fused-epilogue variant captured in a CUDA graph, replayed on new data in the same buffers."""
    import torch

    d = entry["dtypes"]
    mode = entry.get("scale_mode") or "tensor"
    M, n_out, K = 384, 192, 512
    quant = "fp8_groups" in entry["epilogue"]
    fields = [f for f in entry["epilogue"] if f != "fp8_groups"]
    cd = "bf16" if quant else d["c"]
    a, b, kw, _, oshape = epilogue_problem(fields, M, n_out, K, 1, d["a"], cd, mode, device)
    out = torch.full(oshape, float("nan"), device=device).to(torch_dtype(d["c"]))
    got = bundle.gemm(a, b, out, variant=entry["name"], **kw)
    if quant:
        kw["scale_out"] = got[1]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.gemm(a, b, out, variant=entry["name"], **kw)
    a2, b2, kw2, ref, _ = epilogue_problem(fields, M, n_out, K, 1, d["a"], cd, mode, device)
    a.copy_(a2)
    b.copy_(b2)
    for k, v in kw2.items():
        if isinstance(v, torch.Tensor):
            kw[k].copy_(v)
    out.copy_(torch.full(oshape, float("nan"), device=device).to(out.dtype))
    if quant:
        kw["scale_out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    val = decode_fp8_groups(out, kw["scale_out"]) if quant else out
    tol = FP8_OUT_TOLERANCE if quant else TOLERANCE[d["a"]]
    err = rel_error(val, ref)
    nan = int(torch.isnan(val.float()).sum())
    return {"variant": entry["name"] + " [graph replay]", "shape": [M, n_out, K, 1], "rel_err": err, "nan": nan,
            "tol": tol, "ok": nan == 0 and err < tol}


def smoke_gemm(bundle, entry, device="cuda") -> list[dict]:
    if entry.get("epilogue"):  # fused bias / silu_mul / residual / fp8_groups (runtime/epilogue.py)
        shapes = FP8_GROUPS_SHAPES if "fp8_groups" in entry["epilogue"] else EPILOGUE_SHAPES
        return [check_gemm_epilogue(bundle, entry, s, device) for s in shapes]
    if entry.get("family") == "decode":  # packed weights (runtime/packed.py)
        return [check_gemm_packed(bundle, entry, s, device) for s in DECODE_SHAPES]
    shapes = SPLIT_K_SHAPES if "workspace" in entry else GEMM_SHAPES
    return [check_gemm(bundle, entry, s, device) for s in shapes]


# Block-scaled (MXFP8 / NVFP4, Blackwell only): tails in M and N, K a multiple of 32 but not of the
# k-tile, a batch, a multi-tile grid.  The reference is the float32 product of the decoded operands
# (the values the kernel multiplies): only summation order and the output rounding remain, so the
# bf16 bound applies.
BLOCKSCALED_SHAPES = [(257, 136, 320, 1), (1, 264, 1024, 1), (64, 128, 96, 3), (1000, 1032, 2048, 2)]
BLOCKSCALED_FORMATS = {"nvf4": "nvfp4", "mxf8e4m3": "mxfp8_e4m3", "mxf8e5m2": "mxfp8_e5m2"}


def check_gemm_blockscaled(bundle, entry, shape, device="cuda") -> dict:
    import torch

    from .runtime import blockscaled as bs

    M, N, K, L = legal_gemm_shape(shape, entry)
    lead = (L,) if L > 1 else ()
    fmt = BLOCKSCALED_FORMATS[entry["format"]]
    a = bs.pack(torch.randn(*lead, M, K, device=device), fmt)
    b = bs.pack(torch.randn(*lead, N, K, device=device), fmt)
    out = torch.full((*lead, M, N), float("nan"), dtype=torch_dtype(entry["dtypes"]["c"]), device=device)
    bundle.gemm_blockscaled(a, b, out, variant=entry["name"])
    torch.cuda.synchronize()
    return _judge(entry["name"], [M, N, K, L], out, bs.reference_gemm(a, b), TOLERANCE["bf16"])


def smoke_gemm_blockscaled(bundle, entry, device="cuda") -> list[dict]:
    return [check_gemm_blockscaled(bundle, entry, s, device) for s in BLOCKSCALED_SHAPES]


def capture_on_side_stream(fn):
    """A CUDA graph of ``fn()`` captured on a fresh stream (not the caller's current one)."""
    import torch

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            fn()
    return g


def check_graph_capture(bundle, entry, device="cuda") -> dict:
    """The launcher must work under CUDA-graph capture (torch's capture stream) and on replay."""
    import torch

    if entry.get("epilogue"):
        return check_graph_capture_epilogue(bundle, entry, device)

    (M, N, K, L), a, b, out = variant_problem(entry, (384, 256, 512, 1), device)
    d, lay = entry["dtypes"], entry["layout"]
    mode = entry.get("scale_mode") or "tensor"
    scales = {}
    if mode != "tensor":  # row / block scales: 2-D, scales quantized with the operands
        a, b, scales, _ = fp8_scaled_problem(mode, M, N, K, device)
        out = out[0]
    bundle.gemm(a, b, out, variant=entry["name"], **scales)  # warm-up: module load happens outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.gemm(a, b, out, variant=entry["name"], **scales)
    out.fill_(float("nan"))
    if mode != "tensor":  # new data and scales, same buffers
        a2, b2, sc2, ref = fp8_scaled_problem(mode, M, N, K, device)
        a.copy_(a2)
        b.copy_(b2)
        scales["scale_a"].copy_(sc2["scale_a"])
        scales["scale_b"].copy_(sc2["scale_b"])
    else:
        a.copy_(gemm_operand(M, K, L, lay["a"], d["a"], device))  # new data, same buffers
    g.replay()
    torch.cuda.synchronize()
    if mode == "tensor":
        ref = torch.matmul(a.float(), b.float().transpose(1, 2))
    err = rel_error(out, ref)
    nan = int(torch.isnan(out).sum())
    return {"variant": entry["name"] + " [graph replay]", "shape": [M, N, K, L], "rel_err": err, "nan": nan,
            "tol": TOLERANCE[d["a"]], "ok": nan == 0 and err < TOLERANCE[d["a"]]}


# --- attention ---------------------------------------------------------------------------------
def attention_reference(q, k, v, causal: bool, scale: float):
    """float32 attention for (B, S, H, D) inputs with GQA by head index and bottom-right causal
    masking; returns o (B, Sq, Hq, D) and lse (B, Hq, Sq); rows with no visible key give 0 / -inf."""
    import torch

    qf, kf, vf = (t.float() for t in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(rep, dim=2), vf.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vf), lse


def gather_kv_cache(cache, block_table, cache_seqlens, b: int):
    """Sequence ``b``'s keys (or values) of a KV cache as (L, Hkv, D), L = cache_seqlens[b]: rows
    0..L-1 of its pages (block_table row b) in order, or of row b of a dense cache."""
    n = int(cache_seqlens[b])
    if block_table is None:
        return cache[b, :n]
    ps = cache.shape[1]
    pages = block_table[b, : -(-n // ps)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def attention_kvcache_reference(q, k_cache, v_cache, cache_seqlens, block_table=None, *, causal: bool = True,
                                scale: float | None = None, window_size=(-1, -1), softcap: float = 0.0,
                                sinks=None, k_descale=None, v_descale=None):
    """float32 attention over a paged or dense KV cache, sequence by sequence on the gathered K/V
    (:func:`gather_kv_cache`): q (B, Sq, Hq, D); GQA by head index; bottom-right causal (query s
    sees keys j <= s + L - Sq) and the window (j >= s + L - Sq - left; without causal also
    j <= s + L - Sq + right); softcap: scores cap·tanh(s·scale/cap); sinks (Hq,): one more logit
    per head in the denominator, with no value row; fp8 caches times k_descale / v_descale
    (per tensor or per kv head).  Returns o (B, Sq, Hq, D) float32 and lse (B, Hq, Sq) (the sink
    included); rows that see no key give o = 0 and lse = -inf (the sink's logit with sinks)."""
    import torch

    b, sq, hq, d = q.shape
    hkv = k_cache.shape[2]
    scale = d ** -0.5 if scale is None else scale
    o = torch.zeros(b, sq, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((b, hq, sq), -math.inf, dtype=torch.float32, device=q.device)
    for i in range(b):
        k = gather_kv_cache(k_cache, block_table, cache_seqlens, i).float()
        v = gather_kv_cache(v_cache, block_table, cache_seqlens, i).float()
        if k_descale is not None:
            k = k * k_descale.float().reshape(-1)[None, :, None].expand(1, hkv, 1)
        if v_descale is not None:
            v = v * v_descale.float().reshape(-1)[None, :, None].expand(1, hkv, 1)
        n = k.shape[0]
        rep = hq // hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[i].float(), k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qi = torch.arange(sq, device=q.device)[:, None] + (n - sq)
        j = torch.arange(n, device=q.device)[None, :]
        hide = torch.zeros(sq, n, dtype=torch.bool, device=q.device)
        if causal:
            hide |= j > qi
        elif window_size[1] >= 0:
            hide |= j > qi + window_size[1]
        if window_size[0] >= 0:
            hide |= j < qi - window_size[0]
        s = s.masked_fill(hide, -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks.float()[:, None, None].expand(hq, sq, 1)], dim=-1)
            v = torch.cat([v, torch.zeros(1, hq, d, device=q.device)], dim=0)
        if s.shape[-1] == 0:
            continue
        ls = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - ls[..., None]).nan_to_num(0.0)
        o[i] = torch.einsum("hqk,khd->qhd", p, v)
        lse[i] = ls
    return o, lse


def smoke_attention(bundle, entry, device="cuda") -> list[dict]:
    """One dense (GQA 4, tails, Sq ≠ Sk) or varlen (lengths 1, a tile + 2, a tail) problem, launched
    by variant name with NaN-poisoned o and lse, against attention_reference.  Split-KV variants get
    a decode-shaped problem (Sq 3, or 1 for packed GQA; Sk 777: 7 key tiles, so 16 splits leave
    some empty) and a NaN-poisoned workspace."""
    import torch

    from .runtime.attention import split_workspace

    dt, d, causal = torch_dtype(entry["dtype"]), entry["head_dim"], entry["causal"]
    scale = d ** -0.5
    hq, hkv = 8, 2
    splits = entry.get("splits", 1)
    if entry["varlen"]:
        lq, lk = [1, 130, 77], [5, 130, 200]
    elif splits > 1:  # packed-GQA decode variants take seqlen_q == 1 only
        lq, lk = ([1, 1] if entry.get("pack_gqa") else [3, 3]), [777, 777]
    else:
        lq, lk = [200, 200], [333, 333]
    qs = [torch.randn(1, n, hq, d, device=device).to(dt) for n in lq]
    ks = [torch.randn(1, n, hkv, d, device=device).to(dt) for n in lk]
    vs = [torch.randn(1, n, hkv, d, device=device).to(dt) for n in lk]
    if entry["varlen"]:
        q, k, v = (torch.cat(x, 1)[0] for x in (qs, ks, vs))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((hq, q.shape[0]), float("nan"), device=device)
        cu = lambda ls: torch.tensor([0, *itertools.accumulate(ls)], dtype=torch.int32, device=device)  # noqa: E731
        args = [q, k, v, o, lse, cu(lq), cu(lk), scale, max(lq)]
    else:
        q, k, v = (torch.cat(x, 0) for x in (qs, ks, vs))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((q.shape[0], hq, q.shape[1]), float("nan"), device=device)
        args = [q, k, v, o, lse, scale]
        if splits > 1:
            ws = split_workspace(torch, q, splits)
            for w in ws:
                w.fill_(float("nan"))
            args[5:5] = ws
    bundle.launch(entry["name"], args)
    torch.cuda.synchronize()
    outs, lses = [], []
    for i in range(len(lq)):
        ro, rl = attention_reference(qs[i], ks[i], vs[i], causal, scale)
        if entry["varlen"]:
            start = sum(lq[:i])
            outs.append((o[start:start + lq[i]][None], ro))
            lses.append((lse[:, start:start + lq[i]][None], rl))
        else:
            outs.append((o[i:i + 1], ro))
            lses.append((lse[i:i + 1], rl))
    out = torch.cat([x.flatten() for x, _ in outs])
    ref = torch.cat([r.flatten() for _, r in outs])
    lse_got = torch.cat([x.flatten() for x, _ in lses])
    lse_ref = torch.cat([r.flatten() for _, r in lses])
    nan = int(torch.isnan(out).sum() + torch.isnan(lse_got).sum())
    finite = torch.isfinite(lse_ref)
    lse_ok = bool(torch.equal(torch.isinf(lse_got), ~finite)) and (
        not finite.any() or float((lse_got[finite] - lse_ref[finite]).abs().max()) < 2e-2)
    err = rel_error(out, ref) if nan == 0 else math.inf
    tol = TOLERANCE[entry["dtype"]]
    shape = [len(lq), max(lq), max(lk), hq, hkv, d]
    return [{"variant": entry["name"], "shape": shape, "rel_err": err, "nan": nan, "tol": tol,
             "ok": nan == 0 and err < tol and lse_ok}]


# --- every variant, by name ----------------------------------------------------------------------
# Problems per attention family, (B, Sq, Sk, Hq, Hkv): tails, GQA/MQA, Sq != Sk (bottom-right
# causal, so Sq > Sk leaves rows with no key: o = 0, lse = -inf), one key, one query.
ATTENTION_DENSE = [(2, 256, 256, 8, 8), (1, 100, 300, 8, 2), (2, 300, 100, 8, 1), (1, 1, 777, 4, 4),
                   (3, 129, 65, 4, 4), (2, 333, 517, 6, 2), (1, 200, 70, 3, 1)]
# Packed batches: (q lengths, k lengths, Hq, Hkv): a one-token sequence, tails, a sequence with no
# keys, Sq != Sk per sequence, GQA.
ATTENTION_VARLEN = [([1, 17, 130, 300, 64], [1, 17, 130, 300, 64], 8, 8),
                    ([5, 200, 1, 129], [77, 64, 500, 3], 8, 2),
                    ([40, 40], [0, 33], 4, 1)]
# Split-KV variants with a workspace (sm80 family): empty splits (few key tiles), Sq 1 and 4,
# causal rows with no key; packed-GQA ones take Sq 1 only (GQA 1/4/8, a group larger than a tile).
ATTENTION_SPLIT = [(1, 70, 40, 4, 2), (2, 4, 777, 8, 2), (1, 1, 4096, 4, 4), (2, 1, 1, 4, 1), (1, 130, 1000, 2, 2)]
ATTENTION_SPLIT_PACKED = [(2, 1, 777, 8, 2), (1, 1, 4096, 16, 2), (1, 1, 1, 4, 1), (1, 1, 300, 128, 1),
                          (3, 1, 129, 4, 4)]
# Decode family (16 (query, q-head) rows per CTA; Sq <= 16): one key, key tails, many tiles,
# MHA/GQA/MQA, speculative Sq 4/16, partial row blocks, rows with no key.
ATTENTION_DECODE = [(2, 1, 1, 32, 8), (2, 1, 777, 32, 8), (3, 1, 4109, 32, 8), (2, 1, 300, 32, 32),
                    (1, 1, 2000, 8, 1), (1, 1, 1500, 64, 8), (2, 4, 999, 32, 8), (1, 16, 513, 32, 8),
                    (2, 16, 100, 16, 16), (1, 3, 2, 32, 8), (2, 5, 65, 8, 2), (1, 2, 1, 4, 4)]
LSE_TOLERANCE = 2e-2  # absolute, on rows with a visible key


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _nan_padded(shape, dtype, pad: int, gen, device="cuda"):
    """A (B, S, H, D) tensor whose storage continues with ``pad`` NaN rows (a kernel reading past
    its sequence sees NaN)."""
    import torch

    b, s, h, d = shape
    big = torch.full((b, s + pad, h, d), math.nan, dtype=dtype, device=device)
    big[:, :s] = torch.randn(b, s, h, d, generator=gen, device=device).to(dtype)
    return big[:, :s]


def judge_attention(name: str, shape: list, o, lse, ref_o, ref_lse, tol: float) -> dict:
    """One attention result: no NaN in o or lse, ‖o − ref‖/‖ref‖ < tol, lse = −inf (and o = 0)
    exactly on the rows with no visible key, |lse − ref| < LSE_TOLERANCE elsewhere."""
    import torch

    nan = int(torch.isnan(o).sum() + torch.isnan(lse).sum())
    err = rel_error(o, ref_o) if nan == 0 else math.inf
    empty = torch.isinf(ref_lse)
    lse_ok = bool(torch.equal(torch.isinf(lse) & (lse < 0), empty)) and bool((o.transpose(1, 2)[empty] == 0).all())
    lse_err = float((lse[~empty] - ref_lse[~empty]).abs().max()) if nan == 0 and (~empty).any() else 0.0
    ok = nan == 0 and err < tol and lse_ok and lse_err < LSE_TOLERANCE
    return {"variant": name, "shape": shape, "rel_err": err, "lse_err": lse_err, "nan": nan, "tol": tol, "ok": ok}


def check_attention_dense(bundle, entry, case, gen, device="cuda") -> dict:
    """One dense problem launched by name: q, k, v in NaN-padded storage, o, lse (and a split
    variant's workspace) NaN-poisoned."""
    import torch

    from .runtime.attention import dense_workspace

    b, sq, sk, hq, hkv = case
    dt, d = torch_dtype(entry["dtype"]), entry["head_dim"]
    scale = 0.7 / math.sqrt(d)
    q = _nan_padded((b, sq, hq, d), dt, 7, gen, device)
    k = _nan_padded((b, sk, hkv, d), dt, 9, gen, device)
    v = _nan_padded((b, sk, hkv, d), dt, 9, gen, device)
    o = torch.full_like(q, math.nan)
    lse = torch.full((b, hq, sq), math.nan, device=device)
    names = [a["name"] for a in entry["signature"]["args"]]
    ws = dense_workspace(torch, entry, q) if "o_partial" in names or "tile_counters" in names else []
    if "o_partial" in names:
        for w in ws:
            w.fill_(math.nan)
    bundle.launch(entry["name"], [q, k, v, o, lse, *ws, scale])
    _sync(device)
    ref_o, ref_lse = attention_reference(q, k, v, entry["causal"], scale)
    r = judge_attention(entry["name"], list(case), o, lse, ref_o, ref_lse, TOLERANCE[entry["dtype"]])
    if "tile_counters" in names and int(ws[0].count_nonzero()):  # the kernel leaves its counters at 0
        r = {**r, "ok": False, "tile_counters_left": ws[0].tolist()}
    return r


def check_attention_varlen(bundle, entry, case, gen, device="cuda") -> dict:
    """One packed batch launched by name (k/v storage continues with NaN tokens; o and lse
    NaN-poisoned; a dynamic variant's tile counters checked back at 0); every sequence against
    its own float32 reference."""
    import torch

    from .runtime.attention import dense_workspace

    lq, lk, hq, hkv = case
    dt, d = torch_dtype(entry["dtype"]), entry["head_dim"]
    scale = 0.7 / math.sqrt(d)
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(ls)], dtype=torch.int32, device=device) for ls in (lq, lk))
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, hq, d, generator=gen, device=device).to(dt)
    kv = torch.full((2, tk + 16, hkv, d), math.nan, dtype=dt, device=device)
    kv[:, :tk] = torch.randn(2, tk, hkv, d, generator=gen, device=device).to(dt)
    k, v = kv[0, :tk], kv[1, :tk]
    o = torch.full_like(q, math.nan)
    lse = torch.full((hq, tq), math.nan, device=device)
    names = [a["name"] for a in entry["signature"]["args"]]
    ws = dense_workspace(torch, entry, q) if "tile_counters" in names else []
    bundle.launch(entry["name"], [q, k, v, o, lse, *ws, cu_q, cu_k, scale, max(lq)])
    _sync(device)
    refs = [attention_reference(q[None, a:a + n], k[None, c:c + m], v[None, c:c + m], entry["causal"], scale)
            for a, n, c, m in zip(itertools.accumulate([0, *lq]), lq, itertools.accumulate([0, *lk]), lk)]
    ref_o = torch.cat([r[0][0] for r in refs])[None]
    ref_lse = torch.cat([r[1][0] for r in refs], dim=1)[None]
    r = judge_attention(entry["name"], [lq, lk, hq, hkv], o[None], lse[None], ref_o, ref_lse,
                        TOLERANCE[entry["dtype"]])
    if ws and int(ws[0].count_nonzero()):  # the kernel leaves its counters at 0
        r = {**r, "ok": False, "tile_counters_left": ws[0].tolist()}
    return r


def attention_cases(entry) -> tuple[str, list]:
    """("varlen" | "dense", the problems) that exercise one attention variant."""
    if entry["varlen"]:
        return "varlen", ATTENTION_VARLEN
    if entry.get("decode_rows"):
        return "dense", ATTENTION_DECODE
    if "o_partial" in [a["name"] for a in entry["signature"]["args"]]:
        return "dense", ATTENTION_SPLIT_PACKED if entry.get("pack_gqa") else ATTENTION_SPLIT
    return "dense", ATTENTION_DENSE


def check_attention_kvcache(bundle, entry, gen=None, device="cuda") -> list[dict]:
    """An attention_kvcache variant launched by name on paged (pages of 16, dealt out shuffled) or
    dense caches of ragged lengths (0, 1, partial pages, 1000+), GQA 4 and MQA, seqlen_q 1 and 4,
    with its switches' options (window, softcap, sinks) and fp8 descales where it has them;
    NaN-poisoned o, against :func:`attention_kvcache_reference`."""
    import torch

    gen = gen or torch.Generator(device=device).manual_seed(torch.seed() % 2**31)
    if entry["dtype"] == "e4m3":
        return check_attention_kvcache_fp8q(bundle, entry, gen, device)
    dt, d = torch_dtype(entry["dtype"]), entry["head_dim"]
    fp8 = entry.get("kv_dtype") == "e4m3"
    causal = bool(entry.get("causal", True))
    out = []
    # The decode family serves seqlen_q <= 16; the prefill families (sm90, sm80) chunks of queries
    # against a longer cached prefix, their paged loads on the page sizes they list.
    prefill = entry.get("family") != "sm90_decode"
    cases = ((([200, 1030], 32, 8, 64), ([333, 150], 16, 2, 130)) if prefill else
             (([0, 1, 77, 1030], 32, 8, 1), ([1500, 33], 16, 1, 1), ([300, 2], 8, 2, 4)))
    for lens, hq, hkv, sq in cases:
        b = len(lens)
        if entry["paged"]:
            ps = (entry.get("page_sizes") or [16])[0] if prefill else 16
            per = -(-max(lens) // ps) + 1
            pool = torch.randn(b * per + 1, ps, hkv, d, device=device, generator=gen).to(dt)
            vpool = torch.randn(b * per + 1, ps, hkv, d, device=device, generator=gen).to(dt)
            bt = torch.randperm(b * per + 1, device=device, generator=gen)[: b * per].view(b, per).to(torch.int32)
        else:
            pool = torch.randn(b, max(lens) + 3, hkv, d, device=device, generator=gen).to(dt)
            vpool = torch.randn_like(pool)
            bt = None
        opts = {}
        if fp8:
            pool, vpool = pool.to(torch.float8_e4m3fn), vpool.to(torch.float8_e4m3fn)
            opts.update(k_descale=torch.rand(hkv, device=device, generator=gen) + 0.5,
                        v_descale=torch.rand(1, device=device, generator=gen) + 0.5)
        if entry.get("local"):
            opts["window_size"] = (100, 0)
        if entry.get("softcap"):
            opts["softcap"] = 20.0
        if entry.get("sinks"):
            opts["sinks"] = torch.randn(hq, device=device, generator=gen)
        q = torch.randn(b, sq, hq, d, device=device, generator=gen).to(dt)
        sl = torch.tensor(lens, dtype=torch.int32, device=device)
        o = torch.full_like(q, math.nan)
        if entry.get("varlen"):  # packed q: (B·Sq, Hq, D) with cu_seqlens_q
            cu = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device=device)
            bundle.attention_kvcache(q.view(b * sq, hq, d), pool, vpool, sl, block_table=bt, out=o.view(b * sq, hq, d),
                                     cu_seqlens_q=cu, max_seqlen_q=sq, variant=entry["name"], causal=causal, **opts)
        else:
            bundle.attention_kvcache(q, pool, vpool, sl, block_table=bt, out=o, variant=entry["name"], causal=causal,
                                     **opts)
        ref, _ = attention_kvcache_reference(q, pool, vpool, sl, bt, causal=causal,
                                             window_size=opts.get("window_size", (-1, -1)),
                                             softcap=opts.get("softcap", 0.0), sinks=opts.get("sinks"),
                                             k_descale=opts.get("k_descale"), v_descale=opts.get("v_descale"))
        out.append(_judge(entry["name"], [lens, hq, hkv, sq], o, ref, 1e-2 if dt == torch.bfloat16 else 3e-3))
    return out


def kvcache_descale_args(entry: dict, kv_descale) -> list:
    """A kvcache variant's descale arguments from a (2, Hkv) float32 tensor (row 0 k, row 1 v):
    its two rows where the variant takes ``k_descale`` and ``v_descale`` (e4m3 caches), else the
    tensor itself (``kv_descale``)."""
    names = [a["name"] for a in entry["signature"]["args"]]
    return [kv_descale[0], kv_descale[1]] if "k_descale" in names else [kv_descale]


def dequantize_q(q, q_descale):
    """float32 q (B, Sq, Hq, D) times q_descale (B, Hkv): each q head scaled by its kv head's factor."""
    rep = q.shape[2] // q_descale.shape[1]
    return q.float() * q_descale.float().repeat_interleave(rep, dim=1)[:, None, :, None]


def check_attention_kvcache_fp8q(bundle, entry, gen, device="cuda") -> list[dict]:
    """A kvcache variant with e4m3 q (fp8 WGMMAs, signature with ``q_descale``) launched by name on
    a paged e4m3 cache (its first page size, pages shuffled, NaN past each sequence and in o),
    ragged lengths with 0 and a partly filled last page, GQA 4 and MQA, q_descale per (sequence,
    kv head), k_descale per kv head, v_descale per tensor (a zero-stride view); judged against
    float32 attention of the de-scaled inputs (tolerance 5e-2, the fp8 forward's)."""
    import torch

    f8, d, ps = torch.float8_e4m3fn, entry["head_dim"], entry["page_sizes"][0]
    causal = bool(entry.get("causal", True))
    out = []
    for lens, hq, hkv, sq in (([200, 0, 1030], 32, 8, 64), ([333, 150], 16, 1, 130)):
        b = len(lens)
        per = -(-max(lens) // ps) + 1
        bt = torch.randperm(b * per + 1, device=device, generator=gen)[: b * per].view(b, per).to(torch.int32)
        caches = []
        for _ in range(2):  # NaN in the unused page and in the rows past each sequence (float32, then e4m3)
            c = torch.full((b * per + 1, ps, hkv, d), math.nan, device=device)
            for i, n in enumerate(lens):
                rows = torch.full((per * ps, hkv, d), math.nan, device=device)
                rows[:n] = torch.randn(n, hkv, d, device=device, generator=gen)
                c[bt[i].long()] = rows.view(per, ps, hkv, d)
            caches.append(c.to(f8))
        pool, vpool = caches
        sl = torch.tensor(lens, dtype=torch.int32, device=device)
        q = (torch.randn(b, sq, hq, d, device=device, generator=gen) * 2).to(f8)
        q_descale = torch.rand(b, hkv, device=device, generator=gen) + 0.5
        k_descale = torch.rand(hkv, device=device, generator=gen) + 0.5
        v_descale = (torch.rand(1, device=device, generator=gen) + 0.5).expand(hkv)  # per tensor: stride 0
        o = torch.full((b, sq, hq, d), math.nan, dtype=torch.bfloat16, device=device)
        scale = d ** -0.5
        tail = [torch.zeros(hq, device=device), q_descale, k_descale, v_descale, scale, 0.0, -1, -1]
        if entry.get("varlen"):
            cu = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device=device)
            lse = torch.full((hq, b * sq), math.nan, device=device)
            bundle.launch(entry["name"], [q.view(b * sq, hq, d), pool, vpool, o.view(b * sq, hq, d), lse, bt, sl,
                                          cu, *tail, sq])
        else:
            lse = torch.full((b, hq, sq), math.nan, device=device)
            bundle.launch(entry["name"], [q, pool, vpool, o, lse, bt, sl, *tail])
        ref, _ = attention_kvcache_reference(dequantize_q(q, q_descale), pool, vpool, sl, bt, causal=causal,
                                             scale=scale, k_descale=k_descale, v_descale=v_descale)
        out.append(_judge(entry["name"], [lens, hq, hkv, sq], o, ref, 5e-2))
    return out


# Grouped GEMM (MoE): (groups E, N, K, routing).  N and K off the tiles; routings with empty groups,
# one-row groups, groups of 127/129 rows (a partial last m-tile), skew (most rows in one group),
# rows no group owns (past offs[E-1]); masked counts of 0, 1, max_m and, clamped, past max_m and
# below 0.  Rows no group owns stay NaN: a write there is a failure.
GROUPED_CASES = [(8, 1000, 520, "edge"), (256, 256, 512, "skewed"), (16, 4096, 2048, "uniform"),
                 (128, 768, 1024, "one")]
GROUPED_MAX_M = 200


def grouped_counts(E: int, routing: str, gen, max_m: int | None = None) -> list[int]:
    """Rows per group for a routing pattern (host integers; ``gen`` a CPU generator)."""
    import torch

    if routing == "edge":
        base = [0, 1, 127, 129, 0, 300, 1, 64]
        return [base[i % len(base)] for i in range(E)]
    if routing == "one":
        return [1] * E
    if routing == "skewed":
        c = torch.randint(0, 4, (E,), generator=gen)
        c[torch.randperm(E, generator=gen)[: E // 3]] = 0
        c[int(torch.randint(0, E, (1,), generator=gen))] = 3000
        return c.tolist()
    if routing == "masked":
        c = torch.randint(0, max_m + 1, (E,), generator=gen).tolist()
        for i, v in enumerate((0, 1, max_m, max_m + 5, -3)):
            if i < E:
                c[i] = v
        return c
    return torch.randint(0, 512, (E,), generator=gen).tolist()


def check_gemm_grouped(bundle, entry, case, gen=None, device="cuda") -> dict:
    """One grouped case on variant ``entry`` (by name) against float32; fp8 variants take their
    scale form's quantized operands (runtime/fp8.py grouped quantizers) and are judged against the
    float32 product of the dequantized operands."""
    import torch

    from .runtime import fp8, grouped

    E, N, K, routing = case
    cpu = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
    form = entry.get("scale_mode")
    if form:  # e4m3 rows are whole 16-byte vectors: K a multiple of 16 (the last scale block still partial)
        K = -(-K // 16) * 16
    dt = torch.bfloat16 if form else torch_dtype(entry["dtypes"]["a"])
    b = torch.randn(E, N, K, device=device, dtype=dt)  # (E, N, K) weights
    kw = {}
    if form:
        b, kw["scale_b"] = fp8.quantize_grouped_b(b, form)
    b = b.transpose(1, 2)  # (E, K, N), K contiguous
    odt = torch.bfloat16 if form else dt

    def quant(a):
        if form:
            a, kw["scale_a"] = fp8.quantize_grouped_a(a, form)
        return a

    if entry.get("grouped") == "masked":
        counts = grouped_counts(E, "masked", cpu, GROUPED_MAX_M)
        a = quant(torch.randn(E, GROUPED_MAX_M, K, device=device, dtype=dt))
        mm = torch.tensor(counts, dtype=torch.int32, device=device)
        out = torch.full((E, GROUPED_MAX_M, N), float("nan"), dtype=odt, device=device)
        bundle.grouped_gemm(a, b, masked_m=mm, out=out, variant=entry["name"], **kw)
        ref = grouped.reference(a, b, masked_m=mm, **kw)
        shape = [E, GROUPED_MAX_M, N, K]
    else:
        counts = grouped_counts(E, routing, cpu)
        M = sum(counts) + (37 if routing == "edge" else 0)  # rows past offs[E-1]: no group's
        a = quant(torch.randn(M, K, device=device, dtype=dt))
        offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
        out = torch.full((M, N), float("nan"), dtype=odt, device=device)
        bundle.grouped_gemm(a, b, offs=offs, out=out, variant=entry["name"], **kw)
        ref = grouped.reference(a, b, offs=offs, **kw)
        shape = [E, M, N, K]
    torch.cuda.synchronize()
    owned = ~torch.isnan(ref)
    stray = int((~torch.isnan(out[~owned])).sum())
    r = _judge(entry["name"], shape + [routing], out[owned], ref[owned], TOLERANCE[entry["dtypes"]["a"]])
    r["stray_writes"] = stray
    r["ok"] = r["ok"] and stray == 0
    return r


def check_variant(bundle, entry, gen=None, device="cuda") -> list[dict]:
    """Every check of one variant, launched by name on fresh random data against float32: the
    smoke problems of a GEMM (packed-weight decode ones through ``pack_b``), the problems of
    :func:`attention_cases` for attention.  One result per problem (``ok``, ``rel_err``, ``tol``)."""
    import torch

    if entry["op"] == "gemm":
        return smoke_gemm(bundle, entry, device)
    if entry["op"] == "gemm_blockscaled":
        return smoke_gemm_blockscaled(bundle, entry, device)
    if entry["op"] == "attention_kvcache":
        return check_attention_kvcache(bundle, entry, gen, device)
    if entry["op"] == "gemm_grouped":
        return [check_gemm_grouped(bundle, entry, c, gen, device) for c in GROUPED_CASES]
    if entry["op"] != "attention":
        raise ValueError(f"{entry['name']}: no check for op {entry['op']!r}")
    gen = gen or torch.Generator(device=device).manual_seed(torch.seed() % 2**31)
    kind, cases = attention_cases(entry)
    fn = check_attention_varlen if kind == "varlen" else check_attention_dense
    return [fn(bundle, entry, c, gen, device) for c in cases]
