"""Build a bundle: enumerate variants, compile the ones the cache lacks in worker processes, copy
everything into the bundle directory, link the host library and write the manifest.

Bundle layout::

    manifest.json          schema, versions, every variant (see docs/bundle-format.md)
    cubin/<name>.cubin     each variant's device code, on its own (nvdisasm / cuobjdump ready)
    include/<name>.h       the DSL's exported header (struct layouts, wrapper)
    include/fx_bundle.h    the host library's exported functions, for C/C++ callers
    obj/<name>.o.gz        the exported host launcher with the cubin embedded (gzip; for C/C++ linking)
    src/fx_glue.c          the generated glue that the host library is built from
    lib/libfactory_bundle.so   the host library the runtime loads with ctypes
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from ..atoms.targets import get_target
from ..evidence import PROOF_LEVELS, load_records, passed_cubins, proof_label, twin_name
from ..evidence import default_dir as default_evidence_dir
from ..registry import enumerate_variants
from ..runtime.manifest import manifest_text, sha256_file
from ..variant import Variant
from . import toolchain
from .cubin import disassemble, opcode_histogram, ptxas_arch
from .link import link_host_library, pack_object
from .sass import checker_version, sass_problems
from .toolchain import default_cache_dir

SCHEMA_VERSION = 1
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
HOST_LIB = "lib/libfactory_bundle.so"


def cache_key(v: Variant) -> str:
    """Content address of a compiled variant: kernel source, config, target, tool versions."""
    h = hashlib.sha256()
    h.update(json.dumps({
        "schema": SCHEMA_VERSION, "name": v.name, "config": v.config(), "cls": type(v).__qualname__,
        "versions": toolchain.versions(),
    }, sort_keys=True, default=str).encode())
    h.update(_target_record(v.target).encode())
    for rel in sorted(set(v.sources) | {"compiler/compile.py", "compiler/cubin.py", "variant.py"}):
        h.update(rel.encode())
        h.update((PACKAGE_ROOT / rel).read_bytes())
    return h.hexdigest()[:32]


def _target_record(name: str) -> str:
    """The target as the cache key sees it: its registry record (not the whole of atoms/targets.py:
    adding or changing another target must not recompile every variant), fields at their default
    left out (adding a field to Target must not either)."""
    import dataclasses

    t = get_target(name)
    return repr([(f.name, getattr(t, f.name)) for f in dataclasses.fields(t)
                 if f.default is dataclasses.MISSING or getattr(t, f.name) != f.default])


# --- worker side ---------------------------------------------------------------------------------
def _init(target: str) -> None:
    from .compile import init_worker

    init_worker(target)


def _compile_into_cache(v: Variant, entry: str) -> dict:
    from .compile import compile_variant

    entry_p = Path(entry)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry_p.parent))
    try:
        info = compile_variant(v, tmp)
        # Disassemble once, here: the SASS check and histogram are cached with the cubin.
        sass = disassemble(tmp / f"{v.name}.cubin")
        info.update(_check_sass(v, tmp / f"{v.name}.cubin", sass))
        info["sass_histogram"] = opcode_histogram(sass)
        (tmp / "info.json").write_text(json.dumps(info, indent=1))
        try:
            tmp.rename(entry_p)  # atomic publish; a concurrent builder may have won the race
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def compile_cached(v: Variant, out_dir: str | Path, cache: str | Path | None = None) -> dict:
    """``compile.compile_variant(v, out_dir)`` through the build's cache: the cubin, header and
    object of ``v`` in ``out_dir`` and its info, compiled only if the cache lacks them (then into
    the cache, for builds and later callers).  For a process that ran ``compile.init_worker`` for
    ``v``'s target, as ``compile_variant`` needs."""
    cache = Path(cache) if cache else default_cache_dir()
    entry = cache / f"{v.name}-{cache_key(v)}"
    if not (entry / "info.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        _compile_into_cache(v, str(entry))
    for ext in (".cubin", ".h", ".o"):
        shutil.copy2(entry / f"{v.name}{ext}", Path(out_dir) / f"{v.name}{ext}")
    return json.loads((entry / "info.json").read_text())


# --- driver ---------------------------------------------------------------------------------------
def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="variant", file=sys.stderr, disable=total == 0)
    except ImportError:  # pragma: no cover
        class _P:
            def __init__(self):
                self.n = 0

            def update(self, k=1):
                self.n += k
                print(f"{desc}: {self.n}/{total}", file=sys.stderr)

            def close(self):
                pass

        return _P()


def compile_all(variants: list[Variant], jobs: int, cache: Path) -> tuple[dict[str, Path], int]:
    """Cache entries for every variant; returns (name -> entry dir, number compiled now)."""
    cache.mkdir(parents=True, exist_ok=True)
    entries = {v.name: cache / f"{v.name}-{cache_key(v)}" for v in variants}
    todo = [v for v in variants if not (entries[v.name] / "info.json").exists()]
    by_target: dict[str, list[Variant]] = defaultdict(list)
    for v in todo:
        by_target[v.target].append(v)
    bar = _progress(len(todo), "compiling")
    errors = []
    ctx = mp.get_context("spawn")
    try:
        for target, vs in by_target.items():
            # One pool per target: CUTE_DSL_ARCH must be set before the worker imports cutlass.
            with cf.ProcessPoolExecutor(max_workers=max(1, min(jobs, len(vs))), mp_context=ctx,
                                        initializer=_init, initargs=(target,)) as pool:
                futs = {pool.submit(_compile_into_cache, v, str(entries[v.name])): v for v in vs}
                for fut in cf.as_completed(futs):
                    try:
                        fut.result()
                    except Exception as e:  # noqa: BLE001 - report every failure, then stop
                        errors.append(f"{futs[fut].name}: {type(e).__name__}: {e}")
                    bar.update(1)
    finally:
        bar.close()
    if errors:
        raise RuntimeError("compilation failed:\n" + "\n".join(errors))
    return entries, len(todo)


def _replace_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _check_sass(v: Variant, cubin: Path, sass: str | None = None) -> dict:
    """The SASS check of a compiled variant (:func:`factory.compiler.sass.sass_problems`, the same
    check ``verify`` runs), with the version of the check that made it (the cache keeps both)."""
    sass = disassemble(cubin) if sass is None else sass
    return {"sass_problems": sass_problems(v.target, v.sass_requirements(), sass, ptxas_arch(cubin.read_bytes())),
            "sass_checked_by": checker_version()}


def build(
    out: str | Path, targets: list[str], ops: list[str] | None = None, tier: str = "default",
    name_filter: str | None = None, jobs: int | None = None, cache: str | Path | None = None,
    evidence: str | Path | None = None,
) -> dict:
    """Build a bundle into ``out`` (replacing what is there); returns a summary.  Targets and ops
    may also be given with commas (``["sm_80,sm_90a"]``).  ``evidence``: the directory of run
    records that proof labels come from (default: ``factory.evidence.default_dir()``)."""
    t0 = time.perf_counter()
    out = Path(out)
    targets = [t for x in targets for t in x.split(",") if t]
    ops = [o for x in ops for o in x.split(",") if o] if ops else ops
    variants = enumerate_variants(targets, ops, tier=tier, name_filter=name_filter)
    if not variants:
        raise ValueError(f"no variants for targets={targets} ops={ops} tier={tier} filter={name_filter}")
    jobs = jobs or max(1, os.cpu_count() or 1)
    cache = Path(cache) if cache else default_cache_dir()
    entries, compiled = compile_all(variants, jobs, cache)

    staging = Path(tempfile.mkdtemp(prefix=".bundle-", dir=out.parent if out.parent.exists() else None))
    try:
        for sub in ("cubin", "include", "obj"):
            (staging / sub).mkdir()
        records = []
        for v in sorted(variants, key=lambda v: v.name):
            e = entries[v.name]
            info = json.loads((e / "info.json").read_text())
            if info.get("sass_checked_by") != checker_version():
                # Compiled before the SASS check last changed: check the cached cubin again.
                info.update(_check_sass(v, e / f"{v.name}.cubin"))
                _replace_json(e / "info.json", info)
            for ext, sub in ((".cubin", "cubin"), (".h", "include"), (".o", "obj")):
                shutil.copy2(e / f"{v.name}{ext}", staging / sub / f"{v.name}{ext}")
            _patch_cubin(v, staging)
            pack_object(staging / "obj" / f"{v.name}.o")
            if info["sass_problems"]:
                raise RuntimeError(f"{v.name}: " + "; ".join(info["sass_problems"]))
            hist = info["sass_histogram"]
            records.append((v, info, hist))
        entries = _variant_entries(staging, records)
        used = _label_proofs(staging, entries, Path(evidence) if evidence else default_evidence_dir())
        link_host_library(staging, entries, cache=cache)  # its selection tables come from the entries
        manifest = _manifest(staging, entries, used)
        (staging / "manifest.json").write_text(manifest_text(manifest))
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    total_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    labels: dict[str, int] = {}
    for e in manifest["variants"].values():
        labels[e["proof"]] = labels.get(e["proof"], 0) + 1
    return {
        "bundle": str(out), "variants": len(variants), "compiled": compiled, "proof": labels,
        "evidence": used,
        "cached": len(variants) - compiled, "seconds": round(time.perf_counter() - t0, 1),
        "bytes": total_bytes,
    }


def _patch_cubin(v: Variant, staging: Path) -> None:
    """A variant that asks for edits of its compiled cubin (``cubin_edits``, compiler/sass_patch.py:
    scheduling hints) gets the edited cubin in the bundle, in its cubin file and inside its launcher
    object alike."""
    edits = getattr(v, "cubin_edits", ())
    if not edits:
        return
    from .sass_patch import apply_edits, patch_object

    cubin_path = staging / "cubin" / f"{v.name}.cubin"
    cubin = cubin_path.read_bytes()
    patched = apply_edits(cubin, edits, v.name)
    obj_path = staging / "obj" / f"{v.name}.o"
    obj_path.write_bytes(patch_object(obj_path.read_bytes(), cubin, patched))
    cubin_path.write_bytes(patched)


def _constraints(v: Variant, info: dict) -> dict:
    """What a problem must satisfy, spelled out from the signature and the header."""
    from ..abi import TensorArg

    sig = v.signature()
    tensors = [a for a in sig.args if isinstance(a, TensorArg)]
    size32 = any(st["shape_ctype"] == "int32_t" and st["n_shapes"] for st in info["header"]["structs"].values())
    return {
        "pointer_alignment_bytes": {a.name: a.align for a in tensors},
        "multiple_of": dict(sig.divisibility),  # sizes and strides, in elements
        "max_size": 2**31 - 1 if size32 else 2**63 - 1,
    }


_KEY_OPCODES = ("HMMA", "QMMA", "HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCMMA", "UTCCP", "LDGSTS",
                "LDSM", "UTMALDG", "UTMASTG", "LDL", "STL", "MUFU.EX2")


def _variant_entries(bundle: Path, records: list[tuple[Variant, dict, dict]]) -> dict:
    """The manifest's ``variants``: name -> entry, in name order."""
    variants = {}
    for v, info, hist in records:
        files = {}
        for kind, rel in (("cubin", f"cubin/{v.name}.cubin"), ("header", f"include/{v.name}.h"),
                          ("object", f"obj/{v.name}.o.gz")):
            p = bundle / rel
            files[kind] = {"path": rel, "sha256": sha256_file(p), "bytes": p.stat().st_size}
        kernels = info["kernels"]
        spill = sum(k["stack_frame_bytes"] for k in kernels.values()) + sum(
            c for op, c in hist.items() if op.startswith(("LDL", "STL")))
        tgt = get_target(v.target)
        variants[v.name] = {
            "name": v.name,
            "op": v.op,
            "family": v.family,
            "target": v.target,
            "config": v.config(),
            **v.describe(),
            "signature": v.signature().to_json(),
            "constraints": {**v.describe().get("constraints", {}), **_constraints(v, info)},
            "abi": {"wrapper": info["header"]["wrapper"], "params": info["header"]["params"],
                    "structs": info["header"]["structs"]},
            # The best label its target and family allow (a family may know better than its target,
            # e.g. an instruction path no GPU here runs); _label_proofs replaces it with what the run
            # records show.
            "proof": v.proof_level() if hasattr(v, "proof_level") else tgt.proof,
            "resources": {
                "registers": max(k["registers"] for k in kernels.values()),
                "dynamic_smem_bytes": v.smem_bytes(),
                "static_smem_bytes": max(k["static_smem_bytes"] for k in kernels.values()),
                "stack_frame_bytes": max(k["stack_frame_bytes"] for k in kernels.values()),
                "spill_instructions": spill,
                "kernels": kernels,
            },
            "sass": {op: sum(c for o, c in hist.items() if o == op or o.startswith(op + "."))
                     for op in _KEY_OPCODES},
            "sass_requirements": list(v.sass_requirements()),
            "compile_seconds": info["compile_seconds"],
            "files": files,
        }
    return variants


def _label_proofs(bundle: Path, variants: dict, evidence: Path) -> list[str]:
    """Each variant's ``proof`` from the run records (factory/evidence.py, docs/proof.md):
    ``executed`` only where a record shows this cubin (its sha256) ran and passed; a portability
    build (sm_8x) is ``portability-build`` only where its sm_90 twin in this bundle is
    ``executed``.  Copies the records that gave an ``executed`` label into ``bundle/evidence/``
    and returns their file names."""
    passed = passed_cubins(load_records(evidence))
    used: set[str] = set()
    for e in variants.values():  # sm_90 / sm_90a first: the portability builds look at their twins
        ceiling = e["proof"]
        if ceiling != "portability-build":
            e["proof"] = proof_label(ceiling, e["files"]["cubin"]["sha256"], passed)
            if e["proof"] == "executed":
                used.add(passed[e["files"]["cubin"]["sha256"]])
                e["evidence"] = "evidence/" + passed[e["files"]["cubin"]["sha256"]]
    for e in variants.values():
        if e["proof"] == "portability-build":
            tgt = get_target(e["target"])
            twin = variants.get(twin_name(e["name"], e["op"], e["target"]) or "") if tgt.capability < (9, 0) else None
            e["proof"] = proof_label("portability-build", e["files"]["cubin"]["sha256"], passed,
                                     twin["proof"] if twin else None)
            if e["proof"] == "portability-build":
                e["portability_twin"] = twin["name"]
    if used:
        (bundle / "evidence").mkdir()
        for fname in sorted(used):
            shutil.copy2(evidence / fname, bundle / "evidence" / fname)
    return sorted(used)


def _manifest(bundle: Path, variants: dict, evidence: list[str] = ()) -> dict:
    lib = bundle / HOST_LIB
    return {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": toolchain.versions(),
        "host_library": {"path": HOST_LIB, "sha256": sha256_file(lib), "bytes": lib.stat().st_size},
        "proof_levels": dict(PROOF_LEVELS),
        # The run records behind the ``executed`` labels (copied from the repository's evidence/runs).
        "evidence": [{"path": f"evidence/{f}", "sha256": sha256_file(bundle / "evidence" / f),
                      "bytes": (bundle / "evidence" / f).stat().st_size} for f in evidence],
        "variants": variants,
    }
