"""Attention forward through a bundle: argument checks, variant choice, launch.  No DSL import.

The kernels (``factory/attention/sm80.py``) take, in this order,
  dense:  q (B,Sq,Hq,D), k (B,Sk,Hkv,D), v (B,Sk,Hkv,D), o (B,Sq,Hq,D), lse (B,Hq,Sq) f32, scale
  varlen: q (Tq,Hq,D), k/v (Tk,Hkv,D), o (Tq,Hq,D), lse (Hq,Tq) f32, cu_seqlens_q, cu_seqlens_k,
          scale, max_seqlen_q
with head_dim contiguous, every other stride a multiple of 16 bytes and 16-byte aligned data.
LSE is always written (into a scratch buffer when the caller does not want it).
Decode-family variants (manifest ``decode_rows``; attention/decode.py) serve seqlen_q <= 16 by
the selection's decode rule (compiler/csrc/fx_select.c ``decode_pick``); those that merge their splits in a cluster take no workspace (manifest
``splits`` 1, ``kv_splits`` the key splits).
Split-KV variants (manifest ``splits`` > 1, dense only) take two fp32 workspace tensors after lse:
  o_partial (splits,B,Hq,Sq,D), lse_partial (splits,B,Hq,Sq)
carved here from one torch.empty; the variant combines them into o and lse itself (second kernel,
same stream), so a split launch is one call like any other and CUDA-graph capturable.
Dynamic persistent variants (manifest workspace ``tile_counters``; attention/sm90.py ``dynamic``)
take after lse two zeroed int32 counter words (runtime/counters.py: the launch stream's words, the
same call after call, so no per-call allocation or memset; inside a CUDA-graph capture, words of
that capture); each launch leaves them 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import counters as _counters
from . import devmem, validate
from .bundle import BundleCore, not_current
from .errors import InputError, LaunchError, NoVariantError

_DTYPES = {"bfloat16": "bf16", "float16": "f16"}
HEAD_DIMS = (64, 128, 256)
_GRID_YZ_MAX = 65535


def attention(bundle, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False,
              check_varlen=None, out=None, key=None):
    """softmax(q·kᵀ·scale [+ causal mask]) · v.  Returns o (q's shape), or (o, lse) with
    ``return_lse``: lse float32 (B, Hq, Sq), or (Hq, Tq) for packed variable-length input.

    Causal masking is bottom-right aligned: query i sees keys j <= i + Sk - Sq.  A query with no
    visible key gets o = 0 and lse = -inf.  GQA/MQA: Hq must be a multiple of Hkv.

    Varlen (packed batches): q (Tq, Hq, D), k/v (Tk, Hkv, D); ``cu_seqlens_q``/``cu_seqlens_k``
    int32 (batch + 1,) on q's device, sequence i being tokens cu[i]:cu[i+1]; each starts at 0,
    never decreases and ends at its token count (Tq, Tk); ``max_seqlen_q`` ≥ the longest query
    sequence (computed, with a device synchronisation, when None).  By default these are TRUSTED,
    as FlashAttention trusts them: offsets that break the contract read or write out of bounds.
    ``check_varlen=True`` (or the environment variable ``FACTORY_CHECK_VARLEN=1`` when the
    argument is None) checks them on the host first, at the cost of a synchronisation, and raises
    ``InputError``.  ``max_seqlen_k`` is accepted for API symmetry and not needed.

    ``out``: a tensor of q's shape, dtype and device that o is written into (and returned)
    instead of a new one; it must share no memory with q, k or v, and its strides must meet the
    kernel's contract (head_dim contiguous, the others multiples of 16 bytes).

    This is the checked path: everything is validated here.  ``key``: the problem key of a dense
    call (``Bundle.attention`` computes it: the tensors' types, shapes, strides, dtypes and
    devices, the flags, ``out``'s layout); when given, the launch plan of this problem is kept
    under it (:func:`_hot_launch`), so that the next call of the same key skips everything but
    what can differ between calls of one key (autograd, the current device, the data pointers'
    alignment and overlap, checked per call by the plan).
    """
    if isinstance(q, Tensor) and q.dtype == torch.float8_e4m3fn:  # the fp8 forward (runtime/attention_fp8.py)
        if out is not None:
            raise InputError("out= is not available for fp8 q, k, v")
        return bundle.attention_fp8(q, k, v, causal, softmax_scale, return_lse=return_lse,
                                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                    check_varlen=check_varlen)
    dev = q.get_device() if isinstance(q, Tensor) else -1
    if (dev < bundle.lowest_device or not isinstance(k, Tensor) or not isinstance(v, Tensor)
            or k.get_device() != dev or v.get_device() != dev):
        dev = validate.one_device(bundle, q=q, k=k, v=v)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        validate.no_grad("attention", q=q, k=k, v=v)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    scale_given = softmax_scale
    if softmax_scale is not None:
        softmax_scale = _scale(softmax_scale)
    _check_common(torch, q, k, v, varlen)
    dtype = _DTYPES[str(q.dtype).removeprefix("torch.")]
    d = q.shape[-1]
    hq = q.shape[-2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if out is not None:
        _check_out(out, q, k, v, dev)

    if varlen:
        cu_q, cu_k, batch = _check_cu_seqlens(torch, q, k, cu_seqlens_q, cu_seqlens_k)
        if max_seqlen_q is None:
            max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max().item()) if batch else 0  # syncs
        elif isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
            raise InputError(f"max_seqlen_q must be an int, got {type(max_seqlen_q).__name__}")
        if max_seqlen_q > q.shape[0]:
            raise InputError(f"max_seqlen_q = {max_seqlen_q} exceeds the {q.shape[0]} query tokens")
        if validate.check_varlen_default() if check_varlen is None else check_varlen:
            validate.cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0], max_seqlen_q)
        if max_seqlen_q < 0 or (max_seqlen_q == 0 and q.shape[0] > 0 and batch > 0):
            raise InputError(f"max_seqlen_q = {max_seqlen_q}: with {q.shape[0]} query tokens in {batch} sequences it "
                             f"must be at least 1 (the longest query sequence)")
        o = torch.empty_like(q) if out is None else out
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=q.device)
        if q.shape[0] == 0 or batch == 0:
            o.zero_()
            lse.fill_(-math.inf)
            return (o, lse) if return_lse else o
        if k.shape[0] == 0:  # no keys anywhere: every query row is empty
            o.zero_()
            lse.fill_(-math.inf)
            return (o, lse) if return_lse else o
        _check_grid(batch, hq)
        args = [q, k, v, o, lse, cu_q, cu_k, softmax_scale, max_seqlen_q]
    else:
        b, sq, _, _ = q.shape
        sk = k.shape[1]
        o = torch.empty_like(q) if out is None else out
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
        if o.numel() == 0:
            return (o, lse) if return_lse else o
        if sk == 0:
            o.zero_()
            lse.fill_(-math.inf)
            return (o, lse) if return_lse else o
        _check_grid(b, hq)
        args = [q, k, v, o, lse, softmax_scale]
    if out is None:
        _check_strides(o, "o (from empty_like(q))")

    if varlen:
        name, splits = _choose(bundle, dtype, d, bool(causal), varlen)
        if name.endswith("_dy") and uses_tile_counters(bundle.manifest["variants"][name]):
            args.insert(5, tile_counters(q.device, _counters.raw_stream(bundle, q.device)))
    else:
        name, splits = _choose(bundle, dtype, d, bool(causal), varlen, q.shape[0] * hq * q.shape[1],
                               (q.shape[0], hq, k.shape[2], q.shape[1], k.shape[1]))
        if splits > 1:
            args[5:5] = split_workspace(torch, q, splits)
        elif name.endswith("_dy") and uses_tile_counters(bundle.manifest["variants"][name]):
            args.insert(5, tile_counters(q.device, _counters.raw_stream(bundle, q.device)))
    bundle.launch(name, args, device=dev)
    # (cached only for plain flags: a tensor's hash is its identity, so it would never hit again)
    if key is not None and type(causal) in (bool, int) and (scale_given is None or type(scale_given) in (float, int)):
        fire = _hot_launch(bundle, name, splits, q, k, v, o, lse, args, dev, out is not None)
        if fire is not None:
            cache = _hot(bundle)
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = fire
    return (o, lse) if return_lse else o


def _scale(softmax_scale) -> float:
    try:
        softmax_scale = float(softmax_scale)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"softmax_scale must be a number, got {type(softmax_scale).__name__}") from None
    # The kernel takes the row max of the unscaled scores: the scale must be positive.
    if not (softmax_scale > 0.0 and math.isfinite(softmax_scale)):
        raise InputError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return softmax_scale


def check_meta(bundle, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
               max_seqlen_q=None):
    """What ``attention`` checks before a launch, on metadata alone (fake tensors under
    torch.compile), raising the same InputError / NoVariantError; returns the (o, lse) that the
    real op returns with ``return_lse``.  The selection runs as the real op's when the sizes are
    concrete; with symbolic sizes, the choice for the dtype, head_dim and mask alone (whether the
    bundle has such a kernel for this device)."""
    from .gemm import concrete

    validate.one_device(bundle, q=q, k=k, v=v)
    validate.no_grad("attention", q=q, k=k, v=v)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if softmax_scale is not None:
        _scale(softmax_scale)
    _check_common(torch, q, k, v, varlen, data=False)
    dtype = _DTYPES[str(q.dtype).removeprefix("torch.")]
    # head_dim is a kernel's compile-time size: a symbolic one (dynamic shapes) is specialised
    # (int() guards on it) so that the bundle's kernels for it are looked up as the real op does.
    d, hq = int(q.shape[-1]), q.shape[-2]
    o = torch.empty_like(q)
    if varlen:
        _, _, batch = _check_cu_seqlens(torch, q, k, cu_seqlens_q, cu_seqlens_k)
        if max_seqlen_q is not None:
            if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
                raise InputError(f"max_seqlen_q must be an int, got {type(max_seqlen_q).__name__}")
            if concrete(q.shape[0]) and max_seqlen_q > q.shape[0]:
                raise InputError(f"max_seqlen_q = {max_seqlen_q} exceeds the {q.shape[0]} query tokens")
        lse = q.new_empty((hq, q.shape[0]), dtype=torch.float32)
        if concrete(batch, hq):
            _check_grid(batch, hq)
        _choose(bundle, dtype, d, bool(causal), True)
        return o, lse
    b, sq = q.shape[0], q.shape[1]
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    sizes = (b, hq, k.shape[2], sq, k.shape[1])
    if not concrete(*sizes):
        _choose(bundle, dtype, d, bool(causal), False)
    elif o.numel() and k.shape[1]:
        _check_grid(b, hq)
        _choose(bundle, dtype, d, bool(causal), False, b * hq * sq, sizes)
    return o, lse


def uses_tile_counters(entry: dict) -> bool:
    """Whether a variant takes its tiles from a global counter (manifest workspace form
    "tile_counters": two int32 words after lse, zero at launch and left zero)."""
    return (entry.get("workspace") or {}).get("form") == "tile_counters"


def tile_counters(dev, stream=None):
    """The tile counters of a dynamic persistent variant on ``dev`` launched on ``stream`` (a raw
    handle): the first two of that stream's zeroed int32 counter words (runtime/counters.py; while
    a CUDA graph is captured, of that capture's words)."""
    return _counters.zeroed(dev, 2, stream)[0]


def dense_workspace(torch, entry: dict, q) -> list:
    """The arguments a dense variant takes between lse and softmax_scale: a split variant's fp32
    workspace, a dynamic one's tile counters, else none."""
    if uses_tile_counters(entry):
        return [tile_counters(q.device, torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None)]
    if entry.get("splits", 1) > 1:
        return list(split_workspace(torch, q, entry["splits"]))
    return []


def split_workspace(torch, q, splits: int):
    """The fp32 workspace of a split-KV variant for dense q (B, Sq, Hq, D): o_partial
    (splits, B, Hq, Sq, D) and lse_partial (splits, B, Hq, Sq), one allocation (the kernels write
    every element they later read, so torch.empty is enough)."""
    b, sq, hq, d = q.shape
    n = splits * b * hq * sq
    ws = torch.empty(n * (d + 1), dtype=torch.float32, device=q.device)
    return ws[: n * d].view(splits, b, hq, sq, d), ws[n * d:].view(splits, b, hq, sq)


def _hot_launch(bundle, name: str, splits: int, q, k, v, o, lse, args: list, dev: int, out_given: bool):
    """The launch plan of a dense problem just launched (and so checked) with ``args``: a pair
    ``(plan, plan_lse)`` of functions ``(q, k, v, out) ->`` o, resp. (o, lse), each the whole
    per-call work in one Python frame (``FixedLaunch.inline``): the autograd check, o (``out``
    when the key's calls give one, else ``empty_like(q)``), the LSE (``plan_lse`` allocates it;
    ``plan`` writes it into the bundle's scratch buffer of the device, :func:`lse_scratch`, where it
    fits), a split variant's workspace, the current device, the data pointers (their alignment,
    and no overlap of a given ``out`` with q, k, v), the stream, one call of the native launcher.
    Either returns None without launching when a check fails (the checked path then names it).
    Everything else of the key's problem is fixed: the packed argument bytes
    (:meth:`BundleCore.fixed`), the layouts of ``out`` (in the key) and of the allocations
    (``empty_like`` of q and of zero-stride views, which give the layouts checked here).  None
    instead of the pair when the variant was not loaded by that launch (a stand-in launch in
    tests): then nothing is cached."""
    specs = [a if isinstance(a, float) else (a.data_ptr(), tuple(a.shape), tuple(a.stride())) for a in args]
    fixed = bundle.fixed(name, specs) if isinstance(bundle, BundleCore) else None
    if fixed is None:  # a stand-in bundle or launch (tests): every call takes the checked path
        return None
    cur, raw = bundle.device_api()
    one = devmem.proto(torch.float32, q.device)
    lproto = one.expand(lse.shape)  # empty_like of a zero-stride view: a new compact tensor
    empty_like = torch.empty_like
    if empty_like(lproto).stride() != lse.stride() or (not out_given and empty_like(q).stride() != o.stride()):
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layouts")
    names = {"empty_like": empty_like, "lproto": lproto, "cur": cur, "raw": raw, "dev": dev,
             "not_current": not_current, "grad_enabled": torch.is_grad_enabled,
             "error": lambda code: bundle.lib.error(code)}
    head = ("    if (q.requires_grad or k.requires_grad or v.requires_grad) and grad_enabled():\n        return None\n"
            + ("    o = out\n" if out_given else "    o = empty_like(q)\n"))
    device = "    here = cur()\n    if here != dev:\n        not_current(dev, here)\n"
    checks = ""
    if out_given:  # out shares no byte with q, k, v: per call (the pointers differ; the byte extents do not)
        ext = [validate.span(t.shape, t.stride()) * t.element_size() for t in (q, k, v, o)]
        names.update(eq=ext[0], ek=ext[1], ev=ext[2], eo=ext[3])
        checks = ("    if (p3 < p0 + eq and p0 < p3 + eo) or (p3 < p1 + ek and p1 < p3 + eo) "
                  "or (p3 < p2 + ev and p2 < p3 + eo):\n        return None\n")
    ptrs = ["q.data_ptr()", "k.data_ptr()", "v.data_ptr()", "o.data_ptr()"]
    lse_new = "    lse = empty_like(lproto)\n"
    if splits > 1:
        b, sq, hq, d = q.shape
        n = splits * b * hq * sq
        names.update(wproto=one.expand(n * (d + 1)), lse_at=n * d * 4)  # split_workspace's one allocation
        setup = head + lse_new + "    ws = empty_like(wproto)\n" + device + "    w = ws.data_ptr()\n"
        ptrs += ["lse.data_ptr()", "w", "w + lse_at"]
        return tuple(fixed.inline("q, k, v, out", setup, ptrs, r, names, checks=checks) for r in ("o", "(o, lse)"))
    # a dynamic variant's tile counters: the stream's words, found once per stream and kept
    # (runtime/counters.py: never freed; inside a capture the capture's words, never kept)
    cnt = []
    if len(args) == 7 and not isinstance(args[5], float):
        names["cnt_ptr"] = _counters.StreamWords(q.device, 2).ptr
        device += "    s = raw(here)\n    cnt = cnt_ptr(s)\n"
        cnt = ["cnt"]
    st = "s" if cnt else "raw(here)"
    with_lse = fixed.inline("q, k, v, out", head + lse_new + device, ptrs + ["lse.data_ptr()"] + cnt, "(o, lse)",
                            names, stream=st, checks=checks)
    scratch = lse_scratch(bundle, q.device, lse.numel() * 4)
    if scratch is None:
        plan = fixed.inline("q, k, v, out", head + lse_new + device, ptrs + ["lse.data_ptr()"] + cnt, "o", names,
                            stream=st, checks=checks)
    else:
        names["scratch"] = scratch
        plan = fixed.inline("q, k, v, out", head + device, ptrs + ["scratch"] + cnt, "o", names, stream=st,
                            checks=checks)
    return plan, with_lse


# Bytes of the per-device LSE scratch (B·Hq·Sq rows of 4 bytes: 262144 rows, e.g. B1 H32 S8192).  A
# larger problem's LSE is allocated per call, as with return_lse (the allocation, ~2 µs of host
# time, is then far below the kernel's time).
LSE_SCRATCH_BYTES = 1 << 20


def lse_scratch(bundle, device, nbytes: int) -> int | None:
    """The data pointer of ``bundle.scratch[device]`` (allocated on first use, kept for the
    bundle's life), or None when ``nbytes`` exceed it or while a CUDA graph is being captured
    (memory allocated inside a capture belongs to the graph's pool)."""
    if nbytes > LSE_SCRATCH_BYTES:
        return None
    buf = bundle.scratch.get(device)
    if buf is None:
        if devmem.capturing(device):
            return None
        buf = bundle.scratch[device] = devmem.empty(LSE_SCRATCH_BYTES // 4, torch.float32, device)
    return buf.data_ptr()


_NO_CACHE: dict = {}  # (a stand-in bundle's hot path: never filled, see _hot_launch)


def _hot(bundle) -> dict:
    """The dense hot path's cache: problem key -> launch plans (:func:`_hot_launch`)."""
    try:
        return bundle.hot_attention
    except AttributeError:
        return _NO_CACHE


def _choose(bundle, dtype: str, head_dim: int, causal: bool, varlen: bool, rows: int | None = None,
            decode: tuple[int, int, int] | None = None) -> tuple[str, int]:
    """The variant name and its split count: the host library's ``fx_attention_select``
    (compiler/csrc/fx_select.c: the decode family for dense problems of at most 16 queries,
    packed-GQA and split-KV for grids that leave SMs idle, the tuning table's winner of the dense
    problem's bucket, the family's preferred tile or a smaller one for an under-filled grid),
    cached per bundle.  ``rows``: batch·heads·seqlen_q of a dense problem (None for varlen);
    ``decode``: (batch, Hq, Hkv, seqlen_q, seqlen_k) of a dense problem.  The selection sees a
    contiguous problem of these sizes; the launch checks the tensors' own strides."""
    per_bundle = getattr(bundle, "selections", None)
    if per_bundle is None:  # a stand-in bundle (tests): no cache
        per_bundle = {}
    sms = bundle.device_info()["sm_count"]  # (the device given to Bundle.open, else the GPU's)
    key = ("attention", dtype, head_dim, causal, varlen, rows is not None and rows < 128 * sms,
           rows is not None and rows <= 64 * sms, decode)
    hit = per_bundle.get(key)
    if hit is None:
        if len(per_bundle) > 4096:
            per_bundle.clear()
        from .selector import AttentionProblem, DTYPE, _I64x2, _I64x3

        d = head_dim
        if varlen or decode is None:
            b, hq, hkv, sq, sk = 1, 1, 1, 1, 1
        else:
            b, hq, hkv, sq, sk = decode
        qs, ks = _I64x3(sq * hq * d, hq * d, d), _I64x3(sk * hkv * d, hkv * d, d)
        p = AttentionProblem(DTYPE[dtype], int(bool(varlen)), b, sq, sk, hq, hkv, d, None, None, None, None,
                             qs, ks, ks, _I64x3(*qs), None, _I64x2(hq * sq, sq), None, None, sq if varlen else 0,
                             int(bool(causal)), 0.0)
        try:
            sel = bundle.selector.select("attention", p)
        except NoVariantError as err:  # say what the bundle was built for
            raise NoVariantError(f"{err} ({bundle.describe_contents('attention')})") from None
        hit = per_bundle[key] = (sel.name.decode(), max(1, sel.splits))
    return hit


# --- checks ---------------------------------------------------------------------------------------
def _check_common(torch, q, k, v, varlen: bool, data: bool = True) -> None:
    rank = 3 if varlen else 4
    layout = "(total_tokens, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise InputError(f"{name} must be {layout}, got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if str(q.dtype).removeprefix("torch.") not in _DTYPES:
        raise InputError(f"dtype {q.dtype} not supported (bfloat16, float16)")
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        raise InputError(f"head_dim {d} not supported (one of {HEAD_DIMS})")
    if k.shape[-1] != d or v.shape[-1] != d:
        raise InputError(f"head_dim of q, k, v differ: {d}, {k.shape[-1]}, {v.shape[-1]}")
    if k.shape != v.shape:
        raise InputError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv:
        raise InputError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    if not varlen and q.shape[0] != k.shape[0]:
        raise InputError(f"batch of q ({q.shape[0]}) and k/v ({k.shape[0]}) differ")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_strides(t, name, data)


def _check_strides(t, name: str, data: bool = True) -> None:
    if t.numel() == 0:
        return
    vec = 16 // t.element_size()
    if t.stride(-1) != 1:
        raise InputError(f"{name}: head_dim must be contiguous (stride 1), strides {t.stride()}")
    bad = [s for s in t.stride()[:-1] if s % vec]
    if bad:
        raise InputError(f"{name}: strides {t.stride()} must be multiples of {vec} elements "
                         f"(16 bytes) except the last")
    if data and t.data_ptr() % 16:
        raise InputError(f"{name}: data pointer must be 16-byte aligned")


def _check_out(out, q, k, v, dev: int) -> None:
    """``out=``: a tensor of q's shape, dtype and device, every element its own address, no byte
    shared with q, k or v, strides and alignment as the kernels take them (``_check_strides``)."""
    if not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.get_device() != dev:
        got = (f"{tuple(out.shape)} {out.dtype} on {validate.where(out)}" if isinstance(out, Tensor)
               else type(out).__name__)
        raise InputError(f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                         f"({validate.where(q)}), got {got}")
    _check_strides(out, "out")
    validate.distinct("out", out.shape, out.stride())
    validate.disjoint("out", out, q=q, k=k, v=v)


def _check_cu_seqlens(torch, q, k, cu_q, cu_k):
    if cu_q is None or cu_k is None:
        raise InputError("varlen needs both cu_seqlens_q and cu_seqlens_k")
    out = []
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int32:
            raise InputError(f"{name} must be a 1-D int32 tensor")
        if t.device != q.device:
            raise InputError(f"{name} must be on {q.device}")
        if t.numel() < 1:
            raise InputError(f"{name} must hold batch + 1 offsets")
        out.append(t.contiguous())
    if out[0].numel() != out[1].numel():
        raise InputError(f"cu_seqlens_q and cu_seqlens_k lengths differ: "
                         f"{out[0].numel()} vs {out[1].numel()}")
    return out[0], out[1], out[0].numel() - 1


def _check_grid(batch: int, heads: int) -> None:
    if batch > _GRID_YZ_MAX or heads > _GRID_YZ_MAX:
        raise InputError(f"batch ({batch}) and heads ({heads}) must each be <= {_GRID_YZ_MAX}")
