"""Attention in tuning.json (``scripts/tune.py --op attention``): the bucket key, the loader's
selection taking a bucket's winner (after the split-KV / packed-GQA decode rules, among the
variants that fit the problem), only on the device and manifest it was measured for; the tuner's
bucket grid.  No GPU: the test bundle opened for a simulated H100 (launches recorded)."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

import selection_lib as sl
from conftest import ROOT, Recorder
from factory.compiler.link import relink
from factory.runtime import Bundle, tuning

H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}
# (the preferred persistent build as the selection takes it: its dynamic twin with the producer's
# tile coordinates)
BIG = "attention_sm90a_bf16_d128_m128_n128_s2_causal_ov_pp_er_ps_kf_lz_sd_sc_dy"
SMALL = "attention_sm90a_bf16_d128_m64_n128_s2_causal_ov"


def test_attention_bucket_key():
    key = tuning.attention_bucket_key
    assert key("bf16", 128, True, 4096, 4096, 32) == "attention:bf16:d128:causal:q4096_k4096_bh32"
    assert key("f16", 256, False, 3000, 1, 17) == "attention:f16:d256:full:q4096_k1_bh32"
    assert key("bf16", 64, False, 1, 513, 1) == "attention:bf16:d64:full:q1_k1024_bh1"
    assert [tuning.pow2_bucket(x) for x in (1, 2, 3, 512, 513, 16384)] == [1, 2, 4, 512, 1024, 16384]


# --- select() with a table's winner ------------------------------------------------------------------
def _e(name, target, causal=True, tile=(128, 128), splits=1, pack=False, **kw):
    return {"name": name, "op": "attention", "target": target, "dtype": "bf16", "head_dim": 128, "causal": causal,
            "varlen": False, "tile": list(tile), "stages": 2, "splits": splits, "pack_gqa": pack, **kw}


_SM90 = dict(min_seqlen_q=2, ctas_per_sm=1)
CANDS = [
    _e("h", "sm_90a", preferred=True, **_SM90), _e("hs", "sm_90a", tile=(64, 128), **_SM90),
    _e("hn", "sm_90a", False, preferred=True, **_SM90),
    _e("big", "sm_90", preferred=True), _e("small", "sm_90", tile=(64, 128)),
    _e("s4", "sm_90", tile=(64, 128), splits=4), _e("p4", "sm_90", False, tile=(64, 128), splits=4, pack=True),
]


def _pick(b, hq, hkv, sq, sk, tuned=None, causal=True):
    """The host library's choice (the selection library of CANDS) on a planned H100, with a tuning
    table whose bucket of this problem names ``tuned``."""
    table = None
    if tuned is not None:
        key = tuning.attention_bucket_key("bf16", 128, causal, sq, sk, b * hq)
        table = {"device": H100, "buckets": {}, "attention": {key: {"winner": tuned}}}
    lib = sl.Lib(CANDS, cc=(9, 0), sm_count=H100["sm_count"], name=H100["name"], tuning=table)
    return lib.attention(b, hq, hkv, sq, sk, causal=causal)[0]


def test_select_takes_the_tables_winner_among_the_fitting():
    assert _pick(2, 16, 16, 4096, 4096) == "h"  # the rule
    assert _pick(2, 16, 16, 4096, 4096, tuned="hs") == "hs"
    assert _pick(2, 16, 16, 4096, 4096, tuned="small") == "small"  # another target: measured faster
    assert _pick(2, 16, 16, 4096, 4096, tuned="hn") == "h"  # non-causal: does not fit
    assert _pick(2, 16, 16, 4096, 4096, tuned="s4") == "h"  # a split variant is never a table's pick
    assert _pick(2, 16, 16, 4096, 4096, tuned="gone") == "h"  # a name the bundle lacks
    # the decode rules come first: one query with GQA takes the packed split, a short grid the split
    assert _pick(1, 32, 8, 1, 16384, tuned="h", causal=False) == "p4"
    assert _pick(1, 8, 8, 1, 8192, tuned="big") == "s4"
    # below min_seqlen_q the sm90a variants are filtered out before the table is read
    assert _pick(8, 32, 32, 1, 4096) == _pick(8, 32, 32, 1, 4096, tuned="hs") == "small"
    assert _pick(8, 32, 32, 1, 4096, tuned="big") == "big"


# --- through bundle.attention ---------------------------------------------------------------------------
@pytest.fixture()
def tuned_copy(test_bundle, tmp_path, monkeypatch):
    dst = tmp_path / "b"
    shutil.copytree(test_bundle, dst)
    return dst


def _write(path, winners: dict, device=H100):
    buckets = {tuning.attention_bucket_key("bf16", 128, True, sq, sk, bh): {"winner": w, "timings_us": {w: 1.0}}
               for (sq, sk, bh), w in winners.items()}
    tuning.write(path, {"schema": tuning.SCHEMA, "device": dict(device, capability=[9, 0]),
                        "manifest_sha256": tuning.manifest_sha256(path), "buckets": {}, "attention": buckets})
    relink(path)  # compiled into the host library, which selects (python -m factory link)


def _launched(path, b, h, sq, sk, device=H100, varlen=False):
    bundle = Bundle.open(path, capability=(9, 0), device=device)
    bundle.simulate(rec := Recorder())
    q = torch.empty(b, sq, h, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, sk, h, 128, dtype=torch.bfloat16, device="meta")
    if varlen:
        cu = torch.empty(b + 1, dtype=torch.int32, device="meta")
        bundle.attention(q[0], k[0], k[0], causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=sq)
    else:
        bundle.attention(q, k, k, causal=True)
    return rec.launched[-1]


def test_bundle_attention_follows_the_table(tuned_copy):
    assert _launched(tuned_copy, 2, 16, 4096, 4096) == BIG  # no table: the preferred tile
    _write(tuned_copy, {(4096, 4096, 32): SMALL})
    assert Bundle.open(tuned_copy, capability=(9, 0), device=H100).tuning.attention_winner(
        "attention:bf16:d128:causal:q4096_k4096_bh32") == SMALL
    assert _launched(tuned_copy, 2, 16, 4096, 4096) == SMALL
    assert _launched(tuned_copy, 1, 32, 3000, 2049) == SMALL  # the same bucket (q4096 k4096 bh32)
    assert _launched(tuned_copy, 2, 16, 8192, 8192) == BIG  # a bucket the table lacks: the rule
    assert _launched(tuned_copy, 2, 16, 4096, 4096, device={**H100, "sm_count": 114}) == BIG  # another GPU
    assert _launched(tuned_copy, 2, 16, 4096, 4096, device={**H100, "name": "NVIDIA H200"}) == BIG


def test_a_table_for_another_build_is_ignored(tuned_copy):
    _write(tuned_copy, {(4096, 4096, 32): SMALL})
    m = tuned_copy / "manifest.json"
    m.write_text(m.read_text() + " ")  # another manifest: the table was measured for another build
    relink(tuned_copy)  # ... so linking compiles none of it in
    assert _launched(tuned_copy, 2, 16, 4096, 4096) == BIG


# --- the tuner's grid ------------------------------------------------------------------------------------
def test_tuner_buckets():
    sys.path.insert(0, str(ROOT / "scripts"))
    import tune

    quick = tune.attention_buckets("quick")
    assert len(quick) == 18 and {d for d, *_ in quick} == {64, 128, 256}
    wide = tune.attention_buckets("wide")
    assert all(4.0 * bh * s * s * d / (2 if c else 1) <= tune.ATTN_MAX_FLOP for d, c, s, bh in wide)
    assert (256, False, 16384, 32) in wide and (256, True, 16384, 128) in wide
    assert (256, False, 16384, 128) not in wide  # 35 TFLOP per call: over the cap
    for s, bh in tune.ATTN_GRIDS["wide"]:
        b, hq, hkv, sq = tune.attention_shape(s, bh)
        assert b * hq == bh and hq == hkv and sq == s and hq in (8, 16, 32)
        key = tuning.attention_bucket_key("bf16", 128, True, sq, sq, b * hq)
        assert key.endswith(f"q{s}_k{s}_bh{bh}")
