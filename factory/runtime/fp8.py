"""fp8 scale forms of ``bundle.gemm`` and the quantizers that produce them.  Torch only: no DSL.

``bundle.gemm(a, b, scale_a=..., scale_b=...)`` with float8_e4m3fn ``a`` (M, K) and ``b`` (N, K)
(``out = a·bᵀ``) takes float32 scales in one of three forms, told apart by their shapes as
``torch._scaled_mm`` does (or named with ``scale_mode=``):

- ``"tensor"``: one element each (or none: 1.0).  out = sa·sb·a·bᵀ.  2-D or batched (L, M, K).
- ``"row"``: scale_a (M,) or (M, 1), scale_b (N,) or (1, N), contiguous.
  out[m, n] = sa[m]·sb[n]·Σ_k a[m, k]·b[n, k] (``_scaled_mm``'s row-wise form).
- ``"block"`` (DeepSeek-V3 / DeepGEMM): KB = ceil(K/128), NB = ceil(N/128);
  scale_a (M, KB), one scale per row and 128 elements of K, stored **M-major**: strides (1, s) with
  s >= M and a multiple of 4, data 16-byte aligned (DeepGEMM's TMA-aligned layout, which
  ``quantize_blockwise`` writes: s = M rounded up to a multiple of 4);
  scale_b (NB, KB), one scale per 128x128 block of b, K-contiguous: strides (s, 1) with s >= KB.
  out[m, n] = Σ_kb sa[m, kb]·sb[n // 128, kb]·Σ_{k in block kb} a[m, k]·b[n, k]; each k-block's
  partial sum is scaled as it is added into the fp32 accumulators (two-level accumulation).
  K and N need not be multiples of 128 (the last block is partial).

Row and block scales take 2-D a and b.  Shapes that fit two forms (scale_a (M, 1) and scale_b
(1, 1) with N = 1 and K <= 128: row and block) mean the same product there.

Quantizers (``x ≈ q·scale`` with ``q`` float8_e4m3fn): :func:`quantize_rowwise` (one scale per row),
:func:`quantize_blockwise` (per 1x128 or 128x128 block) and their inverses ``dequantize_*``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import InputError

BLOCK = 128  # K elements (and rows of b) per block scale
MODES = ("tensor", "row", "block")
E4M3_MAX = 448.0
_TINY = 1e-12  # a block of zeros gets this amax (its scale stays finite and positive)
# Elements per float32 working slab of quantize_blockwise (256 MiB).
SLAB_ELEMENTS = 1 << 26


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- the forms ----------------------------------------------------------------------------------
def infer_mode(scale_a, scale_b, M: int, N: int, K: int, scale_mode: str | None = None) -> str:
    """The scale form of these scales (their shapes only), or InputError."""
    if scale_mode is not None:
        if scale_mode not in MODES:
            raise InputError(f"scale_mode must be one of {MODES}, got {scale_mode!r}")
        return scale_mode
    if scale_a is None or scale_b is None:
        for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s is not None and s.numel() != 1:
                raise InputError(f"{what} must hold one element (a per-tensor scale; row and block scales need both "
                                 f"scale_a and scale_b), got shape {tuple(s.shape)}")
        return "tensor"
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    KB, NB = _cdiv(K, BLOCK), _cdiv(N, BLOCK)
    fits = []
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        fits.append("tensor")
    if sa in ((M,), (M, 1)) and sb in ((N,), (1, N)):
        fits.append("row")
    if sa == (M, KB) and sb == (NB, KB):
        fits.append("block")
    if not fits:
        raise InputError(
            f"scale shapes scale_a {sa}, scale_b {sb} fit no fp8 scale form for M={M} N={N} K={K}: per tensor "
            f"(1,) and (1,); row-wise ({M},) or ({M}, 1) and ({N},) or (1, {N}); block (1x128 of a, 128x128 of b) "
            f"({M}, {KB}) and ({NB}, {KB})")
    # Shapes that fit two forms mean the same product (row and block coincide only for N = 1 and
    # K <= 128; tensor and the others only for one output element): the first form is taken.
    return fits[0]


def scale_specs(mode: str, scale_a, scale_b, a, M: int, N: int, K: int, L: int, nd: int, dev: int):
    """Checks of row / block scales (dtype, device, shape, strides, alignment) and their launch
    specs [(ptr, shape, stride), (ptr, shape, stride)] with the (mode, a strides, b strides) that
    the host library's ``fx_gemm_scaled_select`` takes.  Returns (specs, keep, (mode id, sa
    strides, sb strides))."""
    form = scale_layout(mode, scale_a, scale_b, M, N, K, L, nd, dev)
    if mode == "block" and scale_a.data_ptr() % 16:
        raise InputError("block scale_a's data must be 16-byte aligned (read by TMA)")
    (_, sa_st, sb_st) = form
    KB, NB = _cdiv(K, BLOCK), _cdiv(N, BLOCK)
    if mode == "row":
        specs = [(scale_a.data_ptr(), (M,), (1,)), (scale_b.data_ptr(), (N,), (1,))]
    else:
        specs = [(scale_a.data_ptr(), (M, KB), sa_st), (scale_b.data_ptr(), (NB, KB), sb_st)]
    return specs, [scale_a, scale_b], form


def scale_layout(mode: str, scale_a, scale_b, M: int, N: int, K: int, L: int, nd: int, dev: int) -> tuple:
    """The metadata checks of row / block scales (dtype, device, shape, strides; no data, no
    pointers: a torch op's fake runs them too) and the (mode id, sa strides, sb strides) form."""
    if nd != 2 or L != 1:
        raise InputError(f"{mode} scales take 2-D a (M, K) and b (N, K); got {nd}-D operands")
    for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, Tensor):
            raise InputError(f"{what} must be a float32 torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise InputError(f"{mode} {what} must be float32, got {s.dtype}")
        if s.get_device() != dev:
            where_s = "cpu" if s.get_device() < 0 else f"cuda:{s.get_device()}"
            raise InputError(f"{what} is on {where_s} but a is on cuda:{dev}: the scales must be on the operands' device")
    KB, NB = _cdiv(K, BLOCK), _cdiv(N, BLOCK)
    if mode == "row":
        if tuple(scale_a.shape) not in ((M,), (M, 1)) or tuple(scale_b.shape) not in ((N,), (1, N)):
            raise InputError(f"row scales: scale_a must be ({M},) or ({M}, 1) and scale_b ({N},) or (1, {N}), "
                             f"got {tuple(scale_a.shape)} and {tuple(scale_b.shape)}")
        sa_t = scale_a.stride()[0] if M > 1 else 1
        sb_t = scale_b.stride()[-1] if N > 1 else 1
        if sa_t != 1 or sb_t != 1:
            raise InputError("row scales must be contiguous (.contiguous())")
        return (1, (1, 0), (1, 0))
    if mode != "block":
        raise InputError(f"unknown scale mode {mode!r}")
    if tuple(scale_a.shape) != (M, KB) or tuple(scale_b.shape) != (NB, KB):
        raise InputError(f"block scales: scale_a must be ({M}, {KB}) (one per row and 128 of K) and scale_b "
                         f"({NB}, {KB}) (one per 128x128 block of b), got {tuple(scale_a.shape)} and "
                         f"{tuple(scale_b.shape)}")
    a0, a1 = scale_a.stride()
    b0, b1 = scale_b.stride()
    if M > 1 and a0 != 1:
        raise InputError(f"block scale_a ({M}, {KB}) must be M-major (strides (1, s), s >= {M}; "
                         f"quantize_blockwise writes it so), got strides {scale_a.stride()}")
    if KB > 1 and a1 < M:
        raise InputError(f"block scale_a's k-block stride {a1} must be >= M = {M}")
    if KB > 1 and a1 % 4:
        raise InputError(f"block scale_a's k-block stride {a1} must be a multiple of 4 (16-byte rows, read by TMA; "
                         f"quantize_blockwise / m_major write M rounded up to 4)")
    if KB > 1 and b1 != 1:
        raise InputError(f"block scale_b ({NB}, {KB}) must be K-contiguous (strides (s, 1)), got {scale_b.stride()}")
    if NB > 1 and b0 < KB:
        raise InputError(f"block scale_b's row stride {b0} must be >= {KB}")
    a0 = 1 if M <= 1 else a0
    a1 = a1 if KB > 1 else _cdiv(max(M, 1), 4) * 4
    b1 = 1 if KB <= 1 else b1
    b0 = b0 if NB > 1 else max(KB, 1)
    return (2, (a0, a1), (b0, b1))


def check_fake(a, b, scale_a, scale_b, scale_mode: str | None = None) -> str:
    """The shape / dtype checks of the scales that need no data (a torch op's fake): the form."""
    if a.dtype != torch.float8_e4m3fn:
        if scale_a is not None or scale_b is not None or scale_mode not in (None, "tensor"):
            raise InputError("scale_a/scale_b apply to fp8 GEMMs only")
        return "tensor"
    if a.dim() < 2 or b.dim() < 2:
        raise InputError(f"a and b must be 2-D or 3-D, got {a.dim()}-D and {b.dim()}-D")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-2]
    mode = infer_mode(scale_a, scale_b, M, N, K, scale_mode)
    if mode != "tensor":
        if a.dim() != 2 or b.dim() != 2:
            raise InputError(f"{mode} scales take 2-D a (M, K) and b (N, K)")
        for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s.dtype != torch.float32:
                raise InputError(f"{mode} {what} must be float32, got {s.dtype}")
    return mode


# --- the grouped GEMM's forms (runtime/grouped.py) -------------------------------------------
# e4m3 a and b, bf16 out; KB = ceil(K/128), NB = ceil(N/128); E groups, M rows (contiguous: all
# tokens; masked: max_m per group):
#   row:   scale_a contiguous (M,) or (M, 1) / masked (E, M) or (E, M, 1), unit stride along M;
#          scale_b (E, N) (or (E, 1, N)), unit stride along N.
#   block: scale_a contiguous (M, KB) / masked (E, M, KB), M-major (stride 1 along M), the KB and
#          E strides multiples of 4 (16-byte TMA rows), KB stride >= M, data 16-byte aligned;
#          scale_b (E, NB, KB), K-contiguous, NB stride >= KB.
GROUPED_MODES = ("row", "block")


def grouped_mode(scale_a, scale_b, masked: bool, E: int, M: int, N: int, K: int) -> str:
    """The fp8 grouped form of these scales (from their shapes), or InputError."""
    for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, Tensor):
            raise InputError(f"the fp8 grouped GEMM needs {what}: a float32 tensor (row or block scales), got "
                             f"{type(s).__name__}")
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    KB, NB = _cdiv(K, BLOCK), _cdiv(N, BLOCK)
    row_a = ((E, M), (E, M, 1)) if masked else ((M,), (M, 1))
    blk_a = (E, M, KB) if masked else (M, KB)
    if sa in row_a and sb in ((E, N), (E, 1, N)):
        return "row"
    if sa == blk_a and sb == (E, NB, KB):
        return "block"
    lay = "masked" if masked else "contiguous"
    raise InputError(f"scale shapes scale_a {sa}, scale_b {sb} fit no fp8 grouped form ({lay}, E={E} M={M} N={N} "
                     f"K={K}): row-wise {row_a[0]} and ({E}, {N}); block (1x128 of a, 128x128 of each b[g]) "
                     f"{blk_a} and ({E}, {NB}, {KB})")


def grouped_scales(scale_a, scale_b, masked: bool, E: int, M: int, N: int, K: int, dev: int,
                   real: bool = True) -> tuple:
    """Checks of the fp8 grouped GEMM's scales (form, dtype, device, shapes, strides, alignment)
    before anything launches.  Returns (mode, [scale_a spec, scale_b spec] in the kernels' mode
    order, (mode id, scale_a strides {m, kb, group}, scale_b strides {n|nb, kb, group}) for the
    host library).  ``real`` False (a torch op's fake): no pointer is read (0)."""
    mode = grouped_mode(scale_a, scale_b, masked, E, M, N, K)
    for what, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            raise InputError(f"{mode} {what} must be float32, got {s.dtype}")
        if s.get_device() != dev and dev != -1:
            where_s = "cpu" if s.get_device() < 0 else f"cuda:{s.get_device()}"
            raise InputError(f"{what} is on {where_s} but a is on cuda:{dev}: the scales must be on the operands' device")
    KB, NB = _cdiv(K, BLOCK), _cdiv(N, BLOCK)
    pa = scale_a.data_ptr() if real else 0
    pb = scale_b.data_ptr() if real else 0
    # scale_b's strides (n | nb, kb, group)
    bst = scale_b.stride()
    if mode == "row":
        xa = (scale_a.stride()[1], 1, scale_a.stride()[0]) if masked else (scale_a.stride()[0], 1, 0)
        xb = (bst[-1], 1, bst[0])
        if M > 1 and xa[0] != 1:
            raise InputError(f"row scale_a must be contiguous along the rows, got strides {scale_a.stride()}")
        if N > 1 and xb[0] != 1:
            raise InputError(f"row scale_b ({E}, {N}) must be contiguous along N, got strides {scale_b.stride()}")
        sa_g = xa[2] if E > 1 else max(M, 1)
        sb_g = xb[2] if E > 1 else max(N, 1)
        sa = (pa, (M, E), (1, sa_g)) if masked else (pa, (M,), (1,))
        sb = (pb, (N, E), (1, sb_g))
        return mode, [sa, sb], (1, xa, xb)
    if masked:
        xa = (scale_a.stride()[1], scale_a.stride()[2], scale_a.stride()[0])
    else:
        xa = (scale_a.stride()[0], scale_a.stride()[1], 0)
    xb = (bst[1], bst[2], bst[0])
    if M > 1 and xa[0] != 1:
        raise InputError(f"block scale_a must be M-major (stride 1 along the rows; quantize_grouped_a writes it so), "
                         f"got strides {scale_a.stride()}")
    if KB > 1 and (xa[1] < M or xa[1] % 4):
        raise InputError(f"block scale_a's k-block stride {xa[1]} must be >= M = {M} and a multiple of 4 (16-byte rows, "
                         f"read by TMA)")
    if masked and E > 1 and (xa[2] < 1 or xa[2] % 4):
        raise InputError(f"block scale_a's group stride {xa[2]} must be a positive multiple of 4 (read by TMA)")
    if real and pa % 16:
        raise InputError("block scale_a's data must be 16-byte aligned (read by TMA)")
    if KB > 1 and xb[1] != 1:
        raise InputError(f"block scale_b ({E}, {NB}, {KB}) must be K-contiguous, got strides {scale_b.stride()}")
    if NB > 1 and xb[0] < KB:
        raise InputError(f"block scale_b's n-block stride {xb[0]} must be >= {KB}")
    a_k = xa[1] if KB > 1 else _cdiv(max(M, 1), 4) * 4
    a_e = (xa[2] if E > 1 else a_k * KB) if masked else 0
    b_n = xb[0] if NB > 1 else KB
    b_e = xb[2] if E > 1 else NB * KB
    sa = (pa, (M, KB, E), (1, a_k, a_e)) if masked else (pa, (M, KB), (1, a_k))
    sb = (pb, (NB, KB, E), (b_n, 1, b_e))
    return mode, [sa, sb], (2, xa, xb)


def quantize_grouped_a(a: Tensor, form: str) -> tuple[Tensor, Tensor]:
    """(q, scale_a) of the grouped GEMM's activations: contiguous a (M, K) or masked a (E, max_m, K).
    ``form`` "row": one scale per row ((M,) / (E, max_m)); "block": one per row and 128 of K,
    M-major and TMA-aligned ((M, KB) strides (1, ceil(M/4)·4) / (E, max_m, KB) with each group's
    (max_m, KB) block so laid out)."""
    if not isinstance(a, Tensor) or a.dim() not in (2, 3) or not a.dtype.is_floating_point:
        raise InputError("quantize_grouped_a takes a 2-D (M, K) or 3-D (E, max_m, K) floating-point tensor")
    if form not in GROUPED_MODES:
        raise InputError(f"form must be one of {GROUPED_MODES}, got {form!r}")
    if a.dim() == 2:
        return quantize_rowwise(a) if form == "row" else quantize_blockwise(a, (1, BLOCK))
    E, M, K = a.shape
    q, s = (quantize_rowwise if form == "row" else quantize_blockwise)(a.reshape(E * M, K), *(
        () if form == "row" else ((1, BLOCK),)))
    q = q.view(E, M, K)
    if form == "row":
        return q, s.view(E, M)
    KB = _cdiv(K, BLOCK)
    lead = _cdiv(max(M, 1), 4) * 4
    out = torch.empty((E, KB, lead), dtype=torch.float32, device=a.device)
    out[:, :, :M] = s.reshape(E, M, KB).transpose(1, 2)
    return q, out[:, :, :M].transpose(1, 2)


def quantize_grouped_b(w: Tensor, form: str) -> tuple[Tensor, Tensor]:
    """(q, scale_b) of stacked expert weights w (E, N, K) (row-major per expert): q (E, N, K)
    float8_e4m3fn (pass ``q.transpose(1, 2)`` as the grouped GEMM's b) and scale_b (E, N) for "row"
    (one per output channel) or (E, ceil(N/128), ceil(K/128)) contiguous for "block" (one per
    128x128 block)."""
    if not isinstance(w, Tensor) or w.dim() != 3 or not w.dtype.is_floating_point:
        raise InputError("quantize_grouped_b takes 3-D (E, N, K) floating-point weights")
    if form not in GROUPED_MODES:
        raise InputError(f"form must be one of {GROUPED_MODES}, got {form!r}")
    E, N, K = w.shape
    if form == "row":
        q, s = quantize_rowwise(w.reshape(E * N, K))
        return q.view(E, N, K), s.view(E, N)
    # Expert by expert into the outputs (no stacked copies: 256 DeepSeek-V3 experts are 7.5 GB in fp8).
    q = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((E, _cdiv(N, BLOCK), _cdiv(K, BLOCK)), dtype=torch.float32, device=w.device)
    for g in range(E):
        q[g], s[g] = quantize_blockwise(w[g], (BLOCK, BLOCK))
    return q, s


def dequantize_grouped(q: Tensor, scale: Tensor, form: str, *, weights: bool = False) -> Tensor:
    """float32 values of a quantize_grouped_a (``weights`` False) or quantize_grouped_b pair."""
    if q.dim() == 2:
        return dequantize_rowwise(q, scale) if form == "row" else dequantize_blockwise(q, scale)
    if form == "row":
        return q.float() * scale.float()[..., None]
    return torch.stack([dequantize_blockwise(q[g], scale[g]) for g in range(q.shape[0])]) if q.shape[0] else q.float()


# --- quantizers ---------------------------------------------------------------------------------
def _fp8(x: Tensor) -> Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """(q, scale) of a 2-D (R, K) tensor, one float32 scale per row: q = x / scale[:, None] in
    float8_e4m3fn with scale = amax(|row|) / 448 (no element saturates).  ``scale`` is (R,)
    contiguous: a's or b's row-wise scale as ``bundle.gemm`` takes it."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise InputError("quantize_rowwise takes a 2-D floating-point tensor")
    # In slabs of rows: the float32 working copy of an expert weight stack (E*N, K) would be 4x
    # the tensor (tens of GiB for 256 experts).
    R, K = x.shape
    q = torch.empty((R, K), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((R,), dtype=torch.float32, device=x.device)
    step = max(1, (1 << 26) // max(K, 1))
    for r0 in range(0, R, step):
        xf = x[r0:r0 + step].float()
        s = xf.abs().amax(dim=1).clamp_min(_TINY) / E4M3_MAX
        scale[r0:r0 + step] = s
        q[r0:r0 + step] = _fp8(xf / s[:, None])
    return q, scale


def quantize_blockwise(x: Tensor, block: tuple[int, int] = (1, 128), pow2: bool = False) -> tuple[Tensor, Tensor]:
    """(q, scale) of a 2-D (R, K) tensor with one float32 scale per ``block`` of (rows, K
    elements): (1, 128) for activations (a), (128, 128) for weights (b).  q = x / scale in
    float8_e4m3fn with each block's scale = its amax / 448.  Layouts (what ``bundle.gemm``'s
    block form takes): (1, 128): scale (R, ceil(K/128)) M-major, strides (1, ceil(R/4)·4)
    (DeepGEMM's TMA-aligned layout); (128, 128): scale (ceil(R/128), ceil(K/128)) contiguous.
    Partial blocks at the ends of R and K take the amax of the elements they hold.  ``pow2``: each
    scale rounded up to a power of two (UE8M0, what the datacenter Blackwell block form takes: the
    tensor core applies the scales' exponents)."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise InputError("quantize_blockwise takes a 2-D floating-point tensor")
    block = tuple(block)
    if block not in ((1, BLOCK), (BLOCK, BLOCK)):
        raise InputError(f"block must be (1, 128) or (128, 128), got {block}")
    R, K = x.shape
    br = block[0]
    RB, KB = _cdiv(R, br), _cdiv(K, BLOCK)
    q = torch.empty((R, K), dtype=torch.float8_e4m3fn, device=x.device)
    if br == 1:  # written M-major straight away: (KB, lead) storage, viewed (R, KB)
        lead = _cdiv(max(R, 1), 4) * 4
        st = torch.empty((KB, lead), dtype=torch.float32, device=x.device)
        scale = st[:, :R].t()
    else:
        scale = torch.empty((RB, KB), dtype=torch.float32, device=x.device)
    # In slabs of whole row blocks (about SLAB_ELEMENTS each): float32 working copies of a large
    # activation or weight tensor would be several times its size.
    step = max(1, SLAB_ELEMENTS // (br * max(KB, 1) * BLOCK)) * br
    for r0 in range(0, R, step):
        r1 = min(R, r0 + step)
        nb = _cdiv(r1 - r0, br)
        pad = torch.zeros((nb * br, KB * BLOCK), dtype=torch.float32, device=x.device)
        pad[:r1 - r0, :K] = x[r0:r1]
        blocks = pad.view(nb, br, KB, BLOCK)
        s = blocks.abs().amax(dim=(1, 3)).clamp_min(_TINY) / E4M3_MAX  # (nb, KB)
        if pow2:  # the power of two at or above s (frexp: s = m·2^e, m in [0.5, 1))
            m, e = torch.frexp(s)
            s = torch.ldexp(torch.ones_like(s), torch.where(m == 0.5, e - 1, e))
        scale[r0 // br:r0 // br + nb] = s
        q[r0:r1] = _fp8(blocks / s[:, None, :, None]).view(nb * br, KB * BLOCK)[:r1 - r0, :K]
    return q, scale


def m_major(s: Tensor) -> Tensor:
    """An (M, KB) float32 scale tensor copied into the M-major TMA-aligned layout the block form
    reads: strides (1, ceil(M/4)·4)."""
    M, KB = s.shape
    lead = _cdiv(max(M, 1), 4) * 4
    out = torch.empty((KB, lead), dtype=torch.float32, device=s.device)
    out[:, :M] = s.t()
    return out[:, :M].t()


def dequantize_rowwise(q: Tensor, scale: Tensor) -> Tensor:
    """float32 q·scale[:, None] (a quantize_rowwise pair)."""
    return q.float() * scale.reshape(-1, 1).float()


def dequantize_blockwise(q: Tensor, scale: Tensor) -> Tensor:
    """float32 values of a quantize_blockwise pair (the block size read from the scale's shape:
    one scale row per row of q, else per 128 rows)."""
    R, K = q.shape
    br = 1 if scale.shape[0] == R else BLOCK  # (R = 1: either reads the one scale row)
    s = scale.float().repeat_interleave(br, dim=0)[:R].repeat_interleave(BLOCK, dim=1)[:, :K]
    return q.float() * s


__all__ = ["BLOCK", "GROUPED_MODES", "MODES", "check_fake", "dequantize_grouped", "grouped_mode", "grouped_scales",
           "quantize_grouped_a", "quantize_grouped_b", "dequantize_blockwise", "dequantize_rowwise", "infer_mode", "m_major",
           "quantize_blockwise", "quantize_rowwise", "scale_specs"]
