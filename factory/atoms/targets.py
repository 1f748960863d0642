"""The registry of compilation targets: the one place that knows what each GPU generation has.

A *target* is what we compile for (``--gpu-arch``); a *device* is what we dispatch on (a compute
capability).  Keeping the two apart is what makes GPU-less builds possible: the factory only ever
looks at ``Target``; the runtime maps the device's capability to the targets that can run there
with :func:`targets_for_capability`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Mma(str, Enum):
    MMA_SYNC = "mma.sync"  # warp-level, sm_80+
    WGMMA = "wgmma"  # warpgroup-level, sm_90a only
    TCGEN05 = "tcgen05"  # TMEM accumulators, sm_100a


class Copy(str, Enum):
    CP_ASYNC = "cp.async"
    TMA = "tma"


@dataclass(frozen=True)
class Target:
    name: str  # the --gpu-arch string, e.g. "sm_90a"
    capability: tuple[int, int]  # the compute capability the cubin is built for
    family: str  # kernel family written for it: "sm80", "sm90", "sm100"
    mma: tuple[Mma, ...]
    copy: tuple[Copy, ...]
    # Largest dynamic shared memory one CTA may opt into (bytes), from the CUDA programming guide's
    # per-capability table.  Stage counts are derived from this, less what a kernel keeps for itself.
    smem_per_cta: int
    fp8: bool = False
    # fp8 mma.sync runs on a native fp8 tensor-core path (QMMA in SASS): Ada and consumer
    # Blackwell.  Hopper accepts the instruction but ptxas lowers it to f16 HMMA plus conversions.
    fp8_mma_native: bool = False
    clusters: bool = False
    tmem: bool = False
    cta_pairs: bool = False
    # "arch-specific" targets (the ``a`` suffix) run only on exactly their capability; plain
    # targets run on every later minor revision of the same major (sm_86 on 8.9, not on 9.0).
    arch_specific: bool = False
    # "family-specific" targets (the ``f`` suffix, CUDA 12.9+): the arch-specific features that a
    # whole family shares; the cubin runs on the family's members listed in ``ccs``.
    family_specific: bool = False
    # The compute capabilities this target's cubins run on, recorded for every arch- and
    # family-specific target (the loader matches devices against it, in Python and in C); empty for
    # plain targets, which run on every minor revision >= theirs of their major.
    ccs: tuple[tuple[int, int], ...] = ()
    # A plain target whose cubins are the same code as another's it runs alongside: every variant
    # both targets have compiles to byte-identical SASS, and that target's cubins run on this one's
    # devices.  When both are built, this one keeps only the variants the other lacks
    # (registry.enumerate_variants); selection takes the other's on this one's devices.
    same_code_as: str | None = None
    # Portability builds compile a lower family's source for a newer chip so its numerics can be
    # proven on hardware we have (the sm80 family built for sm_90 runs on an H100).
    portability_of: str | None = None
    # The strongest proof label a variant for this target can get with the GPU the project has (an
    # H100): "executed" (its cubin can run there), "portability-build" (the same source built for
    # sm_90 can), "sass-only" (no GPU here runs it).  A ceiling, not a claim: the build gives
    # "executed" only where a run record shows that cubin ran and passed, else "compiled"
    # (factory/evidence.py, docs/proof.md).
    proof: str = "portability-build"

    def __post_init__(self):
        if (self.arch_specific or self.family_specific) != bool(self.ccs):
            raise ValueError(f"{self.name}: arch- and family-specific targets record their compute capabilities "
                             f"(ccs); plain targets do not")
        if self.arch_specific and self.ccs != (self.capability,):
            raise ValueError(f"{self.name}: an arch-specific cubin runs on its own capability only")

    def runs_on(self, capability: tuple[int, int]) -> bool:
        capability = tuple(capability)
        if self.ccs:
            return capability in self.ccs
        major, minor = capability
        return major == self.capability[0] and minor >= self.capability[1]

    @property
    def specificity(self) -> int:
        """2 arch-specific, 1 family-specific, 0 plain: on a device several targets run on, the
        most specific is preferred (it may use more of the chip)."""
        return 2 if self.arch_specific else 1 if self.family_specific else 0

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


_TARGETS = (
    Target("sm_80", (8, 0), "sm80", (Mma.MMA_SYNC,), (Copy.CP_ASYNC,), smem_per_cta=163 * 1024),
    Target("sm_86", (8, 6), "sm80", (Mma.MMA_SYNC,), (Copy.CP_ASYNC,), smem_per_cta=99 * 1024),
    # Ada: the sm_86 code (same 99 KB per CTA: the .text of all 70 bf16/f16 variants both build was
    # byte-identical in the 2026-11-25 default bundle; notes/blackwell.md, "Build time"), plus fp8.
    Target("sm_89", (8, 9), "sm80", (Mma.MMA_SYNC,), (Copy.CP_ASYNC,), smem_per_cta=99 * 1024, fp8=True,
           fp8_mma_native=True, same_code_as="sm_86"),
    # The Ampere/Ada family compiled for Hopper: same source, runs on an H100 (proves numerics).
    Target(
        "sm_90", (9, 0), "sm80", (Mma.MMA_SYNC,), (Copy.CP_ASYNC,), smem_per_cta=227 * 1024,
        fp8=True, clusters=True, portability_of="sm80", proof="executed",
    ),
    Target(
        "sm_90a", (9, 0), "sm90", (Mma.MMA_SYNC, Mma.WGMMA), (Copy.CP_ASYNC, Copy.TMA),
        smem_per_cta=227 * 1024, fp8=True, clusters=True, arch_specific=True, ccs=((9, 0),),
        proof="executed",
    ),
    Target(
        "sm_100a", (10, 0), "sm100", (Mma.MMA_SYNC, Mma.TCGEN05), (Copy.CP_ASYNC, Copy.TMA),
        smem_per_cta=227 * 1024, fp8=True, clusters=True, tmem=True, cta_pairs=True,
        arch_specific=True, ccs=((10, 0),), proof="sass-only",
    ),
    # The Blackwell datacenter family target: one cubin for B200/GB200 (10.0) and B300/GB300 (10.3).
    # PTX ISA, tcgen05 "Target ISA notes": sm_100a, sm_110a, "sm_100f or higher in the same family",
    # sm_110f; ptxas 13.4 here accepts every tcgen05/TMEM/2-CTA form of our kernels for sm_100f and
    # emits the same code as for sm_100a (identical .text sections; only the cubin's .nv.compat
    # attributes and its ptxas note differ): notes/blackwell.md, "sm_100f".
    Target(
        "sm_100f", (10, 0), "sm100", (Mma.MMA_SYNC, Mma.TCGEN05), (Copy.CP_ASYNC, Copy.TMA),
        smem_per_cta=227 * 1024, fp8=True, clusters=True, tmem=True, cta_pairs=True,
        family_specific=True, ccs=((10, 0), (10, 3)), proof="sass-only",
    ),
    # B300 (10.3) on its own, for a kernel that needs sm_103a-only features (none of ours does).
    Target(
        "sm_103a", (10, 3), "sm100", (Mma.MMA_SYNC, Mma.TCGEN05), (Copy.CP_ASYNC, Copy.TMA),
        smem_per_cta=227 * 1024, fp8=True, clusters=True, tmem=True, cta_pairs=True,
        arch_specific=True, ccs=((10, 3),), proof="sass-only",
    ),
    # Consumer Blackwell (RTX 50-series, RTX PRO 6000): no TMEM, tcgen05 or WGMMA, so it gets the
    # mma.sync family (fp8 e4m3 mma.sync runs natively, QMMA).  Shared memory: the CUDA C++
    # Programming Guide's "Technical Specifications per Compute Capability" table gives 12.x
    # 128 KB per SM and 99 KB per thread block (CUTLASS: sm120_smem_capacity_bytes = 101376).
    # Built arch-specific (sm_120a): those cubins run on 12.0 only.  No 12.0 GPU has run them.
    # Thread block clusters and distributed shared memory: yes on 12.x (the Programming Guide's
    # "Feature Support per Compute Capability"; the Blackwell Tuning Guide), no TMA multicast use here.
    Target(
        "sm_120a", (12, 0), "sm80", (Mma.MMA_SYNC,), (Copy.CP_ASYNC,), smem_per_cta=99 * 1024,
        fp8=True, fp8_mma_native=True, clusters=True, arch_specific=True, ccs=((12, 0),),
        proof="sass-only",
    ),
)

TARGETS: dict[str, Target] = {t.name: t for t in _TARGETS}
# The compute capabilities NVIDIA devices have (the CUDA C++ Programming Guide's table; 10.1 is
# CUDA 12.8's name for what CUDA 13 calls 11.0).  A device, or a capability given for planning,
# outside this list is refused (InputError, FX_ERR_INPUT): never matched to a target by its minor.
KNOWN_CAPABILITIES: tuple[tuple[int, int], ...] = (
    (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9),
    (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1),
)
for _t in _TARGETS:  # the same code must run where this target's devices are
    if _t.same_code_as is not None and not TARGETS[_t.same_code_as].runs_on(_t.capability):
        raise ValueError(f"{_t.name}: {_t.same_code_as} cubins do not run on {_t.capability}")


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def targets_for_capability(capability: tuple[int, int]) -> list[Target]:
    """Targets whose cubins can run on a device of this capability, best first.

    Best = the most specific: an arch-specific target for exactly this chip, then a family-specific
    target whose recorded capabilities include it, then the newest plain target of the same major.
    """
    fitting = [t for t in _TARGETS if t.runs_on(capability)]
    return sorted(fitting, key=lambda t: (t.specificity, t.capability), reverse=True)
