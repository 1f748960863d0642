from factory.atoms.targets import TARGETS, Mma, get_target, targets_for_capability


def test_plain_targets_run_on_later_minor_of_same_major():
    assert get_target("sm_80").runs_on((8, 6)) and get_target("sm_80").runs_on((8, 9))
    assert get_target("sm_86").runs_on((8, 9)) and not get_target("sm_86").runs_on((8, 0))
    assert not get_target("sm_89").runs_on((9, 0))
    assert get_target("sm_90").runs_on((9, 0))


def test_arch_specific_targets_run_only_on_their_chip():
    assert get_target("sm_90a").runs_on((9, 0)) and not get_target("sm_90a").runs_on((10, 0))
    assert get_target("sm_100a").runs_on((10, 0)) and not get_target("sm_100a").runs_on((10, 3))
    sm120 = get_target("sm_120a")
    assert sm120.runs_on((12, 0)) and not any(sm120.runs_on(c) for c in ((9, 0), (10, 0), (12, 1), (8, 9)))


def test_best_target_first():
    assert [t.name for t in targets_for_capability((9, 0))] == ["sm_90a", "sm_90"]
    assert [t.name for t in targets_for_capability((8, 9))] == ["sm_89", "sm_86", "sm_80"]
    assert [t.name for t in targets_for_capability((8, 6))] == ["sm_86", "sm_80"]
    assert targets_for_capability((7, 5)) == []
    # Blackwell datacenter: the arch-specific build for exactly this chip first, then the family
    # build (no sm_9x cubin runs on 10.x).  B300 (10.3): its own sm_103a, then sm_100f.
    assert [t.name for t in targets_for_capability((10, 0))] == ["sm_100a", "sm_100f"]
    assert [t.name for t in targets_for_capability((10, 3))] == ["sm_103a", "sm_100f"]
    assert targets_for_capability((11, 0)) == [] and targets_for_capability((12, 1)) == []
    # Consumer Blackwell: only its own arch-specific build (no sm_8x/sm_9x/sm_100a cubin runs on 12.0).
    assert [t.name for t in targets_for_capability((12, 0))] == ["sm_120a"]


def test_proof_levels():
    assert {t.proof for t in TARGETS.values()} <= {"executed", "portability-build", "sass-only"}
    assert get_target("sm_100a").proof == "sass-only" and get_target("sm_120a").proof == "sass-only"
    assert get_target("sm_80").proof == "portability-build"
    assert get_target("sm_90").portability_of == "sm80"


def test_consumer_blackwell_is_an_mma_sync_target_with_99_kb():
    t = get_target("sm_120a")
    # Clusters and DSMEM exist on 12.x (Programming Guide feature table); TMEM and tcgen05 do not.
    assert (t.family, t.mma, t.tmem, t.clusters) == ("sm80", (Mma.MMA_SYNC,), False, True)
    assert t.smem_per_cta == 99 * 1024 and t.fp8 and t.fp8_mma_native and t.arch_specific
    # Hopper's fp8 mma.sync is emulated with f16 HMMA; Ada and consumer Blackwell have QMMA.
    assert {n for n, t in TARGETS.items() if t.fp8_mma_native} == {"sm_89", "sm_120a"}


def test_every_specific_target_records_the_capabilities_its_cubins_run_on():
    """Arch-specific targets: their own capability only; family-specific: the family's members
    (sm_100f: B200/GB200 10.0 and B300/GB300 10.3; PTX ISA "sm_100f or higher in the same
    family"); plain targets record none and follow the same-major rule."""
    for t in TARGETS.values():
        if t.arch_specific:
            assert t.ccs == (t.capability,) and t.specificity == 2, t.name
        elif t.family_specific:
            assert t.capability in t.ccs and len(t.ccs) > 1 and t.specificity == 1, t.name
        else:
            assert t.ccs == () and t.specificity == 0, t.name
        for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)):
            if t.ccs:
                assert t.runs_on(cc) == (cc in t.ccs), (t.name, cc)
    f = get_target("sm_100f")
    assert f.ccs == ((10, 0), (10, 3)) and f.family == "sm100" and f.tmem and f.cta_pairs
    assert [c for c in ((9, 0), (10, 0), (10, 3), (11, 0), (12, 0)) if f.runs_on(c)] == [(10, 0), (10, 3)]
    assert get_target("sm_103a").runs_on((10, 3)) and not get_target("sm_103a").runs_on((10, 0))


def test_a_target_must_record_its_capabilities():
    import dataclasses

    import pytest

    sm100a = get_target("sm_100a")
    with pytest.raises(ValueError, match="record their compute capabilities"):
        dataclasses.replace(sm100a, ccs=())
    with pytest.raises(ValueError, match="own capability only"):
        dataclasses.replace(sm100a, ccs=((10, 0), (10, 3)))
    with pytest.raises(ValueError, match="plain targets do not"):
        dataclasses.replace(get_target("sm_90"), ccs=((9, 0),))
