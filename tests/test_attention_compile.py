"""Compile-only checks of the Ampere/Ada FlashAttention-forward family (no GPU needed).

The "test" tier is compiled for sm_80 and for sm_90 (the portability build that runs on an H100);
each cubin must show mma.sync (HMMA.16816.F32[.BF16]), cp.async (LDGSTS 128-bit), ldmatrix
(plain for Q/K, transposed for V), MUFU.EX2 for the softmax, no local-memory spills, and the
header must take the arguments in the signature's order.  The DSL work runs in one subprocess:
the compile worker must set the target before ``cutlass`` is first imported (AOT notes, trap 3).

The rest (enumeration, signature, can_implement, the runtime's selection and argument checks)
needs neither the DSL nor a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import selection_lib as sl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

needs_dsl = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)

_WORKER = textwrap.dedent(
    """
    import json, struct, sys
    from factory.compiler.compile import init_worker
    target, out_dir = sys.argv[1], sys.argv[2]
    init_worker(target)
    from factory.compiler.builder import compile_cached  # the build's cache: compiled once
    from factory.atoms.targets import get_target
    from factory.compiler import cubin as cb
    from factory.attention.sm80 import enumerate_attention

    def regcount(data):
        # sm_90 cubins keep EIATTR_REGCOUNT in the global .nv.info section, keyed by symbol.
        best = 0
        for sname, (_t, off, size, _i) in cb._sections(data).items():
            if sname.startswith(".nv.info"):
                for v in cb._nv_info(data, off, size).get(0x2F, []):
                    if len(v) >= 8:
                        best = max(best, struct.unpack_from("<I", v, 4)[0])
        return best

    report = {}
    variants = enumerate_attention(get_target(target), "test")
    if len(sys.argv) > 3:  # "split": one split-KV and one packed-GQA decode variant instead
        variants = [v for v in enumerate_attention(get_target(target), "default")
                    if v.name.endswith(("_d128_m64_n128_w4_s2_causal_kv4", "bf16_d64_m64_n128_w4_s2_decode_kv16"))
                    and v.dtype == "bf16"]
    for v in variants:
        info = compile_cached(v, out_dir)
        path = f"{out_dir}/{v.name}.cubin"
        data = open(path, "rb").read()
        sass = cb.disassemble(path)
        res = max(info["kernels"].values(), key=lambda r: r["registers"])  # the main kernel
        report[v.name] = {
            "config": v.config(),
            "resources": res,
            "registers": res["registers"] or regcount(data),
            "hist": cb.opcode_histogram(sass),
            "missing_sass": [r for r in v.sass_requirements() if not __import__("re").search(r, sass)],
            "sass_target": cb.sass_target(sass),
            "params": [p for _, p in info["header"]["params"]],
            "arg_names": [a.name for a in v.signature().args],
            "compile_seconds": info["compile_seconds"],
            "n_kernels": len(info["kernels"]),
        }
    print("REPORT" + json.dumps(report))
    """
)


def _compile(target: str, out_dir: Path, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _WORKER, target, str(out_dir), *extra], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


@pytest.fixture(scope="module", params=["sm_80", "sm_90"])
def compiled(request, tmp_path_factory):
    return request.param, _compile(request.param, tmp_path_factory.mktemp(request.param))


@needs_dsl
def test_test_tier_sass(compiled):
    target, report = compiled
    assert len(report) == 2
    for name, r in report.items():
        cfg, hist = r["config"], r["hist"]
        assert r["sass_target"] == target, name
        assert not r["missing_sass"], (name, r["missing_sass"])
        hmma = "HMMA.16816.F32.BF16" if cfg["dtype"] == "bf16" else "HMMA.16816.F32"
        # Per warp and key tile: S = Q·Kᵀ is (tile_n/8)·(D/16) m16n8k16, P·V is (D/8)·(tile_n/16).
        assert hist.get(hmma, 0) == cfg["tile_n"] * cfg["head_dim"] // 64, (name, hist)
        assert hist.get("LDGSTS.E.BYPASS.LTC128B.128", 0) > 0, name
        assert hist.get("LDSM.16.M88.4", 0) > 0 and hist.get("LDSM.16.MT88.4", 0) > 0, name
        assert hist.get("MUFU.EX2", 0) >= cfg["tile_n"] // 4, name  # one per score element
        assert hist.get("STG.E.128", 0) > 0, name  # O in 16-byte stores
        assert not any(op.startswith(("LDL", "STL")) for op in hist), (name, "local memory")
        assert r["resources"]["stack_frame_bytes"] == 0, name
        assert 0 < r["registers"] <= 255, name
        assert r["params"] == ["module", *r["arg_names"], "stream"], name


@needs_dsl
def test_split_kv_sass(tmp_path):
    """The split-KV and packed-GQA decode variants (sm_90 build): two kernels in one module (the
    split attention kernel and the combine), the same mainloop SASS as the plain kernel, fp32
    partial-O stores, no spills, and the workspace arguments after lse in the header."""
    report = _compile("sm_90", tmp_path, "split")
    assert len(report) == 2, sorted(report)
    for name, r in report.items():
        cfg, hist = r["config"], r["hist"]
        assert r["n_kernels"] == 2, name
        assert not r["missing_sass"], (name, r["missing_sass"])
        assert hist.get("HMMA.16816.F32.BF16", 0) == cfg["tile_n"] * cfg["head_dim"] // 64, (name, hist)
        assert hist.get("STG.E", 0) >= 64 * cfg["head_dim"] // 128, name  # fp32 partial O, 4 B each
        assert hist.get("STG.E.U16", 0) == cfg["head_dim"] // 32, name  # combine: o, one per lane
        assert not any(op.startswith(("LDL", "STL")) for op in hist), (name, "local memory")
        assert r["resources"]["stack_frame_bytes"] == 0, name
        assert r["params"] == ["module", "q", "k", "v", "o", "lse", "o_partial", "lse_partial",
                               "softmax_scale", "stream"], name


# --- no DSL needed below ----------------------------------------------------------------------
def _variant_cls():
    pytest.importorskip("cutlass")  # the family module imports the DSL at import time
    from factory.attention.sm80 import AttentionSm80, enumerate_attention

    return AttentionSm80, enumerate_attention


@needs_dsl
def test_enumeration():
    from factory.atoms.targets import get_target

    _, enum = _variant_cls()
    for t in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120a"):
        test = enum(get_target(t), "test")
        default = enum(get_target(t), "default")
        plain = [v for v in default if v.splits == 1]
        split = [v for v in default if v.splits > 1]
        # 16 problems (dtype, head_dim, causal, varlen) + 8 dense ones with 64-row query tiles,
        # + split-KV: 8 dense problems x 2 split counts, and 4 non-causal packed-GQA x 3
        assert len(test) == 2 and len(plain) == 24 and len(split) == 28, t
        assert len({v.name for v in default}) == 52
        assert sum(v.tile_m == 64 and not v.varlen for v in plain) == 8
        assert all(v.can_implement() is None for v in default), t
        assert all(v.tile_m == 64 and not v.varlen and v.splits in (2, 4, 16) for v in split), t
        assert {v.splits for v in split if v.pack_gqa} == {2, 4, 16}
        assert sum(v.pack_gqa for v in split) == 12 and not any(v.causal for v in split if v.pack_gqa)
        assert {(v.dtype, v.head_dim, v.causal, v.splits) for v in split if not v.pack_gqa} == {
            (dt, d, c, s) for dt in ("bf16", "f16") for d in (64, 128) for c in (False, True)
            for s in (4, 16)}
        assert not any(v.splits > 1 for v in test) and not any(v.splits > 1 for v in enum(get_target(t), "full")
                                                               if v not in default), t
        assert {(v.dtype, v.head_dim, v.causal, v.varlen) for v in default} == {
            (dt, d, c, vl) for dt in ("bf16", "f16") for d in (64, 128)
            for c in (False, True) for vl in (False, True)}
    for t in ("sm_90a", "sm_100a"):
        assert enum(get_target(t), "default") == []


def _old_name(t, dt, d, tm, tn, w, s, causal, varlen):
    """The names variants had before split-KV existed, spelled out independently of the code."""
    return (f"attention_{t.replace('_', '')}_{dt}_d{d}_m{tm}_n{tn}_w{w}_s{s}"
            + ("_causal" if causal else "") + ("_varlen" if varlen else ""))


@needs_dsl
def test_existing_names_unchanged():
    """Adding split-KV must not rename (or drop) any existing variant: bundles, caches and the
    tuning tables key on names."""
    from factory.atoms.targets import get_target

    _, enum = _variant_cls()
    for t in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120a"):
        big = 128 if get_target(t).smem_per_cta >= 128 * 1024 else 64
        want = set()
        for dt in ("bf16", "f16"):
            for d in (64, 128):
                tn = 128 if d == 64 else big
                for c in (False, True):
                    for vl in (False, True):
                        want.add(_old_name(t, dt, d, 128, tn, 8, 2, c, vl))
                        if not vl:
                            want.add(_old_name(t, dt, d, 64, tn, 4, 2, c, vl))
        got = {v.name for v in enum(get_target(t), "default") if v.splits == 1}
        assert got == want, (t, sorted(got ^ want))
    assert {v.name for v in enum(get_target("sm_80"), "test")} == {
        "attention_sm80_bf16_d64_m128_n128_w8_s2", "attention_sm80_f16_d128_m128_n128_w8_s2_causal_varlen"}


@needs_dsl
def test_names_signature_and_limits():
    V, _ = _variant_cls()
    v = V(target="sm_80", dtype="bf16", head_dim=128, tile_n=64, causal=True, varlen=True)
    assert v.name == "attention_sm80_bf16_d128_m128_n64_w8_s2_causal_varlen"
    sig = v.signature()
    assert [a.name for a in sig.args] == ["q", "k", "v", "o", "lse", "cu_seqlens_q",
                                          "cu_seqlens_k", "softmax_scale", "max_seqlen_q"]
    assert sig.args[0].shape == ("Tq", "Hq", 128) and sig.args[0].stride == ("sQt", "sQh", 1)
    assert sig.divisor("sKt") == 8 and sig.divisor("Tq") == 1
    dense = V(target="sm_80", dtype="f16", head_dim=64, tile_n=128).signature()
    assert [a.name for a in dense.args] == ["q", "k", "v", "o", "lse", "softmax_scale"]
    assert dense.args[4].shape == ("B", "Hq", "Sq") and dense.args[4].dtype == "f32"
    # 3 stages of 128x128 K+V tiles (192 KB) fit nowhere but sm_90; 2 stages fit everywhere.
    big = dict(dtype="bf16", head_dim=128, tile_n=128, stages=3)
    assert V(target="sm_90", **big).can_implement() is None
    assert "shared memory" in V(target="sm_80", **big).can_implement()
    assert "shared memory" in V(target="sm_86", dtype="bf16", head_dim=128, tile_n=128,
                                stages=2).can_implement()  # 128 KB > 99 KB
    assert V(target="sm_90a", dtype="bf16").can_implement() is not None
    assert V(target="sm_80", dtype="bf16", head_dim=96).can_implement() is not None
    assert V(target="sm_80", dtype="bf16", tile_m=64).can_implement() is not None  # 16 rows/warp
    d = v.describe()
    assert (d["dtype"], d["head_dim"], d["causal"], d["varlen"]) == ("bf16", 128, True, True)
    assert d["splits"] == 1 and d["pack_gqa"] is False
    json.dumps(d)
    # split-KV: the name gains "_kv<n>" (and "_decode" for packed GQA); two fp32 workspace tensors
    # follow lse in the signature
    sp = V(target="sm_90", dtype="bf16", head_dim=128, tile_m=64, warps=4, tile_n=128, causal=True,
           splits=4)
    assert sp.name == "attention_sm90_bf16_d128_m64_n128_w4_s2_causal_kv4" and sp.can_implement() is None
    assert V(target="sm_90", dtype="f16", head_dim=64, tile_m=64, warps=4, tile_n=128, splits=16,
             pack_gqa=True).name == "attention_sm90_f16_d64_m64_n128_w4_s2_decode_kv16"
    ssig = sp.signature()
    assert [a.name for a in ssig.args] == ["q", "k", "v", "o", "lse", "o_partial", "lse_partial",
                                           "softmax_scale"]
    assert ssig.args[5].shape == (4, "B", "Hq", "Sq", 128) and ssig.args[5].dtype == "f32"
    assert ssig.args[5].stride[-1] == 1 and ssig.args[6].shape == (4, "B", "Hq", "Sq")
    assert ssig.args[:5] == V(target="sm_90", dtype="bf16", head_dim=128, tile_m=64, warps=4,
                              tile_n=128, causal=True).signature().args[:5]
    sd = sp.describe()
    assert sd["splits"] == 4 and not sd["preferred"]
    assert "dense" in V(target="sm_90", dtype="bf16", splits=4, varlen=True).can_implement()
    assert V(target="sm_90", dtype="bf16", splits=64).can_implement() is not None
    assert "pack_gqa" in V(target="sm_90", dtype="bf16", pack_gqa=True).can_implement()  # splits 1
    assert "pack_gqa" in V(target="sm_90", dtype="bf16", pack_gqa=True, splits=4,
                           causal=True).can_implement()


def test_runtime_select_and_checks():
    torch = pytest.importorskip("torch")
    from factory.runtime import InputError, NoVariantError
    from factory.runtime.attention import attention

    def select(cands, dtype, head_dim, causal, varlen, rows=None, sms=132):
        """The host library's choice (tests/selection_lib.py) for a problem of ``rows`` query rows
        (a grid that fills the SMs when None)."""
        b, h, s = (1, 8, rows // 8) if rows else (4, 16, 8192)
        name = sl.Lib(cands, sm_count=sms).attention(b, h, h, s, s, d=head_dim, dtype=dtype, causal=causal,
                                                     varlen=varlen)[0]
        return {"name": name}

    cands = [
        {"name": "a90", "dtype": "bf16", "head_dim": 128, "causal": True, "varlen": False},
        {"name": "a80", "dtype": "bf16", "head_dim": 128, "causal": True, "varlen": False},
        {"name": "b", "dtype": "bf16", "head_dim": 128, "causal": False, "varlen": True},
    ]
    assert select(cands, dtype="bf16", head_dim=128, causal=True, varlen=False)["name"] == "a90"
    pref = [{"name": "alt", "target": "sm_90", "dtype": "f16", "head_dim": 64, "causal": False,
             "varlen": False},
            {"name": "def", "target": "sm_90", "dtype": "f16", "head_dim": 64, "causal": False,
             "varlen": False, "preferred": True},
            {"name": "old", "target": "sm_86", "dtype": "f16", "head_dim": 64, "causal": False,
             "varlen": False, "preferred": True}]
    assert select(pref, dtype="f16", head_dim=64, causal=False, varlen=False)["name"] == "def"
    assert select(pref[:1] + pref[2:], dtype="f16", head_dim=64, causal=False,
                  varlen=False)["name"] == "alt"
    assert select(cands, dtype="bf16", head_dim=128, causal=False, varlen=True)["name"] == "b"
    grid = [{"name": "big", "target": "sm_90", "dtype": "bf16", "head_dim": 64, "causal": False,
             "varlen": False, "preferred": True, "tile": [128, 128], "stages": 2},
            {"name": "small", "target": "sm_90", "dtype": "bf16", "head_dim": 64, "causal": False,
             "varlen": False, "tile": [64, 128], "stages": 2}]
    kw = dict(dtype="bf16", head_dim=64, causal=False, varlen=False, sms=132)
    assert select(grid, rows=1 * 8 * 512, **kw)["name"] == "small"  # 32 CTAs of 128 rows: under-filled
    assert select(grid, rows=4 * 16 * 4096, **kw)["name"] == "big"
    assert select(grid, **kw)["name"] == "big"
    with pytest.raises(NoVariantError, match="no attention kernel"):
        select(cands, dtype="f16", head_dim=64, causal=False, varlen=False)

    class NoBundle:
        """Takes CPU tensors as a simulated bundle does (BundleCore.simulate); selects nothing."""
        lowest_device, simulated = -1, True

        def candidates(self, op):
            raise AssertionError("must fail before selecting")

    class GpuBundle(NoBundle):
        lowest_device, simulated = 0, False

    bf = torch.bfloat16
    q = torch.zeros(1, 8, 4, 128, dtype=bf)
    kv = torch.zeros(1, 8, 2, 128, dtype=bf)
    cases = [
        (dict(q=torch.zeros(1, 8, 4, 96, dtype=bf), k=torch.zeros(1, 8, 4, 96, dtype=bf),
              v=torch.zeros(1, 8, 4, 96, dtype=bf)), "head_dim 96"),
        (dict(q=q.float(), k=kv.float(), v=kv.float()), "not supported"),
        (dict(q=q, k=torch.zeros(1, 8, 3, 128, dtype=bf), v=torch.zeros(1, 8, 3, 128, dtype=bf)),
         "multiple of kv heads"),
        (dict(q=q, k=kv, v=torch.zeros(1, 9, 2, 128, dtype=bf)), "k and v shapes differ"),
        (dict(q=q.transpose(1, 3).contiguous().transpose(1, 3), k=kv, v=kv), "contiguous"),
        (dict(q=torch.zeros(1, 8, 4, 129, dtype=bf)[..., 1:], k=kv, v=kv), "multiples of 8"),
        (dict(q=q[0], k=kv, v=kv), "must be \\(batch"),
    ]
    for kw, msg in cases:
        with pytest.raises(InputError, match=msg):
            attention(NoBundle(), **kw)
    with pytest.raises(InputError, match="q is on cpu: the kernels need CUDA tensors"):
        attention(GpuBundle(), q, kv, kv)
    with pytest.raises(ValueError, match="softmax_scale"):
        attention(NoBundle(), q, kv, kv, softmax_scale=-1.0)


def test_split_kv_selection():
    """Split-KV and packed-GQA choices of the host library (tests/selection_lib.py): split only
    under-filled grids, within two waves, at least two key tiles per split; packed rows for one
    query with GQA."""
    from factory.runtime.attention import split_workspace

    def e(name, causal=False, splits=1, pack=False, tile=(64, 128), target="sm_90", **kw):
        return {"name": name, "target": target, "dtype": "bf16", "head_dim": 128, "causal": causal,
                "varlen": False, "tile": list(tile), "stages": 2, "splits": splits, "pack_gqa": pack, **kw}

    cands = [e("big", tile=(128, 128), preferred=True), e("small"),
             e("bigc", True, tile=(128, 128), preferred=True), e("smallc", True),
             e("s4", splits=4), e("s16", splits=16), e("s4c", True, splits=4), e("s16c", True, splits=16),
             e("p4", splits=4, pack=True), e("p16", splits=16, pack=True),
             e("old", target="sm_86", tile=(128, 128), preferred=True)]
    lib = sl.Lib(cands, sm_count=132)

    def pick(causal, b, hq, hkv, sq, sk, lib=lib):
        return lib.attention(b, hq, hkv, sq, sk, causal=causal)[0]

    # Sq = 1 with GQA: packed rows (B·Hkv row sets), causal or not, at every batch: the fewest
    # splits that fill the SMs, else the most; never the unpacked variant, which re-reads K/V per q head
    assert pick(False, 8, 32, 8, 1, 4096) == "p4"     # 64 CTAs -> 4 splits
    assert pick(True, 8, 32, 8, 1, 4096) == "p4"
    assert pick(True, 1, 32, 8, 1, 16384) == "p16"    # 8 CTAs -> 16 splits: 128, the most
    assert pick(True, 16, 32, 8, 1, 4096) == "p4"     # 128 CTAs -> 4 splits
    assert pick(True, 64, 32, 8, 1, 2048) == "p4"     # 512 CTAs already fill the SMs: still packed
    assert pick(True, 256, 32, 8, 1, 512) == "p4"     # 4 key tiles: one each
    assert pick(True, 1, 32, 8, 1, 300) == "smallc"   # 3 key tiles: no packed count fits
    assert pick(True, 1, 32, 8, 1, 512) == "p4"       # 8 CTAs, 4 key tiles: 16 splits would leave empty ones
    assert pick(True, 33, 32, 8, 1, 4096) == "p4"     # 264 CTAs fill the SMs: the fewest splits
    # no GQA, or Sq > 1: plain split-KV of the right causality
    assert pick(False, 1, 32, 32, 1, 4096) == "s4"
    assert pick(True, 1, 8, 8, 4, 4096) == "s16c"
    assert pick(True, 2, 32, 8, 4, 16384) == "s4c"
    # grids that fill the SMs, short key ranges, prefill: unchanged choices
    assert pick(False, 8, 32, 32, 1, 4096) == "small"  # 256 CTAs
    assert pick(True, 1, 8, 8, 1, 777) == "smallc"     # 7 key tiles
    assert pick(True, 4, 16, 16, 1024, 1024) == "bigc"
    assert pick(False, 1, 8, 8, 512, 512) == "small"  # the 64-row tile rule still applies
    assert pick(False, 4, 16, 16, 8192, 8192) == "big"
    # a bundle built before split-KV (no "splits"/"pack_gqa" fields) selects as before
    old = [{k: v for k, v in c.items() if k not in ("splits", "pack_gqa")} for c in cands[:4]]
    assert pick(True, 8, 32, 8, 1, 4096, lib=sl.Lib(old)) == "smallc"
    # never a split variant for varlen
    vl = [dict(c, varlen=True) for c in cands]
    assert sl.Lib(vl).attention(1, 8, 8, 64, 64, causal=False, varlen=True)[0] == "big"

    torch = pytest.importorskip("torch")
    q = torch.zeros(2, 3, 8, 64, dtype=torch.bfloat16)
    op, lp = split_workspace(torch, q, 4)
    assert op.shape == (4, 2, 8, 3, 64) and lp.shape == (4, 2, 8, 3) and op.dtype == torch.float32
    assert op.is_contiguous() and lp.is_contiguous() and lp.data_ptr() % 16 == 0
    assert lp.data_ptr() == op.data_ptr() + op.numel() * 4  # one allocation


def test_runtime_launch_glue(monkeypatch):
    """bundle.attention's glue on CPU tensors (as a simulated bundle takes them): what reaches
    ``bundle.launch`` for varlen, dense, split-KV and packed decode, first call and hot path.  (The
    H100 run of 2026-11-22 caught a varlen call passing a (name, splits) tuple as the name.)"""
    torch = pytest.importorskip("torch")
    from factory.runtime import attention as rt

    monkeypatch.setattr(rt, "_check_common", lambda *a, **k: None)

    def e(name, causal=False, varlen=False, splits=1, pack=False, tile=(64, 128), **kw):
        return {"name": name, "target": "sm_90", "dtype": "bf16", "head_dim": 64, "causal": causal,
                "varlen": varlen, "tile": list(tile), "stages": 2, "splits": splits, "pack_gqa": pack, **kw}

    class Fake:
        lowest_device, simulated = -1, True  # CPU tensors, as BundleCore.simulate()

        def __init__(self):
            self.calls = []

        def device_info(self):
            return {"name": None, "sm_count": 132}

        def candidates(self, op):
            return [e("big", tile=(128, 128), preferred=True), e("small"), e("vl", varlen=True, preferred=True),
                    e("s4", splits=4), e("s16", splits=16), e("p4", splits=4, pack=True),
                    e("p16", splits=16, pack=True)]

        @property
        def selector(self):  # the host library's selection, of these entries
            return sl.Lib(self.candidates("attention")).sel

        def launch(self, name, args, device=None):
            assert isinstance(name, str), name
            assert device == -1  # the tensors' device is passed on (checked against the current one)
            self.calls.append((name, args))

    b = Fake()
    bf = torch.bfloat16
    q, k = torch.zeros(300, 4, 64, dtype=bf), torch.zeros(300, 2, 64, dtype=bf)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    for _ in range(2):
        b.attention = None
        o = rt.attention(b, q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200)
        name, args = b.calls[-1]
        assert name == "vl" and len(args) == 9 and args[3] is o and args[-1] == 200
    # (the packed variants are non-causal and serve causal seqlen_q == 1 calls too)
    cases = [((8, 1, 32, 64), (8, 4096, 8, 64), True, "p4"), ((1, 1, 32, 64), (1, 16384, 8, 64), False, "p16"),
             ((1, 4, 16, 64), (1, 4096, 16, 64), False, "s16"), ((1, 512, 8, 64), (1, 512, 8, 64), False, "small"),
             ((8, 1, 32, 64), (8, 4096, 32, 64), False, "small"), ((4, 4096, 8, 64), (4, 4096, 8, 64), False, "big")]
    for qs, ks, causal, want in cases:
        for attempt in ("first", "hot path"):
            qq, kk = torch.zeros(qs, dtype=bf), torch.zeros(ks, dtype=bf)
            o, lse = rt.attention(b, qq, kk, kk, causal=causal, return_lse=True)
            name, args = b.calls[-1]
            assert name == want, (qs, ks, attempt, name)
            assert args[3] is o and args[4] is lse and lse.shape == (qs[0], qs[2], qs[1])
            splits = {"p4": 4, "p16": 16, "s16": 16}.get(want, 1)
            if splits > 1:
                assert len(args) == 8 and args[5].shape == (splits, qs[0], qs[2], qs[1], 64)
                assert args[6].shape == (splits, qs[0], qs[2], qs[1]) and args[5].dtype == torch.float32
            else:
                assert len(args) == 6
            assert args[-1] == pytest.approx(64 ** -0.5)
