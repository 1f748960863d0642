"""Block-scaled operands (MXFP8, NVFP4) and ``bundle.gemm_blockscaled``.  Torch only: no DSL.

A block-scaled operand is a :class:`BlockScaled`: an (R, K) or (L, R, K) matrix (R = M of A, N of
B) stored as

- ``data``: the elements, K contiguous: float8_e4m3fn / float8_e5m2 (MXFP8), or e2m1 packed two
  to a byte as (…, R, K/2) ``float4_e2m1fn_x2`` (or uint8) with the even k in the low nibble (NVFP4);
- ``scale``: one scale factor per ``vec`` elements along K (MXFP8: e8m0 per 32, NVFP4: e4m3 per 16)
  in the layout the kernels read, ``SF_LAYOUT`` of factory/abi.py: a contiguous
  (L, ceil(R/128), ceil(ceil(K/vec)/4), 32, 4, 4) tensor whose [l, rb, kb, i, j, s] is the scale of
  row 128·rb + 32·j + i, k-block 4·kb + s (the PTX ISA's 128x4 scale-factor atom, which cuBLAS also
  reads); padding entries are zero.  2-D operands have no L mode;
- ``global_scale`` (NVFP4 only): a float32 one-element device tensor multiplying the whole matrix.

Decoded value: x[l, r, k] = data[l, r, k] · scale_of(l, r, k // vec) (· global_scale).

:func:`pack` quantizes a floating-point matrix into that form, :func:`dequantize` decodes one, and
:func:`reference_gemm` is the float32 product of two decoded operands — the reference a test on a
Blackwell GPU compares ``bundle.gemm_blockscaled`` with.  Quantization recipes:

- MXFP8: per block the smallest power of two ``X`` with amax / X ≤ the element format's largest
  finite value (448 for e4m3, 57344 for e5m2), so nothing saturates; elements x / X rounded to
  nearest even.  (The OCP MX spec's floor(log2 amax) − emax choice can saturate; both decode the same way.)
- NVFP4: a per-tensor decode scale g = amax / (6·448) (or the caller's), per block an e4m3 scale
  s = round_e4m3(block_amax / 6 / g), elements x / (s·g) rounded to nearest even on the e2m1 grid
  {0, 0.5, 1, 1.5, 2, 3, 4, 6} and clamped to ±6.

The op (``gemm_blockscaled``) validates operands, output, devices and alignment (InputError), picks a
variant of the op ``gemm_blockscaled`` (family sm100, built for the family target sm_100f: compute
capability 10.0 and 10.3) and launches it; on any other device it raises NoVariantError saying so.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..abi import BLOCK_FORMATS, SF_LAYOUT, BlockFormat, sf_blocks
from ..atoms.targets import TARGETS
from . import gemm as dense
from . import validate
from .errors import InputError, NoVariantError

OP = "gemm_blockscaled"
# The formats by the names users give them.
FORMAT_NAMES = {"mxfp8": "mxf8e4m3", "mxfp8_e4m3": "mxf8e4m3", "mxfp8_e5m2": "mxf8e5m2", "nvfp4": "nvf4"}
_DATA_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}
_E4M3_MAX = 448.0
# e2m1 magnitudes by code (sign in bit 3), and the rounding thresholds between neighbours.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_OUT = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _fp8(name: str):
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]


def _scale_dtype(name: str):
    """torch dtype of a scale-factor tensor: float8_e8m0fnu (where this torch has it, else uint8
    holding the codes) or float8_e4m3fn."""
    if name == "e8m0":
        return getattr(torch, "float8_e8m0fnu", torch.uint8)
    return torch.float8_e4m3fn


def _fp4_dtype():
    return getattr(torch, "float4_e2m1fn_x2", torch.uint8)


def block_format(fmt) -> BlockFormat:
    if isinstance(fmt, BlockFormat):
        return fmt
    key = FORMAT_NAMES.get(fmt, fmt)
    if key not in BLOCK_FORMATS:
        raise InputError(f"unknown block-scaled format {fmt!r}; known: {', '.join(FORMAT_NAMES)}")
    return BLOCK_FORMATS[key]


# --- the scale-factor layout -----------------------------------------------------------------------
def sf_shape(rows: int, k: int, vec: int, batch: int | None = None) -> tuple[int, ...]:
    """Shape of the ``SF_LAYOUT`` scale tensor of an operand of ``rows`` × ``k`` (× ``batch``)."""
    rb, kb = sf_blocks(rows, k, vec)
    return ((batch,) if batch is not None else ()) + (rb, kb, 32, 4, 4)


def swizzle_scales(s: Tensor) -> Tensor:
    """(…, R, Kblocks) scale factors (one per block, row-major) -> the ``SF_LAYOUT`` tensor
    (…, ceil(R/128), ceil(Kblocks/4), 32, 4, 4), zero padded.  Any dtype of one byte."""
    *lead, rows, kblk = s.shape
    rb, kb = -(-rows // 128), -(-kblk // 4)
    p = s.new_zeros((*lead, rb * 128, kb * 4))
    p[..., :rows, :kblk] = s
    n = len(lead)
    # row = 128 rb + 32 j + i, k-block = 4 kb + t  ->  [rb, kb, i, j, t]
    p = p.reshape(*lead, rb, 4, 32, kb, 4)
    return p.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).contiguous()


def unswizzle_scales(sf: Tensor, rows: int, kblocks: int) -> Tensor:
    """The inverse of :func:`swizzle_scales`: (…, R, Kblocks) from the ``SF_LAYOUT`` tensor."""
    *lead, rb, kb, _, _, _ = sf.shape
    n = len(lead)
    p = sf.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).reshape(*lead, rb * 128, kb * 4)
    return p[..., :rows, :kblocks]


# --- element codecs --------------------------------------------------------------------------------
def e2m1_encode(x: Tensor) -> Tensor:
    """Round float32 values to the nearest e2m1 value (ties to the even code), saturating at ±6;
    returns the 4-bit codes as uint8 (bit 3: sign)."""
    m = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for i, t in enumerate(_E2M1_MID):
        # Between codes i and i+1: above the midpoint -> i+1; at it -> the even one of the two.
        code += ((m > t) | ((m == t) & (i % 2 == 1))).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_decode(code: Tensor) -> Tensor:
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=code.device)
    return lut[code.long() & 15]


def pack_nibbles(code: Tensor) -> Tensor:
    """(…, K) 4-bit codes -> (…, K/2) bytes, element 2j in the low nibble of byte j."""
    c = code.reshape(*code.shape[:-1], code.shape[-1] // 2, 2)
    return c[..., 0] | (c[..., 1] << 4)


def unpack_nibbles(byte: Tensor) -> Tensor:
    b = byte.view(torch.uint8) if byte.dtype != torch.uint8 else byte
    return torch.stack((b & 15, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def e8m0_encode(exponent: Tensor) -> Tensor:
    """Powers of two 2^e (integer ``exponent`` in [-127, 127]) as e8m0 codes (e + 127)."""
    return (exponent.clamp(-127, 127) + 127).to(torch.uint8)


def e8m0_decode(code: Tensor) -> Tensor:
    """e8m0 codes -> float32 2^(code − 127); code 255 is NaN."""
    c = code.view(torch.uint8) if code.dtype != torch.uint8 else code
    v = torch.ldexp(torch.ones(c.shape, dtype=torch.float32, device=c.device), c.to(torch.int32) - 127)
    return torch.where(c == 255, torch.full_like(v, float("nan")), v)


# --- the operand -------------------------------------------------------------------------------------
class BlockScaled:
    """A block-scaled operand (see the module docstring): ``data``, ``scale`` in ``SF_LAYOUT``,
    ``global_scale`` (NVFP4) and the format.  Construct it with :func:`pack`, or from existing
    tensors (weights quantized elsewhere, scales in the cuBLAS/PTX 128x4 layout) with
    ``BlockScaled(data, scale, fmt, global_scale=...)``, which checks that they fit together."""

    __slots__ = ("data", "scale", "global_scale", "fmt", "rows", "k", "batch")

    def __init__(self, data: Tensor, scale: Tensor, fmt, global_scale: Tensor | None = None):
        f = block_format(fmt)
        validate.tensors(data=data, scale=scale)
        if data.dim() not in (2, 3):
            raise InputError(f"{f.name} data must be 2-D (R, K) or 3-D (L, R, K), got shape {tuple(data.shape)}")
        if f.data == "e2m1":
            if data.dtype not in (_fp4_dtype(), torch.uint8):
                raise InputError(f"nvfp4 data must be {_fp4_dtype()} (or uint8), two e2m1 values a byte, "
                                 f"got {data.dtype}")
            k = data.shape[-1] * 2
        else:
            if data.dtype != _fp8(f.data):
                raise InputError(f"{f.name} data must be {_fp8(f.data)}, got {data.dtype}")
            k = data.shape[-1]
        batch = data.shape[0] if data.dim() == 3 else None
        rows = data.shape[-2]
        if k % f.vec:
            raise InputError(f"{f.name}: K = {k} must be a multiple of {f.vec} (whole scale blocks)")
        want = sf_shape(rows, k, f.vec, batch)
        if scale.dtype not in (_scale_dtype(f.scale), torch.uint8):
            raise InputError(f"{f.name} scale factors must be {_scale_dtype(f.scale)} (or uint8 holding its "
                             f"bytes), got {scale.dtype}")
        if tuple(scale.shape) != want:
            raise InputError(f"{f.name} scale factors for data {tuple(data.shape)} must have the {SF_LAYOUT} "
                             f"shape {want} (L, ceil(R/128), ceil(ceil(K/{f.vec})/4), 32, 4, 4), "
                             f"got {tuple(scale.shape)}")
        if not scale.is_contiguous():
            raise InputError(f"{f.name} scale factors must be contiguous ({SF_LAYOUT} is a dense layout)")
        if f.global_scale:
            if global_scale is None:
                raise InputError(f"{f.name} needs a global_scale (a one-element float32 tensor)")
            validate.tensors(global_scale=global_scale)
            if global_scale.numel() != 1 or global_scale.dtype != torch.float32:
                raise InputError(f"global_scale must be a one-element float32 tensor, got "
                                 f"{tuple(global_scale.shape)} {global_scale.dtype}")
            global_scale = global_scale.reshape(1)
        elif global_scale is not None:
            raise InputError(f"{f.name} has no global scale (only nvfp4 does)")
        self.data, self.scale, self.global_scale, self.fmt = data, scale, global_scale, f
        self.rows, self.k, self.batch = rows, k, batch

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape: (R, K) or (L, R, K)."""
        return ((self.batch,) if self.batch is not None else ()) + (self.rows, self.k)

    @property
    def device(self):
        return self.data.device

    def to(self, device) -> "BlockScaled":
        g = None if self.global_scale is None else self.global_scale.to(device)
        return BlockScaled(self.data.to(device), self.scale.to(device), self.fmt, g)

    def __repr__(self) -> str:
        return f"BlockScaled({self.fmt.name}, shape={self.shape}, {SF_LAYOUT}, {self.data.device})"


def pack(x: Tensor, fmt="nvfp4", *, global_scale: float | Tensor | None = None) -> BlockScaled:
    """Quantize an (R, K) or (L, R, K) floating-point matrix (K: the reduction dimension, whole
    blocks: a multiple of 32 for MXFP8, 16 for NVFP4) into ``fmt`` ("mxfp8" = "mxfp8_e4m3",
    "mxfp8_e5m2", "nvfp4").  NVFP4's ``global_scale`` (the decode factor of the whole tensor)
    defaults to amax / (6·448).  Returns a :class:`BlockScaled` on ``x``'s device."""
    f = block_format(fmt)
    validate.tensors(x=x)
    if not x.dtype.is_floating_point or x.dim() not in (2, 3):
        raise InputError(f"pack takes a 2-D or 3-D floating-point tensor, got {tuple(x.shape)} {x.dtype}")
    *lead, rows, k = x.shape
    if k == 0 or k % f.vec:
        raise InputError(f"pack({f.name}): K = {k} must be a positive multiple of {f.vec}")
    xf = x.detach().float()
    if not bool(torch.isfinite(xf).all()):
        raise InputError(f"pack({f.name}): the input has infinite or NaN values")
    blocks = xf.reshape(*lead, rows, k // f.vec, f.vec)
    amax = blocks.abs().amax(dim=-1)
    g = None
    if f.name.startswith("mxf8"):
        e = _pow2_exponent(amax, _DATA_MAX[f.data])
        q = (blocks * torch.ldexp(torch.ones_like(amax), -e)[..., None]).to(_fp8(f.data))
        data = q.reshape(*lead, rows, k)
        codes = e8m0_encode(e)
    else:
        if global_scale is None:
            t = float(xf.abs().max()) if xf.numel() else 0.0
            gs = t / (6.0 * _E4M3_MAX) if t > 0 else 1.0
        else:
            gs = float(global_scale)
            if not gs > 0 or gs == float("inf"):
                raise InputError(f"pack(nvfp4): global_scale must be positive and finite, got {gs}")
        s = (amax / 6.0 / gs).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
        step = s.float() * gs  # the block's decode factor
        inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
        q = e2m1_encode(blocks * inv[..., None]).reshape(*lead, rows, k)
        data = pack_nibbles(q)
        if _fp4_dtype() != torch.uint8:
            data = data.view(_fp4_dtype())
        codes = s.view(torch.uint8)
        g = torch.tensor([gs], dtype=torch.float32, device=x.device)
    sf = swizzle_scales(codes)
    if f.scale == "e8m0" and _scale_dtype("e8m0") != torch.uint8:
        sf = sf.view(_scale_dtype("e8m0"))
    elif f.scale == "e4m3":
        sf = sf.view(torch.float8_e4m3fn)
    return BlockScaled(data, sf, f, g)


def _pow2_exponent(amax: Tensor, fmax: float) -> Tensor:
    """Per block the smallest integer e with amax / 2^e <= fmax (e in [-127, 127]; amax = 0: -127)."""
    e = torch.ceil(torch.log2(amax.clamp_min(1e-38) / fmax)).to(torch.int32)
    # log2 is not exact: settle e on the exact comparisons.
    e = e + (torch.ldexp(amax, -e) > fmax).to(torch.int32)
    e = e - (torch.ldexp(amax, -(e - 1)) <= fmax).to(torch.int32)
    return torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)


def block_scales(t: BlockScaled) -> Tensor:
    """The float32 decode factor of every block: (…, R, K/vec), the global scale included."""
    f = t.fmt
    codes = unswizzle_scales(t.scale, t.rows, t.k // f.vec)
    if f.scale == "e8m0":
        s = e8m0_decode(codes)
    else:
        s = codes.view(torch.float8_e4m3fn).float() if codes.dtype == torch.uint8 else codes.float()
    if t.global_scale is not None:
        s = s * t.global_scale.float().to(s.device)
    return s


def element_values(t: BlockScaled) -> Tensor:
    """The elements as float32, before scaling: (…, R, K)."""
    if t.fmt.data == "e2m1":
        return e2m1_decode(unpack_nibbles(t.data))
    return t.data.float()


def dequantize(t: BlockScaled) -> Tensor:
    """The float32 matrix ``t`` encodes: element × its block's scale (× the global scale)."""
    f = t.fmt
    v = element_values(t)
    s = block_scales(t)
    return (v.reshape(*v.shape[:-1], t.k // f.vec, f.vec) * s[..., None]).reshape(v.shape)


def reference_gemm(a: BlockScaled, b: BlockScaled) -> Tensor:
    """float32 a·bᵀ of the decoded operands: what a block-scaled GEMM computes before its output
    rounding (fp32 accumulation; the kernel's differ only in summation order)."""
    return torch.matmul(dequantize(a), dequantize(b).transpose(-1, -2))


# --- the op ------------------------------------------------------------------------------------------
def _data_spec(t: BlockScaled, what: str):
    """(data_ptr, (R, K, L), strides in elements) of an operand's data (fp4: twice the byte strides)."""
    ptr, shape, stride = dense.rkl_spec(t.data, what)
    if t.fmt.data == "e2m1":
        shape = (shape[0], shape[1] * 2, shape[2])
        stride = (stride[0] * 2, stride[1], stride[2] * 2)
    return ptr, shape, stride


def _check_operand(t, what: str) -> None:
    if not isinstance(t, BlockScaled):
        raise InputError(f"gemm_blockscaled: {what} must be a BlockScaled operand (blockscaled.pack(x, fmt), or "
                         f"BlockScaled(data, scale, fmt)), got {type(t).__name__}")
    if t.data.stride(-1) != 1 and t.data.shape[-1] > 1:
        raise InputError(f"gemm_blockscaled: {what}.data must be contiguous along K (K-major), strides "
                         f"{tuple(t.data.stride())}")


def _check_alignment(t: BlockScaled, what: str) -> None:
    """What every block-scaled variant's TMA needs of an operand: 16-byte aligned data and scale
    pointers and data rows (and batches) 16 bytes apart."""
    strides = [s * t.data.element_size() for s, n in zip(t.data.stride()[:-1], t.data.shape[:-1]) if n > 1]
    if t.data.data_ptr() % 16 or any(s % 16 for s in strides):
        raise InputError(f"gemm_blockscaled: {what}.data must start 16-byte aligned with rows 16 bytes apart "
                         f"(TMA), got pointer % 16 = {t.data.data_ptr() % 16}, byte strides {strides}")
    if t.scale.data_ptr() % 16:
        raise InputError(f"gemm_blockscaled: {what}.scale must start 16-byte aligned (TMA), got pointer % 16 = "
                         f"{t.scale.data_ptr() % 16}")


def gemm_blockscaled(bundle, a: BlockScaled, b: BlockScaled, out: Tensor | None = None, *, out_dtype=None,
                     variant: str | None = None) -> Tensor:
    """``out = dequantize(a) @ dequantize(b).T`` for block-scaled a (M, K) / (L, M, K) and b (N, K)
    / (L, N, K) of one format, on a Blackwell datacenter GPU (sm_100f variants); bf16 out unless
    ``out``/``out_dtype`` say otherwise (and the bundle has a variant for it)."""
    _check_operand(a, "a")
    _check_operand(b, "b")
    if a.fmt != b.fmt:
        raise InputError(f"gemm_blockscaled: a is {a.fmt.name} but b is {b.fmt.name}: both operands need one format")
    f = a.fmt
    if (a.batch is None) != (b.batch is None) or a.k != b.k or (a.batch is not None and a.batch != b.batch):
        raise InputError(f"gemm_blockscaled: shapes do not match for a·bᵀ: a {a.shape}, b {b.shape}")
    named = dict(a_data=a.data, a_scale=a.scale, a_global=a.global_scale, b_data=b.data, b_scale=b.scale,
                 b_global=b.global_scale, out=out)
    dev = validate.one_device(bundle, **named)
    if torch.is_grad_enabled():
        validate.no_grad(OP, **named)
    M, N, K = a.rows, b.rows, a.k
    L = a.batch if a.batch is not None else 1
    lead = (a.batch,) if a.batch is not None else ()
    if out is None:
        out = a.data.new_empty((*lead, M, N), dtype=out_dtype or torch.bfloat16)
    else:
        if tuple(out.shape) != (*lead, M, N):
            raise InputError(f"out must have shape {(*lead, M, N)} (a {a.shape} · b {b.shape}ᵀ), got {tuple(out.shape)}")
        if out_dtype is not None and out_dtype != out.dtype:
            raise InputError(f"out_dtype {out_dtype} differs from out's dtype {out.dtype}: give one of them")
        validate.distinct("out", out.shape, out.stride())
        validate.disjoint("out", out, a_data=a.data, a_scale=a.scale, a_global=a.global_scale, b_data=b.data,
                          b_scale=b.scale, b_global=b.global_scale)
    c = _OUT.get(out.dtype)
    if c is None:
        raise InputError(f"out dtype {out.dtype} is not one the kernels write (bfloat16, float16, float32)")
    if M == 0 or N == 0 or L == 0:
        return out
    if K % 32:
        raise InputError(f"gemm_blockscaled: K = {K} must be a multiple of 32 (16-byte rows of fp4, whole MXFP8 blocks)")
    _check_alignment(a, "a")
    _check_alignment(b, "b")
    a3, b3, c3 = _data_spec(a, "a"), _data_spec(b, "b"), dense.rkl_spec(out, "out")
    specs = [a3, b3, c3, (a.scale.data_ptr(), (a.scale.numel(),), (1,)), (b.scale.data_ptr(), (b.scale.numel(),), (1,))]
    if f.global_scale:
        specs += [(t.global_scale.data_ptr(), (1,), (1,)) for t in (a, b)]
    name = select(bundle, f.name, c, specs, M, N, K, L, dev, variant)
    entry = bundle.manifest["variants"][name]
    bundle.launch(name, [*specs, *dense.launch_scalars(bundle, entry, dev)], checked=True, device=dev)
    return out


def select(bundle, fmt: str, c: str, specs: list, M: int, N: int, K: int, L: int, dev: int,
           variant: str | None = None) -> str:
    """The variant for these launch specs: the host library's ``fx_gemm_blockscaled_select``
    (where M > 128 a CTA pair, else a single CTA; then the most CTAs: a rule, not a measurement,
    no Blackwell GPU has run these), or the named ``variant`` where its contract takes them;
    cached per problem key."""
    key = (OP, fmt, c, variant, tuple((s[0] % 16, s[1], s[2]) for s in specs), dev)
    name = bundle.selections.get(key)
    if name is not None:
        return name
    if variant is not None:
        fits, reasons = bundle.fitting(OP, specs, lambda v: v.get("format") == fmt and v["dtypes"]["c"] == c
                                       and v["name"] == variant)
        if not fits:
            raise NoVariantError(_no_variant(bundle, fmt, c, M, N, K, L, variant, reasons))
        return dense.remember(bundle, key, variant)
    from .selector import FORMAT, DTYPE, BlockScaledProblem, _I64x3

    a3, b3, c3, sfa, sfb, *glob = specs
    p = BlockScaledProblem(FORMAT[fmt], DTYPE[c], M, N, K, L, a3[0] or None, _I64x3(*a3[2]), b3[0] or None,
                           _I64x3(*b3[2]), c3[0] or None, _I64x3(*c3[2]), sfa[0] or None, sfb[0] or None,
                           (glob[0][0] or None) if glob else None, (glob[1][0] or None) if glob else None)
    try:
        got = bundle.selector.select(OP, p)
    except NoVariantError as e:
        if not bundle.candidates(OP):  # none built, or none runs here: say which devices they are for
            raise NoVariantError(_no_variant(bundle, fmt, c, M, N, K, L, None, [])) from None
        raise NoVariantError(f"{e}; {bundle.describe_contents(OP)}") from None
    return dense.remember(bundle, key, got.name.decode())


def _no_variant(bundle, fmt, c, M, N, K, L, variant, reasons) -> str:
    have = [v for v in bundle.manifest["variants"].values() if v["op"] == OP]
    where = sorted({v["target"] for v in have})
    what = f"{'variant ' + repr(variant) + ' for ' if variant else ''}{fmt} -> {c}, M={M} N={N} K={K} L={L}"
    if not have:
        return f"no {OP} variant for {what}: the bundle has none (build it with --ops {OP} for sm_100f)"
    if not bundle.candidates(OP):
        ccs = sorted({cc for t in where if t in TARGETS for cc in TARGETS[t].ccs})
        return (f"no {OP} variant for {what} on {bundle.device_name()}: block-scaled GEMM (MXFP8/NVFP4, "
                f"tcgen05 block-scaled MMA) is built for {', '.join(where)} only, which runs on Blackwell "
                f"datacenter GPUs (compute capability {', '.join(f'{a}.{b}' for a, b in ccs)}) and nowhere else")
    why = f" (closest: {reasons[0]})" if reasons else ""
    return f"no {OP} variant for {what} on {bundle.device_name()}{why}; {bundle.describe_contents(OP)}"
