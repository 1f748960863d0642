"""The Blackwell (sm100) GEMM cost model (constants: runtime/cost_sm100.py; code: the host library's
sm100_estimate_us, compiler/csrc/fx_select.c): unmeasured (no B200 here), so what is tested is that
it is a sane ranking device -- monotone in the problem, the published figures it is built on, the
picks on a table of shapes being what its reasoning says -- over the default tier's sm100 variants
(a selection library of their entries, tests/selection_lib.py, and a compiled bundle).  Nothing here
says any pick is fastest on a B200."""

from __future__ import annotations

import json
import math

import pytest

import selection_lib as sl
from conftest import TEST_TARGETS, needs_dsl
from factory.atoms.targets import get_target
from factory.runtime import cost_sm100 as cm

B200_SMS = 148
DC = next(t for t in TEST_TARGETS if get_target(t).family == "sm100")  # the datacenter target built here


def _entries(target: str = DC) -> dict[str, dict]:
    """The default tier's sm100 GEMM variants as manifest entries (describe(), no compile)."""
    from factory.gemm.sm100 import enumerate_sm100

    out = {}
    for v in enumerate_sm100(get_target(target), "default"):
        e = json.loads(json.dumps(v.describe()))
        e.update(name=v.name, family=v.family, target=v.target)
        out[v.name] = e
    return out


def _short(name: str) -> str:
    return name.split("_ak_")[1].split("_", 1)[1]


_LIBS: dict = {}


def _lib(entries: dict, sms: int = B200_SMS) -> sl.Lib:
    key = (tuple(entries), sms)
    if key not in _LIBS:
        _LIBS[key] = sl.Lib(list(entries.values()), cc=(10, 0), sm_count=sms)
    return _LIBS[key]


def _est(entries: dict, name: str, M: int, N: int, K: int, L: int = 1) -> float:
    return _lib(entries).sel.estimate_us(name, M, N, K, L)


def _pick(entries: dict, ab: str, c: str, M: int, N: int, K: int, L: int = 1, b_major: str = "k") -> str:
    """The selection's choice on a B200 (the least estimate among the fitting variants)."""
    return _short(_lib(entries).gemm(M, N, K, L, ab, c, "k", b_major))


def test_published_figures_it_is_built_on():
    """B200: 148 SMs, 2.25 / 4.5 / 9 PFLOP/s dense bf16 / fp8 / fp4, 8 TB/s; 8192 bf16 FLOPs per
    clock per SM (twice Hopper's 4096) puts the clock at ~1.86 GHz."""
    assert cm.B200["sm_count"] == B200_SMS and cm.B200["hbm_tbs"] == 8.0
    assert 1.8 < cm.CLOCK_GHZ < 1.95
    assert cm.flops_per_clk("bf16") == 8192 and cm.flops_per_clk("e4m3") == 2 * 8192 and cm.flops_per_clk("e2m1") == 4 * 8192
    peak = cm.flops_per_clk("bf16") * cm.CLOCK_GHZ * 1e9 * B200_SMS
    assert abs(peak - 2.25e15) / 2.25e15 < 1e-9


def test_monotone_in_every_dimension():
    """More work never predicts less time: M, N, K, L each grown with the others fixed, for every
    default sm100 variant."""
    sizes = [1, 16, 17, 64, 128, 129, 255, 256, 1000, 1024, 4096, 4097, 8192, 14336, 28672]
    entries = _entries()
    for e in entries.values():
        for a, b in ((1, 4096), (16, 4096), (4096, 4096), (128, 28672), (8192, 1024)):
            for dim in range(3):
                ts = []
                for x in sizes:
                    mnk = [a, b, b] if dim == 0 else [a, x, b] if dim == 1 else [a, b, x]
                    if dim == 0:
                        mnk[0] = x
                    ts.append(_est(entries, e["name"], *mnk, 1))
                assert all(t1 <= t2 for t1, t2 in zip(ts, ts[1:])), (e["name"], dim, a, b, ts)
        ls = [_est(entries, e["name"], 512, 4096, 4096, L) for L in (1, 2, 3, 8)]
        assert ls == sorted(ls), e["name"]


def test_a_cta_pair_reads_less_shared_memory_per_flop():
    """The reason CTA pairs exist: B's rows are split between the pair, so per FLOP an SM reads
    fewer operand bytes from shared memory; the model's mainloop is never slower for the pair than
    for the 1-CTA tile of the same CTA shape, and a 64-row MMA runs at half the rate."""
    base = {"family": "sm100", "target": DC, "dtypes": {"a": "bf16", "b": "bf16", "c": "bf16", "acc": "f32"},
            "cluster": [2, 1], "stages": 6, "persistent": {"arg": "max_clusters", "cluster_ctas": 2}}
    one = {**base, "name": "one", "tile": [128, 256, 64], "mma_tile": [128, 256, 64], "cta_group": 1}
    pair = {**base, "name": "pair", "tile": [128, 256, 64], "mma_tile": [256, 256, 64], "cta_group": 2}
    m64 = {**base, "name": "m64", "tile": [64, 256, 64], "mma_tile": [64, 256, 64], "cta_group": 1}
    es = {e["name"]: e for e in (one, pair, m64)}
    # compute-bound problems: the mainloop decides
    for M, N, K in ((8192, 8192, 8192), (4096, 4096, 16384)):
        assert _est(es, "pair", M, N, K) < _est(es, "one", M, N, K)
        # twice the tiles at half the MMA rate: more than twice the compute of the 128-row tile
        assert _est(es, "m64", M, N, K) > 1.5 * _est(es, "one", M, N, K)


# (ab, c, M, N, K) -> the variant the model picks, and why (the model's reasoning, not a measurement)
PICKS = [
    # Decode, N <= ~8K: bound by each CTA's pipeline depth and the bytes; the 64 x 32 tile has
    # N/32 CTAs with 12 stages each, every 128-row tile fewer CTAs with 6-8 stages.
    ("bf16", "bf16", 1, 4096, 4096, "t64x32x64_c1x1_pdl"),
    ("bf16", "bf16", 16, 4096, 4096, "t64x32x64_c1x1_pdl"),
    ("bf16", "bf16", 16, 1024, 4096, "t64x32x64_c1x1_pdl"),
    ("bf16", "bf16", 16, 4096, 14336, "t64x32x64_c1x1_pdl"),
    ("e4m3", "bf16", 16, 4096, 4096, "t64x32x128_c1x1_pdl"),
    ("e4m3", "bf16", 8, 4096, 14336, "t64x32x128_c1x1_pdl"),
    ("f16", "f16", 16, 4096, 4096, "t64x32x64_c1x1_pdl"),
    # Decode past one wave of 64 x 32 tiles (N > 4736): 64 x 64 tiles (12 stages, half the waves)...
    ("bf16", "bf16", 16, 6144, 4096, "t64x64x64_c1x1_pdl"),
    ("bf16", "bf16", 16, 8192, 8192, "t64x64x64_c1x1_pdl"),
    ("e4m3", "bf16", 16, 14336, 4096, "t64x64x128_c1x1_pdl"),
    ("e4m3", "bf16", 16, 28672, 8192, "t64x64x128_c1x1_pdl"),
    # ... or where 224 of them are 2 waves, one wave of 112 128 x 128 tiles (bf16).
    ("bf16", "bf16", 16, 14336, 4096, "t128x128x64_c1x1_pdl"),
    ("bf16", "bf16", 16, 28672, 4096, "t128x128x64_c1x1_pdl"),
    # Mid-size: the 64 x 32 tile's 4 waves of half-rate MMAs lose to one wave of 128-row pairs.
    ("bf16", "bf16", 1024, 1024, 4096, "2cta_t256x128x64_c2x2_pdl"),
    ("bf16", "bf16", 256, 4096, 4096, "2cta_t256x128x64_c2x2_pdl"),
    # Large: CTA pairs (half the shared-memory reads of B per SM); whole waves decide between the
    # two pair shapes (4096^3: 1024 tiles of 128 x 128 = 6.9 waves, 512 of 128 x 256 = 3.5).
    ("bf16", "bf16", 4096, 4096, 4096, "2cta_t256x128x64_c2x2_pdl"),
    ("bf16", "bf16", 8192, 8192, 8192, "2cta_t256x256x64_c2x1_pdl"),
    ("bf16", "bf16", 16384, 4096, 4096, "2cta_t256x256x64_c2x1_pdl"),
    ("e4m3", "bf16", 4096, 4096, 4096, "2cta_t256x256x128_c2x1_pdl"),
    ("bf16", "f32", 4096, 4096, 4096, "2cta_t256x256x64_c2x1_pdl"),
]


@pytest.mark.parametrize("ab,c,M,N,K,want", PICKS)
def test_picks_on_a_table_of_shapes(ab, c, M, N, K, want):
    assert _pick(_entries(), ab, c, M, N, K) == want


def test_decode_rule_on_10_0():
    """The rule for unpacked M <= 16 on 10.0, stated: among the tcgen05 variants, the 64 x 32 tile
    while its grid is one wave of CTAs (N <= 32 x 148 = 4736), beyond that the 64 x 64 tile or a
    one-wave 128-row tile, whichever the model predicts faster; the mma.sync family is not built
    for 10.x (its fp8 MMA is emulated there) and no swap-AB variant exists (notes/gemm-sm100.md)."""
    entries = _entries()
    for m in range(1, 17):
        for n in (256, 1024, 2048, 4096, 4736):
            assert _pick(entries, "bf16", "bf16", m, n, 4096) == "t64x32x64_c1x1_pdl", (m, n)
            assert _pick(entries, "e4m3", "bf16", m, n, 8192) == "t64x32x128_c1x1_pdl", (m, n)
    for m in (1, 16):
        for n in (6144, 8192, 14336, 28672, 57344):
            assert _pick(entries, "bf16", "bf16", m, n, 4096) in ("t64x64x64_c1x1_pdl", "t128x128x64_c1x1_pdl"), (m, n)
    assert all(e["family"] == "sm100" for e in entries.values())


def test_fit_script_reads_the_sm100_model(tmp_path):
    """scripts/fit_cost_model.py --family sm100 scores and refits cost_sm100.MODEL on a tuning
    table (here a synthetic one whose 'measurements' are the model's own times with one constant
    changed: the fit must not get worse than the current model)."""
    import subprocess
    import sys

    from conftest import ROOT

    entries = _entries()
    lib = _lib(entries)
    manifest = {"variants": entries, "host_library": {"path": str(sl.build(list(entries.values())))}}
    try:
        lib.sel.set_cost_model(sm100={**cm.MODEL, "latency_us": 2.0})  # the "device" streams with twice the round trip
        buckets = {}
        for i, (M, N, K) in enumerate([(16, 4096, 4096), (16, 14336, 4096), (4096, 4096, 4096), (128, 8192, 8192)]):
            fits = [e for e in entries.values() if e["dtypes"]["a"] == "bf16" and e["dtypes"]["c"] == "bf16"
                    and e["layout"]["b"] == "k"]
            buckets[f"b{i}"] = {"shape": [M, N, K, 1],
                                "timings_us": {e["name"]: lib.sel.estimate_us(e["name"], M, N, K, 1) for e in fits}}
    finally:
        lib.sel.set_cost_model()
    table = {"device": {"name": "synthetic B200", "sm_count": B200_SMS}, "buckets": buckets}
    (tmp_path / "t.json").write_text(json.dumps(table))
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    r = subprocess.run([sys.executable, "scripts/fit_cost_model.py", "--family", "sm100", str(tmp_path / "t.json"),
                        str(tmp_path / "m.json"), "--rounds", "1"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cur = float(r.stdout.split("current model: regret ")[1].split(",")[0])
    fit = float(r.stdout.split("fitted model:  regret ")[1].split(",")[0])
    assert fit <= cur and math.isfinite(fit) and "latency_us" in r.stdout


@needs_dsl
def test_c_selection_computes_the_same_model(tmp_path_factory):
    """The default tier's sm100 GEMM variants compiled into a bundle: what the loader launches is
    the library's answer on 10.0 devices, and the table's picks hold for the compiled entries."""
    import collections

    import c_selection as cs
    from factory.compiler.builder import build

    out = tmp_path_factory.mktemp("sm100cost") / "bundle"
    build(out, [DC], ["gemm"], tier="default", name_filter="gemm_sm100*_t*_pdl", jobs=1)  # the plain variants
    lib = cs.CLib(out / "lib" / "libfactory_bundle.so")
    problems = cs.gemm_problems(seed=100, n=300)
    problems += [dict(ab=ab, c=c, M=M, N=N, K=K, L=1, a_major="k", b_major="k", pad_a=0, pad_b=0, pad_c=0,
                      b_constant=False, a_off=0, b_off=0, c_off=0)
                 for ab, c, M, N, K, _ in PICKS]
    names = collections.Counter()
    for cc, sms in (((10, 0), 148), ((10, 0), 132), ((10, 0), 160)):
        _, rows = cs.compare_gemm(out, lib, problems, cc, sms, None)
        bad = [(p, want, got) for p, want, got, *_ in rows if want != got]
        assert not bad, bad[:5]
        names.update(g[1] for _, _, g, *_ in rows if g[0] == "ok")
    assert len(names) >= 6, names
    # and the table's picks are the loader's
    _, rows = cs.compare_gemm(out, lib, problems[-len(PICKS):], (10, 0), 148, None)
    for (ab, c, M, N, K, want), (_, got, *_) in zip(PICKS, rows):
        assert got[0] == "ok" and _short(got[1]) == want, (M, N, K, got)


def test_new_model_constants_drop_the_cached_choices():
    """fx_cost_model_set (fitting tools) forgets this thread's cached GEMM choices: the same problem
    asked again is chosen by the new constants, and by the compiled-in ones once they are back."""
    entries = _entries()
    lib = _lib(entries)
    first = _pick(entries, "bf16", "bf16", 1, 4096, 4096)  # cached from here on
    assert first.startswith("t64x")
    try:
        lib.sel.set_cost_model(sm100={**cm.MODEL, "rate_m64": 0.01})  # 64-row MMAs made ~100x slower
        assert not _pick(entries, "bf16", "bf16", 1, 4096, 4096).startswith("t64x")
    finally:
        lib.sel.set_cost_model()
    assert _pick(entries, "bf16", "bf16", 1, 4096, 4096) == first
