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
    # Blackwell datacenter: only the arch-specific sm_100a build (no sm_9x cubin runs on 10.0).
    assert [t.name for t in targets_for_capability((10, 0))] == ["sm_100a"]
    assert targets_for_capability((10, 3)) == [] and targets_for_capability((12, 1)) == []
    # Consumer Blackwell: only its own arch-specific build (no sm_8x/sm_9x/sm_100a cubin runs on 12.0).
    assert [t.name for t in targets_for_capability((12, 0))] == ["sm_120a"]


def test_proof_levels():
    assert {t.proof for t in TARGETS.values()} <= {"executed", "portability-build", "sass-only"}
    assert get_target("sm_100a").proof == "sass-only" and get_target("sm_120a").proof == "sass-only"
    assert get_target("sm_80").proof == "portability-build"
    assert get_target("sm_90").portability_of == "sm80"


def test_consumer_blackwell_is_an_mma_sync_target_with_99_kb():
    t = get_target("sm_120a")
    assert (t.family, t.mma, t.tmem, t.clusters) == ("sm80", (Mma.MMA_SYNC,), False, False)
    assert t.smem_per_cta == 99 * 1024 and t.fp8 and t.fp8_mma_native and t.arch_specific
    # Hopper's fp8 mma.sync is emulated with f16 HMMA; Ada and consumer Blackwell have QMMA.
    assert {n for n, t in TARGETS.items() if t.fp8_mma_native} == {"sm_89", "sm_120a"}
