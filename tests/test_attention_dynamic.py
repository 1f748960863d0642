"""The dynamic persistent Hopper attention variants (tiles from a global counter) on this GPU-less
machine: names, configs and manifests, refusals, the contract's extra argument, the runtime's
counter words, and the selection (C, which the Python loader calls) never taking one."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from factory.atoms.targets import get_target  # noqa: E402


def _sm90(tier):
    from factory.attention.sm90 import enumerate_attention

    return enumerate_attention(get_target("sm_90a"), tier)


def _kvcache():
    from factory.registry import enumerate_variants

    return enumerate_variants(["sm_90a"], ["attention_kvcache"], tier="default")


def test_names_configs_and_manifest():
    full = _sm90("full")
    dyn = [v for v in full if v.dynamic and not v.slot_coords]
    assert dyn and all(v.name.endswith("_dy") and v.persistent for v in dyn)
    assert any(v.varlen for v in dyn) and any(not v.varlen for v in dyn)
    # each is the twin of a variant without it, whose name, config (cache key) and manifest lack it
    by_name = {v.name: v for v in full}
    for v in dyn:
        twin = by_name[v.name[:-3]]
        assert "dynamic" not in twin.config() and twin.config() == {
            k: x for k, x in v.config().items() if k != "dynamic"}
        d = v.describe()
        assert d["workspace"] == {"form": "tile_counters", "words": 2} and d["preferred"] is False
        assert d["tile_scheduler"]["dynamic"] == "global tile counter"
        assert "workspace" not in twin.describe() and "dynamic" not in twin.describe()["tile_scheduler"]
        args = [a.name for a in v.signature().args]
        targs = [a.name for a in twin.signature().args]
        assert args == targs[:5] + ["tile_counters"] + targs[5:]
        assert targs[5:] == (["cu_seqlens_q", "cu_seqlens_k", "softmax_scale", "max_seqlen_q"] if v.varlen
                             else ["softmax_scale"])
        tc = v.signature().args[5]
        assert tc.dtype == "i32" and tuple(tc.shape) == (2,)
    # the default tier has the causal head_dim 64 (128 and 192 rows), 128 and 256 persistent builds'
    # twins (bf16 and fp16) (launches that may run at once count in different words: runtime/counters.py),
    # the bf16 varlen causal head_dim 64 and 128 ones, and the bf16 non-causal head_dim 128 ones
    # (dense and varlen); the full tier those and more
    default_dyn = [v for v in _sm90("default") if v.dynamic]
    assert sorted((v.dtype, v.head_dim, v.tile_m, v.varlen) for v in default_dyn if v.causal) == sorted(
        [(dt, d, m, False) for dt in ("bf16", "f16") for d, m in ((64, 128), (64, 192), (128, 128), (256, 128))]
        + [("bf16", 64, 192, True), ("bf16", 128, 128, True)])
    assert sorted((v.dtype, v.head_dim, v.tile_m, v.varlen) for v in default_dyn if not v.causal) == sorted(
        [("bf16", 128, 128, False), ("bf16", 128, 128, True)])
    assert all(v.slot_coords and v.diag_half and v.o_stmatrix and v.name.endswith("_dh_om_sc_dy")
               for v in default_dyn if v.causal)  # (test_slot_coords_twins)
    # not causal: "_om_sc_dy", dense head_dim 128 with the deferred O-store wait ("_sd_om_sc_dy")
    assert all(v.slot_coords and v.o_stmatrix and not v.diag_half and v.name.endswith("_om_sc_dy")
               and v.store_defer == (v.head_dim == 128 and not v.varlen) for v in default_dyn if not v.causal)
    assert {(64, 128), (64, 192), (128, 128)} <= {(v.head_dim, v.tile_m) for v in _sm90("full") if v.dynamic and v.causal}


def test_slot_coords_twins():
    """slot_coords (the producer passes each tile's coordinates with its index): a twin of every
    dynamic variant in the full tier, named ``..._sc_dy``, whose cache key, manifest and arguments
    differ from its twin's only by the switch; refused without dynamic; absent from the key of every
    other variant."""
    full = _sm90("full")
    by_name = {v.name: v for v in full}
    sc = [v for v in full if v.slot_coords and not v.o_stmatrix and not v.diag_half]
    assert sc and {dataclasses.replace(v, slot_coords=False).name for v in sc} == {
        v.name for v in full if v.dynamic and not v.slot_coords}
    for v in sc:
        assert v.name.endswith("_sc_dy") and v.dynamic and v.can_implement() is None
        twin = by_name[v.name[:-6] + "_dy"]
        assert v.config() == {**twin.config(), "slot_coords": True}
        d, t = v.describe(), twin.describe()
        assert d["tile_scheduler"] == {**t["tile_scheduler"], "coords": "from the producer warp"}
        assert {k: x for k, x in d.items() if k != "tile_scheduler"} == {k: x for k, x in t.items() if k != "tile_scheduler"}
        assert v.signature() == twin.signature()
    assert all("slot_coords" not in v.config() for v in full if not v.slot_coords)
    assert "slot_coords needs dynamic" in dataclasses.replace(sc[0], dynamic=False).can_implement()
    # the default tier holds these twins only (the selection tries "<name>_sc_dy", then "<name>_dy")
    assert all(v.slot_coords for v in _sm90("default") if v.dynamic)
    # o_stmatrix (O into its smem slab by stmatrix; varlen: the slab the 16-byte global stores read):
    # candidates in the full tier, named "..._om_sc_dy", refused for other families' kernels
    om = [v for v in full if v.o_stmatrix and not v.diag_half]
    assert om and all(v.name.endswith("_om_sc_dy") and v.config() == {**by_name[v.name.replace("_om_", "_")].config(),
                                                                      "o_stmatrix": True} for v in om)
    assert any(r"STSM" in x for x in om[0].sass_requirements())
    assert all("o_stmatrix" not in v.config() for v in full if not v.o_stmatrix)
    plain = next(v for v in full if v.varlen and v.causal and v.dtype == "bf16")
    assert dataclasses.replace(plain, o_stmatrix=True).can_implement() is None
    assert any(v.varlen for v in om)
    from factory.attention.sm90 import AttentionKvcacheSm90

    # (the kvcache family: on its 16-bit page-box builds, not on the cp.async gathers)
    kv = next(x for x in _kvcache() if isinstance(x, AttentionKvcacheSm90) and not x.page_box)
    assert "o_stmatrix needs 16-bit O" in dataclasses.replace(kv, o_stmatrix=True).can_implement()
    boxes = next(x for x in _kvcache() if isinstance(x, AttentionKvcacheSm90) and x.page_box and x.head_dim == 128)
    assert boxes.o_stmatrix and boxes.diag_half and boxes.can_implement() is None
    # diag_half (the diagonal key tile's upper half skipped where a warpgroup sees none of it):
    # likewise "..._dh_sc_dy", causal only
    dh = [v for v in full if v.diag_half and not v.o_stmatrix]
    assert dh and all(v.name.endswith("_dh_sc_dy") and v.config() == {**by_name[v.name.replace("_dh_", "_")].config(),
                                                                      "diag_half": True} for v in dh)
    assert all("diag_half" not in v.config() for v in full if not v.diag_half)
    # both together: "..._dh_om_sc_dy"
    assert {v.name for v in full if v.diag_half and v.o_stmatrix} == {v.name.replace("_om_", "_dh_om_") for v in om
                                                                      if v.causal}
    nc = next(v for v in full if not v.causal and v.dtype == "bf16" and v.persistent)
    assert "diag_half needs causal" in dataclasses.replace(nc, diag_half=True).can_implement()


def test_refusals():
    base = next(v for v in _sm90("full") if v.dynamic)
    assert "dynamic needs persistent" in dataclasses.replace(base, persistent=False, store_defer=False).can_implement()
    # varlen: taken (the producer passes over the virtual grid's empty slots)
    assert dataclasses.replace(base, varlen=True, store_defer=False).can_implement() is None
    from factory.attention.sm90_fp8 import AttentionFp8Sm90
    from factory.registry import enumerate_variants

    f = next((x for x in enumerate_variants(["sm_90a"], ["attention"], tier="full")
              if isinstance(x, AttentionFp8Sm90) and x.persistent and not x.varlen), None)
    if f is not None:
        assert "dynamic needs persistent" in dataclasses.replace(f, dynamic=True).can_implement()


def test_runtime_counter_words_are_shared():
    from factory.runtime import counters, kvcache
    from factory.runtime.attention import dense_workspace, tile_counters, uses_tile_counters

    dev = torch.device("cpu")
    t = tile_counters(dev)
    assert t.dtype == torch.int32 and t.shape == (2,) and int(t.count_nonzero()) == 0
    assert t.data_ptr() == counters.buffer(dev).data_ptr() == kvcache.counters_buffer(dev).data_ptr()
    assert kvcache.counters(dev, 1, 2, 1).data_ptr() == t.data_ptr()
    e = {"workspace": {"form": "tile_counters", "words": 2}, "splits": 1}
    assert uses_tile_counters(e) and not uses_tile_counters({"splits": 1})
    q = torch.zeros(1, 4, 2, 64)
    assert dense_workspace(torch, e, q)[0].data_ptr() == t.data_ptr() and dense_workspace(torch, {"splits": 1}, q) == []


def test_selection_takes_the_dynamic_twin_for_causal_persistent(test_bundle):
    """The test bundle holds the dynamic twin of its preferred (persistent, head_dim 128, causal)
    variant: the selection (C; the Python loader asks it) takes the twin for a full causal grid, and
    the 64-row one-tile-per-CTA variant, which has no twin, for an under-filled one."""
    from factory.runtime import Bundle
    from factory.runtime.attention import _choose, uses_tile_counters

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "sim", "sm_count": 132})
    dyn = {e["name"] for e in b.candidates("attention") if uses_tile_counters(e)}
    if not dyn:
        pytest.skip("no dynamic variant in the test bundle")
    full = _choose(b, "bf16", 128, True, False, 32 * 32 * 512, (32, 32, 32, 512, 512))[0]
    assert full in dyn and full.endswith("_sc_dy") and full[:-6] in b.manifest["variants"], full
    small = _choose(b, "bf16", 128, True, False, 8 * 512, (1, 8, 8, 512, 512))[0]
    assert small not in dyn and not b.manifest["variants"][small].get("tile_scheduler", {}).get("persistent"), small


def test_counter_words_per_stream():
    """Each stream its own words, grown in a new buffer (the old one kept); a hot plan's per-stream
    lookup finds the same words and keeps them."""
    from factory.runtime import counters
    from factory.runtime.attention import tile_counters

    dev = torch.device("cpu")
    a, b = tile_counters(dev, 101), tile_counters(dev, 102)
    assert a.data_ptr() != b.data_ptr() and tile_counters(dev, 101).data_ptr() == a.data_ptr()
    big, captured = counters.zeroed(dev, 9000, 101)
    assert not captured and big.numel() == 9000 and counters.buffer(dev, 101).numel() >= 9000
    assert big.data_ptr() != a.data_ptr() and tile_counters(dev, 101).data_ptr() == big.data_ptr()
    assert a.data_ptr() in {t.data_ptr() for t in counters.buffers(dev)}  # the old buffer is kept
    assert all(int(t.count_nonzero()) == 0 for t in counters.buffers(dev))
    look = counters.StreamWords(dev, 2)
    assert look.ptr(101) == counters.zeroed(dev, 2, None)[0].data_ptr() and 101 in look  # (cpu: one buffer)


def test_capture_words_per_capture(monkeypatch):
    """Inside a capture (simulated): words of that capture, a slice of the device's arena (made on the
    eager path, never from a graph's pool), shared by its later launches on the stream, a new slice
    when a launch needs more, new for the next capture, never the eager words, and never kept by a hot
    plan's lookup; without the driver's capture id, or with no arena yet, words of each launch."""
    from factory.runtime import counters

    dev = torch.device("cpu")
    eager = counters.zeroed(dev, 4, 7)[0].data_ptr()  # (the eager path makes the arena)
    arena = counters._ARENAS[dev][0]
    lo, hi = arena.data_ptr(), arena.data_ptr() + 4 * arena.numel()
    state = {"cid": 5}
    monkeypatch.setattr(counters, "_capturing", lambda d: True)
    monkeypatch.setattr(counters, "capture_id", lambda s: state["cid"])
    w1, captured = counters.zeroed(dev, 4, 7)
    assert captured and w1.data_ptr() != eager and counters.zeroed(dev, 2, 7)[0].data_ptr() == w1.data_ptr()
    assert lo <= w1.data_ptr() < hi
    w2 = counters.zeroed(dev, 64, 7)[0]
    assert w2.numel() == 64 and w2.data_ptr() != w1.data_ptr() and lo <= w2.data_ptr() < hi
    other = counters.zeroed(dev, 4, 8)[0]  # another stream of the same capture (a fork): its own words
    assert other.data_ptr() not in (w1.data_ptr(), w2.data_ptr())
    state["cid"] = 6
    w3 = counters.zeroed(dev, 4, 7)[0]
    assert w3.data_ptr() not in (w1.data_ptr(), w2.data_ptr(), eager) and lo <= w3.data_ptr() < hi
    look = counters.StreamWords(dev, 4)
    look.capturing = lambda: True
    assert look.ptr(7) == w3.data_ptr() and 7 not in look
    state["cid"] = None  # the driver cannot tell captures apart
    n1, n2 = counters.zeroed(dev, 4, 7)[0], counters.zeroed(dev, 4, 7)[0]
    assert n1.data_ptr() != n2.data_ptr() and int(n1.count_nonzero()) == 0
    assert not lo <= n1.data_ptr() < hi
    state["cid"] = 7  # a capture before any eager call: no arena, words of each launch
    monkeypatch.setattr(counters, "_ARENAS", {})
    f1, f2 = counters.zeroed(dev, 4, 9)[0], counters.zeroed(dev, 4, 9)[0]
    assert f1.data_ptr() != f2.data_ptr() and int(f1.count_nonzero()) == 0


def test_arena_turns_over_on_the_eager_path(monkeypatch):
    """Slices are never handed out twice; once half of an arena is used, the next eager lookup makes
    a new one (the old one stays among the buffers: graphs may still count in it)."""
    from factory.runtime import counters

    dev = torch.device("cpu")
    monkeypatch.setattr(counters, "ARENA_WORDS", 256)
    monkeypatch.setattr(counters, "_ARENAS", {})
    monkeypatch.setattr(counters, "_OLD_ARENAS", [])
    look = counters.StreamWords(dev, 2)
    look.ptr(3)
    first = counters._ARENAS[dev][0]
    monkeypatch.setattr(counters, "_capturing", lambda d: True)
    monkeypatch.setattr(counters, "capture_id", lambda s: 1)
    seen = {counters.zeroed(dev, 64, s)[0].data_ptr() for s in range(4)}  # four captures' streams
    assert len(seen) == 4 and counters._ARENAS[dev][1] == 256
    assert counters.zeroed(dev, 64, 5)[0].data_ptr() not in seen  # full: a launch's own words
    monkeypatch.setattr(counters, "_capturing", lambda d: False)
    look.ptr(3)
    assert counters._ARENAS[dev][0] is not first and any(t is first for t in counters.buffers(dev))


def test_selection_takes_the_varlen_twin(tmp_path):
    """A bundle of the bf16 causal varlen head_dim 64 build and its dynamic twin: the selection (C;
    the Python loader asks it) takes the twin for packed causal sequences, and its workspace (what
    fx_attention asks of a caller) is the two counter words, then the lse scratch."""
    pytest.importorskip("cutlass")
    from factory.compiler.builder import build
    from factory.runtime import Bundle
    from factory.runtime.attention import _choose, uses_tile_counters
    from factory.runtime.errors import NoVariantError
    from factory.runtime.selector import DTYPE, AttentionProblem, _I64x2, _I64x3

    (tmp_path / "no-runs").mkdir()
    build(tmp_path / "b", ["sm_90a"], ["attention"], tier="default", jobs=1, evidence=tmp_path / "no-runs",
          name_filter="attention_sm90a_bf16_d64_m192_n128_s2_causal_varlen_ov_pp_ps_kf*")
    b = Bundle.open(tmp_path / "b", capability=(9, 0), device={"name": "sim", "sm_count": 132})
    assert len(b.manifest["variants"]) == 2
    name = _choose(b, "bf16", 64, True, True)[0]
    assert name.endswith("_dh_om_sc_dy") and uses_tile_counters(b.manifest["variants"][name])
    assert name[:-len("_dh_om_sc_dy")] in b.manifest["variants"]
    with pytest.raises(NoVariantError):  # (no non-causal build here: the twin is no choice of its own)
        _choose(b, "bf16", 64, False, True)
    hq, tq, d = 8, 3000, 64
    qs = _I64x3(0, hq * d, d)
    for lse, want in ((None, 16 + 4 * hq * tq), (1 << 20, 16)):
        p = AttentionProblem(DTYPE["bf16"], 1, 3, tq, tq, hq, hq, d, None, None, None, None, qs, qs, qs,
                             _I64x3(0, hq * d, d), lse, _I64x2(0, tq), None, None, 1500, 1, 0.0)
        sel = b.selector.select("attention", p)
        assert sel.name.decode() == name and sel.workspace_bytes == want, (sel.name, sel.workspace_bytes)


def test_selection_takes_the_non_causal_twin(tmp_path):
    """A bundle of the bf16 non-causal dense head_dim 128 build and its dynamic twin (the producer's
    coordinates, the stmatrix epilogue, the deferred O-store wait): the selection (C; the Python
    loader asks it) takes the twin for a full grid and for an under-filled one (no smaller tile
    here), never for causal problems, and its workspace is the two counter words."""
    pytest.importorskip("cutlass")
    from factory.compiler.builder import build
    from factory.runtime import Bundle
    from factory.runtime.attention import _choose, uses_tile_counters
    from factory.runtime.errors import NoVariantError
    from factory.runtime.selector import DTYPE, AttentionProblem, _I64x2, _I64x3

    (tmp_path / "no-runs").mkdir()
    build(tmp_path / "b", ["sm_90a"], ["attention"], tier="default", jobs=1, evidence=tmp_path / "no-runs",
          name_filter="attention_sm90a_bf16_d128_m128_n128_s2_ov_pp_er_ps_kf_lz*")
    b = Bundle.open(tmp_path / "b", capability=(9, 0), device={"name": "sim", "sm_count": 132})
    assert len(b.manifest["variants"]) == 2
    for rows, dims in ((32 * 32 * 512, (32, 32, 32, 512, 512)), (8 * 512, (1, 8, 8, 512, 512))):
        name = _choose(b, "bf16", 128, False, False, rows, dims)[0]
        assert name.endswith("_sd_om_sc_dy") and uses_tile_counters(b.manifest["variants"][name]), name
        assert name[:-len("_sd_om_sc_dy")] in b.manifest["variants"]
    with pytest.raises(NoVariantError):
        _choose(b, "bf16", 128, True, False, 32 * 32 * 512, (32, 32, 32, 512, 512))
    B, h, s, d = 32, 32, 512, 128
    qs = _I64x3(s * h * d, h * d, d)
    p = AttentionProblem(DTYPE["bf16"], 0, B, s, s, h, h, d, None, None, None, None, qs, qs, qs,
                         _I64x3(s * h * d, h * d, d), 1 << 20, _I64x2(h * s, s), None, None, 0, 0, 0.0)
    sel = b.selector.select("attention", p)
    assert sel.name.decode() == name and sel.workspace_bytes == 16, (sel.name, sel.workspace_bytes)
