"""``bundle.gemm(a, b)``: a·bᵀ for a (M, K) or (L, M, K) and b (N, K) or (L, N, K).

Selection heuristic (no tuning data yet):
  1. keep the variants runnable here (best target first: the arch-specific build for this exact
     chip, then the newest plain target of the same major) whose dtypes and majorness match and
     whose alignment contract the tensors meet;
  2. among those, take the largest tile that still gives at least one CTA per SM
     (ceil(M/tm)·ceil(N/tn)·L ≥ SMs); if no tile reaches that, the tile with the most CTAs.
     Large tiles re-read A and B least; under-filled grids waste SMs, which dominates for small
     problems (for mma.sync on an H100: 128×128 and 128×256 are within a few % at 4096³, and
     64×128 wins once fewer than ~132 CTAs of 128×128 exist).
The choice is cached per (dtypes, majorness, sizes, strides' alignment).
"""

from __future__ import annotations

from .bundle import NoVariantError

_CACHE_LIMIT = 4096


def _dtype_name(t) -> str:
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    if hasattr(torch, "float8_e4m3fn"):
        names[torch.float8_e4m3fn] = "e4m3"
    try:
        return names[t]
    except KeyError:
        raise ValueError(f"unsupported dtype {t}") from None


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def _as_rkl(t, what: str):
    """(R, K) or (L, R, K) -> a (R, K, L) view (no copy)."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3:
        raise ValueError(f"{what} must be 2-D or 3-D, got shape {tuple(t.shape)}")
    return t.permute(1, 2, 0)


def _major(t3, mn: str) -> str | None:
    if t3.stride(1) == 1 or t3.shape[1] == 1:
        return "k"
    if t3.stride(0) == 1 or t3.shape[0] == 1:
        return mn
    return None


def _sm_count() -> int:
    try:
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # noqa: BLE001 - no device: plan for an H100
        return 132


def select(bundle, a3, b3, c3, ab: str, c: str, scales: list) -> str:
    M, K, L = a3.shape
    N = b3.shape[0]
    am, bm = _major(a3, "m"), _major(b3, "n")
    if am is None or bm is None:
        raise ValueError(f"a and b need a contiguous mode (strides {a3.stride()}, {b3.stride()}); "
                         f"call .contiguous() first")
    align = tuple(x % 16 for x in (a3.data_ptr(), b3.data_ptr(), c3.data_ptr()))
    key = (ab, c, am, bm, M, N, K, L, a3.stride(), b3.stride(), c3.stride(), align)
    name = bundle._select_cache.get(key)
    if name is not None:
        return name
    fits, reasons = [], []
    for v in bundle.candidates("gemm"):
        d, lay = v["dtypes"], v["layout"]
        if (d["a"], d["c"], lay["a"], lay["b"]) != (ab, c, am, bm):
            continue
        try:
            bundle.binder(v["name"]).bind([a3, b3, c3, *scales], 0)
        except ValueError as e:
            reasons.append(str(e))
            continue
        fits.append(v)
    if not fits:
        why = f" (closest: {reasons[0]})" if reasons else ""
        raise NoVariantError(
            f"no gemm variant for a={ab} ({am}-major) b={ab} ({bm}-major) -> {c}, M={M} N={N} K={K} L={L} "
            f"on {bundle.device_name()}{why}; {bundle.describe_contents('gemm')}")
    best_target = fits[0]["target"]
    fits = [v for v in fits if v["target"] == best_target]
    sms = _sm_count()

    def ctas(v):
        tm, tn = v["tile"][0], v["tile"][1]
        return -(-M // tm) * -(-N // tn) * L

    full = [v for v in fits if ctas(v) >= sms]
    if full:
        choice = max(full, key=lambda v: (v["tile"][0] * v["tile"][1], -v["threads"]))
    else:
        choice = max(fits, key=lambda v: (ctas(v), v["tile"][0] * v["tile"][1]))
    if len(bundle._select_cache) >= _CACHE_LIMIT:
        bundle._select_cache.clear()
    bundle._select_cache[key] = choice["name"]
    return choice["name"]


def gemm(bundle, a, b, out=None, *, out_dtype=None, scale_a=None, scale_b=None, variant=None):
    import torch

    ab = _dtype_name(a.dtype)
    if _dtype_name(b.dtype) != ab:
        raise ValueError(f"a and b dtypes differ: {a.dtype} vs {b.dtype}")
    if a.dim() != b.dim() or a.shape[-1] != b.shape[-1] or (a.dim() == 3 and a.shape[0] != b.shape[0]):
        raise ValueError(f"shapes do not match for a·bᵀ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    fp8 = ab == "e4m3"
    if out is None:
        dt = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
        out = torch.empty((*a.shape[:-1], b.shape[-2]), dtype=dt, device=a.device)
    c = _dtype_name(out.dtype)
    a3, b3, c3 = _as_rkl(a, "a"), _as_rkl(b, "b"), _as_rkl(out, "out")
    scales = []
    if fp8:
        one = None
        for s in (scale_a, scale_b):
            if s is None:
                one = one if one is not None else torch.ones(1, dtype=torch.float32, device=a.device)
                s = one
            scales.append(s.reshape(1).to(torch.float32))
    elif scale_a is not None or scale_b is not None:
        raise ValueError("scale_a/scale_b apply to fp8 GEMMs only")
    name = variant or select(bundle, a3, b3, c3, ab, c, scales)
    bundle.launch(name, [a3, b3, c3, *scales])
    return out
