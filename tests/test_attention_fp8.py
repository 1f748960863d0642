"""The fp8 (e4m3) attention forward on this GPU-less machine (attention/sm90_fp8.py,
runtime/attention_fp8.py):

* the register and shared-memory index algebra the kernel relies on, replayed in Python: P's
  accumulator registers -> the fp8 A fragment (the quad exchange for pre-transposed V; the
  thread-local byte permute plus the key order of the in-kernel V transpose), and the
  transposing warps' ldmatrix.trans / stmatrix moves replayed byte by byte (every key lands where
  P holds it; 8 distinct bank groups per matrix);
* the test bundle's fp8 cubins: fp8 WGMMAs (QGMMA ... E4M3.E4M3) in both forms, the transpose's
  LDSM/STSM, no spills;
* the runtime's checks (descale dtype/shape/device, v layouts, dtypes) and its choice, on a
  simulated bundle.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import Recorder
from factory.attention import fp8_order as fo
from factory.runtime import Bundle, InputError, NoVariantError

H100 = {"name": "planned H100", "sm_count": 132}
F8 = torch.float8_e4m3fn


# --- index algebra: the kernel's constants (attention/fp8_order.py) replayed ---------------------
def acc_word(t, j):
    """Accumulator word j of quad thread t after the e4m3 conversion: bytes (row half, key)."""
    return [(0, 8 * j + 2 * t), (0, 8 * j + 2 * t + 1), (1, 8 * j + 2 * t), (1, 8 * j + 2 * t + 1)]


def prmt(a, b, sel):
    src = a + b
    return [src[(sel >> (4 * k)) & 0xF] for k in range(4)]


def a_word_wants(t, kb, h, kh):
    """What the fp8 A fragment's word (h, kh) of 32-key block kb holds for quad thread t."""
    return [(h, 32 * kb + 16 * kh + 4 * t + c) for c in range(4)]


def test_p_exchange_fills_the_fp8_a_fragment():
    """store_p_exchange: sources send W_{s%2} / W_{1-s%2}, receivers read the lanes of
    exchange_sources, one byte permute per row half."""
    bn = 128
    words = {t: [acc_word(t, j) for j in range(bn // 8)] for t in range(4)}
    for t in range(4):
        src1, src2 = fo.exchange_sources(t)
        sel0, sel1 = fo.P_EXCHANGE[t >= 2]
        for kb in range(bn // 32):
            for kh in range(2):
                def send(s, first):
                    w0, w1 = words[s][4 * kb + 2 * kh], words[s][4 * kb + 2 * kh + 1]
                    return (w1 if s % 2 else w0) if first else (w0 if s % 2 else w1)
                x, y = send(src1, True), send(src2, False)
                assert prmt(x, y, sel0) == a_word_wants(t, kb, 0, kh), (t, kb, kh)
                assert prmt(x, y, sel1) == a_word_wants(t, kb, 1, kh)


def test_local_p_matches_the_transposed_v_order():
    """store_p_local puts at A column 16kh + 4t + c (row h) the key that transpose_tile stores at
    V column 16kh + 4t + c: P·V pairs every P value with its own key's V row."""
    bn = 128
    for t in range(4):
        w = [acc_word(t, j) for j in range(bn // 8)]
        for i in range(bn // 16):
            for h, sel in enumerate(fo.P_LOCAL):
                got = prmt(w[2 * i], w[2 * i + 1], sel)
                cols = [16 * i + 4 * t + c for c in range(4)]
                assert got == [(h, 16 * (col // 16) + fo.transposed_key(col % 16)) for col in cols]
    assert sorted(fo.transposed_key(p) for p in range(16)) == list(range(16))
    # the kernel converts the accumulator in p_local_source order instead of permuting bytes:
    # the same bytes (element k of W_j is accumulator element 4j + k)
    elems = [[4 * j + k for k in range(4)] for j in range(bn // 8)]
    for i in range(bn // 16):
        for h, sel in enumerate(fo.P_LOCAL):
            got = prmt(elems[2 * i], elems[2 * i + 1], sel)
            assert got == [fo.p_local_source(4 * (2 * i + h) + c) for c in range(4)], (i, h)
    assert sorted(fo.p_local_source(e) for e in range(bn // 2)) == list(range(bn // 2))


def kmajor(rows, width):
    """A K-major smem tile as the sm90 helpers build it: (rows, K bytes) in atoms of 8 rows x
    ``width`` bytes (the swizzle width), atoms down the rows first; Swizzle<log2(width/16),4,3>."""
    bits = {64: 2, 128: 3}[width]

    def offset(row, k):
        return (k // width) * rows * width + row * width + k % width

    def swz(off):
        return off ^ ((off >> 3) & (((1 << bits) - 1) << 4))
    return offset, swz


def ldsm_x4_trans(mem, addrs):
    """ldmatrix.x4.trans.b16: lane l = 4p + q gets, of matrix i, bytes 2p, 2p+1 of rows 2q, 2q+1."""
    out = []
    for lane in range(32):
        p, q = divmod(lane, 4)
        out.append([[mem[addrs[8 * i + 2 * q + r] + 2 * p + b] for r in range(2) for b in range(2)]
                    for i in range(4)])
    return out


@pytest.mark.parametrize("d, bn", [(64, 128), (128, 128), (128, 192), (256, 64), (256, 128)])
def test_ldmatrix_transpose_puts_each_key_where_p_holds_it(d, bn):
    """transpose_tile replayed byte by byte: per 16-key group and 32-byte head_dim block one
    ldmatrix.x4.trans from the staging slot (bn keys x d bytes), the LDSM_JOIN permutes (lanes
    16-31 swapped), one stmatrix.x4 into the V slot (d rows x bn keys): every V byte (row r,
    column 16g + 4t + c) is staging (key 16g + transposed_key(4t + c), r); the split swizzle
    (unit ^ swizzle(lane)) equals the swizzle of the sum; every matrix's 8 rows of every ldmatrix
    and stmatrix lie on 8 distinct 16-byte bank groups."""
    stages = 2
    s_off, s_swz = kmajor(bn, 128 if d >= 128 else 64)
    v_off, v_swz = kmajor(d, 128 if bn % 128 == 0 else 64)  # (192 keys: three 64-byte atoms)
    for slot in range(stages):
        s_base, v_base = slot * bn * d, slot * bn * d
        mem = {}
        for key in range(bn):
            for col in range(d):
                mem[s_base + s_swz(s_off(key, col))] = (key, col)
        out = {}
        for g in range(bn // 16):
            for c in range(d // 32):
                addrs, daddrs = [], []
                for lane in range(32):
                    lk, lc = fo.ldsm_row(lane)
                    lane_part = s_swz(s_off(lk, lc))
                    unit = s_off(16 * g, 32 * c) + s_base
                    assert unit ^ lane_part == s_swz(unit + s_off(lk, lc)), (lane, g, c)
                    addrs.append(unit ^ lane_part)
                    sr = fo.stsm_row(lane)
                    dunit = v_off(32 * c, 16 * g) + v_base
                    assert dunit ^ v_swz(v_off(sr, 0)) == v_swz(dunit + v_off(sr, 0)), (lane, g, c)
                    daddrs.append(dunit ^ v_swz(v_off(sr, 0)))
                for a in (addrs, daddrs):
                    for i in range(4):
                        assert len({(x // 16) % 8 for x in a[8 * i:8 * i + 8]}) == 8, (g, c, i)
                regs = ldsm_x4_trans(mem, addrs)
                for lane in range(32):
                    sel_a, sel_b = fo.LDSM_JOIN[::-1] if fo.stsm_swap(lane) else fo.LDSM_JOIN
                    r = regs[lane]
                    words = [prmt(r[0], r[1], sel_a), prmt(r[0], r[1], sel_b),
                             prmt(r[2], r[3], sel_a), prmt(r[2], r[3], sel_b)]
                    for i in range(4):  # stmatrix.x4: word i -> row lane // 4 of matrix i
                        base = daddrs[8 * i + lane // 4] + 4 * (lane % 4)
                        for b in range(4):
                            assert base + b not in out
                            out[base + b] = words[i][b]
        assert len(out) == bn * d
        for row in range(d):
            for col in range(bn):
                want = (16 * (col // 16) + fo.transposed_key(col % 16), row)
                assert out[v_base + v_swz(v_off(row, col))] == want, (slot, row, col)


# --- tiles and register budgets ------------------------------------------------------------------
def test_fp8_tiles_and_register_budgets():
    """The preferred tiles per problem, and the register rule with an 8-bit P: every preferred
    tile fits its consumers' setmaxnreg budget, the budgets fit the 512 registers per thread
    slot (transposing warps beside two or three consumer warpgroups), and a tile that would
    not fit is refused."""
    from factory.atoms.sm90 import CONSUMER_REGS, PRODUCER_REGS
    from factory.attention.sm90_fp8 import (AttentionFp8Sm90, fp8_config, register_pool_fits,
                                            transpose_register_split)

    def tile(d, causal, vl, varlen=False):
        c = fp8_config(d, causal, vl, varlen)
        return c["tile_m"], c["tile_n"], c["stages"]

    assert tile(128, False, "bshd") == (128, 128, 2) and tile(128, True, "bshd") == (128, 192, 2)
    assert tile(128, True, "bshd", varlen=True) == (128, 128, 2)
    assert tile(128, False, "bhds") == (128, 128, 3) and tile(128, True, "bhds") == (128, 192, 2)
    assert tile(256, False, "bhds")[1] == tile(256, True, "bhds")[1] == 128
    assert tile(256, False, "bshd")[1] == tile(256, True, "bshd")[1] == 128  # O over the staging ring
    assert tile(256, False, "bshd", True)[1] == tile(256, True, "bshd", True)[1] == 64  # packed varlen
    assert tile(64, False, "bshd")[0] == tile(64, False, "bhds")[0] == 192 and tile(64, True, "bshd")[0] == 128
    for consumers, d, bn in ((2, 128, 128), (2, 128, 192), (2, 256, 64), (2, 256, 128), (3, 128, 96), (3, 64, 128)):
        producer, consumer = transpose_register_split(consumers, d, bn)
        # (the launch gives each of 384 threads 168 registers, of 512 threads 128: the consumers'
        # setmaxnreg increase waits for ever where the budgets add up to more)
        assert register_pool_fits(producer, consumer, consumers) and producer % 8 == consumer % 8 == 0
        assert producer + consumers * consumer <= {2: 3 * 168, 3: 4 * 128}[consumers]
    # head_dim 256, 128-key tiles: 64 + 128 + 16 live + 32 = 240 -> 24 / 240
    assert transpose_register_split(2, 256, 128) == (24, 240) and transpose_register_split(2, 256, 64) == (40, 232)
    assert not register_pool_fits(32, 240, 2) and register_pool_fits(40, 232, 2) and register_pool_fits(40, 152, 3)
    for c in (1, 2, 3):  # the 16-bit family's budgets sum to its launch's registers too
        assert register_pool_fits(PRODUCER_REGS[c], CONSUMER_REGS[c], c)
    for d in (64, 128, 256):
        for causal in (False, True):
            for vl in ("bshd", "bhds"):
                v = AttentionFp8Sm90(target="sm_90a", head_dim=d, causal=causal, v_layout=vl, **fp8_config(d, causal, vl))
                assert v.can_implement() is None, v.name
    too_big = AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False, v_layout="bhds",
                               **{**fp8_config(128, False, "bhds"), "tile_m": 192, "tile_n": 128})
    assert "live accumulator registers" in too_big.can_implement()


def test_d256_o_slabs_over_the_v_staging_ring():
    """Head_dim 256, 128-key tiles, V transposed in the kernel: Q 32 KB + K, V, staging 3 x 64 KB
    leave no room for O's 64 KB of bf16 slabs, which then lie over the staging ring (one tile per
    CTA); every other fp8 tile keeps O's own slabs.  The ring holds O exactly, and the DSL's
    swizzled layouts of the staging ring (keys x 256 bytes), the V slots (256 rows x 128 keys)
    and O (64 x 256 bf16 per consumer warpgroup) are the 128-byte-swizzle K-major tiles the
    transpose replay above models."""
    from factory.attention.sm90_fp8 import AttentionFp8Sm90, fp8_config

    from factory.registry import enumerate_variants

    def make(d, causal, vl, **kw):
        return AttentionFp8Sm90(target="sm_90a", head_dim=d, causal=causal, v_layout=vl,
                                **{**fp8_config(d, causal, vl), **kw})

    full = {v.name: v for v in enumerate_variants(["sm_90a"], ["attention_fp8"], tier="full")}
    for causal in (False, True):
        v = make(256, causal, "bshd", tile_n=128)
        assert v.name in full and v.o_in_staging and v.can_implement() is None
        assert v.describe()["tile_scheduler"] == {"persistent": False, "o_smem": "v staging slots"}
        assert v.smem_bytes() == make(256, causal, "bhds").smem_bytes() <= 227 * 1024 - 1024
        assert v.describe()["preferred"]  # the selection's pick for V as K at head_dim 256
        assert not make(256, causal, "bshd", tile_n=64).o_in_staging
        assert make(256, causal, "bshd", tile_n=64).name in full
        assert not make(256, causal, "bhds").o_in_staging
    for d in (64, 128):
        for causal in (False, True):
            assert not make(d, causal, "bshd").o_in_staging
    pytest.importorskip("cutlass")
    import dsl_layouts

    staging, vslot, o = dsl_layouts.fp8_d256_layouts()
    s_off, _ = kmajor(128, 128)
    v_off, _ = kmajor(256, 128)
    assert staging["swizzle"] == vslot["swizzle"] == o["swizzle"] == "S<3,4,3>"
    for key, col in dsl_layouts.STAGING_COORDS:
        assert staging["offset"](key, col, 1) == s_off(key, col) + 128 * 256
    for row, key in dsl_layouts.V_COORDS:
        assert vslot["offset"](row, key, 1) == v_off(row, key) + 128 * 256
    assert 2 * o["cosize"] == staging["cosize"] == 2 * 128 * 256


# --- the test bundle's cubins --------------------------------------------------------------------
def test_fp8_cubins_hold_fp8_wgmma_and_no_spills(test_bundle):
    from factory.compiler import cubin as cb

    manifest = json.loads((test_bundle / "manifest.json").read_text())
    fp8 = {n: e for n, e in manifest["variants"].items() if e["op"] == "attention_fp8"}
    assert {(e["head_dim"], e["causal"], e["v_layout"]) for e in fp8.values()} == {(128, False, "bshd"),
                                                                                     (128, True, "bshd")}
    for name, e in fp8.items():
        sass = cb.disassemble(str(test_bundle / e["files"]["cubin"]["path"]))
        n = e["tile"][1]  # keys per tile (causal: 192)
        assert re.search(rf"\bQGMMA\.64x{n}x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[", sass), name  # S = Q·Kᵀ
        assert re.search(r"\bQGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[", sass), name  # P·V
        # the transpose: ldmatrix.trans / stmatrix, no byte or word smem accesses
        assert re.search(r"\bLDSM\.16\.MT88\.4\b", sass) and re.search(r"\bSTSM\.16\.M88\.4\b", sass), name
        assert not re.search(r"\b(LDL|STL)\b", sass), name
        assert not re.search(r"\bLDS(\.U8)?\b", sass), name
        assert e["resources"]["stack_frame_bytes"] == 0 and e["resources"]["spill_instructions"] == 0
        assert [a["name"] for a in e["signature"]["args"]] == ["q", "k", "v", "o", "lse", "q_descale", "k_descale",
                                                               "v_descale", "softmax_scale"]


# --- runtime checks on a simulated bundle ---------------------------------------------------------
@pytest.fixture
def sim(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def f8(*shape):
    return torch.randn(*shape).to(F8)


def test_fp8_launch_and_choice(sim):
    q, k, v = f8(2, 64, 8, 128), f8(2, 80, 2, 128), f8(2, 80, 2, 128)
    o, lse = sim.attention(q, k, v, causal=True, return_lse=True, q_descale=torch.ones(2, 2),
                           k_descale=torch.tensor(0.5), v_descale=torch.ones(2))
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.shape == (2, 8, 64)
    assert sim.rec.launched[-1].startswith("attention_fp8_sm90a_e4m3_d128") and "causal" in sim.rec.launched[-1]
    assert sim.rec.launched[-1].endswith("_vbshd")
    sim.attention(q, k, v)  # fp8 inputs without descales: routed by dtype
    assert "causal" not in sim.rec.launched[-1]
    with pytest.raises(NoVariantError, match="head_dim 64"):
        sim.attention(f8(1, 8, 2, 64), f8(1, 8, 2, 64), f8(1, 8, 2, 64), q_descale=torch.ones(1))
    with pytest.raises(NoVariantError, match="bhds"):  # (the test tier has no pre-transposed build)
        sim.attention(q, k, v.permute(0, 2, 3, 1).contiguous(), v_layout="bhds")


@pytest.mark.parametrize("bad, match", [
    (dict(q_descale=torch.ones(2, 2, dtype=torch.float16)), "q_descale must be float32"),
    (dict(k_descale=torch.ones(3)), "k_descale must broadcast"),
    (dict(v_descale=torch.ones(1, 1, 2)), "v_descale must broadcast"),
    (dict(q_descale=2.0), "q_descale must be a torch.Tensor"),
    (dict(v_layout="bsdh"), "v_layout must be one of"),
    (dict(softmax_scale=-1.0, q_descale=torch.ones(1)), "softmax_scale must be a positive"),
    (dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32), q_descale=torch.ones(1)), "total_tokens"),
])
def test_fp8_refusals(sim, bad, match):
    q, k, v = f8(2, 64, 8, 128), f8(2, 80, 2, 128), f8(2, 80, 2, 128)
    n = len(sim.rec.launched)
    with pytest.raises(InputError, match=match):
        sim.attention(q, k, v, **bad)
    assert len(sim.rec.launched) == n


def test_fp8_input_checks(sim):
    q, k, v = f8(2, 64, 8, 128), f8(2, 80, 2, 128), f8(2, 80, 2, 128)
    with pytest.raises(InputError, match="v must be float8_e4m3fn"):
        sim.attention(q, k, v.to(torch.bfloat16), q_descale=torch.ones(1))
    with pytest.raises(InputError, match=r"v must be \(B, Hkv, D, Sk\)"):
        sim.attention(q, k, v, v_layout="bhds")
    with pytest.raises(InputError, match="multiple of kv heads"):
        sim.attention(f8(2, 64, 3, 128), k, v, q_descale=torch.ones(1))
    with pytest.raises(InputError, match="strides"):
        sim.attention(f8(2, 64, 8, 136)[..., :128], k, v, q_descale=torch.ones(1))


def test_fp8_c_selection(sim):
    """fx_attention_fp8_select: the choice and its own refusals (sizes, flags, head_dim, GQA)."""
    from factory.runtime.selector import AttentionFp8Problem

    sel = sim.selector.select("attention_fp8", AttentionFp8Problem(1, 100, 100, 8, 2, 128, 0, 1, 0.0))
    assert sel.name.decode().endswith("_causal_ov_pp_er_ps_kf_vbshd")
    for bad, match in (((1, 100, 100, 8, 2, 128, 0, 2, 0.0), "causal"), ((1, 100, 100, 8, 2, 128, 2, 0, 0.0), "v_layout"),
                       ((1, 100, 100, 8, 2, 96, 0, 0, 0.0), "head_dim 96"), ((1, 100, 100, 8, 3, 128, 0, 0, 0.0), "multiple"),
                       ((-1, 100, 100, 8, 2, 128, 0, 0, 0.0), "batch must not be negative"),
                       ((1, 100, 100, 8, 2, 128, 0, 0, -2.0), "softmax_scale")):
        with pytest.raises(InputError, match=match):
            sim.selector.select("attention_fp8", AttentionFp8Problem(*bad))
    with pytest.raises(NoVariantError, match="v_layout=bhds"):
        sim.selector.select("attention_fp8", AttentionFp8Problem(1, 100, 100, 8, 2, 128, 1, 0, 0.0))
    assert sim.selector.select("attention_fp8", AttentionFp8Problem(0, 100, 100, 8, 2, 128, 0, 0, 0.0)).variant == -1


def test_fp8_torch_op_fake_checks(sim):
    """The torch op's fake runs the same checks on metadata and gives bf16 o and f32 lse."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = sim.torch_ops()
    q, k, v = f8(2, 64, 8, 128), f8(2, 80, 2, 128), f8(2, 80, 2, 128)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        o, lse = ops.attention_fp8(fq, fk, fv, True, None, mode.from_tensor(torch.ones(2, 2)))
        assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.shape == (2, 8, 64)
        with pytest.raises(InputError, match="k_descale must be float32"):
            ops.attention_fp8(fq, fk, fv, False, None, None, mode.from_tensor(torch.ones(2, 2, dtype=torch.float16)))
    n = len(sim.rec.launched)
    o, lse = ops.attention_fp8(q, k, v, False, None, torch.ones(1))
    assert len(sim.rec.launched) == n + 1 and o.dtype == torch.bfloat16


def test_fp8_hot_path(sim):
    """A problem seen before launches through the cached fixed launch; a descale of another dtype
    or shape is a different key and meets the checks again."""
    q, k, v = f8(2, 64, 8, 128), f8(2, 80, 2, 128), f8(2, 80, 2, 128)
    qd = torch.ones(2, 2)
    sim.attention(q, k, v, q_descale=qd)
    n = len(sim.rec.launched)
    assert len(sim.hot_attention_fp8) == 1
    o = sim.attention(f8(2, 64, 8, 128), k, v, q_descale=torch.full((2, 2), 2.0))
    assert len(sim.rec.launched) == n + 1 and len(sim.hot_attention_fp8) == 1 and o.dtype == torch.bfloat16
    with pytest.raises(InputError, match="q_descale must be float32"):
        sim.attention(q, k, v, q_descale=qd.double())
    with pytest.raises(InputError, match="q_descale must broadcast"):
        sim.attention(q, k, v, q_descale=torch.ones(2, 3))
    assert len(sim.rec.launched) == n + 1


def test_fp8_varlen_checks(sim):
    q, k = f8(100, 8, 128), f8(120, 2, 128)
    cu = torch.tensor([0, 40, 100], dtype=torch.int32)
    cuk = torch.tensor([0, 60, 120], dtype=torch.int32)
    with pytest.raises(NoVariantError, match="varlen"):  # (the test tier has no packed fp8 build)
        sim.attention(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cuk, max_seqlen_q=60, q_descale=torch.ones(2, 2))
    with pytest.raises(InputError, match="v as k"):
        sim.attention(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cuk, q_descale=torch.ones(1), v_layout="bhds")
    with pytest.raises(InputError, match="k_descale must broadcast"):
        sim.attention(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cuk, max_seqlen_q=60, k_descale=torch.ones(3, 2))
    with pytest.raises(InputError, match="max_seqlen_q"):
        sim.attention(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cuk, max_seqlen_q=101, q_descale=torch.ones(1))
