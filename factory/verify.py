"""``python -m factory verify``: every hash, and every cubin's disassembly against what its kernel
family must contain (read from the manifest, so no DSL is needed)."""

from __future__ import annotations

import re
from pathlib import Path

from .compiler.cubin import disassemble, opcode_histogram, sass_target
from .runtime.manifest import file_ok, load_manifest

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_SETMAXREG = re.compile(r"\bUSETMAXREG\.(TRY_ALLOC|DEALLOC)\.CTAPOOL\b(?:\s+UP\d+,)?\s+(0x[0-9a-f]+|\d+)")


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


def _shown(match: str) -> str:
    """A requirement's match for the report: an order requirement (a match over several SASS
    lines) as its first and last instruction."""
    if "\n" not in match:
        return match
    words = match.split()
    return f"{words[0]} … {words[-1]}"


def sass_problems(entry: dict, sass: str) -> list[str]:
    """What is wrong with one variant's disassembly: its target against the manifest's, and each of
    the family's required instruction patterns that it lacks (empty when it proves the family)."""
    problems = []
    got = sass_target(sass)
    if got is None or got.rstrip("a") != entry["target"].rstrip("a"):
        problems.append(f"cubin is for {got}, manifest says {entry['target']}")
    missing = [p for p in entry["sass_requirements"] if not re.search(p, sass)]
    if missing:
        problems.append(f"SASS lacks {missing}")
    # Warp-specialised kernels (setmaxnreg): each role's code within the registers it set.
    over = [r for r in role_registers(sass) if r["max_register"] >= r["limit"]]
    if over:
        problems.append("registers past a setmaxnreg budget: " + ", ".join(
            f"R{r['max_register']} after {r['action']} {r['limit']}" for r in over))
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
        sass = disassemble(bundle / v["files"]["cubin"]["path"])
        got = sass_target(sass)
        bad_sass = sass_problems(v, sass)
        problems += [f"{name}: {p}" for p in bad_sass]
        hist = opcode_histogram(sass)
        spills = sum(c for op, c in hist.items() if op.startswith(("LDL", "STL")))
        found = ", ".join(_shown(m_.group(0)) for p in v["sass_requirements"] if (m_ := re.search(p, sass)))
        roles = "".join(f" {r['limit']}:R{r['max_register']}" for r in role_registers(sass))
        report.append(f"{'ok ' if not bad_sass else 'BAD'} {name}  [{got}]  {found}"
                      f"  regs={v['resources']['registers']}{' roles' + roles if roles else ''}"
                      f" spill-instr={spills}")
    return problems, report
