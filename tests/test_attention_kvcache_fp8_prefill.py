"""Chunked prefill over a paged e4m3 cache with fp8 WGMMAs (factory/attention/sm90_kvcache_fp8.py),
without a GPU: enumeration (default and full tiers, sm_90a only), the signature (the kvcache contract with e4m3
q, bf16 o and q_descale), manifest fields, refusals, the transposed V slot's key order replayed
against fp8_order, and one compile (in a subprocess) checked in the SASS: QGMMA, K/V page boxes
by 4D TMA, the transposing warps' ldmatrix.trans/stmatrix, no local memory."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed")


def _variants(target, tier):
    from factory.attention.sm90_kvcache_fp8 import enumerate_attention_kvcache_fp8
    from factory.atoms.targets import get_target

    return enumerate_attention_kvcache_fp8(get_target(target), tier)


def test_enumeration_and_refusals():
    full = _variants("sm_90a", "full")
    assert full and all(v.dtype == "e4m3" and v.kv_dtype == "e4m3" for v in full)
    assert {(v.varlen, v.causal) for v in full if v.page_box == 64} == {(vl, c) for vl in (False, True)
                                                                         for c in (False, True)}
    assert {(v.varlen, v.page_box) for v in full if v.page_box < 64} == {(vl, pb) for vl in (False, True)
                                                                         for pb in (16, 32)}
    assert len({v.name for v in full}) == len(full)
    assert not _variants("sm_90a", "test") and not _variants("sm_90", "full")
    default = _variants("sm_90a", "default")
    assert {(v.varlen, v.page_box) for v in default} == {(False, 16), (True, 16), (True, 64)}
    assert all(v.causal for v in default) and {v.name for v in default} <= {v.name for v in full}
    v = full[0]
    assert v.smem_bytes() <= 227 * 1024
    for change, why in (({"page_box": 128}, "page_box"), ({"page_box": 0}, "page_box"), ({"kv_dtype": "bf16"}, "e4m3"),
                        ({"local": True}, "switches"), ({"head_dim": 64}, "head_dim"), ({"tile_n": 96}, "64"),
                        ({"persistent": True}, "persistent"), ({"stages": 4}, "smem")):
        assert why in (dataclasses.replace(v, **change).can_implement() or ""), change


def test_signature_and_manifest():
    from factory.attention import contract

    for v in _variants("sm_90a", "full"):
        sig = v.signature()
        base = contract.signature_kvcache("e4m3", "e4m3", 128, True, None, varlen_q=v.varlen)
        names = [a.name for a in sig.args]
        assert names == [a.name for a in base.args[:names.index("q_descale")]] + \
            ["q_descale"] + [a.name for a in base.args[names.index("q_descale"):]]
        args = {a.name: a for a in sig.args}
        assert args["q"].dtype == "e4m3" and args["o"].dtype == "bf16" and args["q_descale"].shape == ("B", "Hkv")
        assert all(sig.divisor(s) == 8 for s in args["o"].stride if isinstance(s, str))
        d = v.describe()
        assert d["dtypes"]["o"] == "bf16" and d["kv_loads"] == "tma"
        assert d["page_sizes"] == [p for p in (16, 32, 64, 128, 256) if p >= v.page_box]
        assert d["registers_per_role"] == {"producer": 40, "consumer": 232}


def test_transposed_key_order():
    from factory.attention.fp8_order import transposed_key as group_key
    from factory.attention.sm90_kvcache_fp8 import transposed_key

    assert [transposed_key(c) for c in range(192)] == [16 * (c // 16) + group_key(c % 16) for c in range(192)]


_WORKER = textwrap.dedent(
    """
    import json, re, sys
    from factory.compiler.compile import init_worker
    out_dir, name = sys.argv[1], sys.argv[2]
    init_worker("sm_90a")
    from factory.compiler.builder import compile_cached
    from factory.compiler import cubin as cb
    from factory.attention.sm90_kvcache_fp8 import enumerate_attention_kvcache_fp8
    from factory.atoms.targets import get_target
    v = next(v for v in enumerate_attention_kvcache_fp8(get_target("sm_90a"), "full") if v.name == name)
    info = compile_cached(v, out_dir)
    sass = cb.disassemble(f"{out_dir}/{v.name}.cubin")
    print("REPORT" + json.dumps({"hist": cb.opcode_histogram(sass),
                                 "missing": [r for r in v.sass_requirements() if not re.search(r, sass)],
                                 "params": [p for _, p in info["header"]["params"]],
                                 "args": [a.name for a in v.signature().args]}))
    """
)


def test_compile_dense_q_causal(tmp_path):
    name = "attention_kvcache_sm90a_e4m3_d128_m128_n128_s2_causal_ov_pp_ce4m3_pb64"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _WORKER, str(tmp_path), name], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    r = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))[len("REPORT"):])
    h = r["hist"]
    assert not r["missing"], r["missing"]
    assert not any(op.startswith(("LDL", "STL")) for op in h), "local memory"
    assert h.get("UTMALDG.4D", 0) >= 3 and not any(op.startswith("LDGSTS") for op in h)
    assert r["params"] == ["module", *r["args"], "stream"]


# --- the runtime: e4m3 q with q_descale through bundle.attention_kvcache (checks and choice) ------
class _Stub:
    """What kvcache.choose reads of a bundle: the candidates (the full tier's sm_90a kvcache builds)."""

    def __init__(self):
        from factory.registry import enumerate_variants

        self.entries = [{"name": v.name, "op": v.op, "family": v.family, **v.describe()}
                        for v in enumerate_variants(["sm_90a"], ["attention_kvcache"], tier="full")]

    def candidates(self, op):
        return [e for e in self.entries if e["op"] == op]

    def device_name(self):
        return "H100"

    def describe_contents(self, op):
        return f"{len(self.candidates(op))} variants"


@pytest.fixture(scope="module")
def stub():
    return _Stub()


def _args(page=64, q_dtype=None, kv_dtype=None, b=2, hq=8, hkv=2, sq=40, pages=6):
    import torch

    f8 = torch.float8_e4m3fn
    q = torch.zeros(b, sq, hq, 128, dtype=q_dtype or f8)
    kc = torch.zeros(b * pages, page, hkv, 128, dtype=kv_dtype or f8)
    return q, kc, kc.clone(), torch.zeros(b, dtype=torch.int32), torch.zeros(b, pages, dtype=torch.int32)


def test_runtime_fp8_q_checks_and_choice(stub):
    import torch

    from factory.runtime import kvcache
    from factory.runtime.errors import InputError, NoVariantError

    def run(*a, q_descale=None, out=None, cu=None, mq=None):
        p, _ = kvcache.check(*a, True, None, (-1, -1), 0.0, None, None, None, out, cu, mq, data=False,
                             q_descale=q_descale)
        return p, kvcache.choose(stub, p)["name"]

    for page, box in ((16, "pb16"), (32, "pb32"), (64, "pb64"), (256, "pb64")):
        for qd in (None, torch.ones(1), torch.ones(2), torch.ones(2, 2)):
            p, name = run(*_args(page), q_descale=qd)
            assert p.dtype == "e4m3" and name.startswith("attention_kvcache_sm90a_e4m3_d128_m128_n128_s2_causal")
            assert name.endswith(box), (page, name)
    q, kc, vc, sl, bt = _args(64)
    _, name = run(q.view(-1, 8, 128), kc, vc, sl, bt, cu=torch.tensor([0, 40, 80], dtype=torch.int32), mq=40)
    assert "_varlen_" in name and name.endswith("pb64")
    with pytest.raises(NoVariantError, match="page size"):
        run(*_args(8))
    with pytest.raises(InputError, match="needs a float8_e4m3fn cache"):
        run(*_args(64, kv_dtype=torch.bfloat16))
    with pytest.raises(InputError, match="q_descale applies"):
        run(*_args(64, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16), q_descale=torch.ones(1))
    for qd in (torch.ones(3), torch.ones(2, 2, dtype=torch.float16), torch.ones(1, 2, 2)):
        with pytest.raises(InputError, match="q_descale must be"):
            run(*_args(64), q_descale=qd)
    with pytest.raises(InputError, match="bfloat16"):
        run(*_args(64), out=torch.zeros(2, 40, 8, 128, dtype=torch.float16))
    p = kvcache.plan(stub, batch=2, seqlen_q=40, heads_q=8, heads_kv=2, head_dim=128, max_pages=6, page_size=16,
                     dtype=torch.float8_e4m3fn, kv_dtype=torch.float8_e4m3fn)
    assert p.variant.endswith("pb16") and "_e4m3_" in p.variant
