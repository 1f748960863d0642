"""The decode-attention family's variants and the runtime's decode rule, on the CPU (no GPU, no
DSL needed except where marked): the rule's split count at batch 1/16/64/256 over contexts
512-32k (GQA 32/8, MHA, Sq 1/4/16), where the family is not used, how ``select`` falls back, and
the variants' calling conventions.  The rule is the host library's (compiler/csrc/fx_select.c),
run on synthetic entries (tests/selection_lib.py)."""

from __future__ import annotations

import pytest

import selection_lib as sl
from factory.runtime.errors import NoVariantError

SMS = 132
AVAIL = {1: False, 2: True, 4: True, 8: True, 32: False}  # the default tier: {splits: cluster?}


def split(b, hq, hkv, sq, sk, d=128, sms=SMS, avail=AVAIL):
    """The split count the selection takes with decode variants of these split counts built
    ({splits: merged in a cluster?}), no PDL twins."""
    entries = [_entry(f"kv{sp}", sp, cl, d=d) for sp, cl in avail.items()]
    name = sl.Lib(entries, sm_count=sms).attention(b, hq, hkv, sq, sk, d=d)[0]
    return next(e["kv_splits"] for e in entries if e["name"] == name)


CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
# Expected split counts, documented in decode_split_count (notes/attention-decode.md).
GQA_B1 = {512: 4, 1024: 8, 2048: 8, 4096: 32, 8192: 32, 16384: 8, 32768: 8}


@pytest.mark.parametrize("sk", CONTEXTS)
@pytest.mark.parametrize("b", (1, 16, 64, 256))
def test_rule_gqa(b, sk):
    want = GQA_B1[sk] if b == 1 else 1  # 16 x 8 kv heads = 128 CTAs already fill 3/4 of the SMs
    assert split(b, 32, 8, 1, sk) == want
    # 4 queries x 4 heads: still one row block; 128 query rows: the second kernel's merge pays only
    # where the 8-cluster would keep >= 16 tiles each (so not at 4k keys)
    assert split(b, 32, 8, 4, sk) == (8 if (b, sk) == (1, 4096) else want)


@pytest.mark.parametrize("sk", CONTEXTS)
@pytest.mark.parametrize("b", (1, 16, 64, 256))
def test_rule_mha_and_sq16(b, sk):
    assert split(b, 32, 32, 1, sk) == (2 if b == 1 else 1)  # 32 groups: 2 splits = 64 CTAs
    # 16 queries x 4 heads = 4 row blocks per kv head: target SMs/2 CTAs, so 4 splits at B1
    assert split(b, 32, 8, 16, sk) == (4 if b == 1 else 1)


def test_rule_small_batches_and_short_contexts():
    assert [split(b, 32, 8, 1, 4096) for b in (2, 4, 8, 12, 13)] == [4, 2, 2, 2, 1]  # 104 groups >= 99
    assert split(1, 32, 8, 1, 64) == 1        # one key tile: nothing to split
    assert split(1, 32, 8, 1, 200) == 2       # 4 tiles: 2 each
    assert split(1, 32, 8, 1, 100) == 1       # 2 tiles: a split needs 2
    assert split(1, 32, 8, 1, 16384, d=64) == 32  # D64: K/V fit L2 (34 MB)
    assert split(3, 32, 8, 1, 4096) == 2      # 24 groups: 48 CTAs > SMs/4
    # MQA: 16 query rows a CTA, all real; the 32-split's merge of 128 rows costs more than it gains
    # at 4k keys (H100: 8-cluster 11.0-11.5 µs, 32: 16.0); B2 (32 rows) and 8k+ keys keep 32
    entries = [_entry(f"kv{sp}", sp, cl) for sp, cl in AVAIL.items()]
    lib = sl.Lib(entries, sm_count=SMS)
    got = [lib.attention(b, hq, hkv, 1, sk)[0] for b, hq, hkv, sk in
           ((1, 16, 1, 4096), (2, 16, 1, 4096), (4, 16, 1, 4096), (8, 16, 1, 4096), (8, 16, 1, 8192), (1, 64, 8, 4096))]
    assert got == ["kv32", "kv32", "kv32", "kv8", "kv32", "kv32"]  # the last: 64 rows
    # no global variant built: the largest cluster split stays
    assert split(1, 32, 8, 1, 4096, avail={1: False, 2: True, 4: True, 8: True}) == 8
    # no cluster variant: unsplit
    assert split(1, 32, 8, 1, 4096, avail={1: False}) == 1
    # another SM count (H100 PCIe, 114): the thresholds move with it
    assert split(1, 32, 32, 1, 4096, sms=114) == 2 and split(12, 32, 8, 1, 4096, sms=114) == 1


def _entry(name, splits, cluster, d=128, dtype="bf16", preferred=True, tile=(16, 64), causal=True, pdl=False):
    return {"name": name, "op": "attention", "target": "sm_90", "dtype": dtype, "head_dim": d,
            "causal": causal, "varlen": False, "tile": list(tile), "stages": 3, "decode_rows": 16,
            "kv_splits": splits, "splits": 1 if cluster else splits, "cluster": [splits if cluster else 1, 1],
            "pack_gqa": False, "preferred": preferred, "pdl": pdl}


# As the default tier builds them: PDL twins of the cluster splits, the second-kernel split PDL only.
DECODE = ([_entry(f"dec_kv{sp}", sp, cl) for sp, cl in ((1, False), (2, True), (4, True), (8, True))]
          + [_entry(f"dec_kv{sp}_pdl", sp, cl, pdl=True) for sp, cl in ((2, True), (4, True), (8, True), (32, False))])
OLD = [  # the sm_90a and sm_90 families' dense variants, as their manifests state them
    {"name": "sm90a_m128", "target": "sm_90a", "dtype": "bf16", "head_dim": 128, "causal": True, "varlen": False,
     "tile": [128, 128], "stages": 2, "splits": 1, "preferred": True, "min_seqlen_q": 2, "ctas_per_sm": 1},
    {"name": "sm90a_m64", "target": "sm_90a", "dtype": "bf16", "head_dim": 128, "causal": True, "varlen": False,
     "tile": [64, 128], "stages": 2, "splits": 1, "preferred": False, "min_seqlen_q": 2, "ctas_per_sm": 1},
    {"name": "sm90_m64", "target": "sm_90", "dtype": "bf16", "head_dim": 128, "causal": True, "varlen": False,
     "tile": [64, 128], "stages": 2, "splits": 1, "preferred": True},
    {"name": "sm90_m64_nc", "target": "sm_90", "dtype": "bf16", "head_dim": 128, "causal": False, "varlen": False,
     "tile": [64, 128], "stages": 2, "splits": 1, "preferred": True},
]


def sel(b, hq, hkv, sq, sk, causal=True, cands=None, dtype="bf16"):
    lib = sl.Lib(cands if cands is not None else OLD + DECODE, sm_count=SMS)
    return lib.attention(b, hq, hkv, sq, sk, dtype=dtype, causal=causal)[0]


def test_select_takes_the_decode_family():
    assert sel(1, 32, 8, 1, 4096) == "dec_kv32_pdl"
    assert sel(1, 32, 8, 1, 512) == "dec_kv4_pdl"     # 32 CTAs: PDL
    assert sel(16, 32, 8, 1, 512) == "dec_kv1"
    assert sel(1, 32, 32, 1, 4096) == "dec_kv2_pdl"   # 64 CTAs <= SMs/2: PDL
    assert sel(8, 32, 8, 1, 1024) == "dec_kv2"        # 128 CTAs: no PDL
    assert sel(1, 32, 8, 16, 16384) == "dec_kv4"      # 4 row blocks x 8 kv heads x 4 = 128 CTAs
    assert sel(1, 32, 8, 1, 4096, causal=False) == "dec_kv32_pdl"  # one query: no mask either way
    assert sel(4, 32, 8, 16, 4096) == "dec_kv1"
    # without the PDL twins, the plain split
    assert sel(1, 32, 8, 1, 512, cands=OLD + [e for e in DECODE if not e["pdl"] or e["kv_splits"] == 32]) == "dec_kv4"


def test_select_wide_build():
    """head_dim 128: where the rule's split leaves half the SMs idle, the 8-warp 128-key-tile build
    of that split count (not preferred, one CTA per SM), PDL as the rule says; elsewhere the
    preferred tile (H100 MQA B8 H16/1 4k, notes/attention-kvcache.md)."""
    wide = [_entry("wide_kv8_pdl", 8, True, tile=(16, 128), preferred=False, pdl=True),
            _entry("wide_kv4_pdl", 4, True, tile=(16, 128), preferred=False, pdl=True)]
    for e in wide:
        e["ctas_per_sm"] = 1
    lib = sl.Lib(OLD + [e for e in DECODE if e["name"] != "dec_kv8_pdl"] + wide, sm_count=SMS)

    def pick(*shape):
        return lib.attention(*shape, dtype="bf16", causal=True)[0]
    assert pick(8, 16, 1, 1, 4096) == "wide_kv8_pdl"   # 64 CTAs
    assert pick(1, 32, 8, 1, 1024) == "wide_kv8_pdl"
    assert pick(1, 32, 8, 1, 512) == "wide_kv4_pdl"    # 32 CTAs
    assert pick(1, 32, 8, 1, 4096) == "dec_kv32_pdl"   # 32 splits: not built wide
    assert pick(8, 32, 8, 1, 1024) == "dec_kv2"        # 128 CTAs


def test_select_falls_back():
    assert sel(1, 32, 8, 17, 4096) == "sm90a_m64"            # more than 16 queries: the old rule
    assert sel(1, 32, 8, 4, 4096, causal=False) == "sm90_m64_nc"  # Sq > 1 without the causal mask
    assert sel(1, 32, 8, 1, 4096, cands=OLD) == "sm90_m64"   # no decode variant in the bundle
    assert sel(1, 32, 8, 1, 4096, causal=False, cands=OLD) == "sm90_m64_nc"
    # only non-preferred, or a single tile config: still one tile's entries
    alt = [dict(e, preferred=False, name="alt_" + e["name"]) for e in DECODE]
    assert sel(1, 32, 8, 1, 4096, cands=OLD + alt) == "alt_dec_kv32_pdl"
    assert sel(1, 32, 8, 1, 4096, cands=OLD + DECODE + alt) == "dec_kv32_pdl"
    # a split count the rule wants but the bundle lacks: the old path
    assert sel(1, 32, 8, 1, 4096, cands=OLD + [e for e in DECODE if e["kv_splits"] != 32]) == "dec_kv8_pdl"
    assert sel(16, 32, 8, 1, 4096, cands=OLD + [e for e in DECODE if e["kv_splits"] != 1]) == "sm90_m64"
    # non-causal decode entries are never taken (the family's rule assumes bottom-right masking)
    assert sel(1, 32, 8, 1, 4096, cands=OLD + [dict(e, causal=False) for e in DECODE]) == "sm90_m64"
    # the old rule never takes a decode entry, even as the only candidate of its target
    with pytest.raises(NoVariantError):
        sl.Lib(DECODE).attention(1, 32, 8, 300, 4096)
    with pytest.raises(NoVariantError):
        sl.Lib(DECODE).attention(1, 8, 8, 64, 64, varlen=True)


def test_variants_and_calling_convention():
    pytest.importorskip("cutlass")
    from factory.attention.decode import AttentionDecode, enumerate_decode
    from factory.atoms.targets import get_target

    vs = enumerate_decode(get_target("sm_90"), "default")
    assert len(vs) == 32 and len({v.name for v in vs}) == 32
    # bf16 head_dim 128: the 8-cluster's PDL twin is the 8-warp 128-key-tile build (not preferred:
    # the rule names it)
    wide = [v for v in vs if not v.describe()["preferred"]]
    assert [(v.dtype, v.head_dim, v.splits, v.cluster, v.pdl, v.warps, v.tile_n, v.ctas_per_sm()) for v in wide] == [
        ("bf16", 128, 8, True, True, 8, 128, 1)]
    assert not enumerate_decode(get_target("sm_90a"), "default") and not enumerate_decode(get_target("sm_80"), "default")
    for v in vs:
        d = v.describe()
        args = [a.name for a in v.signature().args]
        if v.cluster or v.splits == 1:
            assert d["splits"] == 1 and "o_partial" not in args
        else:
            assert d["splits"] == v.splits and args[5:7] == ["o_partial", "lse_partial"]
        assert d["kv_splits"] == v.splits and d["decode_rows"] == 16 and d["causal"]
        assert d["ctas_per_sm"] >= 1 and d["smem_bytes"] <= 227 * 1024
    assert AttentionDecode(target="sm_90", splits=16, cluster=True).can_implement() is None
    assert AttentionDecode(target="sm_90", splits=32, cluster=True).can_implement()  # no 32-CTA clusters
    assert AttentionDecode(target="sm_90", tile_n=48).can_implement()
    assert AttentionDecode(target="sm_90a").can_implement()
    assert AttentionDecode(target="sm_90", stages=2, min_ctas=3).ctas_per_sm() == 3
    assert AttentionDecode(target="sm_90", stages=4).ctas_per_sm() == 1
