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

fp8 (float8_e4m3fn a and b, bfloat16 out) takes float32 ``scale_a`` / ``scale_b`` in one of two
forms, told apart by their shapes (runtime/fp8.py ``grouped_scales`` has the layout rules; its
``quantize_grouped_a`` / ``quantize_grouped_b`` write them):

- row: scale_a one per row of a (contiguous (M,), masked (E, max_m)), scale_b (E, N) one per
  group and output column: ``out[rows of g] = sa[rows]·sb[g]·(a[rows of g] @ b[g])``.
- block (DeepSeek-V3): scale_a per row and 128 of K, M-major (contiguous (M, KB), masked
  (E, max_m, KB)), scale_b (E, NB, KB) per 128x128 block of b[g]ᵀ; each k-block's partial product
  is scaled as it is added into the fp32 accumulators.

Selection: the host library's ``fx_gemm_grouped_select`` (compiler/csrc/fx_select.c) on the
expected rows per group (``expected_m``, else M / E contiguous, max_m masked), cached per problem
key.  Torch only: no DSL.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import devmem, fp8, validate
from . import gemm as dense
from .bundle import not_current
from .errors import InputError, LaunchError, NoVariantError

OP = "gemm_grouped"
MAX_GROUPS = 1024
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float8_e4m3fn: "e4m3"}
_SCALE_IDS = {"row": 1, "block": 2}


def out_dtype(a):
    """The output dtype of a grouped GEMM on a: bfloat16 for fp8, else a's."""
    return torch.bfloat16 if a.dtype == torch.float8_e4m3fn else a.dtype


def check(a, b, offs, masked_m, out, expected_m=None, scale_a=None, scale_b=None, dev: int = -1,
          real: bool = False) -> tuple:
    """Every check that needs no bundle (shapes, dtypes, layouts, the routing tensor, the fp8
    scales), shared with the torch op's fake: returns (masked, E, M, N, K, out shape, scales) with
    scales None (bf16/f16) or fp8.grouped_scales' (mode, specs, form)."""
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
        raise InputError(f"grouped_gemm takes bfloat16 (or float16, or float8_e4m3fn with scales) a and b of one dtype, "
                         f"got a {a.dtype}, b {b.dtype}")
    fp8_in = a.dtype == torch.float8_e4m3fn
    if not fp8_in and (scale_a is not None or scale_b is not None):
        raise InputError("scale_a/scale_b apply to the float8_e4m3fn grouped GEMM only")
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
        if out.dtype != out_dtype(a):
            raise InputError(f"out must be {out_dtype(a)} (a is {a.dtype}), got {out.dtype}")
    scales = None
    if fp8_in:
        validate.tensors(**{n: t for n, t in (("scale_a", scale_a), ("scale_b", scale_b)) if isinstance(t, Tensor)})
        scales = fp8.grouped_scales(scale_a, scale_b, masked, E, M, N, K, dev if real else -1, real)
    return masked, E, M, N, K, want, scales


def _specs(a, b, grp, out_stride, out_ptr, masked, M, N, K, E, scales=None) -> list:
    """Launch specs (a, b, c, routing[, scale_a, scale_b]) in the kernels' (M, K, L) / (N, K, E) /
    (M, N, L) order; ``out_ptr`` None: a plan (every pointer 0, taken as aligned)."""
    real = out_ptr is not None
    if masked:
        a3 = (a.data_ptr() if real else 0, (M, K, E), (a.stride(1), a.stride(2), a.stride(0)))
        c3 = (out_ptr or 0, (M, N, E), (out_stride[1], out_stride[2], out_stride[0]))
    else:
        a3 = (a.data_ptr() if real else 0, (M, K, 1), (a.stride(0), a.stride(1), 0))
        c3 = (out_ptr or 0, (M, N, 1), (out_stride[0], out_stride[1], 0))
    b3 = (b.data_ptr() if real else 0, (N, K, E), (b.stride(2), b.stride(1), b.stride(0)))
    specs = [a3, b3, c3, (grp.data_ptr() if real else 0, (E,), (1,))]
    if scales is not None:
        specs += [(p if real else 0, shape, stride) for p, shape, stride in scales[1]]
    return specs


def check_plan(bundle, a, b, offs, masked_m, out, expected_m=None, scale_a=None, scale_b=None) -> tuple:
    """What the torch op's fake runs: :func:`check`, then the choice for these sizes and strides
    (aligned pointers assumed; no data is touched).  Returns the output shape."""
    masked, E, M, N, K, want, scales = check(a, b, offs, masked_m, out, expected_m, scale_a, scale_b)
    stride = out.stride() if out is not None else torch.empty(want, device="meta").stride()
    concrete = all(type(x) is int for x in (*want, *stride, *a.shape, *a.stride(), *b.shape, *b.stride()))
    if concrete and M and N and E:  # (symbolic sizes: the real op selects when it runs)
        if K == 0:
            raise InputError("grouped_gemm: K must be positive (got 0)")
        specs = _specs(a, b, masked_m if masked else offs, stride, None, masked, M, N, K, E, scales)
        select(bundle, _DTYPES[a.dtype], masked, specs, M, N, K, E, E if masked else 1, expected_m, -1, scales=scales)
    return want


def grouped_gemm(bundle, a, b, offs=None, masked_m=None, out=None, *, expected_m=None, variant=None, scale_a=None,
                 scale_b=None):
    # Hot path: a problem key seen before (shapes, strides, dtypes and devices of every tensor, the
    # flags) was checked in full then; per call only the current device, autograd, the pointers'
    # alignment and the output's overlap with the inputs are checked (in ``fire``).
    grp = offs if masked_m is None else masked_m
    try:
        key = (OP, a.shape, a.stride(), b.shape, b.stride(), grp.shape, grp.stride(), a.dtype, b.dtype, grp.dtype,
               offs is None, masked_m is None, a.get_device(), b.get_device(), grp.get_device(), expected_m, variant,
               None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()),
               None if scale_a is None else (scale_a.shape, scale_a.stride(), scale_a.dtype, scale_a.get_device()),
               None if scale_b is None else (scale_b.shape, scale_b.stride(), scale_b.dtype, scale_b.get_device()))
        fire = bundle.hot_gemm.get(key)
    except (AttributeError, TypeError):  # not tensors, an unhashable argument
        key = fire = None
    if (fire is not None and isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(grp, Tensor)
            and (out is None or isinstance(out, Tensor))
            and (scale_a is None or isinstance(scale_a, Tensor)) and (scale_b is None or isinstance(scale_b, Tensor))
            and not ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())):
        r = fire(a, b, grp, out, scale_a, scale_b)
        if r is not None:
            return r
        key = None  # a pointer of another alignment or an overlapping out: the checked path says which
    masked, E, M, N, K, want, _ = check(a, b, offs, masked_m, out, expected_m, scale_a, scale_b)
    grp = masked_m if masked else offs
    dev = validate.one_device(bundle, a=a, b=b, out=out, **{"masked_m" if masked else "offs": grp})
    scales = None
    if a.dtype == torch.float8_e4m3fn:  # again with the device and the pointers (alignment)
        scales = check(a, b, offs, masked_m, out, expected_m, scale_a, scale_b, dev, True)[6]
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        validate.no_grad(OP, a=a, b=b)
    given = out is not None
    if not given:
        out = a.new_empty(want, dtype=out_dtype(a))
    else:
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=b, **{"masked_m" if masked else "offs": grp},
                          **({} if scales is None else {"scale_a": scale_a, "scale_b": scale_b}))
    if M == 0 or N == 0 or E == 0:
        return out
    if K == 0:
        raise InputError("grouped_gemm: K must be positive (got 0)")
    L = E if masked else 1
    specs = _specs(a, b, grp, out.stride(), out.data_ptr(), masked, M, N, K, E, scales)
    name = select(bundle, _DTYPES[a.dtype], masked, specs, M, N, K, E, L, expected_m, dev, variant, scales)
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
    scaled = len(args) > 4 and isinstance(args[4], tuple)
    ea, eb = (validate.span(s[1], s[2]) * (1 if scaled else out.element_size()) for s in (a3, b3))
    eo = validate.span(c3[1], c3[2]) * out.element_size()
    eg = 4 * g1[1][0]
    esa, esb = ((validate.span(s[1], s[2]) * 4 for s in args[4:6]) if scaled else (0, 0))
    empty_like = torch.empty_like
    oproto = None if given else devmem.proto(out.dtype, out.device).expand(out.shape)
    if oproto is not None and empty_like(oproto).stride() != out.stride():
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layout")

    def fire(a, b, grp, out, scale_a=None, scale_b=None):
        here = cur()
        if here != dev:
            not_current(dev, here)
        pa, pb, pg = a.data_ptr(), b.data_ptr(), grp.data_ptr()
        if scaled and (scale_a is None or scale_b is None):
            return None
        if oproto is not None:
            out = empty_like(oproto)
            po = out.data_ptr()
        else:
            po = out.data_ptr()
            if (po < pa + ea and pa < po + eo) or (po < pb + eb and pb < po + eo) or (po < pg + eg and pg < po + eo):
                return None
        if scaled:
            psa, psb = scale_a.data_ptr(), scale_b.data_ptr()
            if oproto is None and ((po < psa + esa and psa < po + eo) or (po < psb + esb and psb < po + eo)):
                return None
            err = go(pa, pb, po, pg, psa, psb, raw(here))
        else:
            err = go(pa, pb, po, pg, raw(here))
        if err is None:
            return None
        if err:
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return out
    return fire


def select(bundle, dt: str, masked: bool, specs: list, M: int, N: int, K: int, E: int, L: int, expected_m, dev: int,
           variant: str | None = None, scales=None) -> str:
    """The variant for these launch specs: the host library's ``fx_gemm_grouped_select``, or the
    named ``variant`` where its contract takes them; cached per problem key."""
    key = (OP, dt, masked, variant, expected_m, tuple((s[0] % 16, s[1], s[2]) for s in specs), dev)
    name = bundle.selections.get(key)
    if name is not None:
        return name
    lay = "masked" if masked else "contig"
    mode = None if scales is None else scales[0]
    if variant is not None:
        fits, reasons = bundle.fitting(OP, specs, lambda v: v.get("grouped") == lay and v["dtypes"]["a"] == dt
                                       and v.get("scale_mode") == mode and v["name"] == variant)
        if not fits:
            why = f": {reasons[0]}" if reasons else ""
            raise NoVariantError(f"no {OP} variant {variant!r} for {lay} {dt} M={M} N={N} K={K} E={E}{why}; "
                                 f"{bundle.describe_contents(OP)}")
        return dense.remember(bundle, key, variant)
    from .selector import DTYPE, GroupedProblem, _I64x3

    a3, b3, c3, g1 = specs[:4]
    c_dt = "bf16" if dt == "e4m3" else dt
    p = GroupedProblem(DTYPE[dt], DTYPE[c_dt], int(masked), M, N, K, E, a3[0] or None, _I64x3(*a3[2]),
                       b3[0] or None, _I64x3(*b3[2]), c3[0] or None, _I64x3(*c3[2]),
                       None if masked else (g1[0] or None), (g1[0] or None) if masked else None, expected_m or 0)
    if scales is not None:
        mode_id, xa, xb = scales[2]
        p.scale_mode = mode_id
        p.scale_a, p.scale_b = specs[4][0] or None, specs[5][0] or None
        p.scale_a_stride, p.scale_b_stride = _I64x3(*xa), _I64x3(*xb)
    try:
        got = bundle.selector.select(OP, p)
    except NoVariantError as e:
        raise NoVariantError(f"{e}; {bundle.describe_contents(OP)}") from None
    return dense.remember(bundle, key, got.name.decode())


def reference(a: Tensor, b: Tensor, offs=None, masked_m=None, scale_a=None, scale_b=None) -> Tensor:
    """float32 result of the grouped product (rows no group owns: NaN), for tests and benchmarks;
    reads the routing on the host.  fp8: the product of the dequantized operands (row or block
    scales, runtime/fp8.py's grouped forms; b (E, K, N) as passed)."""
    # Operands are dequantized (fp8) or widened group by group: a float32 copy of a whole expert
    # stack would be 4x its bf16 size (28 GiB for 256 DeepSeek-V3 experts).
    form = None
    if a.dtype == torch.float8_e4m3fn:
        form = fp8.grouped_mode(scale_a, scale_b, masked_m is not None, b.shape[0], a.shape[-2], b.shape[2],
                                a.shape[-1])
        if form == "row":
            scale_a, scale_b = scale_a.reshape(a.shape[:-1]), scale_b.reshape(b.shape[0], b.shape[2])

    def rows_of(g, r0, r1):  # float32 a rows [r0, r1) of group g (masked: of a[g])
        x = a[g, r0:r1] if masked_m is not None else a[r0:r1]
        if form is None:
            return x.float()
        s = scale_a[g, r0:r1] if masked_m is not None else scale_a[r0:r1]
        return fp8.dequantize_rowwise(x, s) if form == "row" else fp8.dequantize_blockwise(x, s)

    def weights_of(g):  # float32 b[g] (K, N)
        if form is None:
            return b[g].float()
        w = b[g].t()
        return (fp8.dequantize_rowwise(w, scale_b[g]) if form == "row" else
                fp8.dequantize_blockwise(w, scale_b[g])).t()

    if masked_m is not None:
        out = torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), device=a.device)
        for g, n in enumerate(masked_m.tolist()):
            n = max(0, min(n, a.shape[1]))
            if n:
                out[g, :n] = rows_of(g, 0, n) @ weights_of(g)
        return out
    out = torch.full((a.shape[0], b.shape[2]), float("nan"), device=a.device)
    ends = offs.tolist()
    for g, end in enumerate(ends):
        start = max(0, min(ends[g - 1], a.shape[0])) if g else 0
        end = max(start, min(end, a.shape[0]))
        if end > start:
            out[start:end] = rows_of(g, start, end) @ weights_of(g)
    return out
