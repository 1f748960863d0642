"""Proof labels come from run records (factory/evidence.py, docs/proof.md): the build labels a
variant ``executed`` only when a record shows its very cubin (sha256) ran and passed, a portability
build only when its sm_90 twin is executed; ``verify`` checks the labels against the records the
bundle carries.  CPU only: the records here are written by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, needs_dsl

from factory.evidence import FORMAT, RunRecord, load_records, passed_cubins, proof_label, read_record, twin_name

SM90 = "gemm_sm90_bf16_obf16_ak_bk_t128x128x32_w2x2"
SM80 = "gemm_sm80_bf16_obf16_ak_bk_t128x128x32_w2x2"
SM90A = "gemm_sm90a_bf16_obf16_ak_bk_t128x128x64_c1x1_coop_rm_sw1_sk1"
FILTER = "gemm_sm*_bf16_obf16_ak_bk_t128x128x*[0-9]"  # the plain tiles (fused-epilogue names end in a field)


def _record(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "date": "2026-01-01T00:00:00Z", "device": "test", "capability": [9, 0],
                                "driver": None, "torch": None, "cuda": None, "commit": None, "source": "by hand",
                                "variants": [{"name": n, "cubin_sha256": s, "checks": 1, "max_rel_err": 1e-3,
                                              "tol": 1e-2, "pass": ok} for n, s, ok in rows]}))


def test_labels_from_the_evidence():
    sha, other = "a" * 64, "b" * 64
    passed = {sha: "r.json"}
    assert proof_label("executed", sha, passed) == "executed"
    assert proof_label("executed", other, passed) == "compiled"  # another cubin's record proves nothing
    assert proof_label("executed", sha, {}) == "compiled"  # no record: not executed
    assert proof_label("sass-only", sha, passed) == "sass-only"
    assert proof_label("portability-build", other, passed, "executed") == "portability-build"
    assert proof_label("portability-build", other, passed, "compiled") == "compiled"
    assert proof_label("portability-build", other, passed, None) == "compiled"
    assert twin_name(SM80, "gemm", "sm_80") == SM90
    assert twin_name("attention_sm86_x", "attention", "sm_86") == "attention_sm90_x"
    assert twin_name("attention_kvcache_sm80_x", "attention_kvcache", "sm_80") == "attention_kvcache_sm90_x"
    assert twin_name("gemm_sm90_x", "gemm", "sm_80") is None


def test_a_failure_outweighs_passes(tmp_path):
    sha = "c" * 64
    _record(tmp_path / "1.json", [("v", sha, True)])
    _record(tmp_path / "2.json", [("v", sha, False)])
    assert passed_cubins(load_records(tmp_path)) == {}
    assert load_records(tmp_path / "absent") == {}
    (tmp_path / "3.json").write_text(json.dumps({"format": FORMAT, "variants": [{"name": "v", "cubin_sha256": "x"}]}))
    with pytest.raises(ValueError, match="bad variant row"):
        read_record(tmp_path / "3.json")


def test_run_record_rows(tmp_path):
    """RunRecord (what the GPU tests and smoke.py write) checks the cubin file against the
    manifest, keeps the worst error and fails a variant on any failed check."""
    class B:
        path = tmp_path
        manifest = {"versions": {}, "variants": {}}

    (tmp_path / "x.cubin").write_bytes(b"cubin")
    from factory.runtime.manifest import sha256_file

    B.manifest["variants"]["x"] = {"files": {"cubin": {"path": "x.cubin", "sha256": sha256_file(tmp_path / "x.cubin"),
                                                       "bytes": 5}}}
    rec = RunRecord("test")
    rec.add(B, "x", [{"rel_err": 1e-3, "tol": 1e-2, "ok": True}, {"rel_err": 2e-3, "tol": 1e-2, "ok": True}])
    assert rec.rows["x"]["pass"] and rec.rows["x"]["max_rel_err"] == 2e-3 and rec.rows["x"]["checks"] == 2
    rec.add(B, "x", [{"rel_err": float("inf"), "tol": 1e-2, "ok": False}])
    assert not rec.rows["x"]["pass"]
    (tmp_path / "x.cubin").write_bytes(b"other")
    with pytest.raises(ValueError, match="does not match the manifest"):
        RunRecord("test").add(B, "x", [{"rel_err": 0.0, "tol": 1e-2, "ok": True}])


@needs_dsl
def test_the_shared_test_bundle_claims_no_run(test_bundle):
    """Built with no run record: nothing is executed, nothing a portability build."""
    m = json.loads((test_bundle / "manifest.json").read_text())
    labels = {v["proof"] for v in m["variants"].values()}
    assert labels <= {"compiled", "sass-only"} and "compiled" in labels
    assert m["evidence"] == []


@needs_dsl
def test_build_and_verify_read_the_run_records(test_bundle, tmp_path):
    from factory.compiler.builder import build
    from factory.verify import proof_problems

    shas = {n: v["files"]["cubin"]["sha256"]
            for n, v in json.loads((test_bundle / "manifest.json").read_text())["variants"].items()}
    runs = tmp_path / "runs"
    # sm_90: this cubin passed.  sm_90a: a record of the same name but another cubin.
    _record(runs / "2026-01-01-test.json", [(SM90, shas[SM90], True), (SM90A, "d" * 64, True)])
    out = tmp_path / "b"
    build(out, ["sm_80", "sm_90", "sm_90a"], ["gemm"], tier="test", name_filter=FILTER, jobs=1, evidence=runs)
    m = json.loads((out / "manifest.json").read_text())
    v = m["variants"]
    assert set(v) == {SM80, SM90, SM90A}
    assert v[SM90]["proof"] == "executed" and v[SM90]["evidence"] == "evidence/2026-01-01-test.json"
    assert v[SM90A]["proof"] == "compiled"  # the sha256 differs
    assert v[SM80]["proof"] == "portability-build" and v[SM80]["portability_twin"] == SM90
    assert [e["path"] for e in m["evidence"]] == ["evidence/2026-01-01-test.json"]
    assert (out / "evidence" / "2026-01-01-test.json").read_bytes() == (runs / "2026-01-01-test.json").read_bytes()
    assert proof_problems(out, m) == []
    r = subprocess.run([sys.executable, "-m", "factory", "verify", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

    # A label the bundle's records do not back, an altered record: verify says so.
    bad = json.loads(json.dumps(m))
    bad["variants"][SM90A]["proof"] = "executed"
    assert proof_problems(out, bad) == [f"{SM90A}: labelled executed, but no run record in the bundle shows its cubin passed"]
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _record(bad / "evidence" / "2026-01-01-test.json", [(SM90, shas[SM90], True), (SM90A, shas[SM90A], True)])
    probs = proof_problems(bad, m)
    assert any("run record evidence/2026-01-01-test.json" in p and "altered" in p for p in probs)
    assert any(p.startswith(f"{SM90}: labelled executed") for p in probs)

    # The record of a failed run: nothing is executed.
    _record(runs / "2026-01-02-test.json", [(SM90, shas[SM90], False)])
    build(out, ["sm_80", "sm_90"], ["gemm"], tier="test", name_filter=FILTER, jobs=1, evidence=runs)
    v = json.loads((out / "manifest.json").read_text())["variants"]
    assert v[SM90]["proof"] == "compiled" and v[SM80]["proof"] == "compiled"


class _FakeAttention:
    """Stands in for ``Bundle.launch`` on the CPU: writes the float32 reference (then spoils it
    as told), so the checks the GPU run records can be shown to pass and to fail."""

    def __init__(self, entry, spoil=None):
        self.entry, self.spoil = entry, spoil

    def launch(self, name, args):
        from factory.testing import attention_reference

        e = self.entry
        a = dict(zip([x["name"] for x in e["signature"]["args"]], args))
        scale = a["softmax_scale"]
        if e["varlen"]:
            cq, ck = a["cu_seqlens_q"].tolist(), a["cu_seqlens_k"].tolist()
            for i in range(len(cq) - 1):
                ro, rl = attention_reference(a["q"][None, cq[i]:cq[i + 1]], a["k"][None, ck[i]:ck[i + 1]],
                                             a["v"][None, ck[i]:ck[i + 1]], e["causal"], scale)
                a["o"][cq[i]:cq[i + 1]] = ro[0].to(a["o"].dtype)
                a["lse"][:, cq[i]:cq[i + 1]] = rl[0]
        else:
            ro, rl = attention_reference(a["q"], a["k"], a["v"], e["causal"], scale)
            a["o"].copy_(ro)
            a["lse"].copy_(rl)
        if self.spoil == "nan":
            a["o"].view(-1)[5] = float("nan")
        elif self.spoil == "scale":
            a["o"].mul_(1.05)
        elif self.spoil == "lse":
            a["lse"].add_(0.1)


@pytest.mark.parametrize("name", ["attention_sm90a_bf16_d64_m192_n128_s2_causal_ov_pp_ps_kf_sd",
                                  "attention_sm90_bf16_d64_m128_n128_w8_s2_causal_varlen",
                                  "attention_sm90_bf16_d64_q16_n64_w4_s4_causal_kv1"])
def test_the_recorded_checks_can_fail(name):
    """factory.testing.check_variant's attention checks (what the GPU run records) pass the float32
    reference itself and fail a NaN, a 5 % error or a wrong lse."""
    torch = pytest.importorskip("torch")
    from factory import testing
    from factory.registry import enumerate_variants

    v = next(v for v in enumerate_variants(["sm_90", "sm_90a"], ["attention"], tier="default") if v.name == name)
    e = {"name": v.name, "op": v.op, "family": v.family, **v.describe(), "signature": v.signature().to_json()}
    kind, cases = testing.attention_cases(e)
    fn = testing.check_attention_varlen if kind == "varlen" else testing.check_attention_dense
    gen = torch.Generator().manual_seed(0)
    case = cases[1]
    assert fn(_FakeAttention(e), e, case, gen, "cpu")["ok"]
    for spoil in ("nan", "scale", "lse"):
        assert not fn(_FakeAttention(e, spoil), e, case, gen, "cpu")["ok"], spoil


def test_a_written_record_reads_back(tmp_path, monkeypatch):
    """RunRecord.write: one file per run (<date>-<device>.json in a directory), read back by the build."""
    import factory.evidence as ev
    from factory.runtime.manifest import sha256_file

    monkeypatch.setattr(ev, "device_info", lambda: {"device": "NVIDIA H100 80GB HBM3", "capability": [9, 0],
                                                   "sms": 132, "driver": "x", "torch": "y", "cuda": "z", "commit": "c"})
    (tmp_path / "x.cubin").write_bytes(b"cubin")

    class B:
        path = tmp_path
        manifest = {"versions": {"nvidia-cutlass-dsl": "v"}, "variants": {"x": {"files": {"cubin": {
            "path": "x.cubin", "sha256": sha256_file(tmp_path / "x.cubin"), "bytes": 5}}}}}

    rec = RunRecord("test")
    rec.add(B, "x", [{"rel_err": 1.234567e-3, "tol": 1e-2, "ok": True}])
    runs = tmp_path / "runs"
    runs.mkdir()
    path = rec.write(runs, B)
    assert path.parent == runs and path.name.endswith("-h100-80gb-hbm3.json")
    r = read_record(path)
    assert r["device"] == "NVIDIA H100 80GB HBM3" and r["variants"][0]["max_rel_err"] == 0.00123
    assert passed_cubins(load_records(runs)) == {sha256_file(tmp_path / "x.cubin"): path.name}
