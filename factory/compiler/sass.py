"""The one SASS check of a cubin, used by the build (before a cubin enters a bundle) and by
``python -m factory verify`` (on every cubin of a bundle): the cubin's target against the
variant's, each instruction pattern the kernel family must emit, and for warp-specialised kernels
that no role's code uses a register past the budget its ``setmaxnreg`` set.  Reads text only
(the disassembly from :func:`factory.compiler.cubin.disassemble`); no DSL, no GPU."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from ..atoms.targets import TARGETS
from .cubin import sass_target

_SETMAXREG = re.compile(r"\bUSETMAXREG\.(DEALLOC|TRY_ALLOC)\.CTAPOOL\s+(?:U?P[T0-9]+,\s*)?(0x[0-9a-f]+|\d+)")
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def role_registers(sass: str) -> list[dict]:
    """Per ``setmaxnreg`` in a warp-specialised kernel: the register limit it sets and the highest
    general register (R<n>) used by any instruction reachable from it, following branches (the
    code a warp runs after that instruction; ptxas may place a role's cold paths, such as mbarrier
    retry loops, anywhere in the function, so address ranges would not do).  A role is within
    its budget when ``max_register < limit``."""
    insns: list[tuple[str, str]] = []  # (label or "", instruction text) in address order
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in sass.splitlines():
        lab = _LABEL.match(line)
        if lab:
            pending.append(lab.group(1))
            continue
        m = _INSN.search(line)
        if not m:
            continue
        for name in pending:
            labels[name] = len(insns)
        pending = []
        insns.append((m.group(1), m.group(2)))
    out = []
    for i, (_addr, text) in enumerate(insns):
        sm = _SETMAXREG.search(text)
        if not sm:
            continue
        seen, stack, top = set(), [i + 1], -1
        while stack:
            k = stack.pop()
            if k in seen or k >= len(insns):
                continue
            seen.add(k)
            t = insns[k][1]
            top = max([top] + [int(r) for r in re.findall(r"\bR(\d+)\b", t)])
            words = t.split()
            predicated = words[0].startswith("@")
            if predicated:
                words = words[1:]
            op = words[0]
            if op.startswith("BRA"):
                target = re.search(r"`\((\.L_x_\d+)\)", t)
                if target:
                    stack.append(labels[target.group(1)])
                # BRA.U UPn, target: taken on a uniform predicate, else falls through
                if predicated or (len(words) > 1 and re.match(r"!?UP\d", words[1])):
                    stack.append(k + 1)
                continue
            if op == "EXIT" and not predicated:
                continue
            stack.append(k + 1)
        out.append({"action": sm.group(1), "limit": int(sm.group(2), 0), "max_register": top,
                    "instructions": len(seen)})
    return out


def target_problem(want: str, got: str | None, exact: bool) -> bool:
    """Whether a cubin built for ``got`` cannot be the ``want`` target's.  ``exact``: ``got`` is
    ptxas's own ``-arch`` (the cubin's note); otherwise it is nvdisasm's ``.target``, which shows a
    family-specific target without its ``f`` (and older tools an arch-specific one without its
    ``a``)."""
    if got is None:
        return True
    # An arch-specific target (sm_90a: WGMMA, setmaxnreg) must be exactly that: an sm_90 cubin in
    # an sm_90a slot is the portability build, not the family the manifest claims.
    if exact or (TARGETS[want].arch_specific if want in TARGETS else want.endswith("a")):
        return got != want
    return got.rstrip("af") != want.rstrip("af")


def sass_problems(target: str, requirements: Iterable[str], sass: str, arch: str | None = None) -> list[str]:
    """What is wrong with one variant's disassembly (empty when it proves the family): its target
    against ``target`` (``arch``: the target ptxas recorded in the cubin, compared exactly when
    given), each of the family's ``requirements`` (regular expressions) that it lacks, and any
    register used past a setmaxnreg budget (:func:`role_registers`)."""
    problems = []
    got = arch or sass_target(sass)
    if target_problem(target, got, exact=arch is not None):
        problems.append(f"cubin is for {got}, manifest says {target}")
    missing = [p for p in requirements if not re.search(p, sass)]
    if missing:
        problems.append(f"SASS lacks {missing}")
    over = [r for r in role_registers(sass) if r["max_register"] >= r["limit"]]
    if over:
        problems.append("registers past a setmaxnreg budget: " + ", ".join(
            f"R{r['max_register']} after {r['action']} {r['limit']}" for r in over))
    return problems


def setmaxnreg_counts(sass: str) -> dict[str, set[int]]:
    """The register counts of the SASS's setmaxnreg instructions: {"DEALLOC": {...}, "TRY_ALLOC": {...}}."""
    out: dict[str, set[int]] = {"DEALLOC": set(), "TRY_ALLOC": set()}
    for kind, n in _SETMAXREG.findall(sass):
        out[kind].add(int(n, 0))
    return out


@functools.cache
def checker_version() -> str:
    """A digest of this module's source: the build caches each cubin's check result with it and
    checks again when the check has changed."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
