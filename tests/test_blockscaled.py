"""Block-scaled operands on the CPU (torch only): the scale-factor layout against a reference
written from the documentation, the element codecs against the formats' definitions, and the
round trip pack -> dequantize within each format's error.

The reference layout is transcribed, one scalar formula, from the description of the scale-factor
atom that tcgen05.mma's block-scaled kinds read (PTX ISA, "tcgen05 ... scale factor" layouts and
tcgen05.cp .32x128b.warpx4) as cuBLAS documents it for its block-scaled GEMMs ("1D block scaling
factors layout"): scale factors are grouped in blocks of 128 rows x 4 scale columns, 512 bytes each;
within a block, row r and scale column c sit at byte (r % 32)·16 + (r // 32)·4 + c; the blocks of
a matrix follow each other along the scale columns first (the block at row block rb, column block cb
starts at (rb · ceil(C/4) + cb) · 512), batches last; rows past R and columns past C are padding.
It is written with plain integer arithmetic, independently of ``swizzle_scales`` (reshape/permute).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from factory.abi import BLOCK_FORMATS, sf_blocks
from factory.runtime import InputError
from factory.runtime import blockscaled as bs


def documented_offset(r: int, c: int, rows: int, cols: int, l: int = 0) -> int:
    """Byte offset of the scale factor of row ``r``, scale column ``c`` (batch ``l``) in a
    ``rows`` × ``cols`` scale matrix laid out in 128x4 blocks (see the module docstring)."""
    rblocks, cblocks = -(-rows // 128), -(-cols // 4)
    block = (l * rblocks + r // 128) * cblocks + c // 4
    rr = r % 128
    return block * 512 + (rr % 32) * 16 + (rr // 32) * 4 + c % 4


SHAPES = [(1, 1), (1, 4), (5, 3), (32, 4), (128, 4), (129, 5), (200, 7), (300, 13), (256, 8)]


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("batch", [None, 3])
def test_scale_layout_matches_the_documented_128x4_atom(rows, cols, batch):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    lead = (batch,) if batch else ()
    s = torch.randint(1, 256, (*lead, rows, cols), generator=g, dtype=torch.uint8)
    sf = bs.swizzle_scales(s)
    rb, cb = -(-rows // 128), -(-cols // 4)
    assert tuple(sf.shape) == (*lead, rb, cb, 32, 4, 4) and sf.is_contiguous()
    flat = sf.reshape(-1).tolist()
    want = [0] * len(flat)  # padding is zero
    for l in range(batch or 1):
        for r in range(rows):
            for c in range(cols):
                want[documented_offset(r, c, rows, cols, l)] = int((s[l] if batch else s)[r, c])
    assert flat == want
    assert torch.equal(bs.unswizzle_scales(sf, rows, cols), s)


def test_scale_tensor_shape_formula():
    # (L, ceil(R/128), ceil(ceil(K/vec)/4), 32, 4, 4): K counted in elements.
    assert bs.sf_shape(1, 16, 16) == (1, 1, 32, 4, 4)
    assert bs.sf_shape(129, 16 * 17, 16, 2) == (2, 2, 5, 32, 4, 4)
    assert bs.sf_shape(4096, 4096, 32) == (32, 32, 32, 4, 4)
    assert sf_blocks(4096, 7168, 16) == (32, 112)


# --- element codecs -----------------------------------------------------------------------------
def test_e2m1_codes_are_the_format():
    # e2m1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; exponent 0 is subnormal (0, 0.5).
    def by_definition(code):
        sign = -1.0 if code & 8 else 1.0
        e, m = (code >> 1) & 3, code & 1
        return sign * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))

    codes = torch.arange(16, dtype=torch.uint8)
    assert bs.e2m1_decode(codes).tolist() == [by_definition(c) for c in range(16)]


def test_e2m1_rounds_to_nearest_even_and_saturates():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    x = torch.tensor(grid)
    assert bs.e2m1_decode(bs.e2m1_encode(x)).tolist() == grid
    assert bs.e2m1_decode(bs.e2m1_encode(-x[1:])).tolist() == [-v for v in grid[1:]]
    # Midpoints go to the neighbour with the even code (code 0 = 0, 2 = 1.0, 4 = 2.0, 6 = 4.0).
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert bs.e2m1_decode(bs.e2m1_encode(mids)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    near = torch.tensor([0.26, 0.74, 1.26, 1.74, 2.51, 3.49, 5.01, 6.5, 100.0])
    assert bs.e2m1_decode(bs.e2m1_encode(near)).tolist() == [0.5, 0.5, 1.5, 1.5, 3.0, 3.0, 6.0, 6.0, 6.0]
    # Every float against the brute-force nearest (ties excluded above).
    y = torch.linspace(-7, 7, 2801)
    got = bs.e2m1_decode(bs.e2m1_encode(y))
    vals = torch.tensor(grid + [-v for v in grid])
    best = vals[(y[:, None].clamp(-6, 6) - vals[None]).abs().argmin(1)]
    assert ((got - y.clamp(-6, 6)).abs() <= (best - y.clamp(-6, 6)).abs() + 1e-7).all()


def test_fp4_nibble_order():
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 15]], dtype=torch.uint8)
    packed = bs.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x65, 0xF7]]  # element 2j in the low nibble of byte j
    assert torch.equal(bs.unpack_nibbles(packed), codes)
    if hasattr(torch, "float4_e2m1fn_x2"):
        # torch's float4_e2m1fn_x2 holds the same bytes (no conversion exists to compare values).
        assert packed.view(torch.float4_e2m1fn_x2).view(torch.uint8).tolist() == packed.tolist()


def test_e8m0_codes():
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    v = bs.e8m0_decode(codes)
    assert v[:6].tolist() == [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0, 2.0 ** 127] and math.isnan(v[6])
    if hasattr(torch, "float8_e8m0fnu"):
        assert torch.equal(codes[:6].view(torch.float8_e8m0fnu).float(), v[:6])


# --- round trip ------------------------------------------------------------------------------------
def _inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    # Rows and blocks of very different magnitudes, exact zeros, one all-zero block.
    x = x * torch.exp2(torch.randint(-20, 20, (*shape[:-1], 1), generator=g).float())
    x[..., 3] = 0.0
    x[..., 0, :32] = 0.0
    return x


ROUND_TRIP_SHAPES = [(1, 32), (5, 96), (200, 160), (129, 512), (2, 130, 64)]


@pytest.mark.parametrize("shape", ROUND_TRIP_SHAPES)
@pytest.mark.parametrize("fmt,data,emax,mant", [("mxfp8_e4m3", "e4m3", 448.0, 3), ("mxfp8_e5m2", "e5m2", 57344.0, 2)])
def test_mxfp8_round_trip(shape, fmt, data, emax, mant):
    x = _inputs(shape, 1)
    t = bs.pack(x, fmt)
    f = BLOCK_FORMATS["mxf8" + data]
    assert t.fmt == f and t.data.dtype == getattr(torch, f"float8_{data}fn" if data == "e4m3" else "float8_e5m2")
    assert tuple(t.scale.shape) == bs.sf_shape(shape[-2], shape[-1], 32, shape[0] if len(shape) == 3 else None)
    d = bs.dequantize(t)
    scale = bs.block_scales(t)  # powers of two
    assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))
    # Each block's scale is the smallest power of two that keeps its amax representable.
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1)
    nz = amax > 0
    assert (amax[nz] / scale[nz] <= emax).all() and (amax[nz] / scale[nz] > emax / 2).all()
    # Error per element: half an ulp of the element format (2^-(mant+1) relative) or, below its
    # normal range, half its smallest subnormal step (times the block scale).
    sub_step = {"e4m3": 2.0 ** -9, "e5m2": 2.0 ** -16}[data]
    bound = torch.maximum(x.abs() * 2.0 ** -(mant + 1), (scale * sub_step / 2).repeat_interleave(32, -1))
    assert ((d - x).abs() <= bound * (1 + 1e-6)).all()
    assert (d[x == 0] == 0).all()


@pytest.mark.parametrize("shape", ROUND_TRIP_SHAPES + [(3, 48)])
def test_nvfp4_round_trip(shape):
    # NVFP4's range within one tensor is the e4m3 block scales' (448 down to 2^-9, normal from
    # 2^-6): blocks 2^±5 apart keep every block scale normal, where the bound below holds.
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-5, 6, (*shape[:-1], 1), generator=g).float())
    x[..., 3] = 0.0
    x[..., 0, :16] = 0.0
    t = bs.pack(x, "nvfp4")
    assert t.data.shape[-1] == shape[-1] // 2 and t.scale.dtype == torch.float8_e4m3fn
    gs = float(t.global_scale)
    assert math.isclose(gs, float(x.abs().max()) / (6 * 448), rel_tol=1e-6)
    d = bs.dequantize(t)
    step = bs.block_scales(t)  # e4m3 scale x global: the block's unit
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    live = blocks.abs().amax(-1) > 0
    assert (step[live] / gs >= 2.0 ** -6).all()
    step = step.repeat_interleave(16, -1)
    # e2m1 spacing is at most 2 units (between 4 and 6): rounding is off by at most 1 unit, and the
    # e4m3 rounding of the scale (2^-4 relative) can push a block's amax to 6.4 units (clamped to
    # 6: 0.4 unit off).
    assert ((d - x).abs() <= step * (1 + 1e-6)).all()
    # Inside [-2, 2] units the spacing is 0.5: at most a quarter unit off.
    small = x.abs() <= 2 * step
    assert ((d - x).abs()[small] <= 0.25 * step[small] * (1 + 1e-6)).all()
    assert (d[x == 0] == 0).all()
    rel = float((d - x).norm() / x.norm())
    assert rel < 0.12, rel  # typical NVFP4 error of Gaussian data is ~0.1


def test_nvfp4_blocks_below_the_scales_range_flush_to_zero():
    x = torch.ones(2, 32)
    x[0, :16] = 1e6  # 2^20 above the rest: the other blocks' scales underflow e4m3
    t = bs.pack(x, "nvfp4")
    d = bs.dequantize(t)
    assert torch.isfinite(d).all() and torch.allclose(d[0, :16], x[0, :16]) and (d[0, 16:] == 0).all() and (d[1] == 0).all()


def test_nvfp4_given_global_scale_and_zero_input():
    x = torch.zeros(4, 32)
    t = bs.pack(x, "nvfp4")
    assert float(t.global_scale) == 1.0 and (bs.dequantize(t) == 0).all()
    y = torch.randn(8, 64)
    t = bs.pack(y, "nvfp4", global_scale=0.01)
    assert float(t.global_scale) == pytest.approx(0.01)
    assert float((bs.dequantize(t) - y).norm() / y.norm()) < 0.12


def test_reference_gemm_is_the_product_of_the_decoded_operands():
    a = bs.pack(torch.randn(2, 70, 96), "nvfp4")
    b = bs.pack(torch.randn(2, 50, 96), "nvfp4")
    r = bs.reference_gemm(a, b)
    da, db = bs.dequantize(a), bs.dequantize(b)
    for l, m, n in itertools.product(range(2), (0, 69), (0, 49)):
        assert float(r[l, m, n]) == pytest.approx(float((da[l, m].double() * db[l, n].double()).sum()), rel=1e-5, abs=1e-5)


# --- the operand's contract ------------------------------------------------------------------------
def test_block_scaled_refuses_what_does_not_fit():
    t = bs.pack(torch.randn(130, 64), "nvfp4")
    with pytest.raises(InputError, match=r"must have the sf128x4 shape \(2, 1, 32, 4, 4\)"):
        bs.BlockScaled(t.data, t.scale[:1], "nvfp4", t.global_scale)
    with pytest.raises(InputError, match="needs a global_scale"):
        bs.BlockScaled(t.data, t.scale, "nvfp4")
    with pytest.raises(InputError, match="scale factors must be torch.float8_e4m3fn"):
        bs.BlockScaled(t.data, t.scale.float(), "nvfp4", t.global_scale)
    with pytest.raises(InputError, match="must be contiguous"):
        wide = torch.zeros(2, 1, 32, 4, 8, dtype=torch.uint8)[..., ::2]
        bs.BlockScaled(t.data, wide, "nvfp4", t.global_scale)
    m = bs.pack(torch.randn(8, 64), "mxfp8")
    with pytest.raises(InputError, match="data must be torch.float8_e4m3fn"):
        bs.BlockScaled(m.data.view(torch.uint8), m.scale, "mxfp8")
    with pytest.raises(InputError, match="has no global scale"):
        bs.BlockScaled(m.data, m.scale, "mxfp8", torch.ones(1))
    with pytest.raises(InputError, match="unknown block-scaled format"):
        bs.pack(torch.randn(8, 64), "mxfp4")
    with pytest.raises(InputError, match="positive multiple of 32"):
        bs.pack(torch.randn(8, 48), "mxfp8")
    with pytest.raises(InputError, match="infinite or NaN"):
        bs.pack(torch.tensor([[float("inf")] * 16]), "nvfp4")
    # Existing tensors in the documented layout wrap without a copy.
    w = bs.BlockScaled(t.data, t.scale.view(torch.uint8), "nvfp4", t.global_scale)
    assert w.shape == (130, 64) and w.data.data_ptr() == t.data.data_ptr()
