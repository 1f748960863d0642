"""Attention over a KV cache (paged or dense), FlashAttention's ``flash_attn_with_kvcache``
conventions: argument checks, variant choice, launch.  No DSL import.

The kernels take the arguments of ``contract.signature_kvcache`` (factory/attention/contract.py):
  q (B,Sq,Hq,D), k_cache/v_cache (P,PS,Hkv,D) [dense: (B,Sk,Hkv,D)], o, lse (B,Hq,Sq) f32,
  block_table (B,MP) i32, cache_seqlens (B,) i32, sinks (Hq,) f32, kv_descale (2,Hkv) f32
  [e4m3 caches: k_descale (Hkv,) f32, v_descale (Hkv,) f32, the caller's tensors as zero-stride
  (per tensor) or per-head views], softmax_scale, softcap, window_left, window_right
A variant whose switch is off ignores the matching argument; this module passes a cached dummy
where the caller gave none (a (B,1) block table, -inf sinks, unit descales).

Selection is the host library's ``fx_attention_kvcache_select`` (csrc/fx_select.c: the families
in order, best first, each with its rule; the first that answers wins), called once per problem
key through runtime/selector.py; this module only says, on a refusal, what the bundle lacks.

The choice depends on shapes and switches only (batch, heads, seqlen_q, the cache's capacity
max_pages · page_size), never on the cached lengths, so it is fixed for a CUDA graph: a call
reads nothing on the host, and :func:`plan` makes the choice once, ahead of capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import counters as _counters
from . import devmem, validate
from .attention import split_workspace
from .bundle import BundleCore, not_current
from .errors import LaunchError

DECODE_MAX_SEQLEN_Q = 16  # the sm90_decode family's queries per sequence
from .errors import InputError, NoVariantError

OP = "attention_kvcache"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
# q of e4m3 (with q_descale, over an e4m3 cache): fp8 attention, bfloat16 o
_Q_DTYPES = {**_DTYPES, torch.float8_e4m3fn: "e4m3"}
_KV_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float8_e4m3fn: "e4m3"}
HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 8, 16, 32, 64, 128, 256)  # (= contract.PAGE_SIZES; the runtime imports no factory code)
_GRID_YZ_MAX = 65535


@dataclass(frozen=True)
class Problem:
    """What the selection sees of a call: shapes, dtypes and switches (no data)."""

    batch: int
    seqlen_q: int  # dense q: Sq; packed varlen q: max_seqlen_q
    heads_q: int
    heads_kv: int
    head_dim: int
    max_seqlen_k: int  # the cache's capacity per sequence: max_pages · page_size, or the dense Sk
    dtype: str
    kv_dtype: str
    page_size: int | None  # None: dense cache
    causal: bool
    local: bool
    softcap: bool
    sinks: bool
    varlen_q: bool = False

    def describe(self) -> str:
        cache = f"paged page_size={self.page_size}" if self.page_size else "dense cache"
        sw = [n for n in ("local", "softcap", "sinks") if getattr(self, n)]
        return (f"dtype={self.dtype} kv_dtype={self.kv_dtype} head_dim={self.head_dim} {cache} "
                f"seqlen_q={self.seqlen_q} causal={self.causal} varlen_q={self.varlen_q}"
                + (f" with {'/'.join(sw)}" if sw else ""))


def _admits(e: dict, p: Problem) -> bool:
    """Whether variant ``e`` implements problem ``p``: dtypes, head_dim, cache layout, page size,
    q form, and every switch the call needs (a variant with a switch on also serves calls that
    leave it off)."""
    if (e.get("dtype") != p.dtype or e.get("kv_dtype") != p.kv_dtype or e.get("head_dim") != p.head_dim
            or bool(e.get("varlen")) != p.varlen_q or bool(e.get("paged")) != (p.page_size is not None)):
        return False
    if p.page_size is not None:
        sizes = e.get("page_sizes") or ([e["page_size"]] if e.get("page_size") else [])
        if p.page_size not in sizes:
            return False
    # One query per sequence: bottom-right causal hides nothing, so either build serves.
    if bool(e.get("causal")) != p.causal and p.seqlen_q > 1:
        return False
    return all(e.get(s) or not getattr(p, s) for s in ("local", "softcap", "sinks"))


def kvcache_problem(p: Problem):
    """The C selection's problem (csrc/fx_api.h ``fx_attention_kvcache_problem_t``) for ``p``:
    compact strides, no pointers (the selection reads only their alignment), and stand-in
    pointers where a switch needs an argument to be present (sinks with any switch, descales for
    fp8 caches); packed q (``varlen_q``) with ``seqlen_q`` as its max_seqlen_q."""
    from .selector import DTYPE, KVCacheProblem

    # sizes at least 1: an empty problem launches nothing, and the C selection chooses nothing for it
    b, sq, hq, hkv, d = max(p.batch, 1), max(p.seqlen_q, 1), p.heads_q, p.heads_kv, p.head_dim
    c = KVCacheProblem()
    c.dtype, c.kv_dtype = DTYPE[p.dtype], DTYPE[p.kv_dtype]
    c.batch, c.seqlen_q, c.heads_q, c.heads_kv, c.head_dim = b, sq, hq, hkv, d
    if p.page_size is not None:
        c.page_size, c.max_pages = p.page_size, max(1, p.max_seqlen_k // p.page_size)
        c.num_pages, c.block_table_stride = max(1, b * c.max_pages), c.max_pages
    else:
        c.page_size, c.max_pages, c.num_pages = p.max_seqlen_k, 0, b
    c.q_stride[:] = c.o_stride[:] = [sq * hq * d, hq * d, d]
    if p.varlen_q:  # packed q: seqlen_q is the token count (any count >= the longest sequence)
        c.varlen_q, c.max_seqlen_q = 1, sq
        c.seqlen_q = sq * max(b, 1)
        c.q_stride[0] = c.o_stride[0] = 0
    c.k_stride[:] = c.v_stride[:] = [c.page_size * hkv * d, hkv * d, d]
    c.causal = int(p.causal)
    c.window_left = c.window_right = -1
    if p.local:
        c.window_left = 1 << 20
    c.softcap = 1.0 if p.softcap else 0.0
    if p.local or p.softcap or p.sinks:
        c.sinks = 256
    if p.kv_dtype == "e4m3":
        c.kv_descale = 512
    return c


def _missing(candidates: list[dict], p: Problem) -> str:
    """What the bundle lacks for ``p``: the first filter that leaves nothing."""
    msg = f"no attention_kvcache kernel in this bundle for {p.describe()}"
    if not candidates:
        return msg + ": the bundle has no attention_kvcache variant for this device"
    steps = [
        ("dtype/kv_dtype", lambda e: e.get("dtype") == p.dtype and e.get("kv_dtype") == p.kv_dtype),
        ("head_dim", lambda e: e.get("head_dim") == p.head_dim),
        ("cache layout (paged/dense)", lambda e: bool(e.get("paged")) == (p.page_size is not None)),
        ("page size", lambda e: p.page_size is None or p.page_size in (e.get("page_sizes") or [])),
        ("q form (dense/varlen)", lambda e: bool(e.get("varlen")) == p.varlen_q),
        ("causal", lambda e: bool(e.get("causal")) == p.causal or p.seqlen_q == 1),
        ("window/softcap/sinks switches", lambda e: all(e.get(s) or not getattr(p, s)
                                                        for s in ("local", "softcap", "sinks"))),
    ]
    left = candidates
    for what, keep in steps:
        nxt = [e for e in left if keep(e)]
        if not nxt:
            have = sorted({str(_feature(e, what)) for e in left})
            return f"{msg}: no variant matches its {what} (the bundle has {', '.join(have)})"
        left = nxt
    fams = sorted({e.get("family") for e in left})
    return (f"{msg}: the variants that match ({', '.join(fams)}) do not serve seqlen_q={p.seqlen_q} "
            f"(the decode family takes at most {DECODE_MAX_SEQLEN_Q} queries)")


def _feature(e: dict, what: str):
    return {
        "dtype/kv_dtype": (e.get("dtype"), e.get("kv_dtype")), "head_dim": e.get("head_dim"),
        "cache layout (paged/dense)": "paged" if e.get("paged") else "dense",
        "page size": tuple(e.get("page_sizes") or ()), "q form (dense/varlen)": "varlen" if e.get("varlen") else "dense",
        "causal": e.get("causal"),
        "window/softcap/sinks switches": "/".join(s for s in ("local", "softcap", "sinks") if e.get(s)) or "none",
    }[what]


# --- plan: the choice made once, ahead of a CUDA-graph capture ------------------------------------
@dataclass(frozen=True)
class Plan:
    """A variant chosen for the maxima a server fixes at capture (batch, max pages, ...): pass it
    as ``plan=`` and a call only checks that its problem is the planned one.  ``workspace_bytes``:
    the fp32 split-KV workspace a call allocates (0 where the splits merge in a cluster).  A variant
    whose last split merges the others also takes the runtime's arrival counters (:func:`counters`),
    allocated by the first such call: make it before capturing a CUDA graph."""

    problem: Problem
    variant: str
    kv_splits: int
    workspace_bytes: int = 0


def plan(bundle, *, batch: int, seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int,
         max_seqlen_k: int | None = None, max_pages: int | None = None, page_size: int | None = None,
         dtype=torch.bfloat16, kv_dtype=None, causal: bool = True, window_size=(-1, -1),
         softcap: float = 0.0, sinks: bool = False, varlen_q: bool = False) -> Plan:
    """Choose the variant for these maxima once (no tensor, no device work): a paged cache gives
    ``page_size`` and ``max_pages`` (the block table's width), a dense one ``max_seqlen_k``."""
    for n, v in (("batch", batch), ("seqlen_q", seqlen_q), ("heads_q", heads_q), ("heads_kv", heads_kv),
                 ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"plan: {n} must be a non-negative int, got {v!r}")
    if page_size is not None:
        if page_size not in PAGE_SIZES:
            raise InputError(f"page size {page_size} not offered (one of {PAGE_SIZES})")
        if not isinstance(max_pages, int) or max_pages < 1:
            raise InputError("plan: a paged cache needs max_pages >= 1 (the block table's width)")
        max_seqlen_k = max_pages * page_size
    elif not isinstance(max_seqlen_k, int) or max_seqlen_k < 0:
        raise InputError("plan: a dense cache needs max_seqlen_k (its second dimension)")
    p = _problem(batch, seqlen_q, heads_q, heads_kv, head_dim, max_seqlen_k, _dtype_name(dtype, _Q_DTYPES, "dtype"),
                 _dtype_name(kv_dtype or dtype, _KV_DTYPES, "kv_dtype"), page_size, causal,
                 _window(window_size, causal), _softcap(softcap) > 0.0, bool(sinks), varlen_q)
    e = choose(bundle, p)
    ws = int(e.get("splits", 1))
    ws = ws * p.batch * p.heads_q * p.seqlen_q * (p.head_dim + 1) * 4 if ws > 1 else 0
    return Plan(p, e["name"], int(e.get("kv_splits", 1)), ws)


def _dtype_name(dt, table, what) -> str:
    if dt not in table:
        raise InputError(f"{what} {dt} not supported ({', '.join(str(t).removeprefix('torch.') for t in table)})")
    return table[dt]


def _problem(b, sq, hq, hkv, d, sk, dtype, kv_dtype, page_size, causal, window, softcap_on, sinks_on, varlen_q):
    if dtype == "e4m3" and kv_dtype != "e4m3":
        raise InputError(f"float8_e4m3fn q (fp8 attention) needs a float8_e4m3fn cache, got {kv_dtype}")
    if d not in HEAD_DIMS:
        raise InputError(f"head_dim {d} not supported (one of {HEAD_DIMS})")
    if hkv == 0 or hq % hkv:
        raise InputError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    wl, wr = window
    local = wl >= 0 or (wr >= 0 and not causal)
    return Problem(b, sq, hq, hkv, d, sk, dtype, kv_dtype, page_size, bool(causal), local, softcap_on, sinks_on,
                   bool(varlen_q))


def choose(bundle, p: Problem) -> dict:
    """The selected manifest entry for ``p``: the host library's ``fx_attention_kvcache_select``
    (the one selection implementation, csrc/fx_select.c), cached in the bundle's ``selections``;
    NoVariantError saying what the bundle lacks."""
    cache = getattr(bundle, "selections", None)
    if cache is None:  # a stand-in bundle (tests): no cache
        cache = {}
    key = (OP, p)
    e = cache.get(key)
    if e is None and p.dtype == "e4m3":
        e = _fp8_q(bundle, p)
        cache[key] = e
    if e is None:
        try:
            e = bundle.manifest["variants"][bundle.selector.select(OP, kvcache_problem(p)).name.decode()]
        except NoVariantError:
            raise NoVariantError(f"{_missing(bundle.candidates(OP), p)} (on {bundle.device_name()}; "
                                 f"{bundle.describe_contents(OP)}{_blackwell_note(bundle)})") from None
        if len(cache) > 4096:
            cache.clear()
        cache[key] = e
    return e


def _fp8_q(bundle, p: Problem) -> dict:
    """e4m3 q (the C problem has no q_descale, so no C selection): among the variants that admit
    ``p`` (the sm90 family's fp8-WGMMA builds), the one taking the fewest page sizes (the largest
    page boxes), then the preferred tile, then the name."""
    cands = [e for e in bundle.candidates(OP) if _admits(e, p)]
    if not cands:
        raise NoVariantError(f"{_missing(bundle.candidates(OP), p)} (on {bundle.device_name()}; "
                             f"{bundle.describe_contents(OP)}{_blackwell_note(bundle)})")
    return min(cands, key=lambda e: (len(e.get("page_sizes") or ()), not e.get("preferred"), e["name"]))


def _blackwell_note(bundle) -> str:
    cap = getattr(bundle, "capability", None)
    if cap and cap[0] >= 10:
        return ("; Blackwell has no attention_kvcache kernel yet: the sm100 attention (FA4 structure) "
                "would take page tables through per-row TMA gathers or cp.async page loads in its load "
                "warp, per-sequence key counts from cache_seqlens, and the decode rows packed per kv head")
    return ""


# --- checks ----------------------------------------------------------------------------------------
def _window(window_size, causal) -> tuple[int, int]:
    try:
        wl, wr = window_size
    except (TypeError, ValueError):
        raise InputError(f"window_size must be a (left, right) pair of ints, got {window_size!r}") from None
    for w in (wl, wr):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise InputError(f"window_size entries must be ints >= -1 (-1: unbounded), got {window_size!r}")
    if wl > 2**31 - 1 or wr > 2**31 - 1:
        raise InputError(f"window_size {window_size!r} exceeds int32")
    return wl, wr


def _softcap(softcap) -> float:
    try:
        c = float(softcap)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"softcap must be a number, got {type(softcap).__name__}") from None
    if not (c >= 0.0 and math.isfinite(c)):
        raise InputError(f"softcap must be a finite number >= 0 (0: off), got {c}")
    return c


def _scale(softmax_scale, d) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    try:
        s = float(softmax_scale)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"softmax_scale must be a number, got {type(softmax_scale).__name__}") from None
    if not (s > 0.0 and math.isfinite(s)):
        raise InputError(f"softmax_scale must be a positive finite number, got {s}")
    return s


def _strides(t, name: str, data: bool) -> None:
    """head_dim contiguous, other strides multiples of 16 bytes, 16-byte aligned data (``data``:
    the pointer is read; a fake tensor has none)."""
    if t.numel() == 0:
        return
    vec = 16 // t.element_size()
    if t.stride(-1) != 1:
        raise InputError(f"{name}: head_dim must be contiguous (stride 1), strides {t.stride()}")
    if any(s % vec for s in t.stride()[:-1]):
        raise InputError(f"{name}: strides {t.stride()} must be multiples of {vec} elements (16 bytes) "
                         f"except the last")
    if data and t.data_ptr() % 16:
        raise InputError(f"{name}: data pointer must be 16-byte aligned")


def _small(t, name: str, dtype, shape: tuple, dev) -> None:
    if not isinstance(t, Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise InputError(f"{name} must be {str(dtype).removeprefix('torch.')}, got {str(t.dtype).removeprefix('torch.')}")
    if t.device != dev:
        raise InputError(f"{name} is on {t.device}, q on {dev}: every tensor must be on one device")
    if tuple(t.shape) != shape:
        raise InputError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def check(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, window_size, softcap, sinks,
          k_descale, v_descale, out, cu_seqlens_q, max_seqlen_q, *, data: bool = True,
          q_descale=None) -> tuple[Problem, float]:
    """Every check that needs no device data, in the order docs/errors.md lists them; returns the
    problem and the softmax scale.  ``data=False`` (fake tensors, torch.compile): no pointer read."""
    validate.tensors(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        if q.dim() != 3:
            raise InputError(f"q with cu_seqlens_q must be (total_q, heads, head_dim), got shape {tuple(q.shape)}")
    elif q.dim() != 4:
        raise InputError(f"q must be (batch, seqlen_q, heads, head_dim), got shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise InputError(f"{name} must be (num_pages, page_size, kv_heads, head_dim) or (batch, max_seqlen, "
                             f"kv_heads, head_dim), got shape {tuple(t.shape)}")
    if q.dtype not in _Q_DTYPES:
        raise InputError(f"q dtype {q.dtype} not supported (bfloat16, float16; float8_e4m3fn with an e4m3 cache)")
    if k_cache.dtype != v_cache.dtype:
        raise InputError(f"k_cache and v_cache dtypes differ: {k_cache.dtype}, {v_cache.dtype}")
    q8 = q.dtype == torch.float8_e4m3fn
    if q8 and k_cache.dtype != torch.float8_e4m3fn:
        raise InputError(f"float8_e4m3fn q (fp8 attention) needs a float8_e4m3fn cache, got {k_cache.dtype}")
    if k_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise InputError(f"k_cache/v_cache dtype {k_cache.dtype} must be q's ({q.dtype}) or float8_e4m3fn")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    d, hq, hkv = q.shape[-1], q.shape[-2], k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise InputError(f"head_dim of q ({d}) and k_cache/v_cache ({k_cache.shape[3]}) differ")
    dev = q.device
    if varlen_q:
        if not isinstance(cu_seqlens_q, Tensor) or cu_seqlens_q.dtype != torch.int32 or cu_seqlens_q.dim() != 1 \
                or cu_seqlens_q.numel() < 1:
            raise InputError("cu_seqlens_q must be a 1-D int32 tensor of batch + 1 offsets")
        if cu_seqlens_q.device != dev:
            raise InputError(f"cu_seqlens_q is on {cu_seqlens_q.device}, q on {dev}")
        b = cu_seqlens_q.numel() - 1
        if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or not 0 <= max_seqlen_q <= q.shape[0]:
            raise InputError(f"packed varlen q needs an int max_seqlen_q in [0, {q.shape[0]}] (no host sync "
                             f"computes it), got {max_seqlen_q!r}")
        if max_seqlen_q == 0 and q.shape[0] > 0 and b > 0:
            raise InputError(f"max_seqlen_q = 0: with {q.shape[0]} query tokens in {b} sequences it must be at "
                             f"least 1 (the longest query sequence)")
        sq = max_seqlen_q
    else:
        if max_seqlen_q is not None:
            raise InputError("max_seqlen_q goes with cu_seqlens_q (packed varlen q) only")
        b, sq = q.shape[0], q.shape[1]
    _small(cache_seqlens, "cache_seqlens", torch.int32, (b,), dev)
    if block_table is not None:
        if not isinstance(block_table, Tensor):
            raise InputError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
        if block_table.dtype != torch.int32:
            raise InputError(f"block_table must be int32, got {str(block_table.dtype).removeprefix('torch.')}")
        if block_table.device != dev:
            raise InputError(f"block_table is on {block_table.device}, q on {dev}: every tensor must be on one device")
        if block_table.dim() != 2 or block_table.shape[0] != b or block_table.shape[1] < 1:
            raise InputError(f"block_table must be (batch={b}, max_pages >= 1), got shape {tuple(block_table.shape)}")
        if block_table.stride(1) != 1 and block_table.shape[1] > 1:
            raise InputError(f"block_table rows must be contiguous (stride 1), strides {block_table.stride()}")
        page_size = k_cache.shape[1]
        if page_size not in PAGE_SIZES:
            raise InputError(f"page size {page_size} (k_cache.shape[1]) not offered: one of {PAGE_SIZES}")
        if k_cache.shape[0] < 1:
            raise InputError("a paged k_cache needs at least one page")
        max_k = block_table.shape[1] * page_size
    else:
        page_size = None
        if k_cache.shape[0] != b:
            raise InputError(f"a dense cache (no block_table) must be (batch={b}, max_seqlen, kv_heads, head_dim), "
                             f"got shape {tuple(k_cache.shape)}")
        max_k = k_cache.shape[1]
    if k_cache.device != dev or v_cache.device != dev:
        raise InputError(f"k_cache on {k_cache.device}, v_cache on {v_cache.device}, q on {dev}: every tensor "
                         f"must be on one device")
    scale = _scale(softmax_scale, d)
    window = _window(window_size, causal)
    cap = _softcap(softcap)
    if sinks is not None:
        _small(sinks, "sinks", torch.float32, (hq,), dev)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if not fp8:
            raise InputError(f"{name} applies to float8_e4m3fn caches only (the cache is {k_cache.dtype})")
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or t.device != dev or t.numel() not in (1, hkv):
            raise InputError(f"{name} must be a float32 tensor on {dev} of 1 (per tensor) or {hkv} (per kv head) "
                             f"elements")
    if q_descale is not None:
        if not q8:
            raise InputError(f"q_descale applies to float8_e4m3fn q only (q is {q.dtype})")
        if not isinstance(q_descale, Tensor) or q_descale.dtype != torch.float32 or q_descale.device != dev \
                or not (q_descale.numel() == 1 or tuple(q_descale.shape) in ((hkv,), (b, hkv))):
            raise InputError(f"q_descale must be a float32 tensor on {dev} of 1 element (per tensor), ({hkv},) "
                             f"(per kv head) or ({b}, {hkv}) (per sequence and kv head)")
    o_dtype = torch.bfloat16 if q8 else q.dtype
    if out is not None:
        if not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != o_dtype or out.device != dev:
            raise InputError(f"out must be a tensor of q's shape {tuple(q.shape)} and device, dtype "
                             f"{str(o_dtype).removeprefix('torch.')}")
        _strides(out, "out", data)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _strides(t, name, data)
    if b > _GRID_YZ_MAX:
        raise InputError(f"batch ({b}) must be <= {_GRID_YZ_MAX}")
    p = _problem(b, sq, hq, hkv, d, max_k, _Q_DTYPES[q.dtype], _KV_DTYPES[k_cache.dtype], page_size, causal, window,
                 cap > 0.0, sinks is not None, varlen_q)
    return p, scale


def check_contents(cache_seqlens, block_table, num_pages: int, max_k: int) -> None:
    """The caller's contract, checked on the host (a device synchronisation): lengths in
    [0, capacity], and the pages a sequence uses in [0, num_pages)."""
    lens = cache_seqlens.cpu()
    if lens.numel() and int(lens.min()) < 0:
        raise InputError(f"cache_seqlens must be >= 0, has {int(lens.min())}")
    if lens.numel() and int(lens.max()) > max_k:
        i = int(lens.argmax())
        raise InputError(f"cache_seqlens[{i}] = {int(lens[i])} exceeds the cache's {max_k} rows per sequence")
    if block_table is not None:
        bt = block_table.cpu()
        ps = max_k // bt.shape[1]
        for i, n in enumerate(lens.tolist()):
            used = bt[i, : -(-n // ps)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_pages):
                raise InputError(f"block_table[{i}] holds a page index outside [0, {num_pages}) among the "
                                 f"{used.numel()} pages its {n} keys use")


# --- the op ---------------------------------------------------------------------------------------
_DUMMIES: dict = {}
# The arrival counters of the variants whose last split merges the others (manifest workspace form
# "counters"): the zeroed int32 words of runtime/counters.py, per device and stream (each kernel
# sets the ones it counts in back to 0; graphs: see there).
_COUNTERS_MIN = _counters.MIN_WORDS


def uses_counters(entry: dict) -> bool:
    """Whether a variant merges its splits by the last to arrive (takes the arrival counters)."""
    return (entry.get("workspace") or {}).get("form") == "counters"


def counters(dev, b: int, hq: int, sq: int, stream=None) -> Tensor:
    """The arrival counters for a (b, hq, sq) problem on ``dev`` launched on ``stream`` (a raw
    handle): a compact (b, hq, sq) int32 view of that stream's counter buffer (while a CUDA graph
    is captured, of that capture's words; runtime/counters.py)."""
    return _counters.zeroed(dev, b * hq * sq, stream)[0].view(b, hq, sq)


def counters_buffer(dev, stream=None) -> Tensor | None:
    """``stream``'s current arrival-counter buffer on ``dev`` (None before the first such launch):
    every word is zero whenever no kernel that counts in it is running."""
    return _counters.buffer(dev, stream)


def _dummy(kind: str, dev, n: int) -> Tensor:
    """Cached stand-ins for arguments a call leaves out: (n,) -inf sinks, (2, n) unit descales,
    a one-element block table (expanded to (B, 1) by the caller)."""
    key = (kind, dev, n)
    t = _DUMMIES.get(key)
    if t is None:
        value, dtype, shape = {"sinks": (-math.inf, torch.float32, (n,)), "descale": (1.0, torch.float32, (2, n))}.get(
            kind, (0, torch.int32, (1, 1)))
        if devmem.capturing(dev):  # (not kept: memory of the capture's pool, filled when the graph runs)
            return torch.full(shape, value, dtype=dtype, device=dev)
        if len(_DUMMIES) > 1024:
            _DUMMIES.clear()
        t = _DUMMIES[key] = devmem.full(math.prod(shape), value, dtype, dev, sync=True).view(shape)
    return t


def descale_view(t, dev, hkv: int) -> Tensor:
    """An e4m3 cache's k_descale / v_descale as the kernels take it: a (hkv,) view of the caller's
    tensor (checked: 1 or hkv float32 elements; stride 0 for one factor), or of a cached unit
    factor where the caller gave none.  No copy, no kernel."""
    if t is None:
        return _dummy("descale", dev, 1)[0].expand(hkv)
    return t.reshape(1).expand(hkv) if t.numel() == 1 else t.reshape(hkv)


def attention_kvcache(bundle, q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True,
                      softmax_scale=None, window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None,
                      v_descale=None, return_lse=False, out=None, cu_seqlens_q=None, max_seqlen_q=None,
                      plan=None, check_varlen=None, variant=None, q_descale=None, rotary_cos_sin=None,
                      rotary_interleaved=False):
    """softmax(q·Kᵀ·scale [masked]) · V over each sequence's first ``cache_seqlens[b]`` cached
    keys (see :func:`check` and docs/errors.md for every argument's contract).

    ``rotary_cos_sin`` (float32 (max_position, R), R/2 cosines then R/2 sines, R a multiple of 16 up
    to head_dim): q is rotated in the kernel's prologue before the scores (``rotary_interleaved``:
    GPT-J pairs, else GPT-NeoX halves; the first R columns of each head), query s of sequence b at
    position ``cache_seqlens[b] - seqlen_q + s`` (positions past the table read its last row); the
    cache must hold the keys already rotated (``rope_kvcache`` with ``q`` of zero heads rotates
    only k).  q itself is not written.  bf16/f16 caches, dense q; the variant is the rotary build
    of the one the selection takes (NoVariantError where the bundle lacks it); no hot path.  Returns o (q's
    shape, or ``out``), or (o, lse) with ``return_lse`` (lse float32 (B, Hq, Sq), the sink
    included).  ``cache_seqlens`` and ``block_table`` are read on the device only: indices and
    lengths past the cache are the caller's contract, checked on the host (a synchronisation)
    with ``check_varlen=True`` or ``FACTORY_CHECK_VARLEN=1``.

    Hot path: a call whose problem was seen before (the same shapes, strides, dtypes and devices
    of every tensor argument, the same options, plan and ``out`` layout) was checked in full then;
    it only checks what can differ between such calls (tensor types, autograd, the current device,
    the pointers' alignment), allocates o (unless ``out``) and lse (and a workspace-split
    variant's workspace), and launches.  Neither path reads ``cache_seqlens`` or ``block_table``
    on the host (unless ``check_varlen``).

    fp8 attention: q of float8_e4m3fn over an e4m3 cache with ``q_descale`` (1, (Hkv,) or (B, Hkv)
    float32; FlashAttention-3's convention), o bfloat16."""
    rope = rotary_cos_sin is not None or rotary_interleaved is not False
    fp8_q = isinstance(q, Tensor) and q.dtype == torch.float8_e4m3fn
    key = None if rope else _hot_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale,
                                     window_size, softcap, sinks, k_descale, v_descale, out, cu_seqlens_q, plan,
                                     check_varlen, variant, q_descale)
    if key is not None:
        try:
            fire = _hot(bundle).get(key)
        except TypeError:  # an unhashable plan or window entry: checked below
            key = fire = None
        if fire is not None and not ((q.requires_grad or k_cache.requires_grad or v_cache.requires_grad
                                      or (sinks is not None and sinks.requires_grad)) and torch.is_grad_enabled()):
            res = fire(q, k_cache, v_cache, cache_seqlens, block_table, sinks, k_descale, v_descale, out, q_descale)
            if res is not None:
                return res if return_lse else res[0]
            key = None  # a misaligned pointer: the checked path below names it
    p, scale = check(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, window_size, softcap,
                     sinks, k_descale, v_descale, out, cu_seqlens_q, max_seqlen_q, q_descale=q_descale)
    if rope:
        check_rotary(rotary_cos_sin, rotary_interleaved, p, q.device)
    dev = validate.one_device(bundle, q=q, k_cache=k_cache, v_cache=v_cache)
    validate.no_grad("attention_kvcache", q=q, k_cache=k_cache, v_cache=v_cache, sinks=sinks)
    if validate.check_varlen_default() if check_varlen is None else check_varlen:
        check_contents(cache_seqlens, block_table, k_cache.shape[0], p.max_seqlen_k)
        if cu_seqlens_q is not None:
            validate.cu_seqlens(cu_seqlens_q, cu_seqlens_q, q.shape[0], q.shape[0], max_seqlen_q)
    if variant is not None:  # (tests, benchmarks: one variant by name)
        e = bundle.manifest["variants"].get(variant) if isinstance(variant, str) else None
        if e is None or e.get("op") != OP or not _admits(e, p):
            raise NoVariantError(f"variant {variant!r} is not an attention_kvcache variant that implements "
                                 f"{p.describe()}")
        name = variant
    elif plan is not None:
        if not isinstance(plan, Plan):
            raise InputError(f"plan must come from bundle.plan_kvcache, got {type(plan).__name__}")
        if plan.problem != p:
            raise InputError(f"this call's problem ({p}) is not the planned one ({plan.problem})")
        name = plan.variant
    else:
        name = choose(bundle, p)["name"]
    if rope:
        name = rope_twin(bundle, name, rotary_interleaved, p)
    entry = bundle.manifest["variants"][name]
    splits = int(entry.get("splits", 1))
    last = splits > 1 and uses_counters(entry)
    if out is not None:
        o = out
    else:
        o = torch.empty_like(q, dtype=torch.bfloat16) if fp8_q else torch.empty_like(q)
    lse = torch.empty((p.batch, p.heads_q, p.seqlen_q) if not p.varlen_q else (p.heads_q, q.shape[0]),
                      dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return (o, lse) if return_lse else o
    bt = block_table if block_table is not None else _dummy("table", q.device, 1).expand(p.batch, 1)
    sk = sinks if sinks is not None else _dummy("sinks", q.device, p.heads_q)
    if p.kv_dtype == "e4m3":  # the caller's descales as (Hkv,) views (stride 0: per tensor), unit where left out
        desc = [descale_view(t, q.device, p.heads_kv) for t in (k_descale, v_descale)]
    else:  # (unread by bf16/f16 caches)
        desc = [_dummy("descale", q.device, p.heads_kv)]
    wl, wr = window_size
    args = [q, k_cache, v_cache, o, lse, bt, cache_seqlens]
    if splits > 1:  # the workspace of a split merged by the combine kernel or the last split (dense q only)
        args[5:5] = split_workspace(torch, q, splits)
        if last:
            args.insert(7, counters(q.device, p.batch, p.heads_q, p.seqlen_q, _counters.raw_stream(bundle, q.device)))
    if p.varlen_q:
        args.append(cu_seqlens_q)
    args.append(sk)
    if fp8_q:  # q_descale as (B, Hkv): a per-tensor or per-kv-head factor as a zero-stride view
        qd = q_descale if q_descale is not None else _dummy("descale", q.device, p.heads_kv)[0]
        if qd.numel() == 1:
            qd = qd.reshape(1, 1).expand(p.batch, p.heads_kv)
        elif qd.dim() == 1:
            qd = qd.reshape(1, p.heads_kv).expand(p.batch, p.heads_kv)
        args.append(qd)
    args += desc
    if rope:
        args.append(rotary_cos_sin)
    args += [scale, float(softcap), wl if wl >= 0 else -1, wr if wr >= 0 else -1]
    if p.varlen_q:
        args.append(max_seqlen_q)
    bundle.launch(name, args, device=dev)
    if key is not None and not p.varlen_q:
        fire = _hot_launch(bundle, name, splits, args, out is not None, k_descale, v_descale, dev,
                           last=last, fp8_q=fp8_q, fp8_kv=p.kv_dtype == "e4m3")
        if fire is not None:
            cache = _hot(bundle)
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = fire
    return (o, lse) if return_lse else o


ROPE_OP = "attention_kvcache_rope"


def check_rotary(cos_sin, interleaved, p: Problem, dev) -> None:
    """The rotary prologue's argument checks (no device data)."""
    if not isinstance(interleaved, bool):
        raise InputError(f"rotary_interleaved must be a bool, got {type(interleaved).__name__}")
    if cos_sin is None:
        raise InputError("rotary_interleaved needs rotary_cos_sin (float32 (max_position, rotary_dim))")
    if not isinstance(cos_sin, Tensor):
        raise InputError(f"rotary_cos_sin must be a torch.Tensor, got {type(cos_sin).__name__}")
    if cos_sin.dtype != torch.float32 or cos_sin.dim() != 2:
        raise InputError(f"rotary_cos_sin must be float32 (max_position, rotary_dim) (cosines then sines), got "
                         f"{str(cos_sin.dtype).removeprefix('torch.')} {tuple(cos_sin.shape)}")
    if cos_sin.device != dev:
        raise InputError(f"rotary_cos_sin is on {cos_sin.device}, q on {dev}: every tensor must be on one device")
    r = cos_sin.shape[1]
    if r == 0 or r % 16 or r > p.head_dim:
        raise InputError(f"rotary_dim {r} must be a positive multiple of 16 and at most head_dim {p.head_dim}")
    if cos_sin.shape[0] == 0:
        raise InputError("rotary_cos_sin has no positions")
    if cos_sin.shape[0] > 1 and (cos_sin.stride(1) != 1 or cos_sin.stride(0) % 4):
        raise InputError(f"rotary_cos_sin's rows must be contiguous and start 16-byte aligned (row stride a "
                         f"multiple of 4), strides {cos_sin.stride()}")
    if cos_sin.data_ptr() % 16:
        raise InputError("rotary_cos_sin must start 16-byte aligned")
    if p.varlen_q:
        raise InputError("rotary_cos_sin takes dense q (batch, seqlen_q, heads, head_dim), not packed varlen q")
    if p.kv_dtype != p.dtype:
        raise NoVariantError(f"the rotary prologue is built for {p.dtype} caches, not {p.kv_dtype}")


def rope_twin(bundle, name: str, interleaved: bool, p: Problem) -> str:
    """The rotary-prologue build of KV-cache variant ``name`` (``attention_kvcache_rope`` + the
    same fields; ``_gptj`` for interleaved pairs), or NoVariantError."""
    twin = ROPE_OP + name.removeprefix(OP) + ("_gptj" if interleaved else "")
    e = bundle.manifest["variants"].get(twin)
    if e is None or e.get("op") != ROPE_OP:
        raise NoVariantError(f"no rotary-prologue build ({'interleaved' if interleaved else 'neox'}) of {name} "
                             f"in this bundle for {p.describe()}; build the {ROPE_OP} op")
    return twin


# --- the hot path ---------------------------------------------------------------------------------
def _meta(t):
    """A tensor argument's part of the hot key: everything the checks read except its data."""
    return None if t is None else (type(t), t.shape, t.stride(), t.dtype, t.device)


_PLAIN = (bool, int, float, type(None))


def _hot_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, window_size, softcap, sinks,
             k_descale, v_descale, out, cu_seqlens_q, plan, check_varlen, variant, q_descale=None):
    """The hot path's problem key, or None where the call must take the checked path: packed
    varlen q, a variant by name, host-side content checks, options that are not plain numbers,
    arguments that are not tensors."""
    if cu_seqlens_q is not None or variant is not None or check_varlen \
            or (check_varlen is None and validate.check_varlen_default()):
        return None
    if type(causal) not in _PLAIN or type(softmax_scale) not in _PLAIN or type(softcap) not in _PLAIN \
            or type(window_size) is not tuple:
        return None
    try:
        return (_meta(q), _meta(k_cache), _meta(v_cache), _meta(cache_seqlens), _meta(block_table), _meta(sinks),
                _meta(k_descale), _meta(v_descale), _meta(out), causal, softmax_scale, window_size, softcap, plan,
                _meta(q_descale))
    except AttributeError:  # not tensors: the checked path says which
        return None


_NO_CACHE: dict = {}  # (a stand-in bundle's hot path: never filled, see _hot_launch)


def _hot(bundle) -> dict:
    try:
        return bundle.hot_kvcache
    except AttributeError:
        return _NO_CACHE


def _hot_launch(bundle, name: str, splits: int, args: list, has_out: bool, k_descale, v_descale,
                dev: int, last: bool = False, fp8_q: bool = False, fp8_kv: bool = False):
    """``fire(q, k_cache, v_cache, cache_seqlens, block_table, sinks, k_descale, v_descale, out,
    q_descale)``
    for the problem just launched (and so checked) with ``args``: the sizes, strides and scalars
    are fixed (:meth:`BundleCore.fixed`); a call writes the data pointers, allocates o (unless
    ``out``), lse (and a workspace split's workspace), and launches.  Returns (o, lse), or None
    without launching when a pointer breaks its alignment (the checked path then names it).
    The dummies (a (B, 1) block table, -inf sinks, unit descales) are this closure's own
    references.  ``fp8_kv``: the variant takes k_descale and v_descale (the caller's pointers, whose
    shapes and strides the hot key fixed), else the one (2, Hkv) stand-in.  None instead of ``fire`` when the variant was not loaded by that launch (a
    stand-in launch in tests)."""
    specs = [a if isinstance(a, (int, float)) else (a.data_ptr(), tuple(a.shape), tuple(a.stride())) for a in args]
    fixed = bundle.fixed(name, specs) if isinstance(bundle, BundleCore) else None
    if fixed is None:
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    q, o, lse = args[0], args[3], args[4]
    at = (8 if last else 7) if splits > 1 else 5
    bt_arg, sk_arg = args[at], args[at + 2]
    kd_arg = args[at + 3 + fp8_q]
    vd_arg = args[at + 4 + fp8_q] if fp8_kv else None
    # e4m3 q: its q_descale (B, Hkv) view between the sinks and the cache descales, o bfloat16
    qd_arg = args[at + 3] if fp8_q else None
    o_dtype = torch.bfloat16 if fp8_q else q.dtype
    empty_like = torch.empty_like
    one = devmem.proto(torch.float32, q.device)
    lproto = one.expand(lse.shape)  # empty_like of a zero-stride view: a new compact tensor
    if empty_like(lproto).stride() != lse.stride() or (not has_out and empty_like(q, dtype=o_dtype).stride()
                                                       != o.stride()):
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layouts")
    # Arguments the caller left out: the dummies this launch used (fixed pointers).
    bt_dummy = bt_arg.data_ptr()  # (read only where the key's block_table is None: then the dummy)
    sk_dummy = sk_arg.data_ptr()
    kd_dummy = kd_arg.data_ptr()  # (read only where the key's k_descale is None, or for bf16/f16 caches)
    vd_dummy = vd_arg.data_ptr() if fp8_kv else None  # (read only where the key's v_descale is None)
    cnt_arg = args[7] if last else None  # the arrival counters of the checked launch's stream
    qd_dummy = qd_arg.data_ptr() if fp8_q else None  # (read only where the key's q_descale is None)
    # the dummies among them stay alive as long as this closure (never the caller's tensors: one made
    # in a CUDA-graph pool and kept here would stay alive past its graph's capture)
    dummy_ptrs = {t.data_ptr() for t in _DUMMIES.values()}
    keep = tuple(t for t in (bt_arg, sk_arg, kd_arg, vd_arg, qd_arg) if t is not None and t.data_ptr() in dummy_ptrs)
    wproto = lse_at = None
    # the arrival counters per call: the stream's words (runtime/counters.py), found once per stream
    cnt_ptr = _counters.StreamWords(q.device, cnt_arg.numel() if last else 0).ptr
    if splits > 1:
        ws = args[5]
        n = ws.numel()
        wproto, lse_at = one.expand(n + args[6].numel()), n * 4  # split_workspace's one allocation

    def fire(q, k_cache, v_cache, cache_seqlens, block_table, sinks, k_descale, v_descale, out, q_descale=None):
        o = empty_like(q, dtype=o_dtype) if out is None else out
        lse = empty_like(lproto)
        here = cur()
        if here != dev:
            not_current(dev, here)
        bt = bt_dummy if block_table is None else block_table.data_ptr()
        sk = sk_dummy if sinks is None else sinks.data_ptr()
        if fp8_kv:  # (the kernel's (Hkv,) views start at the caller's pointers)
            kd = kd_dummy if k_descale is None else k_descale.data_ptr()
            vd = vd_dummy if v_descale is None else v_descale.data_ptr()
            if fp8_q:  # (no split builds take e4m3 q)
                qd = qd_dummy if q_descale is None else q_descale.data_ptr()
                err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), bt,
                         cache_seqlens.data_ptr(), sk, qd, kd, vd, raw(here))
            elif wproto is None:
                err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), bt,
                         cache_seqlens.data_ptr(), sk, kd, vd, raw(here))
            elif cnt_arg is None:
                w = empty_like(wproto).data_ptr()
                err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), w,
                         w + lse_at, bt, cache_seqlens.data_ptr(), sk, kd, vd, raw(here))
            else:
                w = empty_like(wproto).data_ptr()
                s = raw(here)
                err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), w,
                         w + lse_at, cnt_ptr(s), bt, cache_seqlens.data_ptr(), sk, kd, vd, s)
        elif wproto is None:
            err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), bt,
                     cache_seqlens.data_ptr(), sk, kd_dummy, raw(here))
        elif cnt_arg is None:
            w = empty_like(wproto).data_ptr()
            err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), w,
                     w + lse_at, bt, cache_seqlens.data_ptr(), sk, kd_dummy, raw(here))
        else:
            w = empty_like(wproto).data_ptr()
            s = raw(here)
            err = go(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(), w,
                     w + lse_at, cnt_ptr(s), bt, cache_seqlens.data_ptr(), sk, kd_dummy, s)
        if err != 0:
            if err is None:
                return None
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return o, lse
    fire.fixed = fixed  # (for scripts/launch_overhead.py's breakdown)
    fire.keep = keep
    return fire


# --- bundle.attention with a window, softcap or sinks: the attention_kvcache kernels ---------------
_PAGE_PREFERENCE = (64, 128, 256, 32, 16, 8, 1)  # page views of a dense k/v, the TMA-box size first


def _kept(bundle, key: tuple, make, tracing: bool) -> Tensor:
    """``make()``, kept in the bundle's per-process cache under ``key`` (one made while a CUDA graph
    is captured, or under torch.compile, is not kept: its memory is the graph's / a fake)."""
    t = None if tracing else bundle.selections.get(key)
    if t is None:
        t = make()
        if not tracing and not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            bundle.selections[key] = t
    return t


def attention_switches(bundle, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, return_lse, check_varlen, window_size, softcap, sinks, tracing=False):
    """``bundle.attention`` with a sliding window, a softcap or sinks: the attention_kvcache kernels
    (which build these switches) over k and v viewed as a paged cache, without a copy.

    Dense q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) whose batch and sequence dimensions merge: pages of
    the largest of 64, 128, 256, 32, 16, 8, 1 rows that divides Sk, the block table row b holding
    b's pages in order, every length Sk (tables and lengths kept per device and shape).  Packed
    (cu_seqlens_q/k): one-row pages, the table of sequence b starting at row cu_seqlens_k[b], the
    lengths cu_seqlens_k[b+1] - cu_seqlens_k[b] (two small device ops per call; ``max_seqlen_k``
    sizes the table and is computed with a synchronisation when None, like ``max_seqlen_q``).
    Masking as attention_kvcache's: bottom-right causal, (left, right) window."""
    try:
        return _switches(bundle, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, return_lse, check_varlen, window_size, softcap, sinks, tracing)
    except NoVariantError as e:
        raise NoVariantError(f"attention with a window, softcap or sinks runs the attention_kvcache kernels over k "
                             f"and v as pages: {e}") from None


def _switches(bundle, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              return_lse, check_varlen, window_size, softcap, sinks, tracing):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k.shape != v.shape:
        raise InputError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    dev = q.device
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise InputError("packed sequences need both cu_seqlens_q and cu_seqlens_k")
        if q.dim() != 3 or k.dim() != 3:
            raise InputError(f"packed q and k are (tokens, heads, head_dim), got {tuple(q.shape)} and {tuple(k.shape)}")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not isinstance(cu, Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1 \
                    or cu.device != dev:
                raise InputError(f"{name} must be a 1-D int32 tensor of batch + 1 offsets on {dev}")
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise InputError(f"cu_seqlens_q and cu_seqlens_k hold {cu_seqlens_q.numel()} and "
                             f"{cu_seqlens_k.numel()} offsets: one batch")
        b = cu_seqlens_k.numel() - 1
        if max_seqlen_q is None:  # (a synchronisation, as bundle.attention's)
            max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item()) if b else 0
        if max_seqlen_k is None:
            max_seqlen_k = int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max().item()) if b else 0
        if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int) or not 0 <= max_seqlen_k <= k.shape[0]:
            raise InputError(f"max_seqlen_k must be an int in [0, {k.shape[0]}] (the key tokens), got {max_seqlen_k!r}")
        pages = k.unsqueeze(1)  # (Tk, 1, Hkv, D): a page per key row
        vpages = v.unsqueeze(1)
        cols = max(1, max_seqlen_k)
        top = max(k.shape[0] - 1, 0)
        table = (torch.arange(cols, dtype=torch.int32, device=dev)[None, :] + cu_seqlens_k[:-1, None]).clamp_(0, top)
        lengths = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        return _run(bundle, q, pages, vpages, lengths, table, causal, softmax_scale, window_size, softcap, sinks,
                    return_lse, cu_seqlens_q, max_seqlen_q, check_varlen, tracing)
    if q.dim() != 4 or k.dim() != 4:
        raise InputError(f"q and k must be (batch, seqlen, heads, head_dim), got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.shape[0] != q.shape[0]:
        raise InputError(f"q and k batches differ: {q.shape[0]} vs {k.shape[0]}")
    b, sk = k.shape[0], k.shape[1]
    if sk == 0:
        raise InputError("no keys (seqlen_k = 0): o is 0 and lse -inf by definition")
    ps = next(p for p in _PAGE_PREFERENCE if sk % p == 0)
    views = []
    for name, t in (("k", k), ("v", v)):
        if b > 1 and t.stride(0) != sk * t.stride(1):
            raise InputError(f"{name}: a window, softcap or sinks reads k and v as pages, which needs the batch and "
                             f"sequence dimensions to merge (strides {t.stride()}); pass {name}.contiguous()")
        views.append(t.as_strided((b * sk // ps, ps, t.shape[2], t.shape[3]),
                                  (ps * t.stride(1), t.stride(1), t.stride(2), t.stride(3))))
    n = sk // ps  # block table row b: pages b·n .. b·n + n - 1; every length Sk
    table = _kept(bundle, ("kv-table", dev, b, n),
                  lambda: torch.arange(b * n, dtype=torch.int32, device=dev).view(b, n), tracing)
    lengths = _kept(bundle, ("kv-lengths", dev, b, sk),
                    lambda: torch.full((b,), sk, dtype=torch.int32, device=dev), tracing)
    return _run(bundle, q, views[0], views[1], lengths, table, causal, softmax_scale, window_size, softcap, sinks,
                return_lse, None, None, False if check_varlen is None else check_varlen, tracing)


def _run(bundle, q, k, v, lengths, table, causal, scale, window, softcap, sinks, return_lse, cu_q, max_q,
         check_varlen, tracing):
    """attention_kvcache on the page views; under torch.compile through the bundle's
    ``attention_kvcache`` torch op (whose fake checks like the call)."""
    if tracing:
        wl, wr = _window(window_size=window, causal=causal)
        o, lse = bundle.torch_ops().attention_kvcache(q, k, v, lengths, table, causal, scale, wl, wr,
                                                      float(softcap), sinks, None, None, cu_q, max_q)
        return (o, lse) if return_lse else o
    return attention_kvcache(bundle, q, k, v, lengths, table, causal, scale, window, softcap, sinks, None, None,
                             return_lse, None, cu_q, max_q, None, check_varlen)
