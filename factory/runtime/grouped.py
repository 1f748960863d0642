"""``bundle.grouped_gemm``: the grouped GEMM of mixture-of-experts layers, one launch for every group.

Conventions of ``torch._grouped_mm`` (2-D a, 3-D b):

- contiguous (``offs``): a (M, K) holds the tokens sorted by group (expert), b (E, K, N) the
  groups' weights, ``offs`` (E,) int32 on a's device the cumulative end rows: group g owns rows
  ``offs[g-1] .. offs[g]-1`` (``offs[-1]`` = 0), and ``out[rows of g] = a[rows of g] @ b[g]``;
  out (M, N).  Rows at or past ``offs[E-1]`` are not written (a fresh ``out`` leaves them
  uninitialised, as torch does).
- masked (``masked_m``, DeepGEMM's m-grouped masked layout for decode under CUDA graphs): a
  (E, max_m, K), ``masked_m`` (E,) int32 on the device, out (E, max_m, N);
  ``out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]``, rows past a group's count not written.

b must be K-contiguous: b[g] is the transpose of a row-major (N, K) weight matrix, i.e. pass
``w.transpose(1, 2)`` for weights stored (E, N, K) (what torch's grouped-mm tests do).  bf16 (or
f16 where the bundle has those variants), bf16 out; K a multiple of 8, N a multiple of 8, rows
16-byte aligned; at most 1024 groups.

``offs`` / ``masked_m`` are read on the device only (no host synchronisation: the call can be
captured in a CUDA graph and replayed with new routing).  Their values are the caller's contract
as in torch, but out-of-range ones never reach outside a or out: rows past M (or past max_m) are
neither read nor written, a decreasing offset leaves its group empty.

Selection: the host library's ``fx_gemm_grouped_select`` (compiler/csrc/fx_select.c) on the
expected rows per group (``expected_m``, else M / E contiguous, max_m masked), cached per problem
key.  Torch only: no DSL.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import gemm as dense
from . import validate
from .bundle import not_current
from .errors import InputError, LaunchError, NoVariantError

OP = "gemm_grouped"
MAX_GROUPS = 1024
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def check(a, b, offs, masked_m, out, expected_m=None) -> tuple:
    """Every check that needs no bundle (shapes, dtypes, layouts, the routing tensor), shared with
    the torch op's fake: returns (masked, E, M, N, K, out shape)."""
    if (offs is None) == (masked_m is None):
        raise InputError("grouped_gemm takes exactly one of offs (contiguous layout: a (M, K)) and masked_m "
                         "(masked layout: a (E, max_m, K))")
    masked = masked_m is not None
    grp_name = "masked_m" if masked else "offs"
    grp = masked_m if masked else offs
    validate.tensors(a=a, b=b, **{grp_name: grp})
    if out is not None:
        validate.tensors(out=out)
    if a.dtype not in _DTYPES or b.dtype != a.dtype:
        raise InputError(f"grouped_gemm takes bfloat16 (or float16) a and b of one dtype, got a {a.dtype}, b {b.dtype}")
    if b.dim() != 3:
        raise InputError(f"b must be 3-D (E, K, N) as torch._grouped_mm takes it, got shape {tuple(b.shape)}")
    E, Kb, N = b.shape
    if masked:
        if a.dim() != 3 or a.shape[0] != E:
            raise InputError(f"masked layout: a must be (E, max_m, K) with E = {E} groups of b, got {tuple(a.shape)}")
        M, K = a.shape[1], a.shape[2]
        want = (E, M, N)
    else:
        if a.dim() != 2:
            raise InputError(f"contiguous layout: a must be 2-D (M, K) tokens sorted by group, got {tuple(a.shape)}")
        M, K = a.shape
        want = (M, N)
    if K != Kb:
        raise InputError(f"a's K ({K}) differs from b's ({Kb}): b is (E, K, N)")
    if grp.dtype != torch.int32 or grp.dim() != 1 or grp.shape[0] != E:
        raise InputError(f"{grp_name} must be a 1-D int32 tensor of E = {E} elements (one per group), got "
                         f"{tuple(grp.shape)} {grp.dtype}")
    if E > 1 and grp.stride(0) != 1:
        raise InputError(f"{grp_name} must be contiguous")
    if E > MAX_GROUPS:
        raise InputError(f"grouped_gemm takes at most {MAX_GROUPS} groups, got {E}")
    if b.stride(1) != 1 and K > 1:
        raise InputError(f"b must be contiguous along K (b[g] the transpose of a row-major (N, K) matrix: pass "
                         f"w.transpose(1, 2) for (E, N, K) weights), got strides {tuple(b.stride())}")
    if expected_m is not None and (not isinstance(expected_m, int) or isinstance(expected_m, bool) or expected_m < 0):
        raise InputError(f"expected_m must be a non-negative int, got {expected_m!r}")
    if out is not None:
        if tuple(out.shape) != want:
            raise InputError(f"out must have shape {want}, got {tuple(out.shape)}")
        if out.dtype != a.dtype:
            raise InputError(f"out must be {a.dtype} like a, got {out.dtype}")
    return masked, E, M, N, K, want


def _specs(a, b, grp, out_stride, out_ptr, masked, M, N, K, E) -> list:
    """Launch specs (a, b, c, routing) in the kernels' (M, K, L) / (N, K, E) / (M, N, L) order;
    ``out_ptr`` None: a plan (every pointer 0, taken as aligned)."""
    real = out_ptr is not None
    if masked:
        a3 = (a.data_ptr() if real else 0, (M, K, E), (a.stride(1), a.stride(2), a.stride(0)))
        c3 = (out_ptr or 0, (M, N, E), (out_stride[1], out_stride[2], out_stride[0]))
    else:
        a3 = (a.data_ptr() if real else 0, (M, K, 1), (a.stride(0), a.stride(1), 0))
        c3 = (out_ptr or 0, (M, N, 1), (out_stride[0], out_stride[1], 0))
    b3 = (b.data_ptr() if real else 0, (N, K, E), (b.stride(2), b.stride(1), b.stride(0)))
    return [a3, b3, c3, (grp.data_ptr() if real else 0, (E,), (1,))]


def check_plan(bundle, a, b, offs, masked_m, out, expected_m=None) -> tuple:
    """What the torch op's fake runs: :func:`check`, then the choice for these sizes and strides
    (aligned pointers assumed; no data is touched).  Returns the output shape."""
    masked, E, M, N, K, want = check(a, b, offs, masked_m, out, expected_m)
    stride = out.stride() if out is not None else torch.empty(want, device="meta").stride()
    concrete = all(type(x) is int for x in (*want, *stride, *a.shape, *a.stride(), *b.shape, *b.stride()))
    if concrete and M and N and E:  # (symbolic sizes: the real op selects when it runs)
        if K == 0:
            raise InputError("grouped_gemm: K must be positive (got 0)")
        specs = _specs(a, b, masked_m if masked else offs, stride, None, masked, M, N, K, E)
        select(bundle, _DTYPES[a.dtype], masked, specs, M, N, K, E, E if masked else 1, expected_m, -1)
    return want


def grouped_gemm(bundle, a, b, offs=None, masked_m=None, out=None, *, expected_m=None, variant=None):
    # Hot path: a problem key seen before (shapes, strides, dtypes and devices of every tensor, the
    # flags) was checked in full then; per call only the current device, autograd, the pointers'
    # alignment and the output's overlap with the inputs are checked (in ``fire``).
    grp = offs if masked_m is None else masked_m
    try:
        key = (OP, a.shape, a.stride(), b.shape, b.stride(), grp.shape, grp.stride(), a.dtype, b.dtype, grp.dtype,
               offs is None, masked_m is None, a.get_device(), b.get_device(), grp.get_device(), expected_m, variant,
               None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()))
        fire = bundle.hot_gemm.get(key)
    except (AttributeError, TypeError):  # not tensors, an unhashable argument
        key = fire = None
    if (fire is not None and isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(grp, Tensor)
            and (out is None or isinstance(out, Tensor))
            and not ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())):
        r = fire(a, b, grp, out)
        if r is not None:
            return r
        key = None  # a pointer of another alignment or an overlapping out: the checked path says which
    masked, E, M, N, K, want = check(a, b, offs, masked_m, out, expected_m)
    grp = masked_m if masked else offs
    dev = validate.one_device(bundle, a=a, b=b, out=out, **{"masked_m" if masked else "offs": grp})
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        validate.no_grad(OP, a=a, b=b)
    given = out is not None
    if not given:
        out = a.new_empty(want)
    else:
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=b, **{"masked_m" if masked else "offs": grp})
    if M == 0 or N == 0 or E == 0:
        return out
    if K == 0:
        raise InputError("grouped_gemm: K must be positive (got 0)")
    L = E if masked else 1
    specs = _specs(a, b, grp, out.stride(), out.data_ptr(), masked, M, N, K, E)
    name = select(bundle, _DTYPES[a.dtype], masked, specs, M, N, K, E, L, expected_m, dev, variant)
    entry = bundle.manifest["variants"][name]
    args = [*specs, *dense.launch_scalars(bundle, entry, dev)]
    bundle.launch(name, args, checked=True, device=dev)
    if key is not None:
        dense.remember_hot(bundle, key, _hot_launch(bundle, name, args, dev, out, given))
    return out


def _hot_launch(bundle, name: str, args: list, dev: int, out, given: bool):
    """``fire(a, b, grp, out)`` of a problem just launched (and so checked) with ``args``: launches
    with the new pointers, allocating ``out`` (as the checked path did) when the key has none;
    returns None without launching when a pointer breaks the alignment contract or a given
    ``out`` overlaps an input (the checked path then says which).  None when the variant was not
    loaded by that launch (a stand-in launch in tests)."""
    fixed = bundle.fixed(name, args)
    if fixed is None:
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    a3, b3, c3, g1 = args[:4]
    es = out.element_size()
    ea, eb, eo = (validate.span(s[1], s[2]) * es for s in (a3, b3, c3))
    eg = 4 * g1[1][0]
    empty_like = torch.empty_like
    oproto = None if given else out.new_empty(1).expand(out.shape)
    if oproto is not None and empty_like(oproto).stride() != out.stride():
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layout")

    def fire(a, b, grp, out):
        here = cur()
        if here != dev:
            not_current(dev, here)
        pa, pb, pg = a.data_ptr(), b.data_ptr(), grp.data_ptr()
        if oproto is not None:
            out = empty_like(oproto)
            po = out.data_ptr()
        else:
            po = out.data_ptr()
            if (po < pa + ea and pa < po + eo) or (po < pb + eb and pb < po + eo) or (po < pg + eg and pg < po + eo):
                return None
        err = go(pa, pb, po, pg, raw(here))
        if err is None:
            return None
        if err:
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return out
    return fire


def select(bundle, dt: str, masked: bool, specs: list, M: int, N: int, K: int, E: int, L: int, expected_m, dev: int,
           variant: str | None = None) -> str:
    """The variant for these launch specs: the host library's ``fx_gemm_grouped_select``, or the
    named ``variant`` where its contract takes them; cached per problem key."""
    key = (OP, dt, masked, variant, expected_m, tuple((s[0] % 16, s[1], s[2]) for s in specs), dev)
    name = bundle.selections.get(key)
    if name is not None:
        return name
    lay = "masked" if masked else "contig"
    if variant is not None:
        fits, reasons = bundle.fitting(OP, specs, lambda v: v.get("grouped") == lay and v["dtypes"]["a"] == dt
                                       and v["name"] == variant)
        if not fits:
            why = f": {reasons[0]}" if reasons else ""
            raise NoVariantError(f"no {OP} variant {variant!r} for {lay} {dt} M={M} N={N} K={K} E={E}{why}; "
                                 f"{bundle.describe_contents(OP)}")
        return dense.remember(bundle, key, variant)
    from .selector import DTYPE, GroupedProblem, _I64x3

    a3, b3, c3, g1 = specs
    p = GroupedProblem(DTYPE[dt], DTYPE[dt], int(masked), M, N, K, E, a3[0] or None, _I64x3(*a3[2]),
                       b3[0] or None, _I64x3(*b3[2]), c3[0] or None, _I64x3(*c3[2]),
                       None if masked else (g1[0] or None), (g1[0] or None) if masked else None, expected_m or 0)
    try:
        got = bundle.selector.select(OP, p)
    except NoVariantError as e:
        raise NoVariantError(f"{e}; {bundle.describe_contents(OP)}") from None
    return dense.remember(bundle, key, got.name.decode())


def reference(a: Tensor, b: Tensor, offs=None, masked_m=None) -> Tensor:
    """float32 result of the grouped product (rows no group owns: NaN), for tests and benchmarks;
    reads the routing on the host."""
    af, bf = a.float(), b.float()
    if masked_m is not None:
        out = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), device=a.device)
        for g, n in enumerate(masked_m.tolist()):
            n = max(0, min(n, a.shape[1]))
            out[g, :n] = af[g, :n] @ bf[g]
        return out
    out = torch.full((a.shape[0], b.shape[2]), float("nan"), device=a.device)
    ends = offs.tolist()
    for g, end in enumerate(ends):
        start = max(0, min(ends[g - 1], a.shape[0])) if g else 0
        end = max(start, min(end, a.shape[0]))
        out[start:end] = af[start:end] @ bf[g]
    return out
