"""Attention over a KV cache on this GPU-less machine: the contract's signature, the decode
family's kvcache variants (enumeration; one compiled and its SASS checked where the DSL is
installed), the table-driven selection and its NoVariantError messages, the plan, every
validation row of docs/errors.md for ``attention_kvcache`` through a simulated bundle (CPU tensors,
a launcher that records: nothing may be launched on a refusal), the float32 reference, and the
torch op's fake implementation checking like the real op."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import Recorder, needs_dsl
from factory.attention import contract
from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import kvcache as kv
import kvcache_rules as rules

H100 = {"name": "planned H100", "sm_count": 132}


# --- contract ------------------------------------------------------------------------------------
def test_signature_kvcache():
    s = contract.signature_kvcache("bf16", "bf16", 128, paged=True, page_size=16)
    assert [a.name for a in s.args] == ["q", "k_cache", "v_cache", "o", "lse", "block_table", "cache_seqlens",
                                        "sinks", "kv_descale", "softmax_scale", "softcap", "window_left",
                                        "window_right"]
    k = s.args[1]
    assert k.shape == ("P", 16, "Hkv", 128) and k.stride == ("sKp", "sKs", "sKh", 1)
    assert s.args[5].shape == ("B", "MP") and s.args[6].shape == ("B",)
    assert [a.dtype for a in s.args[9:]] == ["f32", "f32", "i32", "i32"]
    # e4m3 caches: k_descale and v_descale (Hkv,) each with its own stride (0: per tensor), no kv_descale
    s8 = contract.signature_kvcache("bf16", "e4m3", 128, paged=True)
    names = [a.name for a in s8.args]
    assert names[7:11] == ["sinks", "k_descale", "v_descale", "softmax_scale"] and "kv_descale" not in names
    assert [(a.shape, a.stride, a.dtype) for a in s8.args[8:10]] == [(("Hkv",), ("sKD",), "f32"),
                                                                     (("Hkv",), ("sVD",), "f32")]
    # a page-size class (the kernel takes any size at launch) and the dense cache
    assert contract.signature_kvcache("bf16", "bf16", 128, True).args[1].shape[1] == "PS"
    assert contract.signature_kvcache("bf16", "bf16", 128, False).args[1].shape[:2] == ("B", "Sk")
    # fp8 caches: 16 elements per 16 bytes; q keeps 8
    f8 = contract.signature_kvcache("bf16", "e4m3", 128, True, 64)
    assert f8.divisor("sKs") == 16 and f8.divisor("sQs") == 8 and f8.args[1].dtype == "e4m3"
    split = contract.signature_kvcache("f16", "f16", 64, True, 16, splits=4)
    assert [a.name for a in split.args[5:7]] == ["o_partial", "lse_partial"]
    # the last-arrival merge: (B, Hq, Sq) int32 arrival counters after the partials, 16-byte rows
    last = contract.signature_kvcache("bf16", "bf16", 128, True, None, splits=16, counters=True)
    assert [a.name for a in last.args[5:9]] == ["o_partial", "lse_partial", "counters", "block_table"]
    assert last.args[7].dtype == "i32" and last.args[7].shape == ("B", "Hq", "Sq")
    assert last.args[5].align == 16 and last.divisor("sWh") == 4 and split.args[5].align == 4
    vq = contract.signature_kvcache("bf16", "bf16", 128, True, 16, varlen_q=True)
    names = [a.name for a in vq.args]
    assert names[0] == "q" and vq.args[0].shape == ("Tq", "Hq", 128) and "cu_seqlens_q" in names
    assert names[-1] == "max_seqlen_q"
    with pytest.raises(ValueError, match="page_size 12"):
        contract.signature_kvcache("bf16", "bf16", 128, True, 12)


# --- the decode family's variants ---------------------------------------------------------------
@needs_dsl
def test_enumeration():
    from factory.atoms.targets import get_target
    from factory.attention.decode import enumerate_decode_kv

    test = enumerate_decode_kv(get_target("sm_90"), "test")
    assert {v.paged for v in test} == {True, False}
    assert {v.splits > 1 for v in test} == {True, False}
    assert any(v.local and v.softcap and v.sinks for v in test)
    assert {v.dtype for v in test} == {"bf16", "f16"} and {v.head_dim for v in test} == {64, 128}
    f8 = [v for v in test if v.kv_dtype == "e4m3"]
    assert f8 and all(v.paged and v.head_dim == 128 for v in f8)
    default = enumerate_decode_kv(get_target("sm_90"), "default")
    assert len({v.name for v in default}) == len(default) <= 63
    # head_dim 256: bf16 paged caches at every split count
    assert sorted(v.splits for v in default if v.head_dim == 256) == [1, 2, 4, 8, 32]
    assert all(v.dtype == "bf16" and v.paged and v.kv_dtype == "bf16" for v in default if v.head_dim == 256)
    # fp8 caches: bf16 q, head_dim 128, paged, the direct build with warp-own copies and short copy
    # addresses at every split count the paged rule picks, and its 8-warp one-CTA-per-SM build at 8
    # cluster splits with PDL (not preferred: the rule names it)
    assert sorted(v.splits for v in default if v.kv_dtype == "e4m3" and v.warps == 4) == [1, 2, 4, 8, 32]
    assert all(v.direct and v.own and v.fast_addr and v.tail_zero for v in default if v.kv_dtype == "e4m3")
    wide = [v for v in default if v.kv_dtype == "e4m3" and v.warps == 8]
    assert [(v.splits, v.tile_n, v.pdl, v.last, v.describe()["preferred"], v.ctas_per_sm()) for v in wide] == [
        (8, 128, True, False, False, 1), (16, 128, False, True, False, 1)]  # + the last-arrival merge
    assert all(v.dtype == "bf16" and v.head_dim == 128 and v.paged for v in default if v.kv_dtype == "e4m3")
    assert all(v.can_implement() is None for v in default)
    # cluster merges without PDL twins; the workspace split with its PDL combine kernel
    assert all(v.pdl == (v.splits > 1 and not v.cluster) for v in default if v.warps == 4 and not v.last)
    # bf16 caches, 8 warps over 128-key tiles (not preferred: the rule names them): head_dim 128 at 8
    # cluster splits with PDL (paged and dense), head_dim 64 paged unsplit and at 2 splits
    wide = sorted((v.head_dim, v.splits, v.paged, v.pdl) for v in default
                  if v.warps == 8 and v.kv_dtype == "bf16" and not v.last)
    assert wide == [(64, 1, True, False), (64, 2, True, False), (128, 8, False, True), (128, 8, True, True)]
    assert all(not v.describe()["preferred"] and v.ctas_per_sm() == 1 and v.tile_n == 128
               for v in default if v.warps == 8)
    # the last-arrival merge: head_dim 128 paged; bf16 caches 8 warps at 16 and 32 splits, 4 warps at
    # 16; e4m3 caches 8 warps at 16
    last = sorted((v.kv_dtype, v.splits, v.warps, v.ctas_per_sm()) for v in default if v.last)
    assert last == [("bf16", 16, 4, 2), ("bf16", 16, 8, 1), ("bf16", 32, 8, 1), ("e4m3", 16, 8, 1)]
    assert all(v.dtype == "bf16" and v.paged and not v.pdl and not v.cluster and v.head_dim == 128
               and not v.describe()["preferred"] and v.describe()["workspace"] == {"form": "counters"}
               for v in default if v.last)
    assert enumerate_decode_kv(get_target("sm_90a"), "default") == []
    d = default[0].describe()
    assert d["page_sizes"] == list(contract.PAGE_SIZES) if d["paged"] else d["page_sizes"] == []
    assert d["kv_dtype"] == d["dtype"] and d["decode_rows"] == 16


@needs_dsl
def test_compiles_with_paged_loads(tmp_path):
    """One paged variant with every switch, compiled for sm_90 in a worker: vectorised cp.async
    (the block-table-addressed rows), tanh (softcap), the cluster merge."""
    import subprocess
    import sys

    src = (
        "from factory.compiler.compile import init_worker; init_worker('sm_90')\n"
        "from factory.attention.decode import make_kv\n"
        "from factory.compiler.builder import compile_cached\n"  # the build's cache: compiled once
        "v = make_kv('sm_90', 'bf16', 128, 2, switches=True)\n"
        f"compile_cached(v, {str(tmp_path)!r}); print(v.name)\n")
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    from factory.compiler.cubin import disassemble

    sass = disassemble(next(tmp_path.glob("*.cubin")))
    assert "LDGSTS.E.BYPASS.LTC128B.128" in sass and "MUFU.TANH" in sass and "STAS" in sass


# --- selection -----------------------------------------------------------------------------------
def entry(name, splits=1, paged=True, d=128, dtype="bf16", switches=False, family="sm90_decode"):
    return {"name": name, "op": "attention_kvcache", "family": family, "target": "sm_90", "dtype": dtype,
            "kv_dtype": dtype, "head_dim": d, "causal": True, "varlen": False, "paged": paged,
            "page_sizes": list(contract.PAGE_SIZES) if paged else [], "local": switches, "softcap": switches,
            "sinks": switches, "tile": [16, 64], "stages": 3, "decode_rows": 16, "kv_splits": splits,
            "splits": 1, "cluster": [splits, 1], "preferred": True, "pdl": False}


CANDS = ([entry(f"p{s}", s) for s in (1, 2, 4, 8)] + [entry(f"d{s}", s, paged=False) for s in (1, 2, 4, 8)]
         + [entry(f"w{s}", s, switches=True) for s in (1, 8)])


def prob(b=8, sq=1, hq=32, hkv=8, d=128, sk=4096, page=16, **kw):
    base = dict(dtype="bf16", kv_dtype="bf16", causal=True, local=False, softcap=False, sinks=False)
    base.update(kw)
    return kv.Problem(b, sq, hq, hkv, d, sk, page_size=page, **base)


def test_select_splits_and_layouts():
    assert rules.select(CANDS, prob(b=256))["name"] == "p1"          # the grid fills the GPU
    assert rules.select(CANDS, prob(b=1, sk=32768))["name"] == "p8"  # one long sequence: 8 kv heads x 8
    # 64 groups: x 4 would be 2 CTAs per SM, which D128 runs slower than x 2 (one per SM)
    assert rules.select(CANDS, prob(b=8, sk=8192, hq=64))["name"] == "p2"
    assert rules.select(CANDS, prob(b=1, sk=32768, page=None))["name"] == "d8"  # the dense rule
    assert rules.select(CANDS, prob(b=4, sk=32768, hq=64, page=None))["name"] == "d2"
    assert rules.select(CANDS, prob(b=1, sk=100))["name"] == "p1"    # two key tiles: no split


def test_paged_split_rule():
    """paged_split_count on the measured shapes (H200, notes/attention-kvcache.md)."""
    both = {1: False, 2: True, 4: True, 8: True, 32: False}
    assert rules.paged_split_count(8, 512, 132, both) == 32      # B1 H32/8 32k
    assert rules.paged_split_count(32, 512, 132, both) == 32     # B4 H64/8 32k: not the 8-cluster
    # B4 H32/8 8k: the 32-split would keep 4 tiles each: the step-down to 4 (H100 54.8 µs vs 58.3)
    assert rules.paged_split_count(32, 128, 132, both) == 4
    assert rules.paged_split_count(32, 128, 132, both, head_dim=64) == 32
    assert rules.paged_split_count(8, 64, 132, both) == 8        # MQA B8 4k: 4 tiles per split at most
    assert rules.paged_split_count(64, 128, 132, both, head_dim=64) == 4  # B8 H64/8 D64 8k
    # head_dim >= 128: at most one CTA per SM on a cluster split (H100 B8 H32/8 D128 8k: 2 splits
    # 97 µs, 4: 117); head_dim 256 (one CTA per SM) alike
    assert rules.paged_split_count(64, 128, 132, both) == 2
    assert rules.paged_split_count(64, 64, 132, both, head_dim=256) == 2
    assert rules.paged_split_count(128, 64, 132, both) == 1      # B16 H32/8: fills 3/4 of the SMs
    no32 = {1: False, 2: True, 4: True, 8: True}
    assert rules.paged_split_count(8, 512, 132, no32) == 8
    # no 32-split built: the 8-cluster over one CTA per SM steps down (B4 H64/8 32k: 4 splits 149 µs, 8: 172)
    assert rules.paged_split_count(32, 512, 132, no32) == 4
    assert rules.paged_split_count(32, 512, 132, no32, head_dim=64) == 8
    # fp8 caches: the same early unsplit (H100 B16 H32/8 4k page 16: unsplit 54.1 µs, 2 splits 56.2)
    # and step-down (B8 H32/8 8k: 2 splits 55.7, 4: 67.3), 32 for few long sequences, 8 for MQA B8 4k
    assert rules.paged_split_count(128, 64, 132, both, fp8=True) == 1
    assert rules.paged_split_count(64, 128, 132, both, fp8=True) == 2
    assert rules.paged_split_count(8, 512, 132, both, fp8=True) == 32
    assert rules.paged_split_count(32, 512, 132, both, fp8=True) == 32
    assert rules.paged_split_count(8, 64, 132, both, fp8=True) == 8
    assert rules.paged_split_count(512, 32, 132, both, fp8=True) == 1
    assert rules.paged_split_count(8, 3, 132, both) == 1         # 3 tiles: nothing keeps 4
    # bf16/f16, at most 64 query rows: the second-kernel split needs 2 tiles each (H100 page 16,
    # B1 H32/8 4k: 32 splits 9.5 µs, 8: 11.3-12.2); MQA B8 (128 rows) and fp8 keep 4 tiles
    assert rules.paged_split_count(8, 64, 132, both, rows=32) == 32
    assert rules.paged_split_count(2, 64, 132, both, rows=32) == 32  # B2 H16/1 4k
    assert rules.paged_split_count(8, 64, 132, both, rows=128) == 8
    assert rules.paged_split_count(8, 64, 132, both, fp8=True, rows=32) == 8
    assert rules.paged_split_count(8, 63, 132, both, rows=32) == 8  # 32 splits would keep < 2 tiles


def test_select_fp8_one_cta_per_sm_build():
    """fp8 caches: where the split's grid leaves half the SMs idle, the non-preferred build of one CTA
    per SM (8 warps) of that split count, its PDL twin first; elsewhere the preferred one."""
    def e8(name, splits, wide=False, pdl=False):
        e = entry(name, splits)
        e.update(kv_dtype="e4m3", preferred=not wide, ctas_per_sm=1 if wide else 2, pdl=pdl)
        if wide:
            e["tile"] = [16, 128]
        if splits == 32:
            e["cluster"] = [1, 1]
        return e
    cands = [e8(f"f{s}", s) for s in (1, 2, 4, 8, 32)] + [e8(f"w{s}", s, True) for s in (2, 4, 8)]
    fp8 = dict(kv_dtype="e4m3")
    assert rules.select(cands, prob(b=8, sk=8192, **fp8))["name"] == "f2"           # 64 groups x 2: 128 CTAs
    assert rules.select(cands, prob(b=8, sk=16384, **fp8))["name"] == "f2"
    assert rules.select(cands, prob(b=4, sk=4096, **fp8))["name"] == "f4"           # 32 groups x 4
    assert rules.select(cands, prob(b=4, sk=8192, **fp8))["name"] == "f32"          # 8-cluster past the SMs: 32
    assert rules.select(cands, prob(b=8, hq=16, hkv=1, sk=4096, **fp8))["name"] == "w8"  # MQA: 64 CTAs
    assert rules.select(cands, prob(b=2, hq=16, hkv=1, sk=4096, **fp8))["name"] == "w8"
    assert rules.select(cands, prob(b=16, sk=4096, **fp8))["name"] == "f1"          # 128 groups: unsplit
    assert rules.select(cands, prob(b=64, sk=2048, **fp8))["name"] == "f1"
    assert rules.select(cands, prob(b=1, sk=32768, **fp8))["name"] == "f32"
    # the PDL twin first
    twin = cands + [e8("w8p", 8, True, pdl=True)]
    assert rules.select(twin, prob(b=8, hq=16, hkv=1, sk=4096, **fp8))["name"] == "w8p"
    # a last-arrival build of e4m3 caches (8 warps, 16 splits) where built: before the rule above
    lm = e8("l16", 16, True)
    lm.update(splits=16, cluster=[1, 1], workspace={"form": "counters"})
    assert rules.select(twin + [lm], prob(b=8, hq=16, hkv=1, sk=4096, **fp8))["name"] == "l16"  # 128 CTAs
    assert rules.select(twin + [lm], prob(b=1, sk=32768, **fp8))["name"] == "l16"             # 8 groups
    assert rules.select(twin + [lm], prob(b=2, hq=16, hkv=1, sk=4096, **fp8))["name"] == "w8p"  # 32 CTAs


def test_select_wide_build():
    """bf16/f16 caches: the 8-warp 128-key-tile build where built (kvcache_rules._wide_pick):
    head_dim 128 at the preferred build's split count where that grid leaves half the SMs idle
    (its PDL twin there), head_dim 64 at half the split count; elsewhere the preferred build."""
    def wide(name, splits, d=128, paged=True, pdl=False):
        e = entry(name, splits, paged=paged, d=d)
        e.update(preferred=False, ctas_per_sm=1, tile=[16, 128], pdl=pdl)
        return e
    both = [entry(f"p{s}", s) for s in (1, 2, 4, 8)] + [entry(f"d{s}", s, paged=False) for s in (1, 2, 4, 8)]
    d64 = [entry(f"q{s}", s, d=64) for s in (1, 2, 4, 8)]
    cands = (both + d64 + [wide("w8", 8), wide("w8p", 8, pdl=True), wide("wd8p", 8, paged=False, pdl=True)]
             + [wide(f"v{s}", s, d=64) for s in (1, 2)])
    mqa = dict(b=8, hq=16, hkv=1)
    assert rules.select(cands, prob(**mqa))["name"] == "w8p"                  # 64 CTAs: PDL twin
    assert rules.select(cands, prob(page=None, **mqa))["name"] == "wd8p"       # dense cache alike
    assert rules.select([e for e in cands if e["name"] != "w8p"], prob(**mqa))["name"] == "w8"
    assert rules.select(cands, prob(b=2, hq=32, hkv=8))["name"] == "p8"        # 128 CTAs: preferred
    assert rules.select(cands, prob(b=8, sk=8192, hq=64, d=64))["name"] == "v2"   # preferred: 4 splits
    assert rules.select(cands, prob(b=64, sk=1024, d=64))["name"] == "v1"
    assert rules.select(cands, prob(b=1, sk=32768, d=64))["name"] == "q8"     # half of 8: not built
    assert rules.select(cands, prob(b=16, sk=4096, d=64))["name"] == "v1"     # 128 CTAs
    assert rules.select(cands, prob(b=256, sk=512, d=64))["name"] == "q1"     # 2048 CTAs: > 4 per SM


def test_select_last_merge_build():
    """bf16/f16 head_dim >= 128: the builds whose last split merges the others where built
    (kvcache_rules._last_pick): the one-CTA-per-SM build at the largest of 32 and 16 splits whose
    grid is over a quarter of the SMs and within them, each split >= 2 tiles of 128 keys; else the
    two-per-SM build at 16 for grids within two CTAs per SM; elsewhere the rule before."""
    def last(name, splits, per_sm, paged=True, d=128):
        e = entry(name, splits, paged=paged, d=d)
        e.update(preferred=False, ctas_per_sm=per_sm, tile=[16, 128 if per_sm == 1 else 64], pdl=False,
                 splits=splits, cluster=[1, 1], workspace={"form": "counters"})
        return e
    base = [entry(f"p{s}", s) for s in (1, 2, 4, 8)] + [entry(f"d{s}", s, paged=False) for s in (1, 2, 4, 8)]
    base += [entry(f"q{s}", s, d=64) for s in (1, 2, 4, 8)]
    cands = base + [last("l16", 16, 1), last("l32", 32, 1), last("m16", 16, 2), last("ld16", 16, 1, paged=False),
                    last("x16", 16, 1, d=64)]
    mqa = dict(hq=16, hkv=1)
    assert rules.select(cands, prob(b=8, **mqa))["name"] == "l16"                 # 128 CTAs, 2 tiles each
    assert rules.select(cands, prob(b=8, page=None, **mqa))["name"] == "ld16"     # dense cache alike
    assert rules.select(cands, prob(b=4, **mqa))["name"] == "l16"                 # 4k: 32 splits keep 1 tile
    assert rules.select(cands, prob(b=4, sk=8192, **mqa))["name"] == "l32"        # 128 CTAs of 2 tiles
    assert rules.select(cands, prob(b=2, sk=16384, **mqa))["name"] == "l32"
    assert rules.select(cands, prob(b=2, **mqa))["name"] != "l16"                 # 32 CTAs: too few
    assert rules.select(cands, prob(b=8, sk=2048, **mqa))["name"] == "p8"         # one tile a split
    assert rules.select(cands, prob(b=16, **mqa))["name"] == "m16"                # 256 CTAs, two per SM
    assert rules.select(cands, prob(b=4, sk=8192))["name"] not in ("l16", "l32", "m16")  # 32 groups
    assert rules.select(cands, prob(b=1, hq=32, hkv=8))["name"] == "l16"          # 8 groups
    assert rules.select(cands, prob(b=8, d=64, **mqa))["name"] != "x16"           # head_dim 64: never
    assert rules.select(base, prob(b=8, **mqa))["name"] == "p8"                   # not built: the rule before
    assert rules.select(cands, prob(b=8, sq=4, **mqa))["name"] == "p4"            # 4 row blocks: 512 CTAs at 16


def test_select_switches():
    assert rules.select(CANDS, prob(b=256, local=True))["name"] == "w1"
    assert rules.select(CANDS, prob(b=1, sk=32768, sinks=True, softcap=True))["name"] == "w8"
    with pytest.raises(NoVariantError, match="window/softcap/sinks"):
        rules.select(CANDS, prob(page=None, sinks=True))


def test_select_no_variant_messages():
    with pytest.raises(NoVariantError, match="page size"):
        rules.select([dict(e, page_sizes=[16]) for e in CANDS], prob(page=64))
    with pytest.raises(NoVariantError, match="head_dim"):
        rules.select(CANDS, prob(d=256))
    with pytest.raises(NoVariantError, match="dtype/kv_dtype"):
        rules.select(CANDS, prob(kv_dtype="e4m3"))
    with pytest.raises(NoVariantError, match="at most 16 queries"):
        rules.select(CANDS, prob(sq=17))
    with pytest.raises(NoVariantError, match="no attention_kvcache variant"):
        rules.select([], prob())


def test_families_are_table_driven():
    """A second family (as the prefill kernels register) serves what the decode family does not."""
    other = [entry("pre", family="other"), entry("pre_nc", family="other")]
    other[1]["causal"] = False
    saved = list(rules.FAMILIES)
    try:
        rules.register_family("other", lambda es, p, sms: next((e for e in es if e["causal"] == p.causal), None))
        assert rules.select(CANDS + other, prob(sq=100))["name"] == "pre"
        assert rules.select(CANDS + other, prob(sq=100, causal=False))["name"] == "pre_nc"
        assert rules.select(CANDS + other, prob(sq=1))["name"] != "pre"  # decode stays first
        rules.register_family("other", rules.FAMILIES[-1][1], before="sm90_decode")
        assert rules.FAMILIES[0][0] == "other"
    finally:
        rules.FAMILIES[:] = saved


# --- validation through a simulated bundle --------------------------------------------------------
@pytest.fixture
def sim(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("attention_kvcache"):
        pytest.skip("the test bundle has no attention_kvcache variant")
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def paged(b=2, hq=32, hkv=8, d=128, ps=16, pages=20, mp=8):
    q = bf(b, 1, hq, d)
    k, v = bf(pages, ps, hkv, d), bf(pages, ps, hkv, d)
    bt = torch.randint(0, pages, (b, mp), dtype=torch.int32)
    sl = torch.full((b,), 50, dtype=torch.int32)
    return q, k, v, sl, bt


def test_launches_paged_dense_and_switches(sim):
    q, k, v, sl, bt = paged()
    o, lse = sim.attention_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 32, 1) and lse.dtype == torch.float32
    dense = bf(2, 300, 8, 128)
    sim.attention_kvcache(q, dense, dense, sl)
    sim.attention_kvcache(q, k, v, sl, block_table=bt, window_size=(64, 0), softcap=30.0,
                          sinks=torch.zeros(32), softmax_scale=0.1)
    out = torch.empty_like(q)
    assert sim.attention_kvcache(q, k, v, sl, block_table=bt, out=out) is out
    names = sim.rec.launched
    assert len(names) == 4 and "paged" in names[0] and "paged" not in names[1] and names[2].endswith("_win_cap_sink")


def test_last_merge_takes_the_runtimes_counters(sim, monkeypatch):
    """A variant whose last split merges the others gets, after its workspace, the runtime's
    zeroed (B, Hq, Sq) int32 arrival counters: the same buffer call after call (nothing allocated
    or zeroed per call), a larger one for a larger problem (the old one kept for graphs)."""
    lm = [e["name"] for e in sim.candidates("attention_kvcache") if kv.uses_counters(e)]
    if not lm:
        pytest.skip("no last-arrival-merge variant in the test bundle")
    seen = []
    real = sim.launch
    monkeypatch.setattr(sim, "launch", lambda name, args, **k: (seen.append(list(args)), real(name, args, **k)))
    q, k, v, sl, bt = paged(hq=16, hkv=1)
    for _ in range(2):
        sim.attention_kvcache(q, k, v, sl, block_table=bt, variant=lm[0])
    a, b = seen[0][7], seen[1][7]
    assert a.dtype == torch.int32 and a.shape == (2, 16, 1) and a.data_ptr() == b.data_ptr()
    assert int(a.count_nonzero()) == 0 and kv.counters_buffer(a.device).numel() >= kv._COUNTERS_MIN
    assert seen[0][5].shape == (16, 2, 16, 1, 128)  # o_partial (splits, B, Hq, Sq, D) before them
    big = kv.counters(a.device, 512, 16, 1)
    assert big.numel() == 8192 and kv.counters_buffer(a.device).numel() >= 8192
    assert kv.counters(a.device, 2, 16, 1).data_ptr() == kv.counters_buffer(a.device).data_ptr()


BAD = [
    (dict(block_table="bt64"), "block_table must be int32"),
    (dict(block_table="bt_short"), r"block_table must be \(batch=2, max_pages >= 1\)"),
    (dict(block_table="bt_list"), "block_table must be a torch.Tensor"),
    (dict(block_table="bt_cols"), "rows must be contiguous"),
    (dict(cache_seqlens="sl64"), "cache_seqlens must be int32"),
    (dict(cache_seqlens="sl3"), r"cache_seqlens must have shape \(2,\)"),
    (dict(k="k12"), "page size 12 .* not offered"),
    (dict(k="k_hd64"), r"head_dim of q \(128\) and k_cache/v_cache \(64\) differ"),
    (dict(k="k_f32"), "k_cache and v_cache dtypes differ"),
    (dict(q="q_f32"), "q dtype torch.float32 not supported"),
    (dict(q="q_heads"), r"q heads \(12\) must be a multiple of kv heads \(8\)"),
    (dict(q="q_rank"), "q must be"),
    (dict(window_size=(3,)), "window_size must be a"),
    (dict(window_size=(-2, 0)), "window_size entries must be ints >= -1"),
    (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
    (dict(softcap=math.inf), "softcap must be a finite number >= 0"),
    (dict(softmax_scale=0.0), "softmax_scale must be a positive finite number"),
    (dict(sinks="sinks_bf16"), "sinks must be float32"),
    (dict(sinks="sinks_short"), r"sinks must have shape \(32,\)"),
    (dict(k_descale="one"), "k_descale applies to float8_e4m3fn caches only"),
    (dict(out="out_bad"), "out must be a tensor of q's shape"),
    (dict(max_seqlen_q=4), "max_seqlen_q goes with cu_seqlens_q"),
    (dict(q="q_packed", cu_seqlens_q="cu2", max_seqlen_q=0), "max_seqlen_q = 0: with 5 query tokens in 2 sequences"),
    (dict(dense_batch=True), r"a dense cache \(no block_table\) must be \(batch=2"),
    (dict(q="q_strided"), "strides .* must be multiples of 8"),
]


@pytest.mark.parametrize("bad,msg", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_inputs_are_refused_before_launch(sim, bad, msg):
    q, k, v, sl, bt = paged()
    kw = dict(block_table=bt)
    sub = {
        "bt64": bt.long(), "bt_short": bt[:1], "bt_list": bt.tolist(), "bt_cols": bt.t().contiguous().t(),
        "sl64": sl.long(), "sl3": torch.zeros(3, dtype=torch.int32), "k12": bf(20, 12, 8, 128),
        "k_hd64": bf(20, 16, 8, 64), "k_f32": torch.randn(20, 16, 8, 128), "q_f32": torch.randn(2, 1, 32, 128),
        "q_heads": bf(2, 1, 12, 128), "q_rank": bf(2, 32, 128), "sinks_bf16": bf(32),
        "sinks_short": torch.zeros(31), "one": torch.ones(1), "out_bad": bf(2, 1, 32, 64),
        "q_strided": bf(2, 1, 32, 130)[..., :128], "q_packed": bf(5, 32, 128),
        "cu2": torch.tensor([0, 2, 5], dtype=torch.int32),
    }
    for key, val in bad.items():
        val = sub.get(val, val) if isinstance(val, str) else val
        if key == "q":
            q = val
        elif key == "k":
            k = val
            if val.dtype == torch.bfloat16:
                v = val.clone()
        elif key == "cache_seqlens":
            sl = val
        elif key == "dense_batch":
            kw.pop("block_table")
            k = v = bf(3, 64, 8, 128)
        else:
            kw[key] = val
    with pytest.raises(InputError, match=msg):
        sim.attention_kvcache(q, k, v, sl, **kw)
    assert sim.rec.launched == []


def test_no_variant_for_combos_not_built(sim):
    q, k, v, sl, bt = paged(d=256)
    with pytest.raises(NoVariantError, match="head_dim"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt)
    q, k, v, sl, bt = paged()
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    with pytest.raises(NoVariantError, match="cache layout"):  # fp8: paged only
        sim.attention_kvcache(q, bf(2, 64, 8, 128).to(torch.float8_e4m3fn), bf(2, 64, 8, 128).to(torch.float8_e4m3fn),
                              sl, k_descale=torch.ones(1))
    sim.attention_kvcache(q, k8, v8, sl, block_table=bt, k_descale=torch.ones(1), v_descale=torch.full((8,), 2.0))
    assert "_ce4m3_paged" in sim.rec.launched[-1]
    sim.rec.launched.clear()
    with pytest.raises(InputError, match="head_dim 96 not supported"):
        sim.attention_kvcache(bf(2, 1, 32, 96), bf(20, 16, 8, 96), bf(20, 16, 8, 96), sl, block_table=bt)
    assert sim.rec.launched == []


def test_rotary_prologue_launches_the_twin_and_refuses_bad_tables(sim):
    """``rotary_cos_sin=``: the selection's variant's rotary build (attention_kvcache_rope), the
    table appended after kv_descale; bad tables, packed q, fp8 caches and missing builds refused
    before any launch."""
    if not sim.candidates("attention_kvcache_rope"):
        pytest.skip("the test bundle has no attention_kvcache_rope variant")
    q, k, v, sl, bt = paged()
    cs = torch.randn(4096, 128)
    sim.attention_kvcache(q, k, v, sl, block_table=bt)
    plain = sim.rec.launched[-1]
    sim.attention_kvcache(q, k, v, sl, block_table=bt, rotary_cos_sin=cs[:, :64])  # partial rotary
    assert sim.rec.launched[-1] == "attention_kvcache_rope" + plain.removeprefix("attention_kvcache")
    pl = sim.plan_kvcache(batch=2, seqlen_q=1, heads_q=32, heads_kv=8, head_dim=128, max_pages=8, page_size=16)
    sim.attention_kvcache(q, k, v, sl, block_table=bt, plan=pl, rotary_cos_sin=cs)
    assert sim.rec.launched[-1] == "attention_kvcache_rope" + pl.variant.removeprefix("attention_kvcache")
    sim.rec.launched.clear()
    bad = [(dict(rotary_cos_sin=cs.half()), InputError, "rotary_cos_sin must be float32"),
           (dict(rotary_cos_sin=cs[0]), InputError, "rotary_cos_sin must be float32 .max_position"),
           (dict(rotary_cos_sin=cs[:, :40]), InputError, "rotary_dim 40 must be a positive multiple of 16"),
           (dict(rotary_cos_sin=torch.randn(8, 256)), InputError, "at most head_dim 128"),
           (dict(rotary_cos_sin=cs[:0]), InputError, "has no positions"),
           (dict(rotary_cos_sin=cs.t().contiguous().t()), InputError, "rows must be contiguous"),
           (dict(rotary_cos_sin=torch.randn(8, 130)[:, 1:129]), InputError, "16-byte aligned"),
           (dict(rotary_cos_sin=cs.tolist()), InputError, "must be a torch.Tensor"),
           (dict(rotary_interleaved=True), InputError, "rotary_interleaved needs rotary_cos_sin"),
           (dict(rotary_cos_sin=cs, rotary_interleaved=1), InputError, "rotary_interleaved must be a bool")]
    for kw, err, msg in bad:
        with pytest.raises(err, match=msg):
            sim.attention_kvcache(q, k, v, sl, block_table=bt, **kw)
    with pytest.raises(InputError, match="not packed varlen q"):
        sim.attention_kvcache(bf(5, 32, 128), k, v, sl, block_table=bt, cu_seqlens_q=torch.tensor(
            [0, 2, 5], dtype=torch.int32), max_seqlen_q=3, rotary_cos_sin=cs)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    with pytest.raises(NoVariantError, match="bf16 caches, not e4m3"):
        sim.attention_kvcache(q, k8, v8, sl, block_table=bt, rotary_cos_sin=cs)
    with pytest.raises(NoVariantError, match="no rotary-prologue build"):  # the dense cache's: not built
        sim.attention_kvcache(q, bf(2, 64, 8, 128), bf(2, 64, 8, 128), sl, rotary_cos_sin=cs)
    assert sim.rec.launched == []


def test_check_varlen_contents(sim):
    q, k, v, sl, bt = paged()
    bt[1, 2] = 20  # past the 20 pages; used by 50 keys (4 pages of 16)
    with pytest.raises(InputError, match=r"block_table\[1\] holds a page index outside \[0, 20\)"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt, check_varlen=True)
    bt[1, 2] = 0
    bt[1, 7] = -5  # not used by 50 keys: fine
    sim.attention_kvcache(q, k, v, sl, block_table=bt, check_varlen=True)
    with pytest.raises(InputError, match=r"cache_seqlens\[0\] = 129 exceeds the cache's 128 rows"):
        sim.attention_kvcache(q, k, v, torch.tensor([129, 3], dtype=torch.int32), block_table=bt, check_varlen=True)
    with pytest.raises(InputError, match="cache_seqlens must be >= 0"):
        sim.attention_kvcache(q, k, v, torch.tensor([-1, 3], dtype=torch.int32), block_table=bt, check_varlen=True)
    assert len(sim.rec.launched) == 1


def test_plan(sim):
    q, k, v, sl, bt = paged()
    pl = sim.plan_kvcache(batch=2, seqlen_q=1, heads_q=32, heads_kv=8, head_dim=128, max_pages=8, page_size=16)
    assert pl.variant.startswith("attention_kvcache_") and pl.workspace_bytes == 0
    sim.attention_kvcache(q, k, v, sl, block_table=bt, plan=pl)
    assert sim.rec.launched == [pl.variant]
    with pytest.raises(InputError, match="not the planned one"):
        sim.attention_kvcache(q, k, v, sl, block_table=bt[:, :4], plan=pl)
    with pytest.raises(InputError, match="page size 12 not offered"):
        sim.plan_kvcache(batch=2, seqlen_q=1, heads_q=32, heads_kv=8, head_dim=128, max_pages=8, page_size=12)


def test_torch_op_fake_checks_like_the_real_op(sim):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = sim.torch_ops()
    q, k, v, sl, bt = paged()
    bt64, q256, k256 = bt.long(), bf(2, 1, 32, 256), bf(20, 16, 8, 256)
    o, lse = ops.attention_kvcache(q, k, v, sl, bt)
    assert o.shape == q.shape and lse.shape == (2, 32, 1)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fq, fk, fv, fsl, fbt = (mode.from_tensor(t) for t in (q, k, v, sl, bt))
        fo, flse = ops.attention_kvcache(fq, fk, fv, fsl, fbt, window_left=8, softcap=2.0)
        assert fo.shape == q.shape and fo.stride() == q.stride() and flse.shape == (2, 32, 1)
        fbt64 = mode.from_tensor(bt64)
        with pytest.raises(InputError, match="block_table must be int32"):
            ops.attention_kvcache(fq, fk, fv, fsl, fbt64)
        with pytest.raises(NoVariantError, match="head_dim"):
            q2, k2 = mode.from_tensor(q256), mode.from_tensor(k256)
            ops.attention_kvcache(q2, k2, k2, fsl, fbt)
    torch.library.opcheck(ops.attention_kvcache, (q, k, v, sl, bt),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# --- the float32 reference -----------------------------------------------------------------------
def test_reference_paged_equals_dense_and_masks():
    from factory.testing import attention_kvcache_reference, gather_kv_cache

    torch.manual_seed(0)
    q, k, v, sl, bt = paged(b=3, ps=8, pages=24)
    sl = torch.tensor([0, 1, 61], dtype=torch.int32)
    bt = torch.randperm(24).view(3, 8).to(torch.int32)
    dense_k = torch.zeros(3, 64, 8, 128, dtype=torch.bfloat16)
    dense_v = torch.zeros_like(dense_k)
    for i in range(3):
        n = int(sl[i])
        dense_k[i, :n] = gather_kv_cache(k, bt, sl, i)
        dense_v[i, :n] = gather_kv_cache(v, bt, sl, i)
    o1, l1 = attention_kvcache_reference(q, k, v, sl, bt)
    o2, l2 = attention_kvcache_reference(q, dense_k, dense_v, sl)
    assert torch.allclose(o1, o2) and torch.equal(l1.isinf(), l2.isinf())
    assert (o1[0] == 0).all() and torch.isinf(l1[0]).all()
    # one key: o is that key's value row (GQA: kv head h // 4)
    assert torch.allclose(o1[1, 0], v[bt[1, 0]][0].float().repeat_interleave(4, dim=0), atol=1e-6)
    # a sink of -inf changes nothing; a huge one takes all the weight
    o3, _ = attention_kvcache_reference(q, k, v, sl, bt, sinks=torch.full((32,), -math.inf))
    assert torch.allclose(o1, o3)
    o4, l4 = attention_kvcache_reference(q, k, v, sl, bt, sinks=torch.full((32,), 1e4))
    assert o4.abs().max() < 1e-6 and torch.allclose(l4[1:], torch.full_like(l4[1:], 1e4))
    # window 0: only the last key
    o5, _ = attention_kvcache_reference(q, k, v, sl, bt, window_size=(0, 0))
    last = gather_kv_cache(v, bt, sl, 2)[-1].float().repeat_interleave(4, dim=0)
    assert torch.allclose(o5[2, 0], last, atol=1e-6)


# --- the C entry: fx_attention_kvcache_select agrees with the Python selection ---------------------
def _c_problem(cs, b, sq, hq, hkv, d, sk, page, dtype, switches):
    dt = {"bf16": 1, "f16": 2}[dtype]
    p = cs.KVCacheProblem()
    p.dtype = p.kv_dtype = dt
    p.batch, p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim = b, sq, hq, hkv, d
    if page:
        p.page_size, p.max_pages, p.num_pages = page, -(-sk // page), b * -(-sk // page) + 1
    else:
        p.page_size, p.max_pages, p.num_pages = sk, 0, b
    p.q_stride[:] = [sq * hq * d, hq * d, d]
    p.o_stride[:] = [sq * hq * d, hq * d, d]
    p.k_stride[:] = [p.page_size * hkv * d, hkv * d, d]
    p.v_stride[:] = [p.page_size * hkv * d, hkv * d, d]
    p.block_table_stride = max(p.max_pages, 1)
    p.causal = 1
    p.window_left = p.window_right = -1
    if switches:
        p.window_left, p.softcap, p.sinks = 128, 30.0, 0x1000
    return p


def test_packed_q_selection(test_bundle):
    """A packed-q call (cu_seqlens_q) runs a packed-q build: the C selection's packed-q form
    (varlen_q) decides, and the result is the rule's (tests/kvcache_rules.py), refusals included."""
    b_py = Bundle.open(test_bundle, capability=(9, 0), device={"name": None, "sm_count": 132})
    cands = b_py.candidates("attention_kvcache")
    n_ok = 0
    for page in (16, 64, 128):
        for d, dtype in ((128, "bf16"), (64, "f16"), (256, "bf16")):
            for sq, sw in ((512, False), (4, False), (300, True)):
                pr = prob(b=4, sq=sq, d=d, page=page, dtype=dtype, kv_dtype=dtype, varlen_q=True, local=sw,
                          softcap=sw, sinks=sw)
                try:
                    want = rules.select(cands, pr, 132)["name"]
                except NoVariantError:
                    want = None
                if want is None:
                    with pytest.raises(NoVariantError):
                        kv.choose(b_py, pr)
                    continue
                got = kv.choose(b_py, pr)
                assert got["varlen"] and got["name"] == want, (pr, got["name"], want)
                n_ok += 1
    assert n_ok >= 3


def test_c_selection_equals_python(test_bundle):
    """Over batch 1-256, GQA/MQA/MHA, head_dim 64/128/256, seqlen_q 1-17, caches of 64-32768 rows,
    paged (every page size) and dense, with and without the switches, bf16 and f16, on three
    devices: the same variant, or both refuse (NoVariantError / FX_ERR_NO_VARIANT)."""
    import json

    import c_selection as cs

    lib = cs.CLib(test_bundle / json.loads((test_bundle / "manifest.json").read_text())["host_library"]["path"])
    n_ok = n = 0
    for cc, sms in (((9, 0), 132), ((9, 0), 114), ((8, 0), 108)):
        b_py = Bundle.open(test_bundle, capability=cc, device={"name": None, "sm_count": sms})
        cands = b_py.candidates("attention_kvcache")
        dev = lib.device(cc, sms, None)
        for b in (1, 2, 4, 8, 16, 64, 256):
            for hq, hkv in ((32, 8), (16, 1), (8, 8), (64, 8)):
                for d in (64, 128, 256):
                    for sq in (1, 4, 17):
                        for sk in (64, 1000, 4096, 32768):
                            for page in (None, 1, 16, 64, 256):
                                for dtype, switches in (("bf16", False), ("f16", False), ("bf16", True)):
                                    pr = prob(b=b, sq=sq, hq=hq, hkv=hkv, d=d, sk=(-(-sk // page) * page) if page else sk,
                                              page=page, dtype=dtype, kv_dtype=dtype, local=switches,
                                              softcap=switches, sinks=switches)
                                    try:
                                        want = ("ok", rules.select(cands, pr, sms)["name"])
                                    except NoVariantError:
                                        want = ("novariant",)
                                    got, _ = lib.kvcache_select(dev, _c_problem(cs, b, sq, hq, hkv, d, sk, page, dtype,
                                                                                switches))
                                    assert got == want, (cc, sms, pr, got, want, lib.message())
                                    n += 1
                                    n_ok += got[0] == "ok"
    assert n_ok > 300 and n > n_ok  # both answers occur
    # fp8 caches (C needs the descales; Python passes unit ones)
    b_py = Bundle.open(test_bundle, capability=(9, 0), device={"name": None, "sm_count": 132})
    dev = lib.device((9, 0), 132, None)
    picked = set()
    for b, hq, hkv in ((1, 32, 8), (4, 32, 8), (64, 32, 8), (8, 16, 1), (16, 32, 8)):
        for page in (None, 16, 64):
            for dtype in ("bf16", "f16"):
                pr = prob(b=b, hq=hq, hkv=hkv, sk=4096, page=page, dtype=dtype, kv_dtype="e4m3")
                try:
                    want = ("ok", rules.select(b_py.candidates("attention_kvcache"), pr, 132)["name"])
                except NoVariantError:
                    want = ("novariant",)
                cp = _c_problem(cs, b, 1, hq, hkv, 128, 4096, page, dtype, False)
                cp.kv_dtype, cp.kv_descale = 4, 0x2000
                cp.k_stride[:] = list(cp.k_stride)  # (element strides: multiples of 16 for e4m3)
                got, _ = lib.kvcache_select(dev, cp)
                assert got == want, (pr, got, want, lib.message())
                picked.add(got[-1])
    # the test tier's e4m3 last-arrival build is among the answers (MQA B8 4k: 128 CTAs of 2 tiles)
    assert any(str(n).endswith("_ce4m3_paged_rc_ow_fa_lm_tz") for n in picked), picked


def test_c_entry_refuses_bad_problems(test_bundle):
    import json

    import c_selection as cs

    lib = cs.CLib(test_bundle / json.loads((test_bundle / "manifest.json").read_text())["host_library"]["path"])
    dev = lib.device((9, 0), 132, None)
    cases = [
        (dict(page_size=12), "page size 12 not offered"),
        (dict(head_dim=96), "head_dim 96 not supported"),
        (dict(heads_q=12), "must be a multiple of kv heads"),
        (dict(window_left=-2), "window_size entries must be >= -1"),
        (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
        (dict(window_left=64), "the window/softcap build reads sinks"),
        (dict(num_pages=0), "at least one page"),
        (dict(causal=2), "causal"),
        (dict(o=0x10000, q=0x10000), "o overlaps q in memory"),
        (dict(o=0x10000, o_stride=(32 * 128, 32 * 128, 0)), "o: stride 0 of mode 2 makes elements overlap"),
    ]
    for change, msg in cases:
        p = _c_problem(cs, 2, 1, 32, 8, 128, 1000, 16, "bf16", False)
        for k, v in change.items():
            if isinstance(v, tuple):
                getattr(p, k)[:] = list(v)
            else:
                setattr(p, k, v)
        got, sel = lib.kvcache_select(dev, p)
        assert got == ("input",) and msg in lib.message() and sel.variant == -1, (change, got, lib.message())
    got, sel = lib.kvcache_select(dev, _c_problem(cs, 2, 1, 32, 8, 128, 1000, 16, "bf16", False))
    assert got[0] == "ok" and sel.workspace_bytes == 2 * 32 * 4  # the lse scratch (no lse pointer)


def test_c_selection_packed_q(test_bundle):
    """The C problem's packed-q form (varlen_q, cu_seqlens_q, seqlen_q = the token count): the
    variant the rule picks for the packed problem (tests/kvcache_rules.py), or both refuse; the lse
    scratch sized by the tokens; and its own refusals."""
    import json

    import c_selection as cs

    lib = cs.CLib(test_bundle / json.loads((test_bundle / "manifest.json").read_text())["host_library"]["path"])
    dev = lib.device((9, 0), 132, None)
    b_py = Bundle.open(test_bundle, capability=(9, 0), device={"name": None, "sm_count": 132})
    cands = b_py.candidates("attention_kvcache")

    def packed(b, max_q, total, d, page, dtype, switches):
        p = _c_problem(cs, b, total, 32, 8, d, 4096, page, dtype, switches)
        p.varlen_q, p.max_seqlen_q, p.cu_seqlens_q = 1, max_q, 0x3000
        p.q_stride[:] = p.o_stride[:] = [0, 32 * d, d]
        return p

    n_ok, ok_args = 0, None
    for page in (None, 16, 64):
        for d, dtype in ((128, "bf16"), (64, "f16"), (256, "bf16")):
            for max_q, switches in ((512, False), (1, False), (300, True)):
                pr = prob(b=4, sq=max_q, d=d, sk=4096, page=page, dtype=dtype, kv_dtype=dtype, varlen_q=True,
                          local=switches, softcap=switches, sinks=switches)
                try:
                    want = ("ok", rules.select(cands, pr, 132)["name"])
                except NoVariantError:
                    want = ("novariant",)
                got, sel = lib.kvcache_select(dev, packed(4, max_q, 3 * max_q + 5, d, page, dtype, switches))
                assert got == want, (pr, got, want, lib.message())
                if got[0] == "ok":
                    n_ok += 1
                    ok_args = ok_args or (4, max_q, 3 * max_q + 5, d, page, dtype, switches)
                    assert sel.workspace_bytes == 32 * (3 * max_q + 5) * 4  # the (heads, tokens) lse scratch
    assert n_ok >= 3
    total, d = ok_args[2], ok_args[3]
    for change, msg in ((dict(max_seqlen_q=total + 1), f"max_seqlen_q = {total + 1} must be in [0, {total}]"),
                        (dict(max_seqlen_q=0), f"max_seqlen_q = 0: with {total} query tokens in 4 sequences"),
                        (dict(varlen_q=2), "varlen_q"),
                        (dict(q_stride=(0, 32 * d, 4)), "strides must be multiples of 8 elements")):
        p = packed(*ok_args)
        for k, v in change.items():
            if isinstance(v, tuple):
                getattr(p, k)[:] = list(v)
            else:
                setattr(p, k, v)
        got, sel = lib.kvcache_select(dev, p)
        assert got == ("input",) and msg in lib.message() and sel.variant == -1, (change, got, lib.message())
    # q's batch stride is unused in the packed form (any value)
    p = packed(*ok_args)
    p.q_stride[0] = 12345
    assert lib.kvcache_select(dev, p)[0][0] == "ok", lib.message()


def test_attention_with_switches_runs_the_kvcache_kernels(sim):
    """bundle.attention with a window, softcap or sinks: the attention_kvcache switch build over k
    and v viewed as pages (no copy): dense (pages of the largest preferred size dividing Sk) and
    packed (one-row pages); the refusals of what cannot be viewed or is not built."""
    sw = [n for n, e in sim.manifest["variants"].items() if e.get("op") == "attention_kvcache" and e.get("sinks")]
    if not sw:
        pytest.skip("the test bundle has no window/softcap/sinks attention_kvcache build")
    hq, hkv, d = 32, 8, 128
    sinks = torch.zeros(hq)
    n0 = len(sim.rec.launched)
    ran = 0
    for sq, sk in ((1, 1024), (1, 1001), (300, 1024)):
        q, k, v = bf(2, sq, hq, d), bf(2, sk, hkv, d), bf(2, sk, hkv, d)
        try:
            o, lse = sim.attention(q, k, v, True, None, return_lse=True, window_size=(128, 0), softcap=30.0,
                                   sinks=sinks)
        except NoVariantError as e:
            assert "attention_kvcache" in str(e)
            continue
        ran += 1
        assert o.shape == q.shape and lse.shape == (2, hq, sq)
        assert sim.rec.launched[-1].endswith("_win_cap_sink")
    assert ran >= 1 and len(sim.rec.launched) == n0 + ran
    # packed sequences: one-row pages, the table from cu_seqlens_k
    cu_q, cu_k = torch.tensor([0, 5, 12], dtype=torch.int32), torch.tensor([0, 100, 400], dtype=torch.int32)
    q, k, v = bf(12, hq, d), bf(400, hkv, d), bf(400, hkv, d)
    try:
        o = sim.attention(q, k, v, True, None, cu_q, cu_k, 7, 300, window_size=(64, 0))
        assert o.shape == q.shape and sim.rec.launched[-1].endswith("_win_cap_sink")
    except NoVariantError as e:
        assert "varlen_q=True" in str(e)
    # refusals: k/v whose batch and sequence do not merge; fp8 with a window; mismatched offsets
    big = bf(2, 2048, hkv, d)
    with pytest.raises(InputError, match="merge"):
        sim.attention(bf(2, 4, hq, d), big[:, :1024], big[:, :1024], True, None, window_size=(8, 0))
    f8 = torch.float8_e4m3fn
    with pytest.raises(InputError, match="not built for fp8"):
        sim.attention(bf(2, 4, hq, d).to(f8), big.to(f8), big.to(f8), True, None, q_descale=torch.ones(1),
                      window_size=(8, 0))
    with pytest.raises(InputError, match="one batch"):
        sim.attention(q, k, v, True, None, cu_q, torch.tensor([0, 400], dtype=torch.int32), 7, 300, softcap=5.0)
    with pytest.raises(InputError, match="window_size entries"):
        sim.attention(bf(2, 4, hq, d), bf(2, 64, hkv, d), bf(2, 64, hkv, d), True, None, window_size=(-3, 0))
