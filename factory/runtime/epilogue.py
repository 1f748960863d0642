"""``bundle.gemm(a, b, bias=, residual=, activation="silu_mul")``: a GEMM whose epilogue adds a
bias, applies SiLU(gate)·up, and adds a residual before writing the output (sm_90a variants with
the fields ``bias``, ``silu_mul``, ``residual``: gemm/sm90.py; the mma.sync family's variants with
the same fields and semantics on sm_80/86/89 and its sm_90 build: gemm/sm80.py, whose residual
must be 16-byte aligned with strides that are multiples of 16 bytes, read as vectors).

    out = act(a·bᵀ (·fp8 scales) + bias) + residual

- ``bias``: (N,) in the output dtype, contiguous; N = b's rows (for ``silu_mul``, in the packed
  row order of b: :func:`pack_gate_up` packs a bias too).
- ``activation="silu_mul"`` (vLLM's MergedColumnParallelLinear + silu_and_mul): b holds the gate
  and up projections with rows in blocks of ``GATE_UP_BLOCK`` (64): [gate 0..63; up 0..63; gate
  64..127; up 64..127; ...], zero rows past the last output (:func:`pack_gate_up` writes that form
  from a stacked [gate; up] weight).  ``out[:, j] = silu(a·gate_jᵀ) · (a·up_jᵀ)``; the output has
  I columns where N = 2·ceil(I/64)·64: I = N/2 unless ``out`` or ``residual`` gives another I.
- ``residual``: the output's shape and dtype, contiguous along its last mode; it may be ``out``
  itself (the same tensor: an in-place ``out += ...``), else it must not overlap ``out``.
- ``out_dtype=torch.float8_e4m3fn`` (or an e4m3 ``out``; no bias or residual, 2-D operands): the
  result quantised per row and 128 columns, ``scale = max(amax / 448, 1 / (448·512))``, ``out =
  e4m3(x / scale)``; returns ``(out, scale_out)`` with ``scale_out`` (M, ceil(N_out / 128))
  float32 M-major (:func:`new_scale_out`: group stride M rounded up to 4) -- the block-scaled
  GEMM's ``scale_a`` for a K of N_out columns (``bundle.gemm(out, w, scale_a=scale_out,
  scale_b=w_scales)``).

The selection is the host library's (``fx_gemm_epilogue_select``): only variants built with
exactly the requested fields qualify, by the same cost model as the plain GEMM.  Bad inputs raise
InputError / NoVariantError before any launch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import fp8 as fp8_forms
from . import devmem, fused
from . import gemm as plain
from . import validate
from .bundle import not_current
from .errors import InputError, LaunchError, NoVariantError

GATE_UP_BLOCK = 64
FP8_GROUP = 128
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)
ACTIVATIONS = (None, "silu_mul")
FLAGS = {"bias": 1, "silu_mul": 2, "residual": 4, "fp8_groups": 8}  # fx_api.h fx_gemm_epilogue_flags_t
_E4M3 = getattr(torch, "float8_e4m3fn", None)


def fp8_out(out, out_dtype) -> bool:
    """Whether the call asks for the e4m3 output with group scales."""
    return _E4M3 is not None and (out_dtype == _E4M3 or (isinstance(out, Tensor) and out.dtype == _E4M3))


def new_scale_out(a: Tensor, M: int, n_out: int) -> Tensor:
    """The (M, ceil(n_out / 128)) float32 scales of an e4m3 output, M-major with the group stride
    M rounded up to 4 (16-byte aligned columns: the block-scaled GEMM's scale_a form)."""
    m4 = -(-max(M, 1) // 4) * 4
    return a.new_empty((-(-n_out // FP8_GROUP), m4), dtype=torch.float32).t()[:M]


def _scale_out_spec(scale_out: Tensor, M: int, ng: int) -> tuple:
    st = scale_out.stride()
    s1 = st[1] if ng > 1 else -(-max(M, 1) // 4) * 4  # one group: any stride reads the same element
    return (scale_out.data_ptr(), (M, ng), (1, s1))


def check_scale_out(scale_out, M: int, n_out: int, dev: int) -> None:
    ng = -(-n_out // FP8_GROUP)
    if not isinstance(scale_out, Tensor):
        raise InputError(f"scale_out must be a torch.Tensor, got {type(scale_out).__name__}")
    if scale_out.dtype != torch.float32 or tuple(scale_out.shape) != (M, ng):
        raise InputError(f"scale_out must be float32 of shape ({M}, {ng}) (a scale per row and {FP8_GROUP} "
                         f"columns), got {scale_out.dtype} {tuple(scale_out.shape)}")
    if scale_out.get_device() != dev:
        raise InputError(f"scale_out is on {validate.where(scale_out)} but a is on device {dev}")
    if M > 1 and scale_out.stride(0) != 1:
        raise InputError(f"scale_out must be M-major (stride 1 along rows), got strides {scale_out.stride()}")
    if ng > 1 and (scale_out.stride(1) < M or scale_out.stride(1) % 4):
        raise InputError(f"scale_out's group stride must be >= M = {M} and a multiple of 4, got {scale_out.stride(1)}")
    if scale_out.data_ptr() % 16:
        raise InputError("scale_out must be 16-byte aligned")


def pack_gate_up(gate_up: Tensor, up: Tensor | None = None, block: int = GATE_UP_BLOCK) -> Tensor:
    """The ``silu_mul`` weight (or bias) form from a stacked [gate; up] tensor of 2·I rows (vLLM's
    MergedColumnParallelLinear weight, (2I, K), or its (2I,) bias), or from ``gate`` and ``up``
    given apart: rows in blocks of ``block``, [gate block 0; up block 0; gate block 1; ...], the
    last blocks zero-padded to ``block`` rows.  Returns a new contiguous tensor of
    2·ceil(I/block)·block rows.  Do this once per weight, at load time."""
    if not isinstance(gate_up, Tensor) or (up is not None and not isinstance(up, Tensor)):
        raise InputError("pack_gate_up takes torch tensors")
    if up is None:
        if gate_up.dim() not in (1, 2) or gate_up.shape[0] % 2:
            raise InputError(f"pack_gate_up: a stacked [gate; up] tensor has an even number of rows, got shape "
                             f"{tuple(gate_up.shape)}")
        gate, up = gate_up[: gate_up.shape[0] // 2], gate_up[gate_up.shape[0] // 2:]
    else:
        gate = gate_up
        if gate.shape != up.shape or gate.dim() not in (1, 2):
            raise InputError(f"pack_gate_up: gate {tuple(gate.shape)} and up {tuple(up.shape)} must match (1-D or 2-D)")
    rows = gate.shape[0]
    blocks = -(-rows // block)
    tail = tuple(gate.shape[1:])
    out = gate.new_zeros((blocks, 2, block, *tail))
    pad = blocks * block
    g = gate.new_zeros((pad, *tail))
    u = up.new_zeros((pad, *tail))
    g[:rows] = gate
    u[:rows] = up
    out[:, 0] = g.reshape(blocks, block, *tail)
    out[:, 1] = u.reshape(blocks, block, *tail)
    return out.reshape(2 * pad, *tail).contiguous()


def unpack_gate_up(packed: Tensor, rows: int, block: int = GATE_UP_BLOCK) -> tuple[Tensor, Tensor]:
    """(gate, up) of ``rows`` rows each from :func:`pack_gate_up`'s form (for references and tests)."""
    blocks = packed.shape[0] // (2 * block)
    v = packed.reshape(blocks, 2, block, *packed.shape[1:])
    return (v[:, 0].reshape(blocks * block, *packed.shape[1:])[:rows],
            v[:, 1].reshape(blocks * block, *packed.shape[1:])[:rows])


def gate_up_rows(n_out: int) -> int:
    """b's rows for ``n_out`` silu_mul outputs."""
    return 2 * (-(-n_out // GATE_UP_BLOCK)) * GATE_UP_BLOCK


def flags_of(bias, residual, activation, quant: bool = False) -> int:
    if activation not in ACTIVATIONS:
        raise InputError(f"activation must be None or 'silu_mul', got {activation!r}")
    if quant and (bias is not None or residual is not None):
        raise InputError("an e4m3 output (per-128-column scales) takes no bias or residual")
    return ((FLAGS["bias"] if bias is not None else 0) | (FLAGS["silu_mul"] if activation else 0)
            | (FLAGS["residual"] if residual is not None else 0) | (FLAGS["fp8_groups"] if quant else 0))


def fields(flags: int) -> list[str]:
    """The manifest's ``epilogue`` list for these flags."""
    return [f for f in ("bias", "silu_mul", "residual", "fp8_groups") if flags & FLAGS[f]]


def _n_out(N: int, flags: int, out, residual) -> int:
    """The output's columns: N, or for silu_mul the I that ``out`` / ``residual`` give (else N/2)."""
    if not flags & FLAGS["silu_mul"]:
        return N
    given = out if out is not None else residual
    n_out = given.shape[-1] if isinstance(given, Tensor) and given.dim() >= 1 else N // 2
    if N % (2 * GATE_UP_BLOCK) or gate_up_rows(n_out) != N:
        raise InputError(f"activation='silu_mul' needs b in pack_gate_up's form: 2·ceil(I/{GATE_UP_BLOCK})·"
                         f"{GATE_UP_BLOCK} rows for I outputs; b has {N} rows, output I = {n_out}")
    return n_out


def check_epilogue(a, out, bias, residual, N: int, n_out: int, out_dtype, dev: int, in_place_ok: bool = True) -> None:
    """The bias and residual against the output (shape, dtype, device, layout); metadata only."""
    want = (*a.shape[:-1], n_out)
    for what, t in (("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise InputError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != out_dtype:
            raise InputError(f"{what} must have the output's dtype {out_dtype}, got {t.dtype}")
        if t.get_device() != dev:
            raise InputError(f"{what} is on {validate.where(t)} but a is on {validate.where(a)}")
        if t.requires_grad and torch.is_grad_enabled():
            validate.no_grad("gemm", **{what: t})
    if bias is not None:
        if tuple(bias.shape) != (N,):
            raise InputError(f"bias must have shape ({N},) (b's rows), got {tuple(bias.shape)}")
        if N > 1 and bias.stride(0) != 1:
            raise InputError("bias must be contiguous")
    if residual is not None:
        if tuple(residual.shape) != want:
            raise InputError(f"residual must have the output's shape {want}, got {tuple(residual.shape)}")
        if n_out > 1 and residual.stride(-1) != 1:
            raise InputError("residual must be contiguous along its last mode")


def _same(x: Tensor, y: Tensor) -> bool:
    return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()


def gemm_epilogue(bundle, a, b, out=None, *, bias=None, residual=None, activation=None, out_dtype=None,
                  scale_a=None, scale_b=None, variant=None, b_constant=False, scale_mode=None, scale_out=None,
                  row_scales=False):
    quant = fp8_out(out, out_dtype)
    flags = flags_of(bias, residual, activation, quant)
    rows = _row_scales(row_scales, quant, scale_out)
    if quant:
        return _gemm_fp8_groups(bundle, a, b, out, activation, out_dtype, scale_a, scale_b, variant, b_constant,
                                scale_mode, scale_out, flags, rows)
    if scale_out is not None:
        raise InputError("scale_out goes with an e4m3 output (out_dtype=torch.float8_e4m3fn)")
    try:
        key = ("epi", flags, a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(),
               b.get_device(), out_dtype, b_constant, variant, scale_mode)
        for t in (out, bias, residual, scale_a, scale_b):
            key += (None,) if t is None else (t.shape, t.stride(), t.dtype, t.get_device())
        if residual is not None and out is not None:
            key += (_same(residual, out),)
        fire = bundle.hot_gemm.get(key)
    except (AttributeError, TypeError):
        key = fire = None
    if (fire is not None and isinstance(a, Tensor) and isinstance(b, Tensor)
            and not ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())):
        r = fire(a, b, out, bias, residual, scale_a, scale_b)
        if r is not None:
            return r
        key = None
    ab = plain.operands(a, b)
    dev = validate.one_device(bundle, a=a, b=b, out=out)
    validate.no_grad("gemm", a=a, b=b)
    fp8 = ab == "e4m3"
    a3, b3 = plain.rkl_spec(a, "a"), plain.rkl_spec(b, "b")
    M, K, L = a3[1]
    N = b3[1][0]
    n_out = _n_out(N, flags, out, residual)
    out_given = out is not None
    if out is None:
        out = a.new_empty((*a.shape[:-1], n_out), dtype=out_dtype or (torch.bfloat16 if fp8 else a.dtype))
    elif (tuple(out.shape) != (*a.shape[:-1], n_out) or (out_dtype is not None and out_dtype != out.dtype)):
        raise InputError(f"out must have shape {(*a.shape[:-1], n_out)} and dtype {out_dtype or out.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    c = plain.out_kind(out, fp8, scale_a, scale_b, scale_mode)
    check_epilogue(a, out, bias, residual, N, n_out, out.dtype, dev)
    in_place = residual is not None and _same(residual, out)
    if out_given:
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=b, bias=bias, scale_a=scale_a, scale_b=scale_b,
                          residual=None if in_place else residual)
    c3 = plain.rkl_spec(out, "out")
    scales, keep, form = _scale_specs(bundle, a, scale_a, scale_b, scale_mode, fp8, M, N, K, L, dev)
    extra = []
    if bias is not None:
        extra.append((bias.data_ptr(), (N,), (1,)))
    if residual is not None:
        extra.append(plain.rkl_spec(residual, "residual"))
    if M == 0 or n_out == 0 or L == 0:
        return out
    if K == 0:  # no product: the epilogue of zeros, computed by torch (nothing launched)
        return _epilogue_of_zeros(out, bias, residual, activation, N, n_out)
    name, entry, specs = _launch(bundle, variant, flags, ab, c, a3, b3, c3, scales, extra, n_out,
                                 b_constant, dev, form)
    if key is not None and (not fp8 or plain.hot_scales(bundle, a, keep, scale_a, scale_b)):
        unit = bundle.unit_scales.get(a.device) if fp8 else None
        fire = _hot(bundle, name, entry, specs, dev, out, out_given, fp8, unit, flags)
        if fire is not None:
            plain.remember_hot(bundle, key, fire)
    return out


def _row_scales(row_scales, quant: bool, scale_out) -> bool:
    if not isinstance(row_scales, bool):
        raise InputError(f"row_scales must be a bool, got {type(row_scales).__name__}")
    if row_scales and not quant:
        raise InputError("row_scales goes with an e4m3 output (out_dtype=torch.float8_e4m3fn)")
    if row_scales and scale_out is not None:
        raise InputError("row_scales returns its own (M, 1) scales: no scale_out")
    return row_scales


def _gemm_fp8_groups(bundle, a, b, out, activation, out_dtype, scale_a, scale_b, variant, b_constant, scale_mode,
                     scale_out, flags, rows=False):
    """The e4m3 output with per-row, per-128-column scales: (out, scale_out); with ``rows`` one
    scale per row, (out, scale (M, 1)): the group codes re-expressed on the row's largest group
    scale by a second kernel (``fp8_rows``; a row's amax spans every N tile of the product).  Every
    call takes the checked path (no hot path yet)."""
    ab = plain.operands(a, b)
    dev = validate.one_device(bundle, a=a, b=b, out=out, scale_out=scale_out)
    validate.no_grad("gemm", a=a, b=b)
    if a.dim() != 2 or b.dim() != 2:
        raise InputError(f"an e4m3 output takes 2-D a and b, got {a.dim()}-D and {b.dim()}-D")
    fp8 = ab == "e4m3"
    a3, b3 = plain.rkl_spec(a, "a"), plain.rkl_spec(b, "b")
    M, K, L = a3[1]
    N = b3[1][0]
    n_out = _n_out(N, flags, out, None)
    if n_out % 16:
        raise InputError(f"an e4m3 output needs a multiple of 16 columns (16-byte rows), got {n_out}")
    if out is None:
        out = a.new_empty((M, n_out), dtype=_E4M3)
    elif tuple(out.shape) != (M, n_out) or (out_dtype is not None and out_dtype != out.dtype):
        raise InputError(f"out must have shape {(M, n_out)} and dtype {out_dtype or out.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    else:
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=b, scale_a=scale_a, scale_b=scale_b, scale_out=scale_out)
    if rows:  # the second pass's variant, before anything launches
        fused.fp8_rows_choose(bundle, n_out)
    if scale_out is None:
        scale_out = new_scale_out(a, M, n_out)
    else:
        check_scale_out(scale_out, M, n_out, dev)
        validate.disjoint("scale_out", scale_out, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    c = plain.out_kind(out, fp8, scale_a, scale_b, scale_mode)
    c3 = plain.rkl_spec(out, "out")
    scales, keep, form = _scale_specs(bundle, a, scale_a, scale_b, scale_mode, fp8, M, N, K, L, dev)
    extra = [_scale_out_spec(scale_out, M, -(-n_out // FP8_GROUP))]
    if M == 0 or n_out == 0:
        return (out, a.new_empty((M, 1), dtype=torch.float32)) if rows else (out, scale_out)
    if K == 0:  # the product is zero: zero codes, the smallest scale (nothing launched)
        out.zero_()
        scale_out.fill_(FP8_MIN_SCALE)
        return (out, a.new_full((M, 1), FP8_MIN_SCALE, dtype=torch.float32)) if rows else (out, scale_out)
    _launch(bundle, variant, flags, ab, c, a3, b3, c3, scales, extra, n_out, b_constant, dev, form)
    del keep  # the scale tensors the specs point at stay alive until the launch is queued
    if rows:
        return fused.fp8_rows(bundle, out, scale_out, out)
    return out, scale_out


def _scale_specs(bundle, a, scale_a, scale_b, scale_mode, fp8, M, N, K, L, dev):
    """The fp8 scales' launch specs: (specs, tensors to keep alive, the row/block form or None)."""
    if fp8 and (scale_mode is not None or plain._per_element(scale_a) or plain._per_element(scale_b)):
        mode = fp8_forms.infer_mode(scale_a, scale_b, M, N, K, scale_mode)
        if mode != "tensor":
            return fp8_forms.scale_specs(mode, scale_a, scale_b, a, M, N, K, L, a.dim(), dev)
    scales, keep = plain.fp8_scales(bundle, a, scale_a, scale_b, dev) if fp8 else ([], [])
    return scales, keep, None


def _launch(bundle, variant, flags, ab, c, a3, b3, c3, scales, extra, n_out, b_constant, dev, form):
    """Select (or take the named) variant and launch it through the checked path: (name, entry, specs)."""
    if variant is None:
        name = select(bundle, a3, b3, c3, ab, c, scales, extra, flags, n_out, b_constant, dev, form)
    else:
        name = _named(bundle, variant, flags, ab, c, [a3, b3, c3, *scales, *extra])
    entry = bundle.manifest["variants"][name]
    specs = [a3, b3, c3, *scales, *extra]
    if "persistent" in entry:
        specs += plain.launch_scalars(bundle, entry, dev)
    bundle.launch(name, specs, checked=True, device=dev)
    return name, entry, specs


def select(bundle, a3, b3, c3, ab, c, scales, extra, flags, n_out, b_constant, dev, form) -> str:
    key = ("epi", flags, n_out, ab, c, a3[1], b3[1], a3[2], b3[2], c3[2], a3[0] % 16, b3[0] % 16, c3[0] % 16,
           b_constant, dev, form, *(s[0] % 16 for s in scales[:2]), *((s[0] % 16, s[2]) for s in extra))
    name = bundle.selections.get(key)
    if name is not None:
        return name
    sel = bundle.selector
    bias = extra[0] if flags & FLAGS["bias"] else None
    res = extra[-1] if flags & FLAGS["residual"] else None
    so = extra[-1] if flags & FLAGS["fp8_groups"] else None
    try:
        problem = sel.gemm_problem(a3, b3, c3, ab, c, scales, b_constant)
        got = sel.select_epilogue(problem, form, flags, n_out, bias[0] if bias else 0, res[0] if res else 0,
                                  res[2] if res else (0, 1, 0), so[0] if so else 0, so[2][1] if so else 0)
    except NoVariantError as e:
        raise NoVariantError(f"{e} (epilogue {'+'.join(fields(flags))}); {bundle.describe_contents('gemm')}") from None
    return plain.remember(bundle, key, got.name.decode())


def _named(bundle, name: str, flags: int, ab: str, c: str, specs: list) -> str:
    """``variant=name`` (tests, benchmarks): a variant runnable here with exactly these epilogue
    fields and dtypes whose argument contract the operands meet (checked on every such call)."""
    entry = bundle.manifest["variants"].get(name)
    if entry is None or entry.get("op") != "gemm" or (entry.get("epilogue") or []) != fields(flags):
        raise NoVariantError(f"no gemm variant {name!r} with the epilogue {'+'.join(fields(flags))}; "
                             f"{bundle.describe_contents('gemm')}")
    if not any(v["name"] == name for v in bundle.candidates("gemm")):
        raise InputError(f"{name} is built for {entry['target']}, not runnable on {bundle.device_name()}")
    if (entry["dtypes"]["a"], entry["dtypes"]["c"], entry["layout"]["a"], entry["layout"]["b"]) != (ab, c, "k", "k"):
        raise InputError(f"{name} takes a={entry['dtypes']['a']} -> {entry['dtypes']['c']}, K-major operands")
    bundle.binder(name).check(specs)
    return name


def _epilogue_of_zeros(out, bias, residual, activation, N, n_out):
    acc = torch.zeros((*out.shape[:-1], N), dtype=torch.float32, device=out.device)
    if bias is not None:
        acc += bias.float()
    if activation == "silu_mul":
        g, u = unpack_gate_up(acc.movedim(-1, 0), n_out)
        acc = (torch.nn.functional.silu(g) * u).movedim(0, -1)
    if residual is not None:
        acc = acc + residual.float()
    out.copy_(acc)
    return out


def _hot(bundle, name, entry, specs, dev, out, out_given, fp8, unit, flags):
    """The hot path's launch of a problem the checked path just launched: pointers only."""
    fixed = bundle.fixed(name, specs)
    if fixed is None:
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    empty_like = torch.empty_like
    oproto = None if out_given else devmem.proto(out.dtype, out.device).expand(out.shape)
    if oproto is not None and empty_like(oproto).stride() != out.stride():
        return None
    unit_ptr = unit.data_ptr() if unit is not None else 0
    has_bias, has_res = bool(flags & FLAGS["bias"]), bool(flags & FLAGS["residual"])
    # A given ``out`` must share no byte with a, b, bias (or a scale), and be the residual itself or
    # apart from it: checked per call (the pointers differ), over byte extents the key fixes.
    es = plain._ELEMENT_BYTES
    ab, c = entry["dtypes"]["a"], entry["dtypes"]["c"]
    rspec = specs[-2 if "persistent" in entry else -1] if has_res else None
    in_place = has_res and out_given and rspec[0] == out.data_ptr()
    ext = [validate.span(specs[0][1], specs[0][2]) * es[ab], validate.span(specs[1][1], specs[1][2]) * es[ab]]
    eo = validate.span(specs[2][1], specs[2][2]) * es[c]
    if has_bias:
        ext.append(specs[1][1][0] * es[c])
    if has_res and not in_place:
        ext.append(validate.span(rspec[1], rspec[2]) * es[c])

    def apart(po, ptrs) -> bool:
        return all(not (po < p + e and p < po + eo) for p, e in zip(ptrs, ext))

    def fire(a, b, out, bias, residual, sa, sb):
        if out is None:
            out = empty_like(oproto)
        else:
            po = out.data_ptr()
            ins = [a.data_ptr(), b.data_ptr()]
            if has_bias:
                ins.append(bias.data_ptr())
            if has_res:
                rp = residual.data_ptr()
                if in_place != (rp == po):
                    return None
                if not in_place:
                    ins.append(rp)
            if not apart(po, ins):
                return None  # the checked path says which overlaps
            if fp8 and any(po <= x.data_ptr() < po + eo for x in (sa, sb) if x is not None):
                return None
        here = cur()
        if here != dev:
            not_current(dev, here)
        p = [a.data_ptr(), b.data_ptr(), out.data_ptr()]
        if fp8:
            p += (unit_ptr if sa is None else sa.data_ptr(), unit_ptr if sb is None else sb.data_ptr())
        if has_bias:
            p.append(bias.data_ptr())
        if has_res:
            p.append(residual.data_ptr())
        err = go(*p, raw(here))
        if err is None:  # a pointer of another alignment: the checked path
            return None
        if err:
            raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")
        return out
    return fire


def check_meta(bundle, a, b, bias=None, residual=None, activation=None, out_dtype=None, scale_a=None, scale_b=None,
               b_constant=False, scale_mode=None, row_scales=False):
    """What ``gemm_epilogue`` checks before a launch, on metadata alone (the torch op's fake);
    returns a new output (for an e4m3 output: (out, scale_out)).  Selection runs where every size is
    concrete (pointers taken aligned)."""
    quant = fp8_out(None, out_dtype)
    flags = flags_of(bias, residual, activation, quant)
    rows = _row_scales(row_scales, quant, None)
    if quant:
        out, scale_out = _check_meta_fp8_groups(bundle, a, b, activation, scale_a, scale_b, b_constant, scale_mode,
                                                flags)
        if not rows:
            return out, scale_out
        if isinstance(out.shape[1], int):
            fused.fp8_rows_choose(bundle, out.shape[1])
        return out, a.new_empty((out.shape[0], 1), dtype=torch.float32)
    ab = plain.operands(a, b)
    dev = validate.one_device(bundle, a=a, b=b)
    validate.no_grad("gemm", a=a, b=b)
    fp8 = ab == "e4m3"
    N = b.shape[-2]
    sizes = (*a.shape, *b.shape)
    if not plain.concrete(*sizes):
        out = a.new_empty((*a.shape[:-1], N // 2 if activation else N),
                          dtype=out_dtype or (torch.bfloat16 if fp8 else a.dtype))
        if not any((v.get("epilogue") or []) == fields(flags) and v["dtypes"]["a"] == ab
                   for v in bundle.candidates("gemm")):
            raise NoVariantError(f"no gemm variant with the epilogue {'+'.join(fields(flags))} for a={ab} on "
                                 f"{bundle.device_name()}; {bundle.describe_contents('gemm')}")
        return out
    n_out = _n_out(N, flags, None, residual)
    out = a.new_empty((*a.shape[:-1], n_out), dtype=out_dtype or (torch.bfloat16 if fp8 else a.dtype))
    c = plain.out_kind(out, fp8, scale_a, scale_b, scale_mode)
    check_epilogue(a, out, bias, residual, N, n_out, out.dtype, dev)
    spec = [plain._rkl_meta(t, w) for t, w in ((a, "a"), (b, "b"), (out, "out"))]
    M, K, L = spec[0][1]
    if M == 0 or n_out == 0 or L == 0 or K == 0:
        return out
    if fp8 and (scale_mode not in (None, "tensor") or plain._per_element(scale_a) or plain._per_element(scale_b)):
        if not any((v.get("epilogue") or []) == fields(flags) and v["dtypes"]["a"] == ab
                   for v in bundle.candidates("gemm")):
            raise NoVariantError(f"no fp8 gemm variant with the epilogue {'+'.join(fields(flags))}")
        return out
    scales = [(0, (1,), (1,))] * 2 if fp8 else []
    extra = []
    if bias is not None:
        extra.append((0, (N,), (1,)))
    if residual is not None:
        extra.append(plain._rkl_meta(residual, "residual"))
    select(bundle, *spec, ab, c, scales, extra, flags, n_out, b_constant, dev, None)
    return out


def _check_meta_fp8_groups(bundle, a, b, activation, scale_a, scale_b, b_constant, scale_mode, flags):
    ab = plain.operands(a, b)
    dev = validate.one_device(bundle, a=a, b=b)
    validate.no_grad("gemm", a=a, b=b)
    if a.dim() != 2 or b.dim() != 2:
        raise InputError(f"an e4m3 output takes 2-D a and b, got {a.dim()}-D and {b.dim()}-D")
    M, N = a.shape[0], b.shape[0]
    concrete = plain.concrete(*a.shape, *b.shape)
    n_out = _n_out(N, flags, None, None) if concrete else (N // 2 if activation else N)
    if concrete and n_out % 16:
        raise InputError(f"an e4m3 output needs a multiple of 16 columns (16-byte rows), got {n_out}")
    out = a.new_empty((M, n_out), dtype=_E4M3)
    scale_out = new_scale_out(a, M, n_out)
    if not any((v.get("epilogue") or []) == fields(flags) and v["dtypes"]["a"] == ab
               for v in bundle.candidates("gemm")):
        raise NoVariantError(f"no gemm variant with the epilogue {'+'.join(fields(flags))} for a={ab} on "
                             f"{bundle.device_name()}; {bundle.describe_contents('gemm')}")
    return out, scale_out
