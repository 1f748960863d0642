"""Attention forward through a bundle: argument checks, variant choice, launch.  No DSL import.

The kernels (``factory/attention/sm80.py``) take, in this order,
  dense:  q (B,Sq,Hq,D), k (B,Sk,Hkv,D), v (B,Sk,Hkv,D), o (B,Sq,Hq,D), lse (B,Hq,Sq) f32, scale
  varlen: q (Tq,Hq,D), k/v (Tk,Hkv,D), o (Tq,Hq,D), lse (Hq,Tq) f32, cu_seqlens_q, cu_seqlens_k,
          scale, max_seqlen_q
with head_dim contiguous, every other stride a multiple of 16 bytes and 16-byte aligned data.
LSE is always written (into a scratch buffer when the caller does not want it).
Decode-family variants (manifest ``decode_rows``; attention/decode.py) serve seqlen_q <= 16 by
``decode_pick``; those that merge their splits in a cluster take no workspace (manifest
``splits`` 1, ``kv_splits`` the key splits).
Split-KV variants (manifest ``splits`` > 1, dense only) take two fp32 workspace tensors after lse:
  o_partial (splits,B,Hq,Sq,D), lse_partial (splits,B,Hq,Sq)
carved here from one torch.empty; the variant combines them into o and lse itself (second kernel,
same stream), so a split launch is one call like any other and CUDA-graph capturable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import tuning, validate
from .bundle import BundleCore, not_current
from .errors import InputError, LaunchError, NoVariantError

_DTYPES = {"bfloat16": "bf16", "float16": "f16"}
HEAD_DIMS = (64, 128, 256)
_GRID_YZ_MAX = 65535


def attention(bundle, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False,
              check_varlen=None):
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
    """
    if cu_seqlens_q is None and cu_seqlens_k is None:
        # Hot path: a dense problem seen before (same shapes, strides, dtypes, devices, flags) was
        # checked in full then; what can differ between calls of one key is checked here: tensor
        # types, autograd, the current device, the data pointers' alignment (in ``go``).
        try:
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                   q.get_device(), k.get_device(), v.get_device(), causal, softmax_scale)
            fire = _hot(bundle).get(key)
        except (AttributeError, TypeError):  # not tensors, or an unhashable argument: checked below
            key = fire = None
        if (fire is not None and isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
                and not ((q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled())):
            out = fire(q, k, v)
            if out is not None:
                return out if return_lse else out[0]
            key = None  # a misaligned pointer: the checked path below refuses it
    else:
        key = None
    dev = q.get_device() if isinstance(q, Tensor) else -1
    if (dev < bundle.lowest_device or not isinstance(k, Tensor) or not isinstance(v, Tensor)
            or k.get_device() != dev or v.get_device() != dev):
        dev = validate.one_device(bundle, q=q, k=k, v=v)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        validate.no_grad("attention", q=q, k=k, v=v)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    scale_given = softmax_scale
    if softmax_scale is not None:
        try:
            softmax_scale = float(softmax_scale)
        except (TypeError, ValueError, RuntimeError):
            raise InputError(f"softmax_scale must be a number, got {type(softmax_scale).__name__}") from None
        # The kernel takes the row max of the unscaled scores: the scale must be positive.
        if not (softmax_scale > 0.0 and math.isfinite(softmax_scale)):
            raise InputError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    _check_common(torch, q, k, v, varlen)
    dtype = _DTYPES[str(q.dtype).removeprefix("torch.")]
    d = q.shape[-1]
    hq = q.shape[-2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)

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
        o = torch.empty_like(q)
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
        o = torch.empty_like(q)
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
        if o.numel() == 0:
            return (o, lse) if return_lse else o
        if sk == 0:
            o.zero_()
            lse.fill_(-math.inf)
            return (o, lse) if return_lse else o
        _check_grid(b, hq)
        args = [q, k, v, o, lse, softmax_scale]
    _check_strides(o, "o (from empty_like(q))")

    if varlen:
        name, splits = _choose(bundle, dtype, d, bool(causal), varlen)
    else:
        name, splits = _choose(bundle, dtype, d, bool(causal), varlen, q.shape[0] * hq * q.shape[1],
                               (q.shape[0], hq, k.shape[2], q.shape[1], k.shape[1]))
        if splits > 1:
            args[5:5] = split_workspace(torch, q, splits)
    bundle.launch(name, args, device=dev)
    # (cached only for plain flags: a tensor's hash is its identity, so it would never hit again)
    if key is not None and type(causal) in (bool, int) and (scale_given is None or type(scale_given) in (float, int)):
        fire = _hot_launch(bundle, name, splits, q, o, lse, args, dev)
        if fire is not None:
            cache = _hot(bundle)
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = fire
    return (o, lse) if return_lse else o


def split_workspace(torch, q, splits: int):
    """The fp32 workspace of a split-KV variant for dense q (B, Sq, Hq, D): o_partial
    (splits, B, Hq, Sq, D) and lse_partial (splits, B, Hq, Sq), one allocation (the kernels write
    every element they later read, so torch.empty is enough)."""
    b, sq, hq, d = q.shape
    n = splits * b * hq * sq
    ws = torch.empty(n * (d + 1), dtype=torch.float32, device=q.device)
    return ws[: n * d].view(splits, b, hq, sq, d), ws[n * d:].view(splits, b, hq, sq)


def _hot_launch(bundle, name: str, splits: int, q, o, lse, args: list, dev: int):
    """The hot path's launch of a dense problem just launched (and so checked) with ``args``:
    ``fire(q, k, v)`` allocates O, LSE (and a split variant's workspace), launches, and returns
    (o, lse), or None when a data pointer breaks the alignment contract (nothing launched: the
    checked path then says which).  None instead of ``fire`` when the variant was not loaded by
    that launch (a stand-in launch in tests): then nothing is cached.  Everything else of the
    key's problem is fixed: the packed argument bytes (:meth:`BundleCore.fixed`), the outputs'
    shapes and strides (``empty_like`` of q and of zero-stride views, which give the layouts
    checked here)."""
    specs = [a if isinstance(a, float) else (a.data_ptr(), tuple(a.shape), tuple(a.stride())) for a in args]
    fixed = bundle.fixed(name, specs) if isinstance(bundle, BundleCore) else None
    if fixed is None:  # a stand-in bundle or launch (tests): every call takes the checked path
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    one = torch.empty(1, dtype=torch.float32, device=q.device)
    empty_like = torch.empty_like
    lproto = one.expand(lse.shape)  # empty_like of a zero-stride view: a new compact tensor
    if empty_like(lproto).stride() != lse.stride() or empty_like(q).stride() != o.stride():
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layouts")
    if splits == 1:
        def fire(q, k, v):
            o, lse = empty_like(q), empty_like(lproto)
            here = cur()
            if here != dev:
                not_current(dev, here)
            err = go(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), raw(here))
            if err != 0:
                if err is None:
                    return None
                raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
            return o, lse
        fire.fixed = fixed  # (for scripts/launch_overhead.py's breakdown)
        return fire

    b, sq, hq, d = q.shape
    n = splits * b * hq * sq
    wproto, lse_at = one.expand(n * (d + 1)), n * d * 4  # split_workspace's one allocation

    def fire_split(q, k, v):
        o, lse, ws = empty_like(q), empty_like(lproto), empty_like(wproto)
        here = cur()
        if here != dev:
            not_current(dev, here)
        w = ws.data_ptr()
        err = go(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), w, w + lse_at,
                 raw(here))
        if err != 0:
            if err is None:
                return None
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return o, lse
    fire_split.fixed = fixed
    return fire_split


_NO_CACHE: dict = {}  # (a stand-in bundle's hot path: never filled, see _hot_launch)


def _hot(bundle) -> dict:
    """The dense hot path's cache: problem key -> ``fire`` (:func:`_hot_launch`)."""
    try:
        return bundle.hot_attention
    except AttributeError:
        return _NO_CACHE


def _choose(bundle, dtype: str, head_dim: int, causal: bool, varlen: bool, rows: int | None = None,
            decode: tuple[int, int, int] | None = None) -> tuple[str, int]:
    """``rows``: batch·heads·seqlen_q of a dense problem (None for varlen), for the grid check;
    ``decode``: (batch, Hq, Hkv, seqlen_q, seqlen_k) of a dense problem, for split-KV.  Returns
    the variant name and its split count."""
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
        try:
            e = select(bundle.candidates("attention"), dtype=dtype, head_dim=head_dim, causal=causal,
                       varlen=varlen, rows=rows, sms=sms, decode=decode,
                       tuned=_tuned(bundle, dtype, head_dim, causal, decode) if not varlen else None)
        except NoVariantError as err:  # say which device, and what the bundle was built for
            raise NoVariantError(f"{err} (on {bundle.device_name()}; "
                                 f"{bundle.describe_contents('attention')})") from None
        hit = per_bundle[key] = (e["name"], int(e.get("splits", 1)))
    return hit


def _tuned(bundle, dtype: str, head_dim: int, causal: bool, decode) -> str | None:
    """The bundle's measured winner for this dense problem's bucket (runtime/tuning.py
    ``attention_bucket_key``), when its tuning.json applies to this device; else None."""
    table = getattr(bundle, "tuning", None)
    if table is None or decode is None:
        return None
    from .tuning import attention_bucket_key

    b, hq, _, sq, sk = decode
    return table.attention_winner(attention_bucket_key(dtype, head_dim, causal, sq, sk, b * hq))


def split_count(ctas: int, key_tiles: int, sms: int, available) -> int:
    """Split-KV count for a grid of ``ctas`` CTAs over ``key_tiles`` key tiles: 1 unless the grid
    leaves SMs idle (ctas < SMs); then the largest available count that keeps the grid within two
    waves (ctas·splits <= 2·SMs) and gives every split at least two key tiles (so its cp.async
    pipeline has something to overlap), or 1 if none does."""
    if ctas >= sms:
        return 1
    best = 1
    for s in sorted(available):
        if s > 1 and ctas * s <= 2 * sms and key_tiles >= 2 * s:
            best = s
    return best


def pack_split_count(ctas: int, key_tiles: int, sms: int, available) -> int | None:
    """Split count of a packed-GQA decode variant (seqlen_q = 1: the rows of a CTA are the q heads
    of one kv head, so K/V are read once): the fewest splits whose grid fills the SMs
    (ctas·splits >= SMs), else the most; each split keeps at least one key tile.  Packed variants
    always split (their partials are combined by LSE), so this never answers 1; None when no
    available count leaves every split a key tile.  Unlike :func:`split_count`, grids past two
    waves are fine: the alternative re-reads K/V once per q head (Hq/Hkv times the bytes; the H100
    ran B16 H32/8 Sk4096 D128 at 249 µs that way, SDPA 90 µs, 2026-11-24)."""
    ok = sorted(s for s in available if s > 1 and key_tiles >= s)
    if not ok:
        return None
    return next((s for s in ok if ctas * s >= sms), ok[-1])


def _split_pick(entries: list[dict], groups: int, rows: int, sk: int, sms: int) -> dict | None:
    """The split-KV entry for ``groups`` independent row sets of ``rows`` query rows each over
    ``sk`` keys, or None when :func:`split_count` says not to split."""
    if not entries:
        return None
    tm, tn = entries[0]["tile"]
    same = [e for e in entries if list(e["tile"]) == [tm, tn]]
    n = split_count(groups * -(-rows // tm), -(-sk // tn), sms, {e["splits"] for e in same})
    return next((e for e in same if e["splits"] == n), None) if n > 1 else None


# Decode family (attention/decode.py): dense problems with at most this many queries.
DECODE_MAX_SEQLEN_Q = 16
DECODE_ROWS = 16  # rows of one decode CTA: (query, q head) pairs of one kv head
_L2_BYTES = tuning._L2_BYTES


def decode_split_count(groups: int, key_tiles: int, kv_bytes: int, row_blocks: int, sms: int,
                       available, l2_bytes: int = _L2_BYTES) -> int:
    """Split-KV count of a decode-family variant for ``groups`` = batch · kv heads · row blocks
    CTAs per split (``row_blocks`` = ceil(Hq/Hkv · Sq / 16) per kv head) over ``key_tiles`` key
    tiles of ``kv_bytes`` K and V.  H100 (notes/attention-decode.md, 132 SMs, 2 CTAs
    per SM; the best split of every measured shape):
      * groups >= 3/4 of the SMs: 1 (B16 H32/8, 128 groups: split 2 ran 10.8 µs vs 8.3 at Sk512;
        B4 H32/32 Sk1024 28.5 vs 25.7);
      * fewer: the fewest splits, at least 2, that give more than SMs/4 CTAs, or more than
        SMs/2 when a kv head has several row blocks (each CTA reads the whole K/V): 64 CTAs for
        8, 16 or 32 groups (B4 H32/8 Sk4096: 2 splits 29.1 µs, 4 splits 30.7; B2 Sk16384: 4
        splits 50.0, 8 splits 52.7), 128 for 64 groups (B8 Sk1024: 10.0 vs 12.1 unsplit), 4 for
        B1 H32/8 Sq16 (58.5 µs, 2 splits 76.9);
      * every split keeps at least 2 key tiles (B1 Sk512, 8 tiles: 4 splits 6.4 µs, 8 splits 7.4);
      * when that is the largest cluster split (8), K/V fit in L2 and 32 splits keep 2 tiles each:
        32 (merged by the second kernel; B1 H32/8 Sk4096 10.1 µs vs 11.3, Sk8192 12.5 vs 15.8).
    ``available``: {splits: merged in a cluster?} of the built variants."""
    if groups * 4 >= 3 * sms:
        return 1
    target = sms // 2 if row_blocks > 1 else sms // 4
    fits = sorted(sp for sp in available if sp == 1 or key_tiles >= 2 * sp)
    cl = [sp for sp in fits if sp >= 2 and available[sp]]
    n = next((sp for sp in cl if groups * sp > target), cl[-1] if cl else 1)
    big = [sp for sp in fits if not available[sp] and sp > n]
    if cl and n == max(sp for sp in available if available[sp]) and kv_bytes <= l2_bytes and big:
        n = big[-1]
    return n


def decode_pick(entries: list[dict], decode: tuple, causal: bool, sms: int,
                l2_bytes: int = _L2_BYTES) -> dict | None:
    """The decode-family entry for a dense problem ``decode`` = (batch, Hq, Hkv, Sq, Sk), or None
    when the family does not serve it: Sq > 16, or Sq > 1 without causal masking (the family is
    built bottom-right causal; with one query that equals no mask).  Entries of one tile config
    (the preferred one where several are built), split count by :func:`decode_split_count`."""
    b, hq, hkv, sq, sk = decode
    entries = [e for e in entries if e.get("causal")]
    if not entries or sq > DECODE_MAX_SEQLEN_Q or (sq > 1 and not causal) or hkv <= 0:
        return None
    pref = [e for e in entries if e.get("preferred")] or entries
    tile = list(pref[0]["tile"])
    same = [e for e in pref if list(e["tile"]) == tile]
    row_blocks = -(-(hq // hkv) * sq // DECODE_ROWS)
    kv_bytes = 2 * b * sk * hkv * same[0]["head_dim"] * (2 if same[0]["dtype"] in ("bf16", "f16") else 4)
    avail = {int(e["kv_splits"]): e["cluster"][0] > 1 for e in same}
    groups = b * hkv * row_blocks
    n = decode_split_count(groups, -(-sk // tile[1]), kv_bytes, row_blocks, sms, avail, l2_bytes)
    # PDL: for the second-kernel split, and for a cluster split whose grid leaves half the SMs
    # idle (H100: B1-B4 -0.6 to -0.9 µs; grids of ~128 CTAs lost up to 18 %, DEFAULT's note).
    pdl = n > 1 and (not avail.get(n) or 2 * groups * n <= sms)
    fits = [e for e in same if int(e["kv_splits"]) == n]
    return next((e for e in fits if bool(e.get("pdl")) == pdl), fits[0] if fits else None)


def _more_waves(small: dict, big: dict, decode: tuple, sms: int) -> bool:
    """Whether the smaller query tile's grid needs more waves than the bigger one's, for variants
    that state their resident CTAs per SM (``ctas_per_sm``; others: False, the rule above alone).
    H100, sm90 family (1 CTA per SM; a 64-row CTA takes ~0.7x a 128-row one's time): B4 H32/8
    Sq128 Sk4096 causal ran 78.5 µs on 256 CTAs of 64 rows, 54.9 on 128 CTAs of 128 rows."""
    if "ctas_per_sm" not in small or "ctas_per_sm" not in big:
        return False
    b, hq, _, sq, _ = decode

    def waves(e):
        return -(-(b * hq * -(-sq // e["tile"][0])) // (sms * e["ctas_per_sm"]))

    return waves(small) > waves(big)


def select(candidates: list[dict], *, dtype: str, head_dim: int, causal: bool,
           varlen: bool, rows: int | None = None, sms: int = 132,
           decode: tuple[int, int, int, int, int] | None = None, tuned: str | None = None) -> dict:
    """The manifest entry that implements this problem on the best target (candidates come
    best-target first); within that target, the family's preferred tile, unless its grid
    (rows / tile_m CTAs) leaves SMs idle and a variant with a smaller query tile exists: then the
    smallest tile_m (measured on the H100: B1 H8 S512 D64 runs 32 CTAs of 128 rows on 132 SMs).
    ``decode`` = (batch, Hq, Hkv, seqlen_q, seqlen_k) of a dense problem: when split-KV variants
    exist and :func:`split_count` says the grid needs them, the split variant instead; for
    seqlen_q == 1 with GQA, the packed one (rows = the q-heads of one kv head, so B·Hkv CTAs per
    split; built non-causal, which equals bottom-right causal for one query).  Split and packed
    variants come from the best target that has them (the sm90 family has none, so on a 9.0
    device decode shapes keep the sm_90 build's).  A variant whose manifest entry names a
    ``min_seqlen_q`` serves only dense problems with at least that many queries (the sm90
    family's 64-row warpgroup slabs are padding for fewer); below it the next target's choice.
    Variants that state ``ctas_per_sm`` take the smaller tile only if its grid needs no more
    waves than the preferred tile's (:func:`_more_waves`).  ``tuned``: the name the bundle's tuning
    table measured fastest for this dense problem's bucket; taken when it is among the variants
    left after the decode rules and the min_seqlen_q filter (any target), before the tile rule.
    Before all of this, a dense problem with at most 16 queries takes the decode family (manifest
    ``decode_rows``) where :func:`decode_pick` finds a variant; that family is never taken by the
    rules above."""
    fit = [e for e in candidates
           if e.get("dtype") == dtype and e.get("head_dim") == head_dim
           and bool(e.get("varlen")) == varlen]
    if decode is not None and not varlen:
        e = decode_pick([e for e in fit if e.get("decode_rows")], decode, causal, sms)
        if e is not None:
            return e
    fit = [e for e in fit if not e.get("decode_rows")]
    if fit and decode is not None and not varlen:
        b, hq, hkv, sq, sk = decode
        top = next((e.get("target") for e in fit if e.get("splits", 1) > 1), None)
        if sq == 1 and hq > hkv:
            pack = [e for e in fit if e.get("pack_gqa") and e.get("target") == top]
            if pack:
                tn = pack[0]["tile"][1]
                n = pack_split_count(b * hkv * -(-(hq // hkv) // pack[0]["tile"][0]), -(-sk // tn), sms,
                                     {e["splits"] for e in pack if e["tile"][1] == tn})
                e = next((e for e in pack if e["splits"] == n and e["tile"][1] == tn), None)
                if e is not None:
                    return e
        split = [e for e in fit if e.get("splits", 1) > 1 and not e.get("pack_gqa")
                 and bool(e.get("causal")) == causal and e.get("target") == top]
        e = _split_pick(split, b * hq, sq, sk, sms)
        if e is not None:
            return e
    fit = [e for e in fit if bool(e.get("causal")) == causal]
    if decode is not None and not varlen:
        fit = [e for e in fit if decode[3] >= e.get("min_seqlen_q", 0)] or fit
    if tuned is not None:
        e = next((e for e in fit if e["name"] == tuned and e.get("splits", 1) == 1), None)
        if e is not None:
            return e
    if fit:
        best = [e for e in fit if e.get("target") == fit[0].get("target")]
        best = [e for e in best if e.get("splits", 1) == 1] or best
        preferred = next((e for e in best if e.get("preferred")), best[0])
        if rows is not None and rows < preferred["tile"][0] * sms:
            smaller = [e for e in best if e["tile"][0] < preferred["tile"][0]
                       and e["tile"][1] == preferred["tile"][1] and e["stages"] == preferred["stages"]]
            if smaller:
                small = min(smaller, key=lambda e: e["tile"][0])
                if decode is not None and _more_waves(small, preferred, decode, sms):
                    return preferred
                return small
        return preferred
    have = sorted({(e.get("dtype"), e.get("head_dim"), bool(e.get("causal")), bool(e.get("varlen")))
                   for e in candidates})
    raise NoVariantError(
        f"no attention kernel in this bundle for dtype={dtype} head_dim={head_dim} causal={causal} "
        f"varlen={varlen} on this device; available (dtype, head_dim, causal, varlen): {have}")


# --- checks ---------------------------------------------------------------------------------------
def _check_common(torch, q, k, v, varlen: bool) -> None:
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
        _check_strides(t, name)


def _check_strides(t, name: str) -> None:
    if t.numel() == 0:
        return
    vec = 16 // t.element_size()
    if t.stride(-1) != 1:
        raise InputError(f"{name}: head_dim must be contiguous (stride 1), strides {t.stride()}")
    bad = [s for s in t.stride()[:-1] if s % vec]
    if bad:
        raise InputError(f"{name}: strides {t.stride()} must be multiples of {vec} elements "
                         f"(16 bytes) except the last")
    if t.data_ptr() % 16:
        raise InputError(f"{name}: data pointer must be 16-byte aligned")


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
