"""The decoder layer's memory-bound glue as single kernels: ``rms_norm`` (optionally with the
residual add and per-row fp8 quantization) and ``rope_kvcache`` (rotary embedding of q and k with
the new k and v written into the KV cache).  Imports torch and the standard library only.

Selection is a name rule, in Python (no cost model: one kernel shape serves every size): among
the bundle's variants of the op for this device (best target first) with the call's dtype and
switches, the one with the fewest register chunks whose ``max_n`` holds the row.  The choice is
cached per problem key in the bundle's ``selections``.

Both ops validate every argument before a pointer reaches a kernel (InputError), name what the
bundle lacks (NoVariantError), allocate nothing but their outputs, never synchronise with the
device, and run inside CUDA-graph capture once their variant is loaded (``bundle.preload(ops=
("rms_norm", "rope_kvcache"))`` or one call before capturing).  Device data is never read on the
host: rope_kvcache clamps positions into the cos/sin table and skips slots outside the cache.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import validate
from .errors import InputError, LaunchError, NoVariantError
from .loader import Binder

Tensor = torch.Tensor

DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # as factory/elementwise/common.py


def _name(dt) -> str:
    return str(dt).removeprefix("torch.")


def _pick(bundle, op: str, key: tuple, keep, what: str) -> str:
    cache = bundle.selections
    name = cache.get((op, key))
    if name is None:
        fits = [e for e in bundle.candidates(op) if keep(e)]
        if not fits:
            raise NoVariantError(f"no {op} variant for {what} on {bundle.device_name()} "
                                 f"({bundle.describe_contents(op)})")
        best_target = fits[0]["target"]
        fits = [e for e in fits if e["target"] == best_target]
        name = min(fits, key=lambda e: (e.get("max_n", 0), e["name"]))["name"]
        if len(cache) > 4096:
            cache.clear()
        cache[(op, key)] = name
    return name


# --- hot path ---------------------------------------------------------------------------------------
# A call whose tensors have the layouts (shapes, strides, dtypes, devices) and switches of one that
# was checked and launched before takes a FixedLaunch (loader.py): its argument bytes were packed
# and checked then; per call only the tensor types, autograd, the current device and the pointers'
# alignment (in ``go``) are checked.  Kept in the bundle's ``selections`` under ("hot", op, ...).
def _layout(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _hot(bundle, key):
    try:
        return bundle.selections.get(key)
    except TypeError:  # an unhashable argument: the checked path says what is wrong
        return None


def _remember(bundle, key, name, args, make):
    """Cache ``make(go, cur, raw)`` for ``key`` once ``name`` has launched with ``args``."""
    specs = [Binder.spec(a) if isinstance(a, Tensor) else a for a in args]
    fixed = bundle.fixed(name, specs)
    if fixed is None or key is None:
        return
    cur, raw = bundle.device_api()
    if len(bundle.selections) > 4096:
        bundle.selections.clear()
    bundle.selections[key] = make(fixed.go, cur, raw, name)


def _failed(bundle, name, err):
    raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")


def _eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise InputError(f"eps must be a number, got {type(eps).__name__}")
    e = float(eps)
    if not (e >= 0.0 and math.isfinite(e)):
        raise InputError(f"eps must be a finite number >= 0, got {e}")
    return e


def _rows(t, name: str, n: int):
    """``t`` (..., n) as a (rows, n) view with contiguous rows, or InputError."""
    if t.stride(-1) != 1 and t.numel() > 0:
        raise InputError(f"{name}: the last dimension must be contiguous (stride 1), strides {t.stride()}")
    try:
        return t.view(-1, n)
    except RuntimeError:
        raise InputError(f"{name}: its leading dimensions {tuple(t.shape[:-1])} with strides {t.stride()[:-1]} "
                         f"cannot be merged into rows without a copy") from None


def rms_norm_check(x, weight, eps, residual=None, out=None, quantize=None):
    """The checks of :func:`rms_norm` that need no device data (the torch op's fake runs them
    too); returns (dtype name, N, eps, quant)."""
    validate.tensors(x=x, weight=weight)
    if x.dtype not in DTYPES:
        raise InputError(f"x must be bfloat16 or float16, got {_name(x.dtype)}")
    if x.dim() < 1:
        raise InputError("x must have at least one dimension (the hidden size)")
    n = x.shape[-1]
    if weight.dtype != x.dtype:
        raise InputError(f"weight must be {_name(x.dtype)} (x's dtype), got {_name(weight.dtype)}")
    if tuple(weight.shape) != (n,):
        raise InputError(f"weight must have shape ({n},) (x's last dimension), got {tuple(weight.shape)}")
    if weight.stride(-1) != 1 and n > 1:
        raise InputError("weight must be contiguous")
    if n % 8 or n == 0:
        raise InputError(f"the hidden size {n} must be a positive multiple of 8 (16-byte vectors)")
    e = _eps(eps)
    if quantize is not None and quantize != FP8:
        raise InputError(f"quantize must be None or torch.float8_e4m3fn, got {quantize!r}")
    quant = quantize is not None
    if residual is not None:
        validate.tensors(residual=residual)
        if residual.dtype != x.dtype or residual.shape != x.shape:
            raise InputError(f"residual must match x ({_name(x.dtype)} {tuple(x.shape)}), got "
                             f"{_name(residual.dtype)} {tuple(residual.shape)}")
    if out is not None:
        validate.tensors(out=out)
        want = FP8 if quant else x.dtype
        if out.dtype != want or out.shape != x.shape:
            raise InputError(f"out must be {_name(want)} of x's shape {tuple(x.shape)}, got {_name(out.dtype)} "
                             f"{tuple(out.shape)}")
    return DTYPES[x.dtype], n, e, quant


def _c_pick(bundle, op: str, key: tuple, problem, what: str) -> str | None:
    """The host library's ``fx_<op>_select`` (csrc/fx_select.c) of ``problem()`` (a data-free
    problem: no pointers), cached like :func:`_pick`; None where the library has no such entry (one
    linked before it existed: the caller's Python rule, the same, decides)."""
    sel = getattr(bundle, "selector", None)
    if sel is None or getattr(sel, "_fns", {}).get(op) is None:
        return None
    cache = bundle.selections
    name = cache.get((op, key))
    if name is None:
        try:
            name = sel.select(op, problem()).name.decode()
        except NoVariantError:
            raise NoVariantError(f"no {op} variant for {what} on {bundle.device_name()} "
                                 f"({bundle.describe_contents(op)})") from None
        if len(cache) > 4096:
            cache.clear()
        cache[(op, key)] = name
    return name


def rms_norm_choose(bundle, dt: str, n: int, res: bool, quant: bool) -> str:
    """The variant for rows of ``n`` (NoVariantError naming what the bundle has): the host
    library's ``fx_rms_norm_select`` where it has one, else the same rule here."""
    from .selector import DTYPE, RmsNormProblem

    what = f"{dt} rows of {n}{' with residual' if res else ''}{' to fp8' if quant else ''}"
    name = _c_pick(bundle, "rms_norm", (dt, n, res, quant), lambda: RmsNormProblem(
        dtype=DTYPE[dt], m=1, n=n, x_stride=n, residual_add=int(res), residual_stride=n, quantize=int(quant),
        y_stride=n, eps=1e-6), what)
    if name is not None:
        return name
    return _pick(bundle, "rms_norm", (dt, n, res, quant),
                 lambda v: v["dtype"] == dt and v["residual"] == res and v["quant"] == quant and v["max_n"] >= n,
                 f"{dt} rows of {n}{' with residual' if res else ''}{' to fp8' if quant else ''}")


def rope_kvcache_choose(bundle, dt: str, neox: bool, table: bool, fp8_cache: bool = False) -> str:
    """The host library's ``fx_rope_kvcache_select`` where it has one, else the same rule here."""
    from .selector import DTYPE, RopeKVCacheProblem

    cache = "e4m3" if fp8_cache else dt

    def problem():  # one token, one head of 16 into one page of one row: the choice reads no size
        p = RopeKVCacheProblem(dtype=DTYPE[dt], cache_dtype=DTYPE[cache], neox=int(neox), table=int(table), tokens=1,
                               heads_q=1, heads_kv=1, head_dim=16, rotary_dim=16, max_position=1, num_pages=1,
                               page_size=1, batch=1, max_pages=1, block_table_stride=1, cos_sin_stride=16)
        for f in ("q_stride", "k_stride", "v_stride"):
            getattr(p, f)[:] = [16, 16]
        for f in ("k_cache_stride", "v_cache_stride"):
            getattr(p, f)[:] = [16, 16, 16]
        return p

    name = _c_pick(bundle, "rope_kvcache", (dt, neox, table, cache), problem,
                   f"{dt} {'neox' if neox else 'interleaved'} rotary{' with a block table' if table else ''}"
                   f"{' into e4m3 caches' if fp8_cache else ''}")
    if name is not None:
        return name
    return _pick(bundle, "rope_kvcache", (dt, neox, table, cache),
                 lambda e: (e["dtype"] == dt and e["neox"] == neox and e.get("table", False) == table
                            and e.get("cache_dtype", e["dtype"]) == cache),
                 f"{dt} {'neox' if neox else 'interleaved'} rotary{' with a block table' if table else ''}"
                 f"{' into e4m3 caches' if fp8_cache else ''}")


def rms_norm(bundle, x, weight, eps, residual=None, out=None, quantize=None):
    """``y = x / sqrt(mean(x², -1) + eps) · weight`` over the last dimension (float32 arithmetic).

    ``residual``: first ``residual += x`` (in place, rounded to x's dtype), and the norm is of that
    sum (vLLM's ``fused_add_rms_norm``: the running residual stream updated, the normed output
    returned).  ``quantize=torch.float8_e4m3fn``: returns ``(q, scale)``, ``q`` e4m3 of x's shape
    and ``scale`` float32 (..., 1), one per row: ``scale = max(amax(|y|) / 448, 1/(448·512))`` of
    the row's y rounded to x's dtype, ``q = y / scale`` (saturating), so ``q·scale`` decodes y.
    ``out``: where the output goes (x's shape; x's dtype, or e4m3 with ``quantize``)."""
    try:
        key = ("hot", "rms_norm", _layout(x), _layout(weight), _layout(residual), _layout(out), quantize, eps,
               type(eps))
    except AttributeError:  # not tensors: the checks say which
        key = None
    fire = _hot(bundle, key) if key is not None else None
    if (fire is not None and isinstance(x, Tensor) and isinstance(weight, Tensor)
            and (residual is None or isinstance(residual, Tensor)) and (out is None or isinstance(out, Tensor))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (residual is not None and residual.requires_grad)))):
        r = fire(x, weight, residual, out)
        if r is not None:
            return r
    dt, n, e, quant = rms_norm_check(x, weight, eps, residual, out, quantize)
    dev = validate.one_device(bundle, x=x, weight=weight, residual=residual, out=out)
    validate.no_grad("rms_norm", x=x, weight=weight, residual=residual)
    res = residual is not None
    name = rms_norm_choose(bundle, dt, n, res, quant)
    o = torch.empty(x.shape, dtype=FP8 if quant else x.dtype, device=x.device) if out is None else out
    scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if quant else None
    if x.numel() == 0:
        return (o, scale) if quant else o
    args = [_rows(x, "x", n), weight]
    if res:
        args.append(_rows(residual, "residual", n))
    args.append(_rows(o, "out", n))
    if quant:
        args.append(scale.view(-1))
    args.append(e)
    bundle.launch(name, args, device=dev)
    _remember(bundle, key, name, args, lambda go, cur, raw, nm: _rms_fire(bundle, go, cur, raw, nm, dev, res, quant,
                                                                         out is not None, tuple(x.shape)))
    return (o, scale) if quant else o


def _rms_fire(bundle, go, cur, raw, name, dev, res, quant, out_given, shape):
    odt = FP8 if quant else None
    sshape = (*shape[:-1], 1)
    f32 = torch.float32

    def fire(x, w, r, out):
        here = cur()
        if here != dev:
            return None
        o = out if out_given else x.new_empty(shape, dtype=odt or x.dtype)
        ptrs = [x.data_ptr(), w.data_ptr()]
        if res:
            ptrs.append(r.data_ptr())
        ptrs.append(o.data_ptr())
        if quant:
            sc = x.new_empty(sshape, dtype=f32)
            ptrs.append(sc.data_ptr())
        err = go(*ptrs, raw(here))
        if err is None:
            return None
        if err:
            _failed(bundle, name, err)
        return (o, sc) if quant else o

    return fire


def _heads(t, name: str, d: int):
    """(T, H, D) view of ``t`` given as (T, H, D) or (T, H·D)."""
    if t.dim() == 3:
        if t.shape[-1] != d:
            raise InputError(f"{name}: head_dim {t.shape[-1]} is not the cache's {d}")
        return t
    if t.dim() == 2:
        if t.shape[-1] % d:
            raise InputError(f"{name}: its last dimension {t.shape[-1]} is not a multiple of head_dim {d}")
        if t.stride(-1) != 1:
            raise InputError(f"{name}: the last dimension must be contiguous (stride 1)")
        return t.view(t.shape[0], t.shape[1] // d, d)
    raise InputError(f"{name} must be (tokens, heads, head_dim) or (tokens, heads·head_dim), got shape "
                     f"{tuple(t.shape)}")


def _tokens(t, name: str, d: int, batch: int | None):
    """``t`` as (tokens, heads, head_dim): given so, or as (tokens, heads·head_dim), or (with a
    block table: ``batch`` sequences) as (batch, seqlen_q, heads, head_dim)."""
    if t.dim() == 4:
        if batch is None:
            raise InputError(f"{name}: a 4-dimensional (batch, seqlen_q, heads, head_dim) form needs block_table "
                             f"and cache_seqlens; with slot_mapping give (tokens, heads, head_dim)")
        if t.shape[0] != batch:
            raise InputError(f"{name}: batch {t.shape[0]} is not block_table's {batch}")
        if t.shape[-1] != d:
            raise InputError(f"{name}: head_dim {t.shape[-1]} is not the cache's {d}")
        if t.numel() and t.stride(-1) != 1:
            raise InputError(f"{name}: head_dim must be contiguous (stride 1)")
        try:
            return t.view(-1, t.shape[2], d)
        except RuntimeError:
            raise InputError(f"{name}: its batch and seqlen_q dimensions (strides {t.stride()[:2]}) cannot be "
                             f"merged into tokens without a copy") from None
    return _heads(t, name, d)


def rope_kvcache_check(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping=None, neox=True,
                       rotary_dim=None, block_table=None, cache_seqlens=None, k_scale=None, v_scale=None):
    """The checks of :func:`rope_kvcache` that need no device data; returns (dtype name, q, k, v
    as (T, H, D) views, table form?, fp8 caches?)."""
    validate.tensors(q=q, k=k, v=v, cos_sin_cache=cos_sin_cache, k_cache=k_cache, v_cache=v_cache)
    table = block_table is not None or cache_seqlens is not None
    if table:
        if positions is not None or slot_mapping is not None:
            raise InputError("give either positions and slot_mapping, or block_table and cache_seqlens (positions "
                             "are then cache_seqlens[b] + the token's index in its sequence)")
        if block_table is None or cache_seqlens is None:
            raise InputError("block_table and cache_seqlens go together")
        validate.tensors(block_table=block_table, cache_seqlens=cache_seqlens)
        if block_table.dtype != torch.int32 or block_table.dim() != 2:
            raise InputError(f"block_table must be int32 (batch, max_pages), got {_name(block_table.dtype)} "
                             f"{tuple(block_table.shape)}")
        if block_table.numel() and block_table.stride(-1) != 1:
            raise InputError("block_table's rows must be contiguous")
        batch = block_table.shape[0]
        if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (batch,):
            raise InputError(f"cache_seqlens must be int32 of shape ({batch},), got {_name(cache_seqlens.dtype)} "
                             f"{tuple(cache_seqlens.shape)}")
        if batch > 1 and cache_seqlens.stride(0) != 1:
            raise InputError("cache_seqlens must be contiguous")
        if block_table.shape[1] == 0:
            raise InputError("block_table has no columns")
    else:
        if slot_mapping is None:
            raise InputError("slot_mapping is needed (or block_table and cache_seqlens)")
        validate.tensors(slot_mapping=slot_mapping)
        if positions is not None:
            validate.tensors(positions=positions)
        batch = None
    if q.dtype not in DTYPES:
        raise InputError(f"q must be bfloat16 or float16, got {_name(q.dtype)}")
    for nm, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise InputError(f"{nm} must be {_name(q.dtype)} (q's dtype), got {_name(t.dtype)}")
    fp8 = k_cache.dtype == FP8
    for nm, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != (FP8 if fp8 else q.dtype):
            raise InputError(f"{nm} must be {_name(q.dtype)} (q's dtype) or float8_e4m3fn (both caches alike), got "
                             f"{_name(t.dtype)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise InputError(f"k_cache and v_cache must both be (num_pages, page_size, kv_heads, head_dim), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    d = k_cache.shape[-1]
    q3, k3, v3 = (_tokens(t, nm, d, batch) for t, nm in ((q, "q"), (k, "k"), (v, "v")))
    t = q3.shape[0]
    if k3.shape != v3.shape or k3.shape[0] != t:
        raise InputError(f"k and v must both be (tokens={t}, kv_heads, head_dim), got {tuple(k3.shape)} and "
                         f"{tuple(v3.shape)}")
    if k3.shape[1] != k_cache.shape[2]:
        raise InputError(f"k has {k3.shape[1]} heads, the cache {k_cache.shape[2]}")
    if table:
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise InputError("with block_table, q, k and v are (batch, seqlen_q, heads, head_dim)")
    else:
        if positions is None and cos_sin_cache.dim() >= 1 and cos_sin_cache.shape[0] != t:
            raise InputError(f"without positions, cos_sin_cache holds one row per token: ({t}, rotary_dim), got "
                             f"{tuple(cos_sin_cache.shape)}")
        for nm, tt in (("positions", positions), ("slot_mapping", slot_mapping)):
            if tt is None:
                continue
            if tt.dtype != torch.int64 or tuple(tt.shape) != (t,):
                raise InputError(f"{nm} must be int64 of shape ({t},), got {_name(tt.dtype)} {tuple(tt.shape)}")
            if tt.numel() > 1 and tt.stride(0) != 1:
                raise InputError(f"{nm} must be contiguous")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2:
        raise InputError(f"cos_sin_cache must be float32 (max_position, rotary_dim) (cos then sin), got "
                         f"{_name(cos_sin_cache.dtype)} {tuple(cos_sin_cache.shape)}")
    r = cos_sin_cache.shape[1]
    if rotary_dim is not None and rotary_dim != r:
        raise InputError(f"rotary_dim {rotary_dim} is not cos_sin_cache's width {r}")
    if r == 0 or r % 16 or r > d:
        raise InputError(f"rotary_dim {r} must be a positive multiple of 16 and at most head_dim {d}")
    if cos_sin_cache.shape[0] == 0:
        raise InputError("cos_sin_cache has no positions")
    if not isinstance(neox, bool):
        raise InputError(f"neox must be a bool, got {type(neox).__name__}")
    hkv = k_cache.shape[2]
    for nm, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not fp8:
            if sc is not None:
                raise InputError(f"{nm} applies to float8_e4m3fn caches only (the cache is {_name(k_cache.dtype)})")
            continue
        if sc is None:
            raise InputError(f"{nm}: a float8_e4m3fn cache needs k_scale and v_scale (float32, 1 or kv_heads = {hkv} "
                             f"elements: the cache holds x / scale, attention_kvcache's k_descale / v_descale)")
        validate.tensors(**{nm: sc})
        if sc.dtype != torch.float32 or sc.numel() not in (1, hkv) or (sc.numel() > 1 and sc.reshape(-1).stride(0) != 1):
            raise InputError(f"{nm} must be a contiguous float32 tensor of 1 (per tensor) or {hkv} (per kv head) "
                             f"elements, got {_name(sc.dtype)} {tuple(sc.shape)}")
    return DTYPES[q.dtype], q3, k3, v3, table, fp8


def rope_kvcache(bundle, q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping=None, neox=True,
                 rotary_dim=None, block_table=None, cache_seqlens=None, k_scale=None, v_scale=None):
    """Rotary embedding of q and k in place (``neox``: GPT-NeoX halves, else GPT-J interleaved
    pairs; the first ``rotary_dim`` = cos_sin_cache's width of each head; ``cos_sin_cache``
    float32 (max_position, rotary_dim), the cosines then the sines), and the rotated k and the
    token's v written to ``k_cache`` / ``v_cache`` (num_pages, page_size, kv_heads, head_dim).

    vLLM's form: q, k, v (tokens, heads, head_dim) or (tokens, heads·head_dim), ``positions`` and
    ``slot_mapping`` int64 (tokens,) (``positions`` None: ``cos_sin_cache`` holds each token's own
    cos/sin row, (tokens, rotary_dim)): token t at page ``slot // page_size``, row ``slot %
    page_size`` (a slot outside the cache, vLLM's -1 padding included, writes nothing) — vLLM's
    ``rotary_embedding`` then ``reshape_and_cache_flash`` in one kernel.

    FlashAttention's form (``positions`` and ``slot_mapping`` None): q, k, v (batch, seqlen_q,
    heads, head_dim), ``cache_seqlens`` int32 (batch,) the cached lengths before these tokens and
    ``block_table`` int32 (batch, max_pages): token s of sequence b has position
    ``cache_seqlens[b] + s`` and goes to page ``block_table[b, pos // page_size]`` (attention over
    the cache afterwards takes ``cache_seqlens + seqlen_q``).  A position past the block table or a
    page outside the cache writes nothing.  Positions past cos_sin_cache read its last row.

    float8_e4m3fn caches (vLLM's fp8 KV cache): ``k_scale`` / ``v_scale`` float32, one element (per
    tensor) or one per kv head; the caches receive ``e4m3(k / k_scale)`` and ``e4m3(v / v_scale)``,
    saturating at ±448, and ``attention_kvcache`` reads them with ``k_descale=k_scale,
    v_descale=v_scale``.

    q of zero heads (``q[:, :0]``) rotates k alone: the form for ``attention_kvcache(...,
    rotary_cos_sin=)``, which rotates q in its own prologue.

    Returns (q, k)."""
    try:
        key = ("hot", "rope_kvcache", _layout(q), _layout(k), _layout(v), _layout(positions), _layout(cos_sin_cache),
               _layout(k_cache), _layout(v_cache), _layout(slot_mapping), _layout(block_table),
               _layout(cache_seqlens), neox, type(neox), rotary_dim, _layout(k_scale), _layout(v_scale))
    except AttributeError:  # not tensors: the checks say which
        key = None
    fire = _hot(bundle, key) if key is not None else None
    if fire is not None:
        ts = (q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, block_table, cache_seqlens,
              k_scale, v_scale)
        if all(t is None or isinstance(t, Tensor) for t in ts) and not (
                torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)):
            if fire(*ts):
                return q, k
    dt, q3, k3, v3, table, fp8 = rope_kvcache_check(q, k, v, positions, cos_sin_cache, k_cache, v_cache,
                                                    slot_mapping, neox, rotary_dim, block_table, cache_seqlens,
                                                    k_scale, v_scale)
    if not table and positions is None:  # cos/sin given per token: token t reads row t
        positions, key = _iota(bundle, q, q3.shape[0]), None
    idx, tab = (cache_seqlens, block_table) if table else (positions, slot_mapping)
    dev = validate.one_device(bundle, q=q, k=k, v=v, cos_sin_cache=cos_sin_cache, k_cache=k_cache,
                              v_cache=v_cache, index=idx, table=tab)
    if fp8:
        validate.one_device(bundle, q=q, k_scale=k_scale, v_scale=v_scale)
    validate.no_grad("rope_kvcache", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    name = rope_kvcache_choose(bundle, dt, neox, table, fp8)
    if q3.shape[0] == 0 or k_cache.numel() == 0:
        return q, k
    args = [q3, k3, v3, idx, cos_sin_cache, k_cache, v_cache, tab]
    if fp8:  # per kv head; one per-tensor scale as a stride-0 view (no copy)
        hkv = k_cache.shape[2]
        args += [sc.reshape(-1).expand(hkv) for sc in (k_scale, v_scale)]
    bundle.launch(name, args, device=dev)
    _remember(bundle, key, name, args,
              lambda go, cur, raw, nm: _rope_fire(bundle, go, cur, raw, nm, dev, table, fp8))
    return q, k


def _iota(bundle, like, n: int):
    """int64 0..n-1 on ``like``'s device: a view of one arange kept per device (grown when a longer
    one is needed; one made inside a CUDA-graph capture is not kept)."""
    key = ("iota", like.device)
    have = bundle.selections.get(key)
    if have is None or have.numel() < n:
        have = torch.arange(max(n, 1024), device=like.device)
        if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            bundle.selections[key] = have
    return have[:n]


def _rope_fire(bundle, go, cur, raw, name, dev, table, fp8):
    def fire(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_table, cache_seqlens, k_scale,
             v_scale):
        here = cur()
        if here != dev:
            return False
        idx, tab = (cache_seqlens, block_table) if table else (positions, slot_mapping)
        if fp8:
            err = go(q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr(), cos_sin.data_ptr(), k_cache.data_ptr(),
                     v_cache.data_ptr(), tab.data_ptr(), k_scale.data_ptr(), v_scale.data_ptr(), raw(here))
        else:
            err = go(q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr(), cos_sin.data_ptr(), k_cache.data_ptr(),
                     v_cache.data_ptr(), tab.data_ptr(), raw(here))
        if err is None:
            return False
        if err:
            _failed(bundle, name, err)
        return True

    return fire


# --- fp8 rows: per-(row, 128-column) e4m3 codes re-expressed with one scale per row ---------------
GROUP = 128  # columns per group scale (the GEMM epilogue's fp8_groups)


def _same(x, y) -> bool:
    return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()


def fp8_rows_check(codes, group_scale, out=None):
    """The checks of :func:`fp8_rows` that need no device data; returns (M, N)."""
    validate.tensors(codes=codes, group_scale=group_scale)
    if codes.dtype != FP8 or codes.dim() != 2:
        raise InputError(f"codes must be float8_e4m3fn (M, N), got {_name(codes.dtype)} {tuple(codes.shape)}")
    m, n = codes.shape
    if n % 16 or n == 0:
        raise InputError(f"the row length {n} must be a positive multiple of 16 (16-byte vectors)")
    ng = -(-n // GROUP)
    if group_scale.dtype != torch.float32 or tuple(group_scale.shape) != (m, ng):
        raise InputError(f"group_scale must be float32 ({m}, {ng}) (one scale per row and {GROUP} columns), got "
                         f"{_name(group_scale.dtype)} {tuple(group_scale.shape)}")
    if m > 1 and group_scale.stride(0) != 1:
        raise InputError(f"group_scale must be M-major (stride 1 along rows), got strides {group_scale.stride()}")
    for nm, t in (("codes", codes), ("out", out)):
        if t is None:
            continue
        validate.tensors(**{nm: t})
        if t.dtype != FP8 or tuple(t.shape) != (m, n):
            raise InputError(f"{nm} must be float8_e4m3fn of shape ({m}, {n}), got {_name(t.dtype)} {tuple(t.shape)}")
        if t.stride(1) != 1 or (m > 1 and (t.stride(0) < n or t.stride(0) % 16)):
            raise InputError(f"{nm}: rows must be contiguous with a row stride >= {n} and a multiple of 16, got "
                             f"strides {t.stride()}")
    return m, n


def fp8_rows_choose(bundle, n: int) -> str:
    """The host library's ``fx_fp8_rows_select`` where it has one, else the same rule here."""
    from .selector import Fp8RowsProblem

    s = -(-n // 16) * 16
    name = _c_pick(bundle, "fp8_rows", ("e4m3", n), lambda: Fp8RowsProblem(
        m=1, n=n, codes_stride=s, group_scale_stride=4, out_stride=s), f"e4m3 rows of {n}")
    if name is not None:
        return name
    return _pick(bundle, "fp8_rows", ("e4m3", n), lambda e: e["max_n"] >= n, f"e4m3 rows of {n}")


def fp8_rows(bundle, codes, group_scale, out=None):
    """e4m3 ``codes`` (M, N) with float32 ``group_scale`` (M, ceil(N / 128)) (a scale per row and
    128 columns, M-major: what ``gemm(..., out_dtype=torch.float8_e4m3fn)`` returns) re-expressed
    with one scale per row: ``scale[m] = max(max_g group_scale[m, g], 1/(448·512))``, ``out[m, n] =
    e4m3(codes[m, n] · group_scale[m, n // 128] / scale[m])``.  Returns ``(out, scale)``, ``scale``
    float32 (M, 1) (``torch._scaled_mm``'s row-wise ``scale_a``).  ``out`` may be ``codes`` (in
    place); otherwise it must not overlap the inputs."""
    m, n = fp8_rows_check(codes, group_scale, out)
    dev = validate.one_device(bundle, codes=codes, group_scale=group_scale, out=out)
    name = fp8_rows_choose(bundle, n)
    if out is None:
        out = torch.empty((m, n), dtype=FP8, device=codes.device)
    elif not _same(out, codes):
        validate.disjoint("out", out, codes=codes, group_scale=group_scale)
    scale = torch.empty((m, 1), dtype=torch.float32, device=codes.device)
    if m == 0:
        return out, scale
    ng = group_scale.shape[1]

    def rows(t):  # (one row: any row stride reads the same elements)
        return t.data_ptr(), (m, n), (t.stride(0) if m > 1 else -(-n // 16) * 16, 1)

    gs = (group_scale.data_ptr(), (m, ng), (1, group_scale.stride(1) if ng > 1 else -(-m // 4) * 4))
    bundle.launch(name, [rows(codes), gs, rows(out), scale.view(-1)], device=dev)
    return out, scale


# --- torch custom ops (runtime/torch_ops.py registers them): name -> (schema, real, fake), each
# taking the bundle first.  The fakes run the data-free checks and the selection.
def _op_rms_norm(bundle, x, weight, eps, residual=None):
    return bundle.rms_norm(x, weight, eps, residual=residual)


def _op_rms_norm_fp8(bundle, x, weight, eps, residual=None):
    return bundle.rms_norm(x, weight, eps, residual=residual, quantize=FP8)


def _op_rope_kvcache(bundle, q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping=None, neox=True,
                     block_table=None, cache_seqlens=None, k_scale=None, v_scale=None):
    bundle.rope_kvcache(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, neox=neox,
                        block_table=block_table, cache_seqlens=cache_seqlens, k_scale=k_scale, v_scale=v_scale)


def _fake_rms_norm(bundle, x, weight, eps, residual=None):
    dt, n, _, _ = rms_norm_check(x, weight, eps, residual)
    if isinstance(n, int):  # (a symbolic hidden size is selected for when the op runs)
        rms_norm_choose(bundle, dt, n, residual is not None, False)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_rms_norm_fp8(bundle, x, weight, eps, residual=None):
    dt, n, _, _ = rms_norm_check(x, weight, eps, residual, quantize=FP8)
    if isinstance(n, int):
        rms_norm_choose(bundle, dt, n, residual is not None, True)
    return x.new_empty(x.shape, dtype=FP8), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def _fake_rope_kvcache(bundle, q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping=None, neox=True,
                       block_table=None, cache_seqlens=None, k_scale=None, v_scale=None):
    dt, *_, table, fp8 = rope_kvcache_check(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, neox,
                                            None, block_table, cache_seqlens, k_scale, v_scale)
    rope_kvcache_choose(bundle, dt, neox, table, fp8)


def _op_fp8_rows(bundle, codes, group_scale):
    return bundle.fp8_rows(codes, group_scale)


def _fake_fp8_rows(bundle, codes, group_scale):
    m, n = fp8_rows_check(codes, group_scale)
    if isinstance(n, int):
        fp8_rows_choose(bundle, n)
    return codes.new_empty((m, n)), codes.new_empty((m, 1), dtype=torch.float32)


TORCH_OPS = {
    "fp8_rows": ("fp8_rows(Tensor codes, Tensor group_scale) -> (Tensor, Tensor)", _op_fp8_rows, _fake_fp8_rows),
    "rms_norm": ("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!)? residual=None) -> Tensor",
                 _op_rms_norm, _fake_rms_norm),
    "rms_norm_fp8": ("rms_norm_fp8(Tensor x, Tensor weight, float eps, Tensor(a!)? residual=None) -> (Tensor, Tensor)",
                     _op_rms_norm_fp8, _fake_rms_norm_fp8),
    "rope_kvcache": ("rope_kvcache(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor? positions, Tensor cos_sin_cache, "
                     "Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor? slot_mapping=None, bool neox=True, "
                     "Tensor? block_table=None, Tensor? cache_seqlens=None, Tensor? k_scale=None, "
                     "Tensor? v_scale=None) -> ()", _op_rope_kvcache, _fake_rope_kvcache),
}
