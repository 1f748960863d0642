"""``python -m factory verify``: every hash, every cubin's disassembly against what its kernel
family must contain, and every cubin's resources against the manifest (read from the manifest and
the cubins, so no DSL is needed).

Resources (:func:`resource_problems`): the registers, static shared memory and stack frame the
manifest records must be the cubin's own (read back from its ELF); dynamic + static shared memory
must fit the target's per-CTA capacity and registers x threads the register file.  A
warp-specialized variant (its manifest entry names ``registers_per_role``: the setmaxnreg budget
of each warpgroup role, as the sm90 attention family does) must also show those budgets in its
SASS (``USETMAXREG.DEALLOC`` to the producer's count, ``USETMAXREG.TRY_ALLOC`` to the consumers'),
their sum over the CTA must fit the register file, and it must not spill (no LDL/STL, no stack
frame): its register budget is the design.
"""

from __future__ import annotations

import re
from pathlib import Path

from .atoms.targets import TARGETS
from .compiler.cubin import cubin_target, disassemble, kernel_resources, opcode_histogram
from .compiler.sass import role_registers, sass_problems, setmaxnreg_counts
from .runtime.manifest import file_ok, load_manifest

REGISTER_FILE = 65536  # 32-bit registers per SM (every target the factory builds for)


def _shown(match: str) -> str:
    """A requirement's match for the report: an order requirement (a match over several SASS
    lines) as its first and last instruction."""
    if "\n" not in match:
        return match
    words = match.split()
    return f"{words[0]} … {words[-1]}"


def resource_problems(entry: dict, cubin: bytes, sass: str) -> list[str]:
    """What is wrong with one variant's resources: the manifest's record against the cubin's own,
    the target's shared memory and register file, and for warp-specialized variants the register
    budget per role and spills (module docstring; the SASS itself: :mod:`factory.compiler.sass`).  Empty when all hold."""
    problems = []
    res = entry.get("resources", {})
    kernels = kernel_resources(cubin)
    if not kernels:
        return ["cubin holds no kernel"]
    got = {"registers": max(k["registers"] for k in kernels.values()),
           "static_smem_bytes": max(k["static_smem_bytes"] for k in kernels.values()),
           "stack_frame_bytes": max(k["stack_frame_bytes"] for k in kernels.values())}
    for key, val in got.items():
        if res.get(key) != val:
            problems.append(f"manifest records {key}={res.get(key)}, the cubin has {val}")
    tgt = TARGETS.get(entry["target"])
    smem = int(res.get("dynamic_smem_bytes", 0)) + got["static_smem_bytes"]
    if tgt is not None and smem > tgt.smem_per_cta:
        problems.append(f"shared memory {smem} B (dynamic + static) > {tgt.smem_per_cta} B per CTA on {tgt.name}")
    threads = int(entry.get("threads", 0))
    if threads and got["registers"] * threads > REGISTER_FILE:
        problems.append(f"{got['registers']} registers x {threads} threads > the {REGISTER_FILE}-register file")
    roles = entry.get("registers_per_role")
    if roles is not None and {"producer", "consumer"} <= set(roles):
        counts = setmaxnreg_counts(sass)
        for role, kind in (("producer", "DEALLOC"), ("consumer", "TRY_ALLOC")):
            if counts[kind] != {int(roles[role])}:
                problems.append(f"manifest's {role} budget {roles[role]} registers, the SASS's setmaxnreg "
                                f"{kind.lower()} {sorted(counts[kind]) or 'absent'}")
        consumers = threads // 128 - 1
        total = 128 * (int(roles["producer"]) + consumers * int(roles["consumer"]))
        if threads % 128 or consumers < 1 or total > REGISTER_FILE:
            problems.append(f"register budget per role {roles} over {threads} threads: {total} > {REGISTER_FILE}")
    if roles is not None:
        # (Other role sets -- the sm100 FA4 attention's softmax/correction/mma_tma -- are checked by
        # the SASS check, sass.role_registers: no register past its setmaxnreg budget.)
        hist = opcode_histogram(sass)
        spills = sum(c for op, c in hist.items() if op.startswith(("LDL", "STL")))
        if spills or got["stack_frame_bytes"]:
            problems.append(f"spills: {spills} local-memory instructions, {got['stack_frame_bytes']} B stack frame")
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
        bad_sass = sass_problems(v["target"], v["sass_requirements"], sass, arch=got) + resource_problems(v, cubin.read_bytes(), sass)
        problems += [f"{name}: {p}" for p in bad_sass]
        hist = opcode_histogram(sass)
        spills = sum(c for op, c in hist.items() if op.startswith(("LDL", "STL")))
        found = ", ".join(_shown(m_.group(0)) for p in v["sass_requirements"] if (m_ := re.search(p, sass)))
        roles = v.get("registers_per_role")
        roles = f" roles={'/'.join(str(r) for r in roles.values())}" if roles else ""
        used = "".join(f" {r['limit']}:R{r['max_register']}" for r in role_registers(sass))
        smem = v["resources"].get("dynamic_smem_bytes", 0) + v["resources"].get("static_smem_bytes", 0)
        report.append(f"{'ok ' if not bad_sass else 'BAD'} {name}  [{got}]  {found}"
                      f"  regs={v['resources']['registers']}{roles}{' used' + used if used else ''}"
                      f" smem={smem} spill-instr={spills}")
    return problems, report
