"""Fuzzes a bundle's manifest.json: random edits of its JSON tree (fields deleted, retyped, set to
edge values, paths pointed outside the bundle, nesting deepened) and of its bytes, each written
into a small bundle, then every consumer run on it.  Each must either accept the manifest or raise
BundleError (the loader may also answer NoVariantError); anything else -- a KeyError, a
TypeError, a RecursionError -- is a failure, reported with the edit that caused it.

The consumers: ``load_manifest``; ``Bundle.open`` and a simulated load of every variant
(``preload``, building each variant's argument binder); ``bundle_problems``; ``verify`` (its
disassembly memoised per file, since the fuzz is of the manifest); ``doctor.report``; the command
line's ``list`` and ``inspect``; and the host library's generated C glue and selection tables
(``link.glue_source``: what ``python -m factory link`` would compile).

usage: python tests/fuzz_manifest.py BUNDLE SEED ITERATIONS   (BUNDLE: a bundle to copy from)
Prints one JSON line: {"iterations", "accepted", "refused", "failures": [...]}; exit 1 on failures.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import random
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import Recorder  # noqa: E402
from tampering import pick, small_copy, write_manifest  # noqa: E402

from factory import doctor, verify  # noqa: E402
from factory.__main__ import main as factory_main  # noqa: E402
from factory.compiler import link  # noqa: E402
from factory.runtime import Bundle, BundleError, NoVariantError  # noqa: E402
from factory.runtime.manifest import bundle_problems, load_manifest  # noqa: E402

EDGE = [None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63) - 1, 1.5, float("inf"), "", "x", "../x", "/etc/passwd",
        "a" * 5000, "\x00", "é", [], {}, [1, 2], {"path": "/etc/passwd"}, "int64_t", "cubin/../../x"]


def nodes(value, path=()):
    """Every (path, value) of a JSON tree."""
    out = [(path, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            out += nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += nodes(v, path + (i,))
    return out


def at(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def mutate(m: dict, rng: random.Random) -> tuple[object, str]:
    """One random edit of a copy of ``m``: (the new manifest, or its text; what was done)."""
    m = copy.deepcopy(m)
    if rng.random() < 0.1:  # bytes: flip, cut or insert
        text = json.dumps(m)
        i = rng.randrange(len(text))
        how = rng.choice(["flip", "cut", "insert"])
        if how == "flip":
            text = text[:i] + chr(rng.randrange(32, 127)) + text[i + 1:]
        elif how == "cut":
            text = text[:i]
        else:
            text = text[:i] + rng.choice(["[", "{", "]", '"', ",", "\\", "1e999", "-"]) * rng.randint(1, 4) + text[i:]
        return text, f"text {how} at {i}"
    path, value = rng.choice(nodes(m)[1:])
    parent = at(m, path[:-1])
    key = path[-1]
    how = rng.choice(["delete", "edge", "edge", "retype", "nest", "path", "rename", "duplicate"])
    if how == "delete":
        del parent[key]
    elif how == "edge":
        parent[key] = copy.deepcopy(rng.choice(EDGE))
    elif how == "retype":
        parent[key] = str(value) if not isinstance(value, str) else (len(value) if rng.random() < 0.5 else [value])
    elif how == "nest":
        deep = value
        for _ in range(rng.choice([2, 30, 200])):
            deep = [deep] if rng.random() < 0.5 else {"x": deep}
        parent[key] = deep
    elif how == "path":
        parent[key] = rng.choice(["../manifest.json", "/proc/self/environ", "lib/../../b/lib/libfactory_bundle.so",
                                  "cubin", ".", "lib//libfactory_bundle.so", "./lib/libfactory_bundle.so"])
    elif how == "rename" and isinstance(parent, dict):
        parent[rng.choice(["name", "files", "../x", "", "variants", 'x"); abort(); ("'])] = parent.pop(key)
    elif how == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(value))
    return m, f"{how} {'.'.join(map(str, path))}"


@functools.lru_cache(maxsize=None)
def _disassemble_cached(path: str, size: int, mtime: float) -> str:
    return _disassemble(Path(path))


_disassemble = verify.disassemble


def consumers(path: Path) -> list[str]:
    """Run every consumer on the bundle at ``path``; the names of those that did not raise."""
    ok = []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            m = load_manifest(path)
        except BundleError:
            m = None
        rep = doctor.report(path)  # never raises
        assert isinstance(rep, dict)
        for args in (["list", str(path)], ["inspect", str(path), "x"]):
            assert factory_main(args) in (0, 1)
        if m is None:
            return ok
        ok.append("load_manifest")
        bundle_problems(path, m)
        try:
            verify.verify(path)
            ok.append("verify")
        except BundleError:
            pass
        link.glue_source(m["variants"])
        try:
            b = Bundle.open(path, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
            b.simulate(Recorder())
            for name in m["variants"]:
                b.binder(name)
            b.preload()
            b.describe_contents()
            ok.append("loader")
        except (BundleError, NoVariantError):
            pass
    return ok


def main() -> int:
    src, seed, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    verify.disassemble = lambda p: _disassemble_cached(str(p), p.stat().st_size, p.stat().st_mtime)
    failures, accepted = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b"
        src_m = json.loads((src / "manifest.json").read_text())
        names = pick(src_m, "sm_90", "gemm", 1) + pick(src_m, "sm_90", "attention", 1)
        base = small_copy(src, path, names)
        assert consumers(path) == ["load_manifest", "verify", "loader"], "the unedited copy must pass"
        for i in range(n):
            m, what = mutate(base, rng)
            write_manifest(path, m)
            try:
                accepted += "load_manifest" in consumers(path)
            except Exception as e:  # noqa: BLE001 - the failure being looked for
                failures.append({"iteration": i, "edit": what, "error": f"{type(e).__name__}: {e}"[:300],
                                 "where": traceback.format_exc().strip().splitlines()[-3][:200]})
    print(json.dumps({"iterations": n, "accepted": accepted, "refused": n - accepted - len(failures),
                      "failures": failures[:20]}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
