"""Weights packed once for the decode kernels (family ``decode``, fp8 e4m3, M ≤ 16).

``bundle.pack_b(b)`` rearranges an (N, K) e4m3 weight matrix as (N/8, K/64, 8, 64) —
``[nb, kc, r, j] = b[8 nb + r, 64 kc + j]`` — so that a warp's 16-byte loads of 8 weight rows × 64
bytes of K are one contiguous 512-byte piece (gemm/decode.py says why).  An inference server does
this once when it loads its weights and keeps only the packed copy; ``bundle.gemm(a, packed,
...)`` then runs a decode variant (M ≤ 16).  Torch only: no DSL.

Selection: the host library's ``fx_gemm_packed_select`` (compiler/csrc/fx_select.c, through
runtime/selector.py), cached per problem key.  Among the decode variants that fit (N a multiple of
their rows per CTA, K of their ``k_multiple``): the most CTAs among those whose grid is one wave on
this device (CTAs per cluster × the clusters its SMs hold), else the most CTAs.  Measured on the H100
over N = 2048-10240 (notes/gemm-sm90.md, the packed decode kernel): it picks the fastest shape of the kernel at
every N tried.  ``b_constant=True`` (nothing still running writes the weights) then takes that
shape's ``early_b`` twin, which issues its first weight loads before the PDL wait, where the grid is
one wave.  A tuning table compiled into the library that matches this device overrides the rule
with each fp8 decode bucket's measured winner on packed weights (``packed``: ``winner`` and
``b_constant_winner``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import gemm, validate
from .errors import InputError, NoVariantError

FORMAT = "rows8_k64"


class PackedB:
    """An (N, K) e4m3 weight matrix packed for the decode kernels; ``data`` is (N/8, K/64, 32, 16)."""

    __slots__ = ("data", "n", "k")

    def __init__(self, data, n: int, k: int):
        self.data, self.n, self.k = data, n, k

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    def __repr__(self) -> str:
        return f"PackedB(N={self.n}, K={self.k}, {FORMAT}, {self.data.dtype}, {self.data.device})"


def pack_b(b) -> PackedB:
    """(N, K) e4m3 → PackedB (a new tensor; ``b`` is not kept).  N must be a multiple of 8 and
    K of 64 (the variants need more: N of their rows per CTA, K of their ``k_multiple``)."""
    validate.tensors(b=b)
    if b.dim() != 2 or b.dtype != torch.float8_e4m3fn:
        raise InputError(f"pack_b takes an (N, K) float8_e4m3fn matrix, got {tuple(b.shape)} {b.dtype}")
    n, k = b.shape
    if n % 8 or k % 64 or k == 0:
        raise InputError(f"pack_b needs N % 8 == 0 and K a positive multiple of 64, got N={n} K={k}")
    data = b.contiguous().view(n // 8, 8, k // 64, 64).permute(0, 2, 1, 3).contiguous()
    return PackedB(data.view(n // 8, k // 64, 32, 16), n, k)


def unpack_b(p: PackedB):
    """The (N, K) matrix back (tests, debugging)."""
    return p.data.view(p.n // 8, p.k // 64, 8, 64).permute(0, 2, 1, 3).reshape(p.n, p.k)


def launch_specs(a, p: PackedB, out, scales) -> list:
    """(data_ptr, shape, stride) of a, the packed b, out, then the scales: a decode launch's tensors."""
    d = p.data
    return [(a.data_ptr(), tuple(a.shape), tuple(a.stride())), (d.data_ptr(), tuple(d.shape), tuple(d.stride())),
            (out.data_ptr(), tuple(out.shape), tuple(out.stride())), *scales]


def select_packed(bundle, specs: list, M: int, N: int, K: int, b_constant: bool, device: int = 0) -> str:
    """The decode variant for these (a, packed b, c, scale_a, scale_b) specs: the host library's
    ``fx_gemm_packed_select``, cached per problem key."""
    key = ("packed", M, N, K, specs[0][2], specs[1][2], specs[2][2], specs[0][0] % 16, specs[1][0] % 16,
           specs[2][0] % 16, b_constant, device)
    name = bundle.selections.get(key)
    if name is not None:
        return name
    from .selector import PackedProblem, _I64x2, _I64x4

    a, b, c, sa, sb = specs
    p = PackedProblem(M, N, K, a[0] or None, _I64x2(*a[2]), b[0] or None, _I64x4(*b[2]), c[0] or None,
                      _I64x2(*c[2]), sa[0] or None, sb[0] or None, int(bool(b_constant)))
    try:
        got = bundle.selector.select("gemm_packed", p)
    except NoVariantError as e:
        raise NoVariantError(f"{e}; {bundle.describe_contents('gemm')}") from None
    return gemm.remember(bundle, key, got.name.decode())


def fitting(bundle, specs: list, M: int, N: int, K: int) -> list[dict]:
    """The decode variants whose contract takes these (a, packed b, c, scales) specs (for
    ``variant=``: a named variant must be among them); NoVariantError if none without
    ``early_b`` does."""
    fits, reasons = bundle.fitting("gemm", specs, lambda v: v.get("family") == "decode" and M <= v["max_m"])
    if not any(not v["config"].get("early_b") for v in fits):
        why = f" (closest: {reasons[0]})" if reasons else ""
        raise NoVariantError(f"no decode variant for packed weights N={N} K={K}, M={M} on {bundle.device_name()}"
                             f"{why}: use the unpacked weights; {bundle.describe_contents('gemm')}")
    return fits


def check_meta(bundle, a, data, scale_a=None, scale_b=None, b_constant=False):
    """What ``gemm_packed`` checks before a launch for ``bundle.gemm(a, PackedB(data, ...))``
    (the torch op's arguments), on metadata alone (fake tensors under torch.compile), raising the
    same InputError / NoVariantError; returns the new output.  The selection runs as the real
    op's when the sizes are concrete."""
    validate.tensors(a=a, packed=data)
    n, k = data.shape[0] * 8, data.shape[1] * 64
    if a.dim() != 2 or a.shape[1] != k:
        raise InputError(f"packed weights take a 2-D a of K={k} columns, got {tuple(a.shape)}")
    if a.dtype != torch.float8_e4m3fn:
        raise InputError(f"packed weights are e4m3: a must be too, got {a.dtype}")
    dev = validate.one_device(bundle, a=a, b=data)
    validate.no_grad("gemm", a=a)
    M = a.shape[0]
    out = a.new_empty((M, n), dtype=torch.bfloat16)
    for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is None:
            continue
        if not isinstance(s, Tensor) or s.get_device() != dev or s.numel() != 1:
            gemm._scale_error(what, s, a)
        if not s.dtype.is_floating_point:
            raise InputError(f"{what} must be a floating-point tensor, got {s.dtype}")
    if not gemm.concrete(M, n, k, *a.stride(), *data.stride()) or M == 0 or n == 0:
        return out
    specs = [(0, tuple(a.shape), tuple(a.stride())), (0, tuple(data.shape), tuple(data.stride())),
             (0, tuple(out.shape), tuple(out.stride())), (0, (1,), (1,)), (0, (1,), (1,))]
    select_packed(bundle, specs, M, n, k, b_constant, dev)
    return out


def gemm_packed(bundle, a, p: PackedB, out=None, *, out_dtype=None, scale_a=None, scale_b=None, variant=None,
                b_constant=False):
    # Hot path (as bundle.gemm's, runtime/gemm.py): a problem key seen before launches with its
    # arguments packed then; the tensor types, autograd, the current device and the pointers'
    # alignment are checked per call.
    try:
        d = p.data
        key = (a.shape, d.shape, a.stride(), d.stride(), a.dtype, d.dtype, a.get_device(), d.get_device(),
               out_dtype, b_constant, variant, scale_a is None, scale_b is None, "packed", p.n, p.k)
        if out is not None or scale_a is not None or scale_b is not None:
            key = gemm.hot_key(key, out, scale_a, scale_b)
        fire = bundle.hot_gemm.get(key)
    except (AttributeError, TypeError):
        key = fire = None
    if (fire is not None and isinstance(a, Tensor) and isinstance(d, Tensor) and gemm.hot_types(out, scale_a, scale_b)
            and not (a.requires_grad and torch.is_grad_enabled())):
        r = fire(a, d, out, scale_a, scale_b)
        if r is not None:
            return r
        key = None  # a pointer of another alignment: selected for below, uncached
    if not isinstance(a, Tensor):
        validate.tensors(a=a)
    if a.dim() != 2 or a.shape[1] != p.k:
        raise InputError(f"packed weights take a 2-D a of K={p.k} columns, got {tuple(a.shape)}")
    if a.dtype != torch.float8_e4m3fn:
        raise InputError(f"packed weights are e4m3: a must be too, got {a.dtype}")
    dev = a.get_device()
    if p.data.get_device() != dev or dev < bundle.lowest_device or (out is not None and (not isinstance(out, Tensor) or out.get_device() != dev)):
        dev = validate.one_device(bundle, a=a, b=p.data, out=out)
    if a.requires_grad and torch.is_grad_enabled():
        validate.no_grad("gemm", a=a)
    M = a.shape[0]
    out_given = out is not None
    if out is None:
        out = a.new_empty((M, p.n), dtype=out_dtype or torch.bfloat16)
    elif out.dim() != 2 or out.shape[0] != M or out.shape[1] != p.n or (out_dtype is not None and out_dtype != out.dtype):
        if tuple(out.shape) != (M, p.n):
            raise InputError(f"out must have shape {(M, p.n)}, got {tuple(out.shape)}")
        raise InputError(f"out_dtype {out_dtype} differs from out's dtype {out.dtype}: give one of them")
    if out.dtype != torch.bfloat16:
        raise InputError(f"the packed decode kernels write bfloat16, out is {out.dtype}")
    if out_given:
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=p.data, scale_a=scale_a, scale_b=scale_b)
    scales, keep = gemm.fp8_scales(bundle, a, scale_a, scale_b, dev)  # (keep: alive until queued)
    if M == 0 or p.n == 0:
        return out
    specs = launch_specs(a, p, out, scales)
    if variant is None:
        name = select_packed(bundle, specs, M, p.n, p.k, b_constant, dev)
    else:
        fits = fitting(bundle, specs, M, p.n, p.k)
        if not any(v["name"] == variant for v in fits):
            raise InputError(f"{variant} is not a decode variant that takes these operands here; fitting: "
                             f"{', '.join(v['name'] for v in fits)}")
        name = variant
    bundle.launch(name, specs, checked=True, device=dev)
    if key is not None and gemm.hot_scales(bundle, a, keep, scale_a, scale_b):
        entry = bundle.manifest["variants"][name]
        gemm.remember_hot(bundle, key, gemm.hot_launch(bundle, name, entry, specs, dev, out, out_given,
                                                       bundle.unit_scales.get(a.device)))
    return out
