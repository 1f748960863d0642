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
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

needs_dsl = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)

_WORKER = textwrap.dedent(
    """
    import json, struct, sys
    from factory.build.compile import init_worker, compile_variant
    target, out_dir = sys.argv[1], sys.argv[2]
    init_worker(target)
    from factory.atoms.targets import get_target
    from factory.build import cubin as cb
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
    for v in enumerate_attention(get_target(target), "test"):
        info = compile_variant(v, out_dir)
        path = f"{out_dir}/{v.name}.cubin"
        data = open(path, "rb").read()
        sass = cb.disassemble(path)
        (res,) = info["kernels"].values()
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
        }
    print("REPORT" + json.dumps(report))
    """
)


def _compile(target: str, out_dir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _WORKER, target, str(out_dir)], capture_output=True,
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


# --- no DSL needed below ----------------------------------------------------------------------
def _variant_cls():
    pytest.importorskip("cutlass")  # the family module imports the DSL at import time
    from factory.attention.sm80 import AttentionSm80, enumerate_attention

    return AttentionSm80, enumerate_attention


@needs_dsl
def test_enumeration():
    from factory.atoms.targets import get_target

    _, enum = _variant_cls()
    for t in ("sm_80", "sm_86", "sm_89", "sm_90"):
        test = enum(get_target(t), "test")
        default = enum(get_target(t), "default")
        # 16 problems (dtype, head_dim, causal, varlen) + 8 dense ones with 64-row query tiles
        assert len(test) == 2 and len(default) == 24, t
        assert len({v.name for v in default}) == 24
        assert sum(v.tile_m == 64 and not v.varlen for v in default) == 8
        assert all(v.can_implement() is None for v in default), t
        assert {(v.dtype, v.head_dim, v.causal, v.varlen) for v in default} == {
            (dt, d, c, vl) for dt in ("bf16", "f16") for d in (64, 128)
            for c in (False, True) for vl in (False, True)}
    for t in ("sm_90a", "sm_100a"):
        assert enum(get_target(t), "default") == []


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
    json.dumps(d)


def test_runtime_select_and_checks():
    torch = pytest.importorskip("torch")
    from factory.runtime.attention import attention, select

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
    with pytest.raises(ValueError, match="no attention kernel"):
        select(cands, dtype="f16", head_dim=64, causal=False, varlen=False)

    class NoBundle:
        def candidates(self, op):
            raise AssertionError("must fail before selecting")

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
        (dict(q=q, k=kv, v=kv), "CUDA"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            attention(NoBundle(), **kw)
    with pytest.raises(ValueError, match="softmax_scale"):
        attention(NoBundle(), q, kv, kv, softmax_scale=-1.0)
