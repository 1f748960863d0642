"""fp8 (e4m3) attention forward through a bundle: argument checks, variant choice, launch.  No DSL
import.

``attention_fp8(bundle, q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, ...)``:
q (B, Sq, Hq, D), k (B, Sk, Hkv, D) float8_e4m3fn; v float8_e4m3fn as (B, Sk, Hkv, D)
(``v_layout="bshd"``: the kernels transpose V tiles in shared memory; where the bundle has no
such build for the problem, V is copied once into (B, Hkv, D, Sk), one extra pass over V and one
allocation) or pre-transposed (B, Hkv, D, Sk) with Sk contiguous (``v_layout="bhds"``: read in
place).  Descales (FlashAttention-3's ``q_descale``/``k_descale``/``v_descale``): float32
on q's device, broadcastable to (B, Hkv) (a per-tensor scalar, per kv head, per batch and kv
head); None means 1.  The result is bfloat16:
    o = softmax(q·kᵀ · q_descale·k_descale · scale [+ causal mask]) · v · v_descale
with the descales of each (batch, kv head) applied to the q heads of its group.  LSE float32
(B, Hq, Sq) in natural-log units of the de-scaled scores.  Causal masking is bottom-right
aligned, as in runtime/attention.py.
"""

from __future__ import annotations

import math

import torch

from . import devmem, validate
from .bundle import BundleCore, not_current
from .errors import InputError, LaunchError, NoVariantError

HEAD_DIMS = (64, 128, 256)
V_LAYOUTS = ("bshd", "bhds")
_GRID_YZ_MAX = 65535
_ONES: dict = {}  # device index -> a 1-element float32 1.0 (the descale of None)


def attention_fp8(bundle, q, k, v, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
                  v_descale=None, return_lse=False, v_layout="bshd", cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, check_varlen=None):
    """See the module docstring.  Hot path (dense): a problem seen before (same shapes, strides,
    dtypes, devices, flags, descale layouts) was checked in full then; a call of the same key
    checks the tensor types, autograd, the current device and the pointers' alignment, then
    launches.  Varlen (packed (tokens, heads, head_dim) q/k/v with cu_seqlens, runtime/attention.py's
    conventions, v as k): descales broadcast to (sequences, kv heads)."""
    if cu_seqlens_q is None and cu_seqlens_k is None:
        try:
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                   q.get_device(), k.get_device(), v.get_device(), causal, softmax_scale, v_layout,
                   *(None if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.requires_grad)
                     for t in (q_descale, k_descale, v_descale)))
            fire = _hot(bundle).get(key)
        except (AttributeError, TypeError):  # not tensors, or an unhashable argument: checked below
            key = fire = None
        if (fire is not None and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
                and isinstance(v, torch.Tensor)
                and not ((q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled())):
            out = fire(q, k, v, q_descale, k_descale, v_descale)
            if out is not None:
                return out if return_lse else out[0]
            key = None  # a misaligned pointer: the checked path below refuses it
    else:
        key = None
        return _varlen(bundle, q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, return_lse,
                       v_layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, check_varlen)
    dev = validate.one_device(bundle, q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale,
                              v_descale=v_descale)
    validate.no_grad("attention", q=q, k=k, v=v)
    b, sq, hq, d, sk, hkv = _check(q, k, v, v_layout)
    softmax_scale = 1.0 / math.sqrt(d) if softmax_scale is None else _scale(softmax_scale)
    _check_causal(causal)
    scales = [_descale(name, t, b, hkv, q.device) for name, t in
              (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))]
    name, layout = choose(bundle, d, bool(causal), v_layout, (b, sq, sk, hq, hkv))
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return (o, lse) if return_lse else o
    if sk == 0:
        o.zero_()
        lse.fill_(-math.inf)
        return (o, lse) if return_lse else o
    if b > _GRID_YZ_MAX or hq > _GRID_YZ_MAX:
        raise InputError(f"batch ({b}) and heads ({hq}) must each be <= {_GRID_YZ_MAX}")
    copied = layout != v_layout
    if copied:  # (only bshd -> bhds: no in-kernel transpose for this problem in the bundle)
        # rows padded to 16 keys: the kernel's TMA needs 16-byte strides
        vt = torch.empty((b, hkv, d, (sk + 15) // 16 * 16), dtype=v.dtype, device=v.device)
        vt[..., :sk] = v.permute(0, 2, 3, 1)
        v = vt[..., :sk]
    args = [q, k, v, o, lse, *scales, softmax_scale]
    bundle.launch(name, args, device=dev)
    if key is not None and not copied and type(causal) in (bool, int) and type(softmax_scale) in (float, int):
        fire = _hot_launch(bundle, name, args, dev)
        if fire is not None:
            cache = _hot(bundle)
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = fire
    return (o, lse) if return_lse else o


def _varlen(bundle, q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, return_lse, v_layout,
            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, check_varlen):
    """The packed form: checks (runtime/attention.py's cu_seqlens contract), choice, launch."""
    from .attention import _check_cu_seqlens

    dev = validate.one_device(bundle, q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale,
                              v_descale=v_descale)
    validate.no_grad("attention", q=q, k=k, v=v)
    if v_layout != "bshd":
        raise InputError("packed variable-length fp8 takes v as k: (total_tokens, kv_heads, head_dim), v_layout 'bshd'")
    tq, hq, d, tk, hkv = _check_packed(q, k, v)
    softmax_scale = 1.0 / math.sqrt(d) if softmax_scale is None else _scale(softmax_scale)
    _check_causal(causal)
    cu_q, cu_k, batch = _check_cu_seqlens(torch, q, k, cu_seqlens_q, cu_seqlens_k)
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max().item()) if batch else 0  # syncs
    elif isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
        raise InputError(f"max_seqlen_q must be an int, got {type(max_seqlen_q).__name__}")
    if max_seqlen_q > tq or max_seqlen_q < 0 or (max_seqlen_q == 0 and tq > 0 and batch > 0):
        raise InputError(f"max_seqlen_q = {max_seqlen_q} must be in [1, {tq}] (the longest query sequence)")
    if validate.check_varlen_default() if check_varlen is None else check_varlen:
        validate.cu_seqlens(cu_q, cu_k, tq, tk, max_seqlen_q)
    scales = [_descale(name, t, max(batch, 1), hkv, q.device) for name, t in
              (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))]
    name, _ = choose(bundle, d, bool(causal), "bshd", (batch, max_seqlen_q, tk, hq, hkv), varlen=True)
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device)
    if tq == 0 or batch == 0 or tk == 0:
        o.zero_()
        lse.fill_(-math.inf)
        return (o, lse) if return_lse else o
    if batch > _GRID_YZ_MAX or hq > _GRID_YZ_MAX:
        raise InputError(f"batch ({batch}) and heads ({hq}) must each be <= {_GRID_YZ_MAX}")
    bundle.launch(name, [q, k, v, o, lse, cu_q, cu_k, *scales, softmax_scale, max_seqlen_q], device=dev)
    return (o, lse) if return_lse else o


def _check_causal(causal):
    if not isinstance(causal, (bool, int)) or isinstance(causal, int) and causal not in (0, 1):
        raise InputError(f"causal must be a bool, got {causal!r}")


def _check_packed(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise InputError(f"{name} must be (total_tokens, heads, head_dim) with cu_seqlens, got shape {tuple(t.shape)}")
        if t.dtype != torch.float8_e4m3fn:
            raise InputError(f"{name} must be float8_e4m3fn for the fp8 forward, got {t.dtype}")
    tq, hq, d = q.shape
    tk, hkv, dk = k.shape
    if d not in HEAD_DIMS or dk != d:
        raise InputError(f"head_dim of q ({d}) and k ({dk}) must match and be one of {HEAD_DIMS}")
    if tuple(v.shape) != tuple(k.shape):
        raise InputError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if hkv == 0 or hq % hkv:
        raise InputError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            continue
        if t.stride(-1) != 1 or any(s % 16 for s in t.stride()[:-1]):
            raise InputError(f"{name}: head_dim must be contiguous and the other strides multiples of 16 elements, "
                             f"strides {t.stride()}")
        if t.data_ptr() % 16:
            raise InputError(f"{name}: data pointer must be 16-byte aligned")
    return tq, hq, d, tk, hkv


def _hot(bundle) -> dict:
    """The fp8 hot path's cache: problem key -> ``fire`` (:func:`_hot_launch`); none for a
    stand-in bundle."""
    cache = getattr(bundle, "hot_attention_fp8", None)
    if cache is None:
        if not isinstance(bundle, BundleCore):
            return {}
        cache = bundle.hot_attention_fp8 = {}
    return cache


def _hot_launch(bundle, name: str, args: list, dev: int):
    """``fire(q, k, v, q_descale, k_descale, v_descale)`` of a problem just launched (and so
    checked) with ``args``: allocates o and lse, launches with the new data pointers (a descale
    of None: the cached ones), returns (o, lse); None when a pointer breaks the alignment
    contract (nothing launched).  None instead of ``fire`` when the variant is not loaded."""
    specs = [a if isinstance(a, float) else (a.data_ptr(), tuple(a.shape), tuple(a.stride())) for a in args]
    fixed = bundle.fixed(name, specs)
    if fixed is None:
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    q, o, lse = args[0], args[3], args[4]
    o_shape, lse_shape, device = tuple(o.shape), tuple(lse.shape), q.device
    empty = torch.empty
    bf16, f32 = torch.bfloat16, torch.float32
    ones = [s.data_ptr() for s in args[5:8]]  # (the cached ones where the caller gave None)

    def fire(q, k, v, qd, kd, vd):
        o = empty(o_shape, dtype=bf16, device=device)
        lse = empty(lse_shape, dtype=f32, device=device)
        here = cur()
        if here != dev:
            not_current(dev, here)
        err = go(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                 ones[0] if qd is None else qd.data_ptr(), ones[1] if kd is None else kd.data_ptr(),
                 ones[2] if vd is None else vd.data_ptr(), raw(here))
        if err != 0:
            if err is None:
                return None
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return o, lse
    fire.fixed = fixed
    return fire


def choose(bundle, head_dim: int, causal: bool, v_layout: str = "bshd",
           sizes: tuple[int, int, int, int, int] = (1, 1, 1, 1, 1), varlen: bool = False) -> tuple[str, str]:
    """(variant name, the V layout it takes): the host library's ``fx_attention_fp8_select``
    (compiler/csrc/fx_select.c: the head_dim and mask, a variant taking ``v_layout``, else for
    "bshd" one taking V pre-transposed; the preferred tile, best target first), cached per
    bundle.  ``sizes``: (batch, seqlen_q, seqlen_k, heads_q, heads_kv)."""
    per_bundle = getattr(bundle, "selections", None)
    if per_bundle is None:  # a stand-in bundle (tests): no cache
        per_bundle = {}
    key = ("attention_fp8", head_dim, causal, v_layout, varlen)
    hit = per_bundle.get(key)
    if hit is None:
        from .selector import AttentionFp8Problem

        b, sq, sk, hq, hkv = sizes
        # (sizes at least 1: the choice does not depend on them, and an empty problem selects nothing)
        p = AttentionFp8Problem(max(b, 1), max(sq, 1), max(sk, 1), max(hq, hkv, 1), max(hkv, 1), head_dim,
                                V_LAYOUTS.index(v_layout), int(bool(causal)), 0.0, int(varlen))
        try:
            sel = bundle.selector.select("attention_fp8", p)
        except NoVariantError as err:
            raise NoVariantError(f"{err} ({bundle.describe_contents('attention_fp8')})") from None
        name = sel.name.decode()
        hit = per_bundle[key] = (name, bundle.manifest["variants"][name]["v_layout"])
    return hit


def check_meta(bundle, q, k, v, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
               v_descale=None, v_layout="bshd"):
    """What ``attention_fp8`` checks before a launch, on metadata alone; returns (o, lse) shaped as
    the real op's."""
    validate.one_device(bundle, q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    validate.no_grad("attention", q=q, k=k, v=v)
    b, sq, hq, d, sk, hkv = _check(q, k, v, v_layout, data=False)
    if softmax_scale is not None:
        _scale(softmax_scale)
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        _descale(name, t, b, hkv, q.device, data=False)
    from .gemm import concrete

    choose(bundle, d, bool(causal), v_layout, (b, sq, sk, hq, hkv) if concrete(b, sq, sk, hq, hkv) else (1,) * 5)
    return (q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((b, hq, sq), dtype=torch.float32))


def _scale(softmax_scale) -> float:
    try:
        softmax_scale = float(softmax_scale)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"softmax_scale must be a number, got {type(softmax_scale).__name__}") from None
    if not (softmax_scale > 0.0 and math.isfinite(softmax_scale)):
        raise InputError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return softmax_scale


def _check(q, k, v, v_layout, data: bool = True):
    if v_layout not in V_LAYOUTS:
        raise InputError(f"v_layout must be one of {V_LAYOUTS}, got {v_layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
        if t.dtype != torch.float8_e4m3fn:
            raise InputError(f"{name} must be float8_e4m3fn for the fp8 forward, got {t.dtype}")
    b, sq, hq, d = q.shape
    _, sk, hkv, dk = k.shape
    if d not in HEAD_DIMS:
        raise InputError(f"head_dim {d} not supported (one of {HEAD_DIMS})")
    if dk != d:
        raise InputError(f"head_dim of q ({d}) and k ({dk}) differ")
    want_v = (b, sk, hkv, d) if v_layout == "bshd" else (b, hkv, d, sk)
    if tuple(v.shape) != want_v:
        raise InputError(f"v must be {'(B, Sk, Hkv, D)' if v_layout == 'bshd' else '(B, Hkv, D, Sk)'} = {want_v} "
                         f"for v_layout={v_layout!r}, got {tuple(v.shape)}")
    if k.shape[0] != b:
        raise InputError(f"batch of q ({b}) and k ({k.shape[0]}) differ")
    if hkv == 0 or hq % hkv:
        raise InputError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            continue
        if t.stride(-1) != 1:
            raise InputError(f"{name}: the last dimension must be contiguous (stride 1), strides {t.stride()}")
        if any(s % 16 for s in t.stride()[:-1]):
            raise InputError(f"{name}: strides {t.stride()} must be multiples of 16 elements (16 bytes) "
                             f"except the last")
        if data and t.data_ptr() % 16:
            raise InputError(f"{name}: data pointer must be 16-byte aligned")
    return b, sq, hq, d, sk, hkv


def _descale(name, t, b, hkv, device, data: bool = True):
    """A (B, Hkv) float32 view of descale ``t`` (zero strides where it broadcasts; no copy)."""
    if t is None:
        if not data:
            return None
        key = device.index
        one = _ONES.get(key)
        if one is None:
            if devmem.capturing(device):  # (not kept: the capture's pool, filled when the graph runs)
                return torch.ones(1, dtype=torch.float32, device=device).expand(b, hkv)
            one = _ONES[key] = devmem.full(1, 1.0, torch.float32, device, sync=True)
        return one.expand(b, hkv)
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a float32 tensor or None, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise InputError(f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        raise InputError(f"{name} must be on {device}, got {t.device}")
    if t.dim() > 2:
        raise InputError(f"{name} must broadcast to (batch, kv heads) = ({b}, {hkv}), got shape {tuple(t.shape)}")
    try:
        view = t.expand(b, hkv) if t.dim() else t.reshape(1, 1).expand(b, hkv)
    except RuntimeError:
        raise InputError(f"{name} must broadcast to (batch, kv heads) = ({b}, {hkv}), "
                         f"got shape {tuple(t.shape)}") from None
    if data and t.numel() and t.data_ptr() % 4:
        raise InputError(f"{name}: data pointer must be 4-byte aligned")
    return view


__all__ = ["HEAD_DIMS", "V_LAYOUTS", "attention_fp8", "check_meta", "choose"]
