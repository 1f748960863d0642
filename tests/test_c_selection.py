"""The selection: the host library's fx_gemm_select / fx_attention_select (compiler/csrc/
fx_select.c, the one implementation; the Python loader calls it through runtime/selector.py) on this
GPU-less machine.  Answers asserted by name on the test bundle for several capabilities and SM
counts; a tuning table compiled in changes them (its winners where they fit), only for the device it
names; a perturbed table changes them; refusals say why.  Over hundreds of GEMM and attention
problems, what ``bundle.gemm`` / ``bundle.attention`` launch is what the library answers for the
same problem through the C API (the loader's own checks never disagree with the library's).

The default bundle ($FACTORY_BUNDLE or artifacts/default), when present, is checked too (a copy,
relinked with this tree's C selection)."""

from __future__ import annotations

import collections
import ctypes
import json
import math
import os
import shutil
import zlib
from pathlib import Path

import pytest

import c_selection as cs
from conftest import ROOT, needs_dsl
from factory.compiler.link import link_host_library, relink
from factory.runtime import gemm as rt_gemm
from factory.runtime import tuning
from factory.runtime.errors import NoVariantError

pytestmark = needs_dsl  # relinking needs the toolchain (the DSL's static runtime)

# (capability, SMs): A100, A10/3090, L4 and 4090, H100 SXM and PCIe, one with no target here, B200
# and B300 (the family target's recorded capabilities, Target.ccs, in C as in Python).
DEVICES = [((8, 0), 108), ((8, 6), 84), ((8, 9), 58), ((8, 9), 128), ((9, 0), 132), ((9, 0), 114),
           ((7, 5), 40), ((10, 0), 148), ((10, 3), 148)]
ATTN_DEVICES = DEVICES[:7]  # 7.5: no target, no variant
GEMM_PROBLEMS = cs.gemm_problems(seed=15, n=420)
ATTN_PROBLEMS = cs.attention_problems(seed=15, n_dense=340, n_varlen=120)
TUNED = {"name": "Test GPU (selection in C)", "sm_count": 132}


def _default_bundle() -> Path | None:
    p = Path(os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    return p if (p / "manifest.json").exists() else None


def _relinked_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    relink(dst)
    return dst


@pytest.fixture(scope="module")
def bundles(test_bundle, tmp_path_factory) -> dict[str, Path]:
    """The test bundle (built from this tree), and a relinked copy of the default one if present."""
    out = {"test": test_bundle}
    d = _default_bundle()
    if d is not None:
        out["default"] = _relinked_copy(d, tmp_path_factory.mktemp("default") / "bundle")
    return out


def _mismatches(rows) -> list:
    return [(p, want, got) for p, want, got, *_ in rows if want != got]


def _report(bad) -> str:
    return "\n".join(f"{p}: python {want}, C {got}" for p, want, got in bad[:12])


def test_gemm_launches_what_the_library_selects(bundles):
    for label, path in bundles.items():
        lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
        seen, names = collections.Counter(), set()
        for cc, sms in DEVICES:
            bundle, rows = cs.compare_gemm(path, lib, GEMM_PROBLEMS, cc, sms, None)
            bad = _mismatches(rows)
            assert not bad, f"{label} bundle, {cc} {sms} SMs: {len(bad)} of {len(rows)} differ\n{_report(bad)}"
            for p, want, got, ws, max_clusters in rows:
                seen[want[0]] += 1
                if got[0] != "ok":
                    continue
                names.add(got[1])
                e = bundle.manifest["variants"][got[1]]
                # the workspace and grid cap that the Python launch passes (gemm.gemm, launch_scalars)
                # (runtime/gemm.py and fx_select.c compute the same bytes, either workspace form)
                spec = rt_gemm._workspace_spec(e, p["M"], p["N"], 0, p.get("L", 1))
                assert ws == (4 * math.prod(spec[0][1]) if spec else 0)
                assert max_clusters == (max(1, sms // e["persistent"]["cluster_ctas"]) if e.get("persistent") else 0)
        assert sum(seen.values()) == len(DEVICES) * len(GEMM_PROBLEMS)
        # every kind of answer occurs (the grid reaches each branch), and many different variants
        assert seen["ok"] >= 100 and seen["empty"] and seen["novariant"] and seen["input"], seen
        assert len(names) >= (8 if label == "test" else 40), sorted(names)


def test_attention_launches_what_the_library_selects(bundles, monkeypatch):
    for label, path in bundles.items():
        lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
        seen, names = collections.Counter(), set()
        for cc, sms in ATTN_DEVICES:
            bundle, rows = cs.compare_attention(path, lib, ATTN_PROBLEMS, cc, sms, monkeypatch)
            bad = _mismatches(rows)
            assert not bad, f"{label} bundle, {cc} {sms} SMs: {len(bad)} of {len(rows)} differ\n{_report(bad)}"
            for p, want, got, ws, splits in rows:
                seen[want[0]] += 1
                if got[0] != "ok":
                    continue
                names.add(got[1])
                s = bundle.manifest["variants"][got[1]].get("splits", 1)
                assert splits == s
                # attention.split_workspace's floats (lse is the caller's here); a dynamic variant's
                # two tile counters (16 bytes, zeroed by fx_attention)
                dyn = bundle.manifest["variants"][got[1]].get("workspace", {}).get("form") == "tile_counters"
                assert ws == (4 * s * p["B"] * p["Hq"] * p["Sq"] * (p["D"] + 1) if s > 1 and not p["varlen"]
                              else 16 if dyn else 0)
        assert seen["ok"] >= 100 and seen["empty"] and seen["novariant"] and seen["input"], seen
        assert len(names) >= (6 if label == "test" else 40), sorted(names)


def _decode_attention_problems() -> list[dict]:
    """Decode and short prefill with GQA over batch x context: the split-KV, packed-GQA and
    decode-family rules (Sq 1..16, where the family applies)."""
    out = []
    for b in (1, 2, 4, 13, 16, 64, 256):
        for sk in (1, 100, 128, 200, 512, 1024, 4096, 8192, 16384, 32768):
            for hq, hkv in ((32, 8), (32, 32), (64, 8), (16, 1), (16, 2)):
                for sq, causal in ((1, False), (1, True), (2, True), (4, True), (4, False), (16, True),
                                   (17, True), (128, True)):
                    out.append(dict(varlen=False, dtype="bf16", D=128, causal=causal, B=b, Sq=sq, Sk=sk, Hq=hq,
                                    Hkv=hkv, layout="bshd", scale=None, q_off=0))
    return out


def test_decode_attention_launches_what_the_library_selects(bundles, monkeypatch):
    problems = _decode_attention_problems()
    for label, path in bundles.items():
        lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
        for cc, sms in ((9, 0), 132), ((9, 0), 114), ((8, 9), 58), ((8, 0), 108):
            _, rows = cs.compare_attention(path, lib, problems, cc, sms, monkeypatch)
            bad = _mismatches(rows)
            assert not bad, f"{label}, {cc}: {len(bad)} of {len(rows)} differ\n{_report(bad)}"


# --- tuning.json compiled in --------------------------------------------------------------------------
# (bundle, capability, bucket key) -> (the table's winner, the model's pick, the fitting names); per
# bundle: the test and default bundles' tables pick different winners for the same bucket.
WINNERS: dict = {}


def _fitting_names(bundle, p: dict) -> set[str]:
    """The variants that take GEMM problem ``p`` (the loader's list, runtime/gemm.fitting_variants)."""
    a, b, c = cs.gemm_tensors(p)
    specs = [rt_gemm.rkl_spec(t, w) for t, w in ((a, "a"), (b, "b"), (c, "c"))]
    scales = [(cs.SCALE_A, (1,), (1,)), (cs.SCALE_B, (1,), (1,))] if p["ab"] == "e4m3" else []
    try:
        return {v["name"] for v in rt_gemm.fitting_variants(bundle, *specs, p["ab"], p["c"], scales)[0]}
    except (NoVariantError, ValueError):
        return set()


def _write_tuning(path: Path, problems: list[dict]) -> int:
    """A tuning.json for TUNED whose winners differ from the cost model's picks: per bucket a
    fitting variant other than the model's (chosen by the key's hash), now and then a name the
    bundle lacks or any variant of the bundle; b_constant winners an early_b variant, the plain winner,
    or absent.  Returns the number of buckets."""
    per_cc = {cc: cs.open_simulated(path, cc, TUNED["sm_count"], None) for cc in ((9, 0), (8, 0))}
    names = list(per_cc[(9, 0)].manifest["variants"])
    buckets = {}
    for p in problems:
        if 0 in (p["M"], p["N"], p["K"]) or p["a_off"] or p["b_off"] or p["c_off"]:
            continue
        a, b, c = cs.gemm_tensors(p)
        specs = [rt_gemm.rkl_spec(t, w) for t, w in ((a, "a"), (b, "b"), (c, "c"))]
        scales = [(cs.SCALE_A, (1,), (1,)), (cs.SCALE_B, (1,), (1,))] if p["ab"] == "e4m3" else []
        for bundle in per_cc.values():
            try:
                fits, am, bm = rt_gemm.fitting_variants(bundle, *specs, p["ab"], p["c"], scales)
            except (NoVariantError, ValueError):
                continue
            key = tuning.bucket_key(p["ab"], p["c"], am, bm, p["M"], p["N"], p["K"], p["L"])
            if key in buckets:
                continue
            h = zlib.crc32(key.encode())
            model = rt_gemm.select(bundle, *specs, p["ab"], p["c"], scales)  # (no device name: no table)
            others = [v["name"] for v in fits if v["name"] != model] or [model]
            winner = (others[h % len(others)] if h % 7 else
                      "gemm_not_in_this_bundle" if h % 2 else names[h % len(names)])
            try:
                eb = rt_gemm.fitting_variants(bundle, *specs, p["ab"], p["c"], scales, early_b=True)[0]
            except NoVariantError:
                eb = []
            const = (eb[h % len(eb)]["name"] if eb and h % 3 else winner if h % 3 == 1 else None)
            WINNERS[(str(path), bundle.capability, key)] = (winner, model, {v["name"] for v in fits})
            buckets[key] = {"shape": list(tuning.bucket_shape(p["M"], p["N"], p["K"], p["L"])), "winner": winner,
                            "timings_us": {winner: 1.0}, **({"b_constant": {"winner": const}} if const else {})}
    tuning.write(path, {"schema": tuning.SCHEMA, "created": "test", "device": {**TUNED, "capability": [9, 0]},
                        "manifest_sha256": tuning.manifest_sha256(path), "method": {"test": True},
                        "buckets": buckets})
    return len(buckets)


@pytest.fixture(scope="module")
def tuned_bundles(bundles, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for label, path in bundles.items():
        dst = tmp_path_factory.mktemp(f"tuned-{label}") / "bundle"
        shutil.copytree(path, dst)
        assert _write_tuning(dst, GEMM_PROBLEMS) > 20
        s = relink(dst)
        assert s["tuning"].startswith(TUNED["name"]), s
        out[label] = dst
    return out


def test_tuned_selection_matches_python(tuned_bundles):
    for label, path in tuned_bundles.items():
        lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
        assert TUNED["name"] in lib.lib.fx_selection_info().decode()
        differ = checked = 0
        for cc, sms in (((9, 0), 132), ((8, 0), 132), ((9, 0), 114)):
            tuned_b, tuned = cs.compare_gemm(path, lib, GEMM_PROBLEMS, cc, sms, TUNED["name"])
            assert (tuned_b.tuning is not None) == (sms == TUNED["sm_count"])
            bad = _mismatches(tuned)
            assert not bad, f"{label}, tuned, {cc} {sms}: {len(bad)} differ\n{_report(bad)}"
            # another device name: the same table must not apply, in either language
            _, model = cs.compare_gemm(path, lib, GEMM_PROBLEMS, cc, sms, "Another GPU")
            bad = _mismatches(model)
            assert not bad, f"{label}, untuned, {cc} {sms}: {len(bad)} differ\n{_report(bad)}"
            differ += sum(1 for t, m in zip(tuned, model) if t[1] != m[1])
            if sms != TUNED["sm_count"]:
                continue
            for (p, _, got, *_), (_, _, plain, *_) in zip(tuned, model):  # the table's winner where it fits
                if got[0] != "ok" or p["b_constant"]:
                    continue
                key = tuning.bucket_key(p["ab"], p["c"], *cs.majors(p), p["M"], p["N"], p["K"], p["L"])
                w = WINNERS.get((str(path), cc, key))
                if w is not None:
                    winner = w[0]
                    fits = _fitting_names(tuned_b, p)  # this problem's (a bucket's problems differ)
                    assert got[1] == (winner if winner in fits else plain[1]), (p, got, w[:2])
                    checked += winner in fits
        assert differ >= 10, f"{label}: the tuning table changed only {differ} answers"
        assert checked >= 10, f"{label}: only {checked} answers were a table's winner"


def test_relink_keeps_python_on_the_tuning_table(tuned_bundles):
    """relink re-stamps tuning.json with the new manifest's sha256: the Python loader still uses it."""
    for path in tuned_bundles.values():
        m = json.loads((path / "manifest.json").read_text())
        from factory.runtime.manifest import sha256_file

        assert m["host_library"]["sha256"] == sha256_file(path / m["host_library"]["path"])
        assert tuning.load(path, TUNED)[0] is not None


def test_grids_fixed_at_build_time_launch_what_the_library_selects(test_bundle, tmp_path):
    """Persistent variants of older bundles had their grid fixed at build time (persistent_ctas):
    both selections drop those whose grid would exceed the device's SMs and cap the cost model's
    grid.  The test bundle's manifest, so marked, relinked."""
    path = tmp_path / "bundle"
    shutil.copytree(test_bundle, path)
    m = json.loads((path / "manifest.json").read_text())
    marked = 0
    for e in m["variants"].values():
        if e.get("persistent"):
            e["persistent_ctas"] = 120 if "c2x1" in e["name"] else 64
            marked += 1
    assert marked >= 2
    (path / "manifest.json").write_text(json.dumps(m, indent=1))
    relink(path)
    lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
    for sms in (132, 100, 64, 40):
        _, rows = cs.compare_gemm(path, lib, GEMM_PROBLEMS, (9, 0), sms, None)
        bad = _mismatches(rows)
        assert not bad, f"{sms} SMs: {len(bad)} differ\n{_report(bad)}"


# --- the comparison can fail -----------------------------------------------------------------------
def test_known_answers(test_bundle):
    """Answers of the test bundle asserted by name (the comparison above could pass with both
    sides equally wrong; these could not)."""
    lib = cs.CLib(test_bundle / "lib" / "libfactory_bundle.so")

    def answer(cc, sms, **kw):
        p = dict(ab="bf16", c="bf16", M=4096, N=4096, K=4096, L=1, a_major="k", b_major="k", pad_a=0, pad_b=0,
                 pad_c=0, b_constant=False, a_off=0, b_off=0, c_off=0)
        p.update(kw)
        got, sel = lib.gemm_select(lib.device(cc, sms, None), cs.c_gemm_problem(p, *cs.gemm_tensors(p)))
        return got, sel

    got, sel = answer((9, 0), 132)
    assert got == ("ok", "gemm_sm90a_bf16_obf16_ak_bk_t128x256x64_c2x1_coop_rm_sw1_sk1") and sel.max_clusters == 66
    assert answer((8, 0), 108)[0] == ("ok", "gemm_sm80_bf16_obf16_ak_bk_t128x128x32_w2x2")
    got, sel = answer((8, 6), 84, M=1)  # 32 CTAs < 84 SMs, 128 k-tiles: split-K 4
    assert got == ("ok", "gemm_sm86_bf16_obf16_ak_bk_t64x128x32_w2x2_sk4") and sel.workspace_bytes == 4 * 4 * 4096
    assert answer((8, 9), 58, ab="e4m3", M=256)[0] == ("ok", "gemm_sm89_e4m3_obf16_ak_bk_t128x128x64_w2x2")
    assert answer((9, 0), 132, ab="e4m3", M=16, b_constant=True)[0] == (
        "ok", "gemm_sm90a_e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk2_pdl_eb")
    assert answer((8, 0), 108, ab="e4m3")[0] == ("novariant",)  # no fp8 before sm_89
    assert answer((9, 0), 132, a_off=2)[0] == ("novariant",)  # a misaligned: no variant's contract
    assert answer((9, 0), 132, K=4100)[0] == ("novariant",)  # K % 8
    assert answer((9, 0), 132, a_major="m", pad_a=0)[0] == ("novariant",)  # the test tier is K-major only
    assert answer((9, 0), 132, M=0)[0] == ("empty",)
    # 2 x 10 tiles of 64x128 (a sixth of a wave), 128 k-blocks: split 4 ways over the grid (80
    # units); its workspace: 20 semaphores rounded to 32 words, then 4 partial tiles per tile
    got, sel = answer((9, 0), 132, M=128, N=1280, K=8192)
    assert got == ("ok", "gemm_sm90a_bf16_obf16_ak_bk_t64x128x64_c1x1_ws_rm_sw1_sk1_pdl_skw4")
    assert sel.workspace_bytes == 4 * (32 + 20 * 4 * 64 * 128) and sel.splits == 4
    # a full wave of tiles: no split; too few k-blocks per part (8 each at least): no split
    assert "skw" not in answer((9, 0), 132, M=2048, N=2048 * 4, K=8192)[0][1]
    assert "skw" not in answer((9, 0), 132, M=512, N=2048, K=1024)[0][1]
    # 272 tiles of 128x128 over 132 SMs: two whole rounds, then the last 8 tiles split 16 ways (the
    # tail split); its workspace: 272 semaphores rounded to 288 words, then at most 144 partial tiles
    got, sel = answer((9, 0), 132, M=2048, N=2112, K=7168)
    assert got == ("ok", "gemm_sm90a_bf16_obf16_ak_bk_t128x128x64_c1x1_coop_rm_sw1_sk1_pdl_skw16_tail")
    assert sel.workspace_bytes == 4 * (288 + 144 * 128 * 128) and sel.splits == 16
    assert "tail" not in answer((9, 0), 132, M=1024, N=2048, K=7168)[0][1]  # under one round: no tail split
    assert answer((9, 0), 0)[0] == ("input",)  # no SMs
    assert answer((9, 0), 132, a_major="x")[0] == ("input",)  # no contiguous mode in a


def test_a_perturbed_table_is_caught(test_bundle, tmp_path):
    """The comparison fails when the C tables disagree with the manifest Python reads: a library
    linked from entries with the split-K variants' split count and the sm90a tiles altered."""
    m = json.loads((test_bundle / "manifest.json").read_text())
    entries = m["variants"]
    for e in entries.values():
        if e.get("split_k", 1) > 1 and e["family"] == "sm80":
            e["split_k"] = 64  # no split qualifies any more (K // 32 >= 8 * 64 fails)
        if e["family"] == "sm90" and e["op"] == "gemm" and e["tile"][1] == 256:
            e["tile"] = [64, 64, 64]
    work = tmp_path / "perturbed"
    shutil.copytree(test_bundle, work)
    lib_path = link_host_library(work, entries, out=tmp_path / "perturbed.so")
    lib = cs.CLib(lib_path)
    bad = 0
    for cc, sms in (((8, 0), 108), ((9, 0), 132)):
        _, rows = cs.compare_gemm(test_bundle, lib, GEMM_PROBLEMS, cc, sms, None)
        bad += len(_mismatches(rows))
    assert bad >= 5, f"the perturbed tables changed only {bad} answers"


def test_c_selection_reports_why(test_bundle):
    lib = cs.CLib(test_bundle / "lib" / "libfactory_bundle.so")
    p = dict(ab="bf16", c="bf16", M=64, N=64, K=4100, L=1, a_major="k", b_major="k", pad_a=0, pad_b=0, pad_c=0,
             b_constant=False, a_off=0, b_off=0, c_off=0)
    got, _ = lib.gemm_select(lib.device((9, 0), 132, None), cs.c_gemm_problem(p, *cs.gemm_tensors(p)))
    assert got == ("novariant",)
    msg = lib.message()
    assert "no gemm variant" in msg and "must be a multiple of 8" in msg, msg
    assert lib.lib.fx_error_string(cs.FX_ERR_NO_VARIANT).startswith(b"FX_ERR_NO_VARIANT")
    assert lib.lib.fx_error_string(0) == b"no error"  # cudaError_t codes still read as CUDA's
    n = lib.lib.fx_variant_count()
    assert n == len(json.loads((test_bundle / "manifest.json").read_text())["variants"])
    assert lib.lib.fx_variant_name(n) is None and lib.lib.fx_variant_name(0)


def test_fp8_needs_scales_only_to_launch(test_bundle):
    """fx_gemm_select plans without pointers; fx_gemm refuses fp8 without scale pointers (Python
    substitutes 1.0 tensors; C has no device memory of its own) before touching CUDA."""
    lib = cs.CLib(test_bundle / "lib" / "libfactory_bundle.so")
    p = dict(ab="e4m3", c="bf16", M=256, N=4096, K=4096, L=1, a_major="k", b_major="k", pad_a=0, pad_b=0, pad_c=0,
             b_constant=False, a_off=0, b_off=0, c_off=0)
    prob = cs.c_gemm_problem(p, *cs.gemm_tensors(p))
    prob.a, prob.b, prob.c = 1 << 32, 2 << 32, 3 << 32  # (disjoint: an output must not alias an input)
    prob.scale_a = prob.scale_b = None
    dev = lib.device((9, 0), 132, None)
    assert lib.gemm_select(dev, prob)[0][0] == "ok"
    sel = cs.Selection()
    rc = lib.lib.fx_gemm(ctypes.byref(dev), ctypes.byref(prob), None, ctypes.c_uint64(0), None, ctypes.byref(sel))
    assert rc == cs.FX_ERR_INPUT and "scale" in lib.message()


# --- attention buckets in tuning.json ------------------------------------------------------------------
def _write_attention_tuning(path: Path, problems: list[dict]) -> int:
    """A tuning.json for TUNED with ``attention`` buckets for the dense problems: per bucket (by the
    key's hash) a variant of the problem's dtype / head_dim / causal other than the rule's pick, a
    split-KV variant (never taken), a varlen or other-dtype variant (not among the fitting ones), or
    a name the bundle lacks.  Returns the number of buckets."""
    bundle = cs.open_simulated(path, (9, 0), TUNED["sm_count"], None)
    entries = bundle.candidates("attention")
    names = [e["name"] for e in entries]
    buckets = {}
    for p in problems:
        if p["varlen"] or 0 in (p["B"], p["Sq"], p["Sk"], p["Hq"]):
            continue
        key = tuning.attention_bucket_key(p["dtype"], p["D"], p["causal"], p["Sq"], p["Sk"], p["B"] * p["Hq"])
        if key in buckets:
            continue
        h = zlib.crc32(key.encode())
        same = [e["name"] for e in entries if e["dtype"] == p["dtype"] and e["head_dim"] == p["D"]
                and bool(e["causal"]) == p["causal"] and not e["varlen"]]
        split = [e["name"] for e in entries if e.get("splits", 1) > 1]
        pool = [same[h % len(same)]] * 4 if same else []
        pool += [split[h % len(split)]] if split else []
        pool += [names[h % len(names)], "attention_not_in_this_bundle"]
        buckets[key] = {"shape": [p["B"], p["Hq"], p["Hkv"], p["Sq"], p["Sk"], p["D"]],
                        "winner": pool[h % len(pool)], "timings_us": {}}
    tuning.write(path, {"schema": tuning.SCHEMA, "created": "test", "device": {**TUNED, "capability": [9, 0]},
                        "manifest_sha256": tuning.manifest_sha256(path), "method": {"test": True},
                        "buckets": {}, "attention": buckets})
    return len(buckets)


def test_tuned_attention_selection_matches_python(bundles, tmp_path, monkeypatch):
    """Attention buckets compiled into the host library: C takes the same winners as the Python
    loader (on the tuned device only), and the table changes answers."""
    problems = ATTN_PROBLEMS + _decode_attention_problems()[::7] + [
        dict(varlen=False, dtype="bf16", D=d, causal=c, B=b, Sq=s, Sk=s, Hq=h, Hkv=h, layout="bshd", scale=None,
             q_off=0) for d in (128, 256) for c in (False, True) for b, h, s in ((1, 8, 512), (2, 16, 4096), (32, 32, 512))]
    for label, src in bundles.items():
        path = tmp_path / label
        shutil.copytree(src, path)
        assert _write_attention_tuning(path, problems) > 50
        s = relink(path)
        assert s["tuning"].startswith(TUNED["name"]), s
        lib = cs.CLib(path / "lib" / "libfactory_bundle.so")
        b, tuned = cs.compare_attention(path, lib, problems, (9, 0), TUNED["sm_count"], monkeypatch, TUNED["name"])
        assert b.tuning is not None
        bad = _mismatches(tuned)
        assert not bad, f"{label}, tuned: {len(bad)} of {len(tuned)} differ\n{_report(bad)}"
        _, other = cs.compare_attention(path, lib, problems, (9, 0), TUNED["sm_count"], monkeypatch, "Another GPU")
        bad = _mismatches(other)
        assert not bad, f"{label}, another GPU: {len(bad)} of {len(other)} differ\n{_report(bad)}"
        differ = sum(1 for t, o in zip(tuned, other) if t[1] != o[1])
        assert differ >= 10, f"{label}: the attention table changed only {differ} answers"
