"""``python -m factory verify``: every hash, and every cubin's disassembly against what its kernel
family must contain (read from the manifest, so no DSL is needed)."""

from __future__ import annotations

import re
from pathlib import Path

from .compiler.cubin import cubin_target, disassemble, opcode_histogram, sass_target
from .runtime.manifest import file_ok, load_manifest



def _shown(match: str) -> str:
    """A requirement's match for the report: an order requirement (a match over several SASS
    lines) as its first and last instruction."""
    if "\n" not in match:
        return match
    words = match.split()
    return f"{words[0]} … {words[-1]}"


def target_problem(want: str, got: str | None, exact: bool) -> bool:
    """Whether a cubin built for ``got`` cannot be the ``want`` target's.  ``exact``: ``got`` is
    ptxas's own ``-arch`` (the cubin's note); otherwise it is nvdisasm's ``.target``, which shows a
    family-specific target without its ``f`` (and older tools an arch-specific one without its
    ``a``)."""
    if got is None:
        return True
    if exact:
        return got != want
    return got.rstrip("af") != want.rstrip("af")


def sass_problems(entry: dict, sass: str, arch: str | None = None) -> list[str]:
    """What is wrong with one variant's disassembly: its target against the manifest's (``arch``:
    the target ptxas recorded in the cubin, where known), and each of the family's required
    instruction patterns that it lacks (empty when it proves the family)."""
    problems = []
    got = arch or sass_target(sass)
    if target_problem(entry["target"], got, exact=arch is not None):
        problems.append(f"cubin is for {got}, manifest says {entry['target']}")
    missing = [p for p in entry["sass_requirements"] if not re.search(p, sass)]
    if missing:
        problems.append(f"SASS lacks {missing}")
    return problems


def verify(bundle: str | Path) -> tuple[list[str], list[str]]:
    bundle = Path(bundle)
    m = load_manifest(bundle)
    problems: list[str] = []
    report: list[str] = []
    if not file_ok(bundle, m["host_library"]):
        problems.append(f"host library {m['host_library']['path']}: sha256 mismatch or missing")
    for name, v in sorted(m["variants"].items()):
        bad = [f"{name}: {kind} {f['path']}: sha256 mismatch or missing"
               for kind, f in v["files"].items() if not file_ok(bundle, f)]
        problems += bad
        if bad:
            continue
        cubin = bundle / v["files"]["cubin"]["path"]
        sass = disassemble(cubin)
        got = cubin_target(cubin.read_bytes(), sass)
        bad_sass = sass_problems(v, sass, arch=got)
        problems += [f"{name}: {p}" for p in bad_sass]
        hist = opcode_histogram(sass)
        spills = sum(c for op, c in hist.items() if op.startswith(("LDL", "STL")))
        found = ", ".join(_shown(m_.group(0)) for p in v["sass_requirements"] if (m_ := re.search(p, sass)))
        report.append(f"{'ok ' if not bad_sass else 'BAD'} {name}  [{got}]  {found}"
                      f"  regs={v['resources']['registers']} spill-instr={spills}")
    return problems, report
