"""``bundle.gemm(a, b)``: a·bᵀ for a (M, K) or (L, M, K) and b (N, K) or (L, N, K).

Selection, once per problem key (dtypes, majorness, sizes, strides, pointer alignment, b_constant),
cached: the host library's ``fx_gemm_select`` (compiler/csrc/fx_select.c, through
runtime/selector.py), the one implementation of the rules, the families' cost models (sm90: fitted
to H100 measurements; sm100: a roofline from published B200 figures, unmeasured) and the tuning
table compiled into the library (``python -m factory link``).  notes/gemm-sm90.md and
notes/gemm-sm100.md give the models; fx_select.c says how it chooses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import fp8 as fp8_forms
from . import counters, devmem, validate, workspaces
from .bundle import not_current
from .errors import InputError, LaunchError, NoVariantError

_CACHE_LIMIT = 4096

# Our names of the torch dtypes the GEMM kernels take (operands: bf16, f16, e4m3; out: + f32).
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES[torch.float8_e4m3fn] = "e4m3"
_OPERANDS = ("bf16", "f16", "e4m3")
_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1}


def _as_rkl(t, what: str):
    """(R, K) or (L, R, K) -> a (R, K, L) view (no copy)."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3:
        raise InputError(f"{what} must be 2-D or 3-D, got shape {tuple(t.shape)}")
    return t.permute(1, 2, 0)


def rkl_spec(t, what: str) -> tuple[int, tuple, tuple]:
    """The (data_ptr, shape, stride) of ``_as_rkl(t)`` without building the view (hot path)."""
    shape, stride = t.shape, t.stride()
    if len(shape) == 2:
        return t.data_ptr(), (shape[0], shape[1], 1), (stride[0], stride[1], 0)
    if len(shape) == 3:
        return t.data_ptr(), (shape[1], shape[2], shape[0]), (stride[1], stride[2], stride[0])
    raise InputError(f"{what} must be 2-D or 3-D, got shape {tuple(shape)}")


def _rkl_meta(t, what: str) -> tuple[int, tuple, tuple]:
    """``rkl_spec`` without the pointer (0: taken as aligned), for tensors that have no data."""
    shape, stride = t.shape, t.stride()
    if len(shape) == 2:
        return 0, (shape[0], shape[1], 1), (stride[0], stride[1], 0)
    if len(shape) == 3:
        return 0, (shape[1], shape[2], shape[0]), (stride[1], stride[2], stride[0])
    raise InputError(f"{what} must be 2-D or 3-D, got shape {tuple(shape)}")


def _major(spec, mn: str) -> str | None:
    _, shape, stride = spec
    if stride[1] == 1 or shape[1] == 1:
        return "k"
    if stride[0] == 1 or shape[0] == 1:
        return mn
    return None


def select(bundle, a3, b3, c3, ab: str, c: str, scales: list, b_constant: bool = False, device: int = 0,
           scale_form: tuple | None = None) -> str:
    """The variant for these (R, K, L) operand specs (or tensors); the host library's choice
    (``fx_gemm_select``), cached per problem key.

    ``b_constant``: B is not written by any kernel that may still run in the stream, so an
    ``early_b`` variant may run (the tuning table's measured b_constant winner of the bucket, or
    the early_b twin of the plain choice).  ``scale_form``: fp8 row / block scales (runtime/fp8.py
    ``scale_specs``' third value), selected by the host library's ``fx_gemm_scaled_select``."""
    a3, b3, c3 = (x if isinstance(x, tuple) else (x.data_ptr(), tuple(x.shape), tuple(x.stride()))
                  for x in (a3, b3, c3))
    M, K, L = a3[1]
    N = b3[1][0]
    key = (ab, c, M, N, K, L, a3[2], b3[2], c3[2], a3[0] % 16, b3[0] % 16, c3[0] % 16, b_constant, device,
           scale_form, *(s[0] % 16 for s in scales[:2]))
    name = bundle.selections.get(key)
    if name is not None:
        return name
    sel = bundle.selector
    try:
        problem = sel.gemm_problem(a3, b3, c3, ab, c, scales, b_constant)
        got = sel.select_scaled(problem, scale_form) if scale_form else sel.select("gemm", problem)
    except NoVariantError as e:
        raise NoVariantError(f"{e}; {bundle.describe_contents('gemm')}") from None
    return remember(bundle, key, got.name.decode())


def launch_scalars(bundle, entry: dict, device: int = 0) -> list:
    """The variant's scalar arguments after its tensors: a persistent variant's grid cap
    (``max_clusters``), else none.  The cap is the clusters the device holds at once: the
    driver's answer for this kernel on a real device (runtime/occupancy.py), never more than the
    SMs over the CTAs of one launched cluster (the only figure for a planned device)."""
    pers = entry.get("persistent")
    if pers is None:
        return []
    return [resident_clusters(bundle, entry, pers["cluster_ctas"], bundle.device_info()["sm_count"] // pers["cluster_ctas"],
                              device)]


def resident_clusters(bundle, entry: dict, cluster_ctas: int, bound: int, device: int = 0) -> int:
    """Clusters of ``cluster_ctas`` CTAs of this variant that CUDA device ``device`` (the current
    one) holds at once: the driver's answer on a real device (runtime/occupancy.py), never more
    than ``bound`` (the only figure for a planned device); asked once per variant and device."""
    key = ("max_clusters", entry["name"], None if bundle.planned else device)
    cap = bundle.variant_facts.get(key)
    if cap is None:
        cap = max(1, bound)
        if not bundle.planned and not bundle.simulated:  # the GPU itself, not a device given for planning
            from .occupancy import capturing, current_device, max_active_clusters

            if current_device() not in (device, None) or capturing():
                return cap  # the driver would answer for another device / must not be asked inside a capture
            cap = min(cap, max_active_clusters(bundle.path, entry, cluster_ctas) or cap)
        bundle.variant_facts[key] = cap
    return cap


def remember(bundle, key: tuple, name: str) -> str:
    """Cache a selection (bounded: a long-running server sees unboundedly many shapes)."""
    if len(bundle.selections) >= _CACHE_LIMIT:
        bundle.selections.clear()
    bundle.selections[key] = name
    return name


def fp8_scales(bundle, a, scale_a, scale_b, dev: int) -> tuple[list, list]:
    """(launch specs, tensors to keep alive until the launch is queued) of fp8's two per-tensor
    scales: one-element tensors on ``a``'s device (index ``dev``); float32 is passed as it is, another floating
    dtype converted, a missing one is the cached [1.0] of that device."""
    scales, keep = [], []
    for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is None:
            s = _unit_scale(bundle, a.device)
        else:
            if not isinstance(s, Tensor) or s.get_device() != dev or s.numel() != 1:
                _scale_error(what, s, a)
            if s.dtype != torch.float32:
                if not s.dtype.is_floating_point:
                    raise InputError(f"{what} must be a floating-point tensor, got {s.dtype}")
                s = s.reshape(1).to(torch.float32)
        keep.append(s)
        scales.append((s.data_ptr(), (1,), (1,)))
    return scales, keep


def _scale_error(what: str, s, a):
    if not isinstance(s, Tensor):
        raise InputError(f"{what} must be a one-element torch.Tensor on {validate.where(a)} "
                         f"(a per-tensor scale), got {type(s).__name__}")
    if s.numel() != 1:
        raise InputError(f"{what} must hold one element (a per-tensor scale), got shape {tuple(s.shape)}")
    raise InputError(f"{what} is on {validate.where(s)} but a is on {validate.where(a)}: "
                     f"the scale must be on the operands' device")


def _workspace_spec(entry: dict, M: int, N: int, ptr: int = 0, L: int = 1) -> list:
    """The split-K workspace argument of a variant that has one, else nothing: (split_k, M, N)
    fp32 passed as its (M, N, split_k) view, or for the in-kernel fix-up (``form`` "tiles") the
    flat float32 buffer of ``workspace_words`` (also the tail split's form, "tail")."""
    if "workspace" not in entry:
        return []
    w = entry["workspace"]
    if w.get("form") in _FLAT_FORMS:
        return [(ptr, (workspace_words(w, M, N, L),), (1,))]
    s = entry["split_k"]
    return [(ptr, (M, N, s), (N, 1, M * N))]


_FLAT_FORMS = ("tiles", "tail")  # the in-kernel fix-ups' flat workspaces: semaphores, then partial tiles


def workspace_words(w: dict, M: int, N: int, L: int) -> int:
    """float32 elements of a "tiles" or "tail" workspace (gemm/sm90_splitk.py, fx_select.c agree):
    one int32 semaphore per output tile, rounded up to ``sem_align`` words, then a partial tile per
    (tile, part) ("tiles"), or at most ``slots`` partial tiles ("tail": the split parts of the
    last round only)."""
    tm, tn = w["tile"]
    t = -(-M // tm) * -(-N // tn) * L
    a = w["sem_align"]
    parts = t * w["splits"]
    if w.get("form") == "tail":
        parts = min(parts, w["slots"])
    return -(-t // a) * a + parts * tm * tn


def sem_words(w: dict, M: int, N: int, L: int) -> int:
    """The leading words of a "tiles" / "tail" workspace that must be zero at launch (the semaphores)."""
    tm, tn = w["tile"]
    t = -(-M // tm) * -(-N // tn) * L
    return -(-t // w["sem_align"]) * w["sem_align"]


def new_workspace(entry: dict, M: int, N: int, L: int, device, stream=None) -> tuple[int, Tensor | None]:
    """A split-K variant's workspace for one launch on ``stream`` (a raw handle): its data pointer
    and the tensor to keep until the launch is queued.  The flat forms' take the stream's buffer
    (runtime/workspaces.py: semaphores kept zero, no allocation or zeroing per launch); the other
    form's comes from the stream-ordered allocator (a CUDA graph's pool while capturing)."""
    w = entry["workspace"]
    if w.get("form") in _FLAT_FORMS:
        return workspaces.flat(device, stream, workspace_words(w, M, N, L), sem_words(w, M, N, L))
    ws = torch.empty((entry["split_k"], M, N), dtype=torch.float32, device=device)
    return ws.data_ptr(), ws


def _unit_scale(bundle, device):
    """A float32 [1.0] on ``device`` for an fp8 scale not given, made once per device.  Not kept
    when made during CUDA-graph capture: its fill would then run only when the graph replays.
    Kept only once its fill has finished, so a launch on any other stream may read it."""
    s = bundle.unit_scales.get(device)
    if s is None:
        if devmem.capturing(device):
            return torch.ones(1, dtype=torch.float32, device=device)
        s = bundle.unit_scales[device] = devmem.full(1, 1.0, torch.float32, device, sync=True)
    return s


def fitting_variants(bundle, a3, b3, c3, ab: str, c: str, scales: list,
                     early_b: bool = False, every_target: bool = False) -> tuple[list[dict], str, str]:
    """For tools (scripts/tune.py times every variant that fits): manifest entries of the best
    runnable target (or, with ``every_target``, of every runnable target) whose dtypes, majorness
    and argument contract take this problem (specs as in ``select``), and the majorness of a and
    b; raises NoVariantError when none can.  (The runtime's choice is ``select``'s.)  Variants
    that load B before their PDL wait (config ``early_b``) are left out, or with ``early_b=True``
    are the only ones listed."""
    M, K, L = a3[1]
    N = b3[1][0]
    am, bm = _major(a3, "m"), _major(b3, "n")
    if am is None or bm is None:
        raise InputError(f"a and b need a contiguous mode (strides {a3[2]}, {b3[2]}); "
                         f"call .contiguous() first")
    fits, reasons = [], []
    for v in bundle.candidates("gemm"):
        d, lay = v["dtypes"], v["layout"]
        if (d["a"], d["c"], lay["a"], lay["b"]) != (ab, c, am, bm):
            continue
        if bool(v.get("config", {}).get("early_b")) != early_b:  # for a constant B only (select())
            continue
        if v.get("epilogue"):  # fused epilogues take more arguments (runtime/epilogue.py)
            continue
        try:
            # (Scalars are not checked: the grid cap is asked of the driver only at launch.)
            bundle.binder(v["name"]).check([a3, b3, c3, *scales, *_workspace_spec(v, M, N, 0, L)])
        except InputError as e:
            reasons.append(str(e))
            continue
        fits.append(v)
    if not fits:
        why = f" (closest: {reasons[0]})" if reasons else ""
        raise NoVariantError(
            f"no gemm variant for a={ab} ({am}-major) b={ab} ({bm}-major) -> {c}, M={M} N={N} K={K} L={L} "
            f"on {bundle.device_name()}{why}; {bundle.describe_contents('gemm')}")
    best_target = fits[0]["target"]
    return [v for v in fits if every_target or v["target"] == best_target], am, bm


def gemm(bundle, a, b, out=None, *, out_dtype=None, scale_a=None, scale_b=None, variant=None,
         b_constant=False, scale_mode=None):
    # Hot path: a problem seen before (shapes, strides, dtypes and devices of every tensor, the
    # flags) was checked in full then; what can differ between calls of one key is checked here:
    # tensor types, autograd, the current device, the data pointers' alignment (in ``go``).
    try:
        key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(), b.get_device(),
               out_dtype, b_constant, variant, scale_a is None, scale_b is None, scale_mode)
        if out is not None or scale_a is not None or scale_b is not None:
            key = hot_key(key, out, scale_a, scale_b)
        fire = bundle.hot_gemm.get(key)
    except (AttributeError, TypeError):  # not tensors, an unhashable argument, a stand-in bundle
        key = fire = None
    if (fire is not None and isinstance(a, Tensor) and isinstance(b, Tensor) and hot_types(out, scale_a, scale_b)
            and not ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())):
        r = fire(a, b, out, scale_a, scale_b)
        if r is not None:
            return r
        key = None  # a pointer of another alignment: the checked path selects for it, uncached
    # Checked on every call, cheaply: types, dtypes, ranks and sizes, one CUDA device, autograd.
    # Strides, alignment and 32-bit sizes are checked once per problem key (select / the binder).
    ab = operands(a, b)
    sa, sb = a.shape, b.shape
    nd = len(sa)
    dev = a.get_device()
    if b.get_device() != dev or dev < bundle.lowest_device or (out is not None and (not isinstance(out, Tensor) or out.get_device() != dev)):
        dev = validate.one_device(bundle, a=a, b=b, out=out)
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        validate.no_grad("gemm", a=a, b=b)
    fp8 = ab == "e4m3"
    a3, b3 = rkl_spec(a, "a"), rkl_spec(b, "b")
    M, K, L = a3[1]
    N = b3[1][0]
    out_given = out is not None
    if out is None:
        dt = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
        out = a.new_empty((*sa[:-1], N), dtype=dt)  # (a's device, no device object)
        c3 = rkl_spec(out, "out")
    else:
        c3 = rkl_spec(out, "out")
        if c3[1] != (M, N, L) or out.dim() != nd or (out_dtype is not None and out_dtype != out.dtype):
            _out_error(a, b, out, out_dtype)
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    c = out_kind(out, fp8, scale_a, scale_b, scale_mode)
    form = None  # row / block scales (runtime/fp8.py): shapes, strides and the C selection's form
    if fp8 and (scale_mode is not None or _per_element(scale_a) or _per_element(scale_b)):
        mode = fp8_forms.infer_mode(scale_a, scale_b, M, N, K, scale_mode)
        if mode != "tensor":
            scales, keep, form = fp8_forms.scale_specs(mode, scale_a, scale_b, a, M, N, K, L, nd, dev)
    if form is None:
        scales, keep = fp8_scales(bundle, a, scale_a, scale_b, dev) if fp8 else ([], [])
    if M == 0 or N == 0 or L == 0 or K == 0:  # torch's result, nothing launched
        return _empty_problem(out, K, keep if fp8 and form is None else None)
    if variant is None:
        name = select(bundle, a3, b3, c3, ab, c, scales, b_constant, dev, form)
    else:
        name = _named(bundle, variant, a3, b3, c3, ab, c, scales, dev)
    entry = bundle.manifest["variants"][name]
    if "workspace" in entry:  # split-K partials; kept until the launch is queued
        ptr, ws = new_workspace(entry, M, N, L, a.device, counters.raw_stream(bundle, a.device))
        keep.append(ws)
        scales += _workspace_spec(entry, M, N, ptr, L)
    if "persistent" in entry:
        scales += launch_scalars(bundle, entry, dev)
    bundle.launch(name, [a3, b3, c3, *scales], checked=True, device=dev)
    if key is not None and (not fp8 or hot_scales(bundle, a, keep, scale_a, scale_b)):
        unit = bundle.unit_scales.get(a.device) if fp8 else None
        remember_hot(bundle, key, hot_launch(bundle, name, entry, [a3, b3, c3, *scales], dev, out, out_given, unit))
    return out


def operands(a, b) -> str:
    """The operands' dtype name (bf16, f16, e4m3); InputError for what the metadata already
    refuses: not tensors, dtypes, ranks, shapes that do not multiply.  (The real op and its
    torch-op fake, ``check_meta``, both call this.)"""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        validate.tensors(a=a, b=b)
    ab = DTYPES.get(a.dtype)
    if ab not in _OPERANDS or DTYPES.get(b.dtype) != ab:
        if a.dtype != b.dtype:
            raise InputError(f"a and b dtypes differ: {a.dtype} vs {b.dtype}")
        raise InputError(f"unsupported dtype {a.dtype}: gemm takes bfloat16, float16 or float8_e4m3fn")
    sa, sb = a.shape, b.shape
    nd = len(sa)
    if nd != len(sb) or nd not in (2, 3) or sa[-1] != sb[-1] or (nd == 3 and sa[0] != sb[0]):
        raise InputError(f"shapes do not match for a·bᵀ: a {tuple(sa)}, b {tuple(sb)} (a (M, K) or (L, M, K), "
                         f"b (N, K) or (L, N, K))")
    return ab


def out_kind(out, fp8: bool, scale_a, scale_b, scale_mode=None) -> str:
    """The output's dtype name; InputError when the kernels do not write it, or scales are given
    to a GEMM that is not fp8."""
    c = DTYPES.get(out.dtype)
    if c is None:
        raise InputError(f"out dtype {out.dtype} is not one the kernels write (bfloat16, float16, float32)")
    if not fp8 and (scale_a is not None or scale_b is not None or scale_mode not in (None, "tensor")):
        raise InputError("scale_a/scale_b apply to fp8 GEMMs only")
    return c


def concrete(*values) -> bool:
    """Whether every size/stride is a plain int (under torch.compile with dynamic shapes some are
    symbolic: a selection on them would specialise the graph to one size)."""
    return all(type(v) is int for v in values)


def check_meta(bundle, a, b, out=None, out_dtype=None, scale_a=None, scale_b=None, b_constant=False,
               scale_mode=None):
    """What ``gemm`` checks before a launch, on metadata alone (fake tensors under torch.compile),
    raising the same InputError / NoVariantError; returns ``out`` (a new one when None).

    The selection runs as the real op's when every size and stride is concrete (pointers taken as
    16-byte aligned); with symbolic sizes, only whether the bundle has a GEMM of these dtypes for
    this device."""
    ab = operands(a, b)
    dev = validate.one_device(bundle, a=a, b=b, out=out)
    validate.no_grad("gemm", a=a, b=b)
    fp8 = ab == "e4m3"
    sa, sb = a.shape, b.shape
    if out is None:
        out = a.new_empty((*sa[:-1], sb[-2]), dtype=out_dtype or (torch.bfloat16 if fp8 else a.dtype))
    else:
        if (tuple(out.shape) != (*sa[:-1], sb[-2])) or (out_dtype is not None and out_dtype != out.dtype):
            _out_error(a, b, out, out_dtype)
        validate.distinct("out", out.shape, out.stride())
    c = out_kind(out, fp8, scale_a, scale_b, scale_mode)
    mode = fp8_forms.check_fake(a, b, scale_a, scale_b, scale_mode) if fp8 else "tensor"
    if mode != "tensor":  # row / block scales: their layout as the real op checks it, then the variants
        if not concrete(*a.shape, *b.shape, *scale_a.stride(), *scale_b.stride()):
            return out
        M, K, N = a.shape[-2], a.shape[-1], b.shape[-2]
        fp8_forms.scale_layout(mode, scale_a, scale_b, M, N, K, 1, a.dim(), dev)
        if M == 0 or N == 0 or K == 0:
            return out
        if not any(v["dtypes"]["a"] == ab and v["dtypes"]["c"] == c and (v.get("scale_mode") or "tensor") == mode
                   for v in bundle.candidates("gemm")):
            raise NoVariantError(f"no gemm variant with {mode} fp8 scales for a={ab} -> {c} on "
                                 f"{bundle.device_name()}; {bundle.describe_contents('gemm')}")
        return out
    if fp8:
        for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s is None:
                continue
            if not isinstance(s, Tensor) or s.get_device() != dev or s.numel() != 1:
                _scale_error(what, s, a)
            if not s.dtype.is_floating_point:
                raise InputError(f"{what} must be a floating-point tensor, got {s.dtype}")
    spec = [_rkl_meta(t, w) for t, w in ((a, "a"), (b, "b"), (out, "out"))]
    if not concrete(*spec[0][1], *spec[1][1], *(x for s in spec for x in s[2])):
        if not any(v["dtypes"]["a"] == ab and v["dtypes"]["c"] == c for v in bundle.candidates("gemm")):
            raise NoVariantError(f"no gemm variant for a={ab} b={ab} -> {c} on {bundle.device_name()}; "
                                 f"{bundle.describe_contents('gemm')}")
        return out
    M, K, L = spec[0][1]
    if M == 0 or spec[1][1][0] == 0 or L == 0 or K == 0:
        return out
    scales = [(0, (1,), (1,))] * 2 if fp8 else []
    select(bundle, *spec, ab, c, scales, b_constant, dev)
    return out


def hot_key(key: tuple, out, scale_a, scale_b) -> tuple:
    """``key`` extended by what the hot path's launch depends on in ``out`` and the scales (their
    shapes, strides, dtypes, devices; a scale's element count).  AttributeError when one is not
    a tensor."""
    if out is not None:
        key += (out.shape, out.stride(), out.dtype, out.get_device())
    if scale_a is not None:
        key += (scale_a.dtype, scale_a.get_device(), scale_a.shape, scale_a.stride())
    if scale_b is not None:
        key += (scale_b.dtype, scale_b.get_device(), scale_b.shape, scale_b.stride())
    return key


def _per_element(s) -> bool:
    """A scale tensor of more than one element: a row or block form (runtime/fp8.py)."""
    return isinstance(s, Tensor) and s.numel() != 1


def hot_scales(bundle, a, keep: list, scale_a, scale_b) -> bool:
    """Whether the fp8 scales the checked path launched with are the ones the hot path will pass:
    given ones float32 as given, a default one kept (made outside a graph capture)."""
    unit = bundle.unit_scales.get(a.device)
    return all(s is unit if g is None else s is g for s, g in zip(keep, (scale_a, scale_b)))


def hot_types(out, scale_a, scale_b) -> bool:
    return ((out is None or isinstance(out, Tensor)) and (scale_a is None or isinstance(scale_a, Tensor))
            and (scale_b is None or isinstance(scale_b, Tensor)))


def remember_hot(bundle, key: tuple, fire) -> None:
    if fire is not None:
        if len(bundle.hot_gemm) >= _CACHE_LIMIT:
            bundle.hot_gemm.clear()
        bundle.hot_gemm[key] = fire


def hot_launch(bundle, name: str, entry: dict, specs: list, dev: int, out, out_given: bool, unit):
    """The hot path's launch of a problem just launched (and so checked) with ``specs``:
    ``fire(a, b, out, scale_a, scale_b)`` allocates ``out`` when not given (and a split-K
    variant's workspace), launches, and returns ``out``, or None when a data pointer breaks the
    alignment contract (nothing launched: the checked path then says which).  Everything else of
    the key's problem is fixed: the packed argument bytes (:meth:`BundleCore.fixed`) and the
    allocations' layouts (``empty_like`` of zero-stride views, checked here).  None when the
    variant was not loaded by that launch (a stand-in launch in tests)."""
    fixed = bundle.fixed(name, specs)
    if fixed is None:  # not loaded by that launch (a stand-in launch in tests): nothing cached
        return None
    go = fixed.go
    cur, raw = bundle.device_api()
    empty_like = torch.empty_like
    oproto = None if out_given else devmem.proto(out.dtype, out.device).expand(out.shape)
    if oproto is not None and empty_like(oproto).stride() != out.stride():
        raise AssertionError(f"{name}: empty_like does not reproduce the checked output layout")
    wproto = wflat = None  # a split-K workspace: (split_k, M, N) per launch, or a flat one per stream
    if "workspace" in entry:
        M, N, L = specs[0][1][0], specs[1][1][0], specs[0][1][2]  # as the checked path takes it
        w = entry["workspace"]
        if w.get("form") in _FLAT_FORMS:
            wflat = workspaces.StreamFlat(torch.device("cuda", dev) if dev >= 0 else torch.device("cpu"),
                                          workspace_words(w, M, N, L),
                                          sem_words(w, M, N, L)).get
        else:
            words = _workspace_spec(entry, M, N, 0, L)[0][1]
            wproto = devmem.proto(torch.float32, out.device).expand(math.prod(words))
    fp8 = entry["dtypes"]["a"] == "e4m3"
    unit_ptr = unit.data_ptr() if unit is not None else 0
    # A given ``out`` must share no byte with a, b (or a given scale): checked per call, the
    # pointers differ; the byte extents are fixed by the key.  (An overlap returns None: the
    # checked path then raises the InputError.)
    es = _ELEMENT_BYTES
    ea, eb = (validate.span(s[1], s[2]) * es[entry["dtypes"]["a"]] for s in specs[:2])
    eo = validate.span(specs[2][1], specs[2][2]) * es[entry["dtypes"]["c"]]

    def failed(err):
        if err is None:
            return None
        raise LaunchError(f"{name}: launch failed: {bundle.lib.error(err)}")

    if not fp8 and wproto is None and wflat is None:
        if out_given:
            def fire_out(a, b, out, sa, sb):
                here = cur()
                if here != dev:
                    not_current(dev, here)
                pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
                if (po < pa + ea and pa < po + eo) or (po < pb + eb and pb < po + eo):
                    return None
                err = go(pa, pb, po, raw(here))
                return out if err == 0 else failed(err)
            return fire_out

        def fire(a, b, out, sa, sb):
            out = empty_like(oproto)
            here = cur()
            if here != dev:
                not_current(dev, here)
            err = go(a.data_ptr(), b.data_ptr(), out.data_ptr(), raw(here))
            return out if err == 0 else failed(err)
        return fire

    def fire_any(a, b, out, sa, sb):
        if out is None:
            out = empty_like(oproto)
        here = cur()
        if here != dev:
            not_current(dev, here)
        p = [a.data_ptr(), b.data_ptr(), out.data_ptr()]
        if out_given:
            pa, pb, po = p
            if (po < pa + ea and pa < po + eo) or (po < pb + eb and pb < po + eo):
                return None
        if fp8:
            p += (unit_ptr if sa is None else sa.data_ptr(), unit_ptr if sb is None else sb.data_ptr())
            if out_given and any(po <= x < po + eo for x in p[3:]):
                return None
        stream = raw(here)
        if wflat is not None:
            wp, ws = wflat(stream)  # (ws: a workspace of this launch alone, alive until it is queued)
            p.append(wp)
        elif wproto is not None:
            ws = empty_like(wproto)  # (alive until the launch is queued)
            p.append(ws.data_ptr())
        err = go(*p, stream)
        return out if err == 0 else failed(err)
    return fire_any


def _out_error(a, b, out, out_dtype):
    want = (*a.shape[:-1], b.shape[-2])
    if tuple(out.shape) != want:
        raise InputError(f"out must have shape {want} (a {tuple(a.shape)} · b {tuple(b.shape)}ᵀ), "
                         f"got {tuple(out.shape)}")
    raise InputError(f"out_dtype {out_dtype} differs from out's dtype {out.dtype}: give one of them")


def _empty_problem(out, K: int, scales: list | None):
    """An empty product: M, N or L = 0 leaves nothing to write; K = 0 is a sum of nothing, zeros
    (times the fp8 scales, as torch's ``_scaled_mm`` would)."""
    if out.numel() and K == 0:
        out.zero_()
        if scales:
            out.mul_(scales[0] * scales[1])
    return out


def _named(bundle, name: str, a3, b3, c3, ab: str, c: str, scales: list, dev: int) -> str:
    """``variant=name`` (benchmarks, tests): a gemm variant runnable here for these dtypes and
    majorness whose contract the operands meet; checked once per problem key."""
    key = ("named", name, ab, c, a3[1], b3[1], a3[2], b3[2], c3[2], a3[0] % 16, b3[0] % 16, c3[0] % 16, dev)
    if key in bundle.selections:
        return name
    entry = bundle.manifest["variants"].get(name)
    if entry is None or entry["op"] != "gemm" or entry.get("family") == "decode" or entry.get("epilogue"):
        raise NoVariantError(f"no gemm variant {name!r} for unpacked operands; {bundle.describe_contents('gemm')}")
    am, bm = _major(a3, "m"), _major(b3, "n")
    d, lay = entry["dtypes"], entry["layout"]
    if not any(v["name"] == name for v in bundle.candidates("gemm")):
        why = f"built for {entry['target']}"
    elif (d["a"], d["c"], lay["a"], lay["b"]) != (ab, c, am, bm):
        why = f"it takes a={d['a']} ({lay['a']}-major) b ({lay['b']}-major) -> {d['c']}"
    else:
        try:
            bundle.binder(name).check([a3, b3, c3, *scales, *_workspace_spec(entry, a3[1][0], b3[1][0], 0, a3[1][2])])
            why = None
        except InputError as e:
            why = str(e)
    if why is not None:
        raise InputError(f"{name} does not fit a={ab} {a3[1]} b={b3[1]} -> {c} on {bundle.device_name()} "
                         f"(dtypes, majorness, alignment or target differ: {why})")
    return remember(bundle, key, name)
