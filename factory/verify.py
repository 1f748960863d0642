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
import struct
from pathlib import Path

from .atoms.targets import TARGETS
from .compiler.cubin import cubin_target, disassemble, kernel_resources, opcode_histogram
from .compiler.sass import role_registers, sass_problems, setmaxnreg_counts
from .runtime.manifest import file_problem, host_library_problem, load_manifest, variant_problems

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


def proof_problems(bundle: Path, m: dict) -> list[str]:
    """Every ``executed`` label backed by a run record the bundle carries (``evidence/``, hashed in
    the manifest) in which this cubin's sha256 passed; every ``portability-build`` label by an
    ``executed`` sm_90 twin (factory/evidence.py, docs/proof.md)."""
    from .evidence import passed_cubins, read_record

    problems, records = [], {}
    for f in m.get("evidence", []):
        bad = file_problem(bundle, f)
        if bad:
            problems.append(f"run record {f['path']} {bad}")
            continue
        try:
            records[f["path"]] = read_record(bundle / f["path"])
        except ValueError as e:
            problems.append(str(e))
    passed = passed_cubins(records)
    variants = m["variants"]
    for name, v in sorted(variants.items()):
        if v.get("proof") == "executed" and v["files"]["cubin"]["sha256"] not in passed:
            problems.append(f"{name}: labelled executed, but no run record in the bundle shows its cubin passed")
        if v.get("proof") == "portability-build":
            twin = variants.get(v.get("portability_twin", ""), {})
            if twin.get("proof") != "executed":
                problems.append(f"{name}: labelled portability-build, but its sm_90 twin "
                                f"{v.get('portability_twin')!r} is not executed in this bundle")
    return problems


def verify(bundle: str | Path, progress=None) -> tuple[list[str], list[str]]:
    """(problems, report lines) of a bundle.  The manifest and the files are checked as the loader
    checks them (runtime/manifest.py: a manifest it refuses raises BundleError here too).
    ``progress(done, total, name)`` is called before each variant's checks."""
    bundle = Path(bundle)
    m = load_manifest(bundle)
    problems: list[str] = []
    report: list[str] = []
    lib = host_library_problem(bundle, m)
    if lib:
        problems.append(lib)
    problems += proof_problems(bundle, m)
    for i, (name, v) in enumerate(sorted(m["variants"].items())):
        if progress is not None:
            progress(i, len(m["variants"]), name)
        bad = variant_problems(bundle, name, v)
        problems += bad
        if bad:
            continue
        cubin = bundle / v["files"]["cubin"]["path"]
        try:  # (a manifest re-stamped for a file that is no cubin: reported, not a traceback)
            sass = disassemble(cubin)
            data = cubin.read_bytes()
            got = cubin_target(data, sass)
            bad_sass = sass_problems(v["target"], v["sass_requirements"], sass, arch=got)
            bad_sass += resource_problems(v, data, sass)
        except (RuntimeError, ValueError, LookupError, struct.error) as e:
            problems.append(f"{cubin}: {name}'s cubin is not a cubin nvdisasm and the ELF reader take ({e})")
            report.append(f"BAD {name}  not a readable cubin")
            continue
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
