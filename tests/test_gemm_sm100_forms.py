"""Row-wise fp8 scales and fused epilogue fields (bias, residual) on the Blackwell datacenter GEMM
(gemm/sm100.py), on this GPU-less machine: no Blackwell GPU has run them, so what is checked is
what the build proves (SASS, resources, argument contract) and which variant the loader takes on a
10.0 device (no launches; a recording launcher stands in for the host library's).

The epilogue holds one load per accumulator element and field after the tcgen05.ld (scale_b as a
32-bit load, bias and residual as 16-bit loads of the output dtype); the SASS requirements count
them, so a cubin without the epilogue (the plain kernel, or per-tensor fp8 with its 2 scale loads)
fails them.
"""

from __future__ import annotations

import ast
import functools
import json
import re

import pytest
import torch

from conftest import BLACKWELL_DC, Recorder, needs_dsl
from factory.runtime import Bundle, InputError, NoVariantError

pytestmark = needs_dsl

B200 = {"name": "planned B200", "sm_count": 148}


def _manifest(test_bundle) -> dict:
    return json.loads((test_bundle / "manifest.json").read_text())


def _dense(m: dict) -> dict:
    return {n: v for n, v in m["variants"].items()
            if v["target"] == BLACKWELL_DC and v["family"] == "sm100" and v["op"] == "gemm"}


def _forms(m: dict) -> dict:
    return {n: v for n, v in _dense(m).items() if v.get("epilogue") or v.get("scale_mode") == "row"}


def _sass(test_bundle, entry) -> str:
    return _disassemble(str(test_bundle / entry["files"]["cubin"]["path"]))


@functools.lru_cache(maxsize=None)
def _disassemble(path: str) -> str:
    from factory.compiler.cubin import disassemble

    return disassemble(path)


def _lacks(problems: list[str]) -> set[str]:
    assert len(problems) == 1 and problems[0].startswith("SASS lacks "), problems
    return set(ast.literal_eval(problems[0][len("SASS lacks "):]))


def test_forms_compile_with_their_epilogue_and_fit(test_bundle):
    from factory.compiler.sass import sass_problems

    forms = _forms(_manifest(test_bundle))
    kinds = {(v["dtypes"]["a"], v.get("scale_mode"), tuple(v.get("epilogue") or ()), v["cta_group"])
             for v in forms.values()}
    assert kinds == {("e4m3", "row", ("bias", "residual"), 1), ("bf16", None, ("bias", "residual"), 2),
                     ("bf16", None, ("silu_mul", "residual"), 1), ("bf16", None, ("fp8_groups",), 1)}, kinds
    for name, v in forms.items():
        assert v["proof"] == "sass-only", name
        assert sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, v)) == [], name
        res = v["resources"]
        assert res["stack_frame_bytes"] == 0 and res["spill_instructions"] == 0, (name, res)
        assert 0 < res["registers"] <= 255, (name, res)
        if "silu_mul" in v["epilogue"] or "fp8_groups" in v["epilogue"]:
            continue  # (below)
        # The Hopper forms' argument contract (gemm/sm90.py scale_args, epilogue_args).
        args = [(a["name"], a.get("shape")) for a in v["signature"]["args"]]
        scales = [("scale_a", ["M"]), ("scale_b", ["N"])] if v["dtypes"]["a"] == "e4m3" else []
        assert args == [("a", ["M", "K", "L"]), ("b", ["N", "K", "L"]), ("c", ["M", "N", "L"]), *scales,
                        ("bias", ["N"]), ("residual", ["M", "N", "L"]), ("max_clusters", None)], args


def test_requirements_fail_on_a_kernel_without_the_epilogue(test_bundle):
    """The plain pair kernel in the bias+residual slot lacks exactly the epilogue's 16-bit loads; the
    bf16 epilogue kernel in the row-scaled fp8 slot lacks the fp8 MMA and the per-column scale loads;
    and a per-tensor fp8 epilogue (two scale loads) does not pass for row scales."""
    from factory.compiler.sass import sass_problems
    from factory.gemm.sm100 import SASS_LOAD_F32, SASS_LOAD_U16, sass_count

    m = _manifest(test_bundle)
    forms = _forms(m)
    plain = [v for n, v in _dense(m).items() if n not in forms and "_2cta_" in n and v["dtypes"]["a"] == "bf16"]
    assert plain
    row = next(v for v in forms.values() if v.get("scale_mode") == "row")
    epi = next(v for v in forms.values() if v["dtypes"]["a"] == "bf16")
    u16 = sass_count(SASS_LOAD_U16, 2 * 32)
    f32 = sass_count(SASS_LOAD_F32, 32)
    assert u16 in epi["sass_requirements"] and u16 in row["sass_requirements"]
    assert f32 in row["sass_requirements"]
    for p in plain:
        lacked = _lacks(sass_problems(epi["target"], epi["sass_requirements"], _sass(test_bundle, p)))
        assert lacked == {u16}, lacked
    lacked = _lacks(sass_problems(row["target"], row["sass_requirements"], _sass(test_bundle, epi)))
    assert lacked == {r"\bUTCQMMA\b", f32}, lacked
    per_tensor = "\n".join(f"/*00{i}0*/  LDG.E R{i}, desc[UR4][R2.64] ;" for i in range(2))
    assert not re.search(f32, per_tensor) and re.search(sass_count(SASS_LOAD_F32, 2), per_tensor)
    assert not re.search(f32, "LDG.E.U16 R4, desc[UR4][R2.64] ;\n" * 40)


def test_silu_mul_reads_gate_and_up_and_writes_half_the_columns(test_bundle):
    """silu_mul: c and the residual have N / 2 columns (NO); two tcgen05.ld per output sub-tile (the
    gate and the up sub-tile) and an exp2 per output element.  The plain kernel lacks them."""
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    v = next(e for e in _forms(m).values() if "silu_mul" in e["epilogue"])
    assert v["gate_up_block"] == 64 and v["tile"] == [128, 128, 64]
    args = [(a["name"], a.get("shape")) for a in v["signature"]["args"]]
    assert args == [("a", ["M", "K", "L"]), ("b", ["N", "K", "L"]), ("c", ["M", "NO", "L"]),
                    ("residual", ["M", "NO", "L"]), ("max_clusters", None)], args
    sass = _sass(test_bundle, v)
    assert sass_problems(v["target"], v["sass_requirements"], sass) == []
    assert len(re.findall(r"\bLDTM\.", sass)) == 2 and len(re.findall(r"\bMUFU\.EX2\b", sass)) == 32
    plain = next(e for n, e in _dense(m).items() if n not in _forms(m) and e["dtypes"]["a"] == "bf16")
    lacked = _lacks(sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, plain)))
    assert any("LDTM" in p for p in lacked) and any("MUFU" in p for p in lacked), lacked


def test_fp8_groups_takes_the_amax_pass_then_writes_e4m3_and_the_scales(test_bundle):
    """fp8_groups (e4m3 out, one scale per row and 128 columns): the amax pass and the store pass
    each read the tile from TMEM (tcgen05.ld), the saturating e4m3 conversion, the scale store;
    scale_out (M, NG) M-major after c.  The plain kernel lacks them."""
    from factory.compiler.sass import sass_problems

    m = _manifest(test_bundle)
    v = next(e for e in _forms(m).values() if e.get("epilogue") == ["fp8_groups"])
    assert v["dtypes"]["c"] == "e4m3" and v["fp8_group"] == 128 and v["tile"] == [128, 128, 64]
    args = [(a["name"], a.get("shape"), a.get("stride")) for a in v["signature"]["args"]]
    assert args[3] == ("scale_out", ["M", "NG"], [1, "sSOg"]), args
    sass = _sass(test_bundle, v)
    assert sass_problems(v["target"], v["sass_requirements"], sass) == []
    assert len(re.findall(r"\bLDTM\.", sass)) >= 2
    plain = next(e for n, e in _dense(m).items() if n not in _forms(m) and e["dtypes"]["a"] == "bf16")
    lacked = _lacks(sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, plain)))
    assert any("F2FP" in p for p in lacked) and any("STG" in p for p in lacked), lacked


@pytest.fixture
def b200(test_bundle):
    b = Bundle.open(test_bundle, capability=(10, 0), device=B200)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def test_selection_on_10_0_takes_the_form_asked_for(b200):
    """Row-scaled fp8 with bias and residual, and bf16 with bias and residual, reach their sm100
    variants on 10.0 (tails in M, N; K a multiple of 16 bytes); the forms the test tier lacks are a
    NoVariantError and bad scales an InputError, before any launch."""
    M, N, K = 300, 520, 272
    f8, bf = torch.float8_e4m3fn, torch.bfloat16
    a, w = torch.randn(M, K).to(f8), torch.randn(N, K).to(f8)
    sa, sb = torch.rand(M), torch.rand(N)
    bias, res = torch.randn(N, dtype=bf), torch.randn(M, N, dtype=bf)
    out = b200.gemm(a, w, scale_a=sa, scale_b=sb, bias=bias, residual=res)
    assert out.shape == (M, N) and out.dtype == bf
    assert re.fullmatch(r"gemm_sm100f_e4m3_obf16_.*_rowsc_bias_res", b200.rec.launched[-1])
    a16, w16 = torch.randn(M, K, dtype=bf), torch.randn(N, K, dtype=bf)
    b200.gemm(a16, w16, bias=bias, residual=res)
    assert re.fullmatch(r"gemm_sm100f_bf16_obf16_.*_2cta_.*_bias_res", b200.rec.launched[-1])
    n = len(b200.rec.launched)
    for kw, err in ((dict(bias=bias), NoVariantError), (dict(residual=res), NoVariantError),
                    (dict(bias=bias[:-8], residual=res), InputError),
                    (dict(bias=bias, residual=res[:, :-8]), InputError)):
        with pytest.raises(err):
            b200.gemm(a16, w16, **kw)
    for sa_, sb_, err in ((sa[:1], sb[:1], NoVariantError), (sa[:7], sb, InputError),
                          (sa.double(), sb, InputError)):
        with pytest.raises(err):
            b200.gemm(a, w, scale_a=sa_, scale_b=sb_, bias=bias, residual=res)
    assert len(b200.rec.launched) == n
    # SiLU(gate)·up with a residual (gate and up rows packed in blocks of 64; N / 2 output columns).
    from factory.runtime import epilogue as ep

    NO = 200
    w = ep.pack_gate_up(torch.randn(NO, K, dtype=bf), torch.randn(NO, K, dtype=bf))
    out = b200.gemm(a16, w, activation="silu_mul", residual=torch.randn(M, NO, dtype=bf))
    assert out.shape == (M, NO) and b200.rec.launched[-1].endswith("_silumul_res")
    with pytest.raises(NoVariantError):  # (the test tier has silu_mul with a residual only)
        b200.gemm(a16, w, activation="silu_mul")
    # e4m3 out with per-row group scales (scale_out in the block-scaled GEMM's scale_a layout).
    q, so = b200.gemm(a16, w16[:512], out_dtype=torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, 512) and so.shape == (M, 4) and so.stride()[0] == 1
    assert b200.rec.launched[-1].endswith("_oe4m3_ak_bk_t128x128x64_c1x1_pdl_q128")


# --- grouped GEMM (gemm/sm100_grouped.py) ------------------------------------------------------------
def _grouped(m: dict, target: str) -> dict:
    return {n: v for n, v in m["variants"].items() if v["op"] == "gemm_grouped" and v["target"] == target}


def test_grouped_compiles_to_tcgen05_with_the_walk_and_the_masked_store(test_bundle):
    """One contiguous and one masked variant: tcgen05 MMA into TMEM, the device-side group table
    (SHFL.UP prefix sum), the masked 16-bit stores of a group's partial last m-tile; no spills.
    The dense plain cubin in their slot lacks the table and the masked store; the Hopper grouped
    cubin lacks every tcgen05 form."""
    from factory.compiler.sass import sass_problems
    from factory.gemm.sm100_grouped import SASS_MASKED_STORE, SASS_TABLE

    m = _manifest(test_bundle)
    bw = _grouped(m, BLACKWELL_DC)
    assert sorted((v["grouped"], v["dtypes"]["a"]) for v in bw.values()) == [
        ("contig", "bf16"), ("contig", "e4m3"), ("masked", "bf16")]
    plain = next(v for n, v in _dense(m).items() if n not in _forms(m))
    hopper = {n: v for n, v in _grouped(m, "sm_90a").items() if v["dtypes"]["a"] == "bf16"}
    assert hopper
    for name, v in bw.items():
        assert v["proof"] == "sass-only" and v["family"] == "sm100_grouped", name
        assert sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, v)) == [], name
        res = v["resources"]
        assert res["stack_frame_bytes"] == 0 and res["spill_instructions"] == 0 and res["registers"] <= 255, res
        assert v["smem_bytes"] + res["static_smem_bytes"] <= 232448 and v["tmem_columns"] == 256, name
        args = [a["name"] for a in v["signature"]["args"]]
        scales = ["scale_a", "scale_b"] if v["dtypes"]["a"] == "e4m3" else []
        assert args == ["a", "b", "c", "offs" if v["grouped"] == "contig" else "masked_m", *scales,
                        "max_clusters"], args
        lacked = _lacks(sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, plain)))
        if v["dtypes"]["a"] == "bf16":
            assert lacked == {SASS_TABLE, SASS_MASKED_STORE}, lacked
        else:  # (and the fp8 MMA, the scale loads)
            assert {SASS_TABLE, SASS_MASKED_STORE, r"\bUTCQMMA\b"} <= lacked, lacked
        for h in hopper.values():
            problems = sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, h))
            assert any("UTC" in p and "MMA" in p and "LDTM" in p for p in problems), problems


def test_grouped_selection_on_10_0(b200):
    """bf16 grouped calls reach the sm100 variants of their layout on 10.0 (empty groups, a
    one-row group, a partial last tile), row-scaled e4m3 its fp8 variant; the block-scaled grouped
    form, not built for 10.x, is a NoVariantError."""
    bf = torch.bfloat16
    E, N, K = 8, 512, 256
    w = torch.randn(E, N, K, dtype=bf).transpose(1, 2)
    offs = torch.tensor([0, 1, 130, 400, 400, 700, 900, 1000], dtype=torch.int32)
    out = b200.grouped_gemm(torch.randn(1000, K, dtype=bf), w, offs=offs)
    assert out.shape == (1000, N) and b200.rec.launched[-1] == "gemm_grouped_sm100f_bf16_obf16_contig_t128x128x64_sw8"
    counts = torch.tensor([0, 1, 2, 3, 64, 5, 6, 7], dtype=torch.int32)
    out = b200.grouped_gemm(torch.randn(E, 64, K, dtype=bf), w, masked_m=counts)
    assert out.shape == (E, 64, N) and b200.rec.launched[-1] == "gemm_grouped_sm100f_bf16_obf16_masked_t128x128x64_sw8"
    n = len(b200.rec.launched)
    f8 = torch.float8_e4m3fn
    out = b200.grouped_gemm(torch.randn(1000, K).to(f8), w.to(f8), offs=offs, scale_a=torch.ones(1000),
                            scale_b=torch.ones(E, N))
    assert out.dtype == bf and b200.rec.launched[-1] == "gemm_grouped_sm100f_e4m3_obf16_contig_t128x128x128_sw8_rowsc"
    from factory.runtime import fp8 as fp8_forms

    qa, sa = fp8_forms.quantize_blockwise(torch.randn(1000, K), (1, 128))
    sb = torch.ones(E, N // 128, K // 128)
    with pytest.raises(NoVariantError, match="no gemm_grouped variant"):
        b200.grouped_gemm(qa, w.to(f8), offs=offs, scale_a=sa, scale_b=sb)
    assert len(b200.rec.launched) == n + 1


# --- DeepSeek-form block scales (gemm/sm100_block128.py) ------------------------------------------------
def test_block_form_compiles_to_the_block_scale_mma_fed_by_the_producer(test_bundle):
    """The block-scaled MMA with its TMEM scale operands and tcgen05.cp into the planned columns;
    the scale words stored by the producer (STS.128) from global loads of the fp32 scales, no TMA
    of scale atoms.  The MXFP8 kernel (scale atoms by TMA) and the row-scaled dense kernel (no
    block-scale MMA) fail its requirements."""
    from factory.compiler.sass import sass_problems
    from factory.gemm.sm100_block128 import SASS_NO_SF_TMA, SASS_SF_STORE

    m = _manifest(test_bundle)
    blk = {n: v for n, v in _dense(m).items() if v.get("scale_mode") == "block"}
    assert len(blk) == 1
    (name, v), = blk.items()
    assert v["proof"] == "sass-only" and v["scale_pow2"] is True and v["dtypes"]["a"] == "e4m3"
    assert sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, v)) == []
    res = v["resources"]
    assert res["stack_frame_bytes"] == 0 and res["spill_instructions"] == 0 and res["registers"] <= 255, res
    assert v["tmem_columns"] == 512 and v["tmem_columns_used"] == {"acc": 256, "sfa": 16, "sfb": 16}
    args = [(a["name"], a.get("shape"), a.get("stride")) for a in v["signature"]["args"]]
    assert args[3:] == [("scale_a", ["M", "KB"], [1, "sSAk"]), ("scale_b", ["NB", "KB"], ["sSBn", 1]),
                        ("max_clusters", None, None)], args
    mx = next(e for e in m["variants"].values() if e["op"] == "gemm_blockscaled" and e["target"] == BLACKWELL_DC
              and e["format"] == "mxf8e4m3")
    lacked = _lacks(sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, mx)))
    assert SASS_NO_SF_TMA in lacked and SASS_SF_STORE in lacked, lacked
    row = next(e for e in _forms(m).values() if e.get("scale_mode") == "row")
    problems = sass_problems(v["target"], v["sass_requirements"], _sass(test_bundle, row))
    assert problems and "UTCCP" in problems[0] and "idesc" in problems[0], problems


def test_block_form_selection_on_10_0(b200):
    """quantize_blockwise(pow2=True) operands with DeepSeek-V3 block scales reach the block variant on
    10.0 (tails in M, N, K); bad scale layouts are refused before any launch."""
    from factory.runtime import fp8

    M, N, K = 300, 520, 272
    qa, sa = fp8.quantize_blockwise(torch.randn(M, K), (1, 128), pow2=True)
    qb, sb = fp8.quantize_blockwise(torch.randn(N, K), (128, 128), pow2=True)
    out = b200.gemm(qa, qb, scale_a=sa, scale_b=sb)
    assert out.shape == (M, N) and b200.rec.launched[-1].endswith("_blksc")
    n = len(b200.rec.launched)
    for sa_, sb_ in ((sa.contiguous(), sb), (sa[:, :2], sb), (sa, sb[:, :2])):
        with pytest.raises(InputError):
            b200.gemm(qa, qb, scale_a=sa_, scale_b=sb_, scale_mode="block")
    assert len(b200.rec.launched) == n


def test_pow2_block_scales_are_the_mxfp8_scales_repeated():
    """What the kernel relies on: with power-of-two scales the DeepSeek form is exactly MXFP8 whose
    e8m0 scale per 32 elements repeats each 128-block scale (A per row, B per 128 rows), and the
    fp32 exponent field is that e8m0 code.  pow2 scales are the power of two at or above amax/448."""
    from factory.runtime import blockscaled as bs
    from factory.runtime import fp8

    torch.manual_seed(0)
    M, N, K = 200, 136, 384
    x, w = torch.randn(M, K) * 5, torch.randn(N, K) / 7
    qa, sa = fp8.quantize_blockwise(x, (1, 128), pow2=True)
    qb, sb = fp8.quantize_blockwise(w, (128, 128), pow2=True)
    for s, amax in ((sa, x.abs().view(M, 3, 128).amax(-1)), ):
        mant, _ = torch.frexp(s)
        assert bool((mant == 0.5).all()) and bool((s >= amax / 448).all()) and bool((s < 2 * amax / 448).all())
    codes_a = (sa.contiguous().view(torch.int32) >> 23) & 0xFF
    assert torch.equal(torch.exp2(codes_a.float() - 127), sa)
    # Dequantized both ways: DeepSeek blocks and per-32 e8m0 scales repeated.
    deq_a = qa.float() * sa.repeat_interleave(128, 1)[:, :K]
    deq_b = qb.float() * sb.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    sf_a = torch.exp2(codes_a.float() - 127).repeat_interleave(4, 1)  # (M, K/32)
    codes_b = (sb.contiguous().view(torch.int32) >> 23) & 0xFF
    sf_b = torch.exp2(codes_b.float() - 127).repeat_interleave(128, 0)[:N].repeat_interleave(4, 1)
    assert torch.equal(qa.float() * sf_a.repeat_interleave(32, 1), deq_a)
    assert torch.equal(qb.float() * sf_b.repeat_interleave(32, 1), deq_b)
    ref = deq_a @ deq_b.t()
    assert torch.allclose(ref, x @ w.t(), rtol=0.1, atol=0.15 * (x @ w.t()).abs().max().item())
    assert bs is not None


def test_tiers_keep_the_default_share_small():
    """The default bundle takes one row-scaled fp8, one silu_mul and one contiguous grouped
    variant for 10.x (about 0.14 MB each with their share of the host library); the other forms
    (bias, residual, pairs, masked grouped, the block form) are in the test/full tiers."""
    from factory.atoms.targets import get_target
    from factory.gemm.sm100 import enumerate_sm100_forms
    from factory.gemm.sm100_block128 import enumerate_sm100_block128
    from factory.gemm.sm100_grouped import enumerate_sm100_grouped

    t = get_target(BLACKWELL_DC)
    tiers = {tier: [v.name for f in (enumerate_sm100_forms, enumerate_sm100_grouped, enumerate_sm100_block128)
                    for v in f(t, tier)] for tier in ("test", "default", "full")}
    assert sorted(tiers["default"]) == sorted([
        "gemm_sm100f_e4m3_obf16_ak_bk_t128x128x128_c1x1_pdl_rowsc",
        "gemm_sm100f_bf16_obf16_ak_bk_t128x128x64_c1x1_pdl_silumul",
        "gemm_grouped_sm100f_bf16_obf16_contig_t128x128x64_sw8"])
    assert set(tiers["default"]) <= set(tiers["full"]) and set(tiers["test"]) <= set(tiers["full"])
    assert len(tiers["test"]) == 8
    for tgt in ("sm_90a", "sm_80", "sm_120a"):
        assert not any(f(get_target(tgt), "full") for f in (enumerate_sm100_forms, enumerate_sm100_grouped,
                                                              enumerate_sm100_block128))
