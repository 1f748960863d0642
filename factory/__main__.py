"""python -m factory {build,link,list,verify,inspect,doctor}"""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_build(a) -> int:
    from .compiler.builder import build

    s = build(a.out, a.targets, a.ops, tier=a.tier, name_filter=a.filter, jobs=a.jobs, cache=a.cache,
              evidence=a.evidence)
    print(f"built {s['bundle']}: {s['variants']} variants ({s['compiled']} compiled, {s['cached']} from cache) "
          f"in {s['seconds']} s, {s['bytes'] / 1e6:.2f} MB")
    print("proof labels: " + ", ".join(f"{k} {n}" for k, n in sorted(s["proof"].items()))
          + (f" (run records: {', '.join(s['evidence'])})" if s["evidence"] else " (no run record applies)"))
    return 0


def _cmd_link(a) -> int:
    from .compiler.link import relink

    s = relink(a.bundle, a.cuda)
    print(f"relinked {s['bundle']}: {s['variants']} variants; CUDA runtime {s['cuda_runtime']}; "
          f"tuning compiled in: {s['tuning']}")
    return 0


def _cmd_list(a) -> int:
    from .runtime.manifest import load_manifest

    m = load_manifest(a.bundle)
    rows = [("name", "op", "target", "proof", "regs", "smem KB", "spills")]
    for v in m["variants"].values():
        r = v["resources"]
        rows.append((v["name"], v["op"], v["target"], v["proof"], str(r["registers"]),
                     f"{r['dynamic_smem_bytes'] / 1024:.0f}", str(r["spill_instructions"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"{len(rows) - 1} variants; DSL {m.get('versions', {}).get('nvidia-cutlass-dsl')}")
    return 0


def _cmd_verify(a) -> int:
    from .verify import verify

    import time

    start, last = time.monotonic(), [0.0]

    def progress(done: int, total: int, name: str) -> None:  # one line per 10 s (or per 50 variants)
        now = time.monotonic()
        if done and (now - last[0] >= 10 or done % 50 == 0):
            last[0] = now
            print(f"verify: {done}/{total} variants checked ({now - start:.0f} s), at {name}", file=sys.stderr,
                  flush=True)

    problems, report = verify(a.bundle, progress)
    for line in report:
        print(line)
    if problems:
        print(f"FAILED: {len(problems)} problem(s)", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print("verify: OK")
    return 0


def _cmd_inspect(a) -> int:
    from .runtime.manifest import load_manifest

    m = load_manifest(a.bundle)
    if a.variant not in m["variants"]:
        import difflib

        names = sorted(m["variants"])
        close = [n for n in names if n.startswith(a.variant)][:5] or difflib.get_close_matches(a.variant, names, 5, 0.5)
        hint = f"closest: {', '.join(close)}" if close else "`python -m factory list BUNDLE` lists them"
        print(f"error: no variant {a.variant!r} among the bundle's {len(names)}; {hint}", file=sys.stderr)
        return 1
    print(json.dumps(m["variants"][a.variant], indent=1))
    return 0


def _cmd_doctor(a) -> int:
    from .doctor import healthy, report

    r = report(a.bundle)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        w = max(len(k) for k in r)
        for k, v in r.items():
            print(f"{k.ljust(w)}  {v if not isinstance(v, (list, dict)) else json.dumps(v)}")
    return 0 if healthy(r) else 1


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    p = argparse.ArgumentParser(prog="python -m factory", description=__doc__)
    p.add_argument("--version", action="version", version=f"kernel-factory {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile variants into a bundle (no GPU needed)")
    b.add_argument("--targets", nargs="+", required=True, help="e.g. sm_80 sm_86 sm_89 sm_90 sm_90a (or sm_80,sm_90a)")
    b.add_argument("--ops", nargs="+", default=None, help="gemm, attention (default: all)")
    b.add_argument("--out", required=True)
    b.add_argument("--tier", default="default", choices=("test", "default", "full"))
    b.add_argument("--filter", default=None, help="glob over variant names")
    b.add_argument("--jobs", type=int, default=None, help="compile worker processes (default: cores)")
    b.add_argument("--cache", default=None, help="compile cache dir (default: ~/.cache/kernel-factory)")
    b.add_argument("--evidence", default=None,
                   help="run records that proof labels come from (default: evidence/runs; docs/proof.md)")
    b.set_defaults(fn=_cmd_build)
    k = sub.add_parser("link", help="relink a bundle's host library, its tuning.json compiled into the C selection")
    k.add_argument("bundle")
    k.add_argument("--cuda", type=int, choices=(12, 13), default=None,
                   help="the CUDA runtime major to link (default: the one the bundle records; 12 needs "
                        "nvidia-cuda-runtime-cu12: docs/packaging.md)")
    k.set_defaults(fn=_cmd_link)
    for name, fn, helptext in (("list", _cmd_list, "one line per variant"),
                               ("verify", _cmd_verify, "hashes and SASS of every variant")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("bundle")
        s.set_defaults(fn=fn)
    d = sub.add_parser("doctor", help="this machine, its GPU and what the bundle runs here (for bug reports)")
    d.add_argument("bundle", nargs="?", default=None,
                   help="default: artifacts/default if present, else the installed kernels package for this GPU")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=_cmd_doctor)
    i = sub.add_parser("inspect", help="a variant's manifest entry")
    i.add_argument("bundle")
    i.add_argument("variant")
    i.set_defaults(fn=_cmd_inspect)
    a = p.parse_args(argv)
    import os

    from .runtime.errors import BundleError, InputError, NoVariantError

    try:
        return a.fn(a)
    except (BundleError, InputError, NoVariantError, ValueError, OSError) as e:
        # a user's mistake (a path that is not a bundle, a tampered bundle, a bad target or filter):
        # one line, no traceback (FACTORY_TRACEBACK=1 shows it)
        if os.environ.get("FACTORY_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
