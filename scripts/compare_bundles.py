"""Compare the cubins of two bundles variant by variant: byte-identical, identical ``.text``
sections, identical SASS once register numbers (and reuse flags) are normalised, the same
instructions in another order ("reordered"), or different
(then the opcode counts that changed).  For proving that a refactor left the kernels as they were.

    python3 scripts/compare_bundles.py BEFORE_BUNDLE AFTER_BUNDLE [--filter GLOB] [--diff N]
        [--by-family [--opcodes FSEL,MUFU.EX2]] [--csv OUT.csv]

``--by-family``: one line per (family, target): how many variants of each kind, and summed over
the variants that differ the SASS instruction count, the named opcodes' counts, code bytes and
the largest register count, before -> after.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.compiler.cubin import _sections, disassemble, opcode_histogram  # noqa: E402

_REG = re.compile(r"\b(U?R|U?P|B)\d+\b")
_COMMENT = re.compile(r"/\*.*?\*/")
_LABEL = re.compile(r"\.L_x_\d+")


def _cubin(bundle: Path, entry: dict) -> Path:
    return bundle / entry["files"]["cubin"]["path"]


def _text(data: bytes) -> dict[str, bytes]:
    return {k: data[o:o + n] for k, (_t, o, n, _i) in _sections(data).items() if k.startswith(".text.")}


def _norm_sass(sass: str) -> list[str]:
    """Instructions without addresses, encodings, register numbers (and the operand-reuse flags
    that follow them) and label numbers."""
    out, labels = [], {}
    for line in sass.splitlines():
        # (operand-reuse flags follow the register assignment)
        line = _REG.sub(lambda m: m.group(1), _COMMENT.sub("", line)).replace(".reuse", "").strip()
        # labels are numbered across the whole cubin: renumber by first appearance
        line = _LABEL.sub(lambda m: labels.setdefault(m.group(0), f".L{len(labels)}"), line)
        if line and not line.startswith((".section", ".sectionflags", ".sectioninfo", "//")):
            out.append(line)
    return out


def compare(before: Path, after: Path, glob: str = "*") -> dict[str, tuple[str, dict]]:
    mb = json.loads((before / "manifest.json").read_text())["variants"]
    ma = json.loads((after / "manifest.json").read_text())["variants"]
    out: dict[str, tuple[str, dict]] = {}
    for name in sorted(set(mb) | set(ma)):
        if not fnmatch.fnmatch(name, glob):
            continue
        if name not in mb or name not in ma:
            out[name] = ("only-after" if name in ma else "only-before", {})
            continue
        pb, pa = _cubin(before, mb[name]), _cubin(after, ma[name])
        db, da = pb.read_bytes(), pa.read_bytes()
        if db == da:
            out[name] = ("bytes", {})
            continue
        if _text(db) == _text(da):
            out[name] = ("text", {})
            continue
        sb, sa = disassemble(pb), disassemble(pa)
        nb, na = _norm_sass(sb), _norm_sass(sa)
        if nb == na:
            out[name] = ("sass-regs", {})
            continue
        if sorted(nb) == sorted(na):  # the same instructions, some in another order
            out[name] = ("reordered", {"lines_moved": sum(x != y for x, y in zip(nb, na)), "total": 0,
                                       "before_total": len(nb)})
            continue
        hb, ha = Counter(opcode_histogram(sb)), Counter(opcode_histogram(sa))
        delta = {k: ha[k] - hb[k] for k in sorted(set(hb) | set(ha)) if ha[k] != hb[k]}
        delta["total"] = sum(ha.values()) - sum(hb.values())
        delta["before_total"] = sum(hb.values())
        out[name] = ("differs", delta)
    return out


def family_summary(before: Path, after: Path, res: dict, opcodes: list[str]) -> list[str]:
    mb = json.loads((before / "manifest.json").read_text())["variants"]
    ma = json.loads((after / "manifest.json").read_text())["variants"]
    groups: dict[tuple[str, str], list[str]] = {}
    for name in res:
        e = ma.get(name) or mb[name]
        groups.setdefault((e["family"], e["target"]), []).append(name)
    lines = []
    for (fam, tgt), names in sorted(groups.items()):
        kinds = Counter(res[n][0] for n in names)
        line = f"{fam:12s} {tgt:8s} " + ", ".join(f"{c} {k}" for k, c in sorted(kinds.items()))
        diff = [n for n in names if res[n][0] == "differs"]
        if diff:
            tot = {"instructions": [0, 0], "code bytes": [0, 0], **{o: [0, 0] for o in opcodes}}
            regs = [0, 0]
            for n in diff:
                for i, (m, b) in enumerate(((mb, before), (ma, after))):
                    h = opcode_histogram(disassemble(_cubin(b, m[n])))
                    tot["instructions"][i] += sum(h.values())
                    for o in opcodes:
                        tot[o][i] += h.get(o, 0)
                    r = m[n]["resources"]
                    tot["code bytes"][i] += sum(k["code_bytes"] for k in r["kernels"].values())
                    regs[i] = max(regs[i], r["registers"])
            line += "; differing: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in tot.items())
            line += f", max registers {regs[0]} -> {regs[1]}"
        lines.append(line)
    return lines


def write_csv(out: Path, before: Path, after: Path, res: dict) -> None:
    import csv

    mb = json.loads((before / "manifest.json").read_text())["variants"]
    ma = json.loads((after / "manifest.json").read_text())["variants"]
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "kind", "instructions_before", "instructions_after", "registers_before",
                    "registers_after", "spills_before", "spills_after"])
        for name, (kind, delta) in res.items():
            rb = mb.get(name, {}).get("resources", {})
            ra = ma.get(name, {}).get("resources", {})
            ib = delta.get("before_total", "")
            ia = ib + delta["total"] if delta else ""
            w.writerow([name, kind, ib, ia, rb.get("registers", ""), ra.get("registers", ""),
                        rb.get("spill_instructions", ""), ra.get("spill_instructions", "")])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--filter", default="*", help="glob over variant names")
    p.add_argument("--diff", type=int, default=40, help="list at most this many differing variants")
    p.add_argument("--by-family", action="store_true", help="summary per (family, target)")
    p.add_argument("--opcodes", default="FSEL", help="with --by-family: opcodes to count")
    p.add_argument("--csv", type=Path, help="one row per variant: kind, SASS instructions (differing "
                   "ones), registers and spill instructions before/after")
    a = p.parse_args()
    res = compare(a.before, a.after, a.filter)
    if a.csv:
        write_csv(a.csv, a.before, a.after, res)
    if a.by_family:
        for line in family_summary(a.before, a.after, res, [o for o in a.opcodes.split(",") if o]):
            print(line)
    kinds = Counter(k for k, _ in res.values())
    print(f"{len(res)} variants: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    shown = 0
    for name, (kind, delta) in res.items():
        if kind in ("bytes", "text", "sass-regs") or shown >= a.diff:
            continue
        shown += 1
        print(f"  {kind:12s} {name} {json.dumps(delta) if delta else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
