"""Run records: the evidence behind a variant's ``executed`` label (standard library only).

A *run record* is one compact JSON file written on a GPU by ``tests/test_every_variant_gpu.py``
(through the ``run_record`` fixture of ``tests/conftest.py``) or by ``scripts/smoke.py --record``:
the device, driver, torch and CUDA versions, the commit, and for every variant launched its name,
the sha256 of its cubin, its largest relative error against float32, the tolerance and whether it
passed.  The repository keeps them in ``evidence/runs/`` (``docs/proof.md``).

The build (``compiler/builder.py``) reads these records: a variant is labelled ``executed`` only
when a record shows this very cubin (same sha256) ran and passed; otherwise it gets the best label
the rest of the evidence allows (:func:`proof_label`).  The build copies the records it used into
the bundle (``evidence/``), so ``python -m factory verify`` can check every ``executed`` label
against them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

FORMAT = "kernel-factory-run/1"
REPO_ROOT = Path(__file__).resolve().parents[1]
# The labels, strongest first (docs/proof.md defines them; the manifest carries these lines).
PROOF_LEVELS = {
    "executed": "a run record (evidence/) shows this very cubin (its sha256) ran on a GPU and matched float32",
    "portability-build": "an sm_8x build whose sm_90 twin (same source and configuration) in this bundle is executed",
    "compiled": "compiled and its SASS checked; could run on a GPU here, but no run record shows this cubin ran",
    "sass-only": "compiled and its SASS checked; no GPU available to the project runs it",
}
LABELS = tuple(PROOF_LEVELS)


def default_dir() -> Path:
    """Where the build looks for run records: $FACTORY_EVIDENCE, else the repository's evidence/runs."""
    env = os.environ.get("FACTORY_EVIDENCE")
    return Path(env) if env else REPO_ROOT / "evidence" / "runs"


# --- reading ---------------------------------------------------------------------------------------
def read_record(path: str | Path) -> dict:
    """One run record, checked for the fields the build relies on (ValueError otherwise)."""
    path = Path(path)
    r = json.loads(path.read_text())
    if not isinstance(r, dict) or r.get("format") != FORMAT:
        raise ValueError(f"{path}: not a run record (format {FORMAT!r} expected)")
    for row in r.get("variants", []):
        if not (isinstance(row, dict) and isinstance(row.get("name"), str)
                and re.fullmatch(r"[0-9a-f]{64}", str(row.get("cubin_sha256"))) and isinstance(row.get("pass"), bool)):
            raise ValueError(f"{path}: bad variant row {row!r}")
    return r


def load_records(directory: str | Path | None) -> dict[str, dict]:
    """Every run record in ``directory`` (file name -> record); none when it does not exist."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return {}
    return {p.name: read_record(p) for p in sorted(d.glob("*.json"))}


def passed_cubins(records: dict[str, dict]) -> dict[str, str]:
    """cubin sha256 -> the first record file (by name) in which that cubin ran and passed.  A cubin
    that failed in any record is left out: one failure outweighs any number of passes."""
    passed: dict[str, str] = {}
    failed: set[str] = set()
    for fname, r in sorted(records.items()):
        for row in r.get("variants", []):
            if row["pass"]:
                passed.setdefault(row["cubin_sha256"], fname)
            else:
                failed.add(row["cubin_sha256"])
    return {sha: f for sha, f in passed.items() if sha not in failed}


def twin_name(name: str, op: str, target: str, portability_of: str = "sm_90") -> str | None:
    """The name the same variant has when built for ``portability_of`` (names start
    ``<op>_<target>_``, variant.Variant.name); None for a name of another form."""
    head = f"{op}_{target.replace('_', '')}_"
    if not name.startswith(head):
        return None
    return f"{op}_{portability_of.replace('_', '')}_{name[len(head):]}"


def proof_label(ceiling: str, cubin_sha256: str, passed: dict[str, str], twin_label: str | None = None) -> str:
    """A variant's label from the evidence.  ``ceiling``: the best its target and family allow
    (``sass-only`` where no GPU here can run it, ``portability-build`` for the sm_8x builds whose
    sm_90 twin runs here, ``executed`` for sm_90/sm_90a); ``twin_label``: that sm_90 twin's label
    in the same bundle (portability builds only)."""
    if ceiling == "sass-only":
        return "sass-only"
    if ceiling == "executed":
        return "executed" if cubin_sha256 in passed else "compiled"
    if ceiling == "portability-build":
        return "portability-build" if twin_label == "executed" else "compiled"
    raise ValueError(f"unknown proof ceiling {ceiling!r}")


# --- writing ---------------------------------------------------------------------------------------
def _git_commit() -> str | None:
    """The checkout's commit (``-dirty`` with uncommitted changes); $FACTORY_COMMIT where the tree
    was copied without its git directory."""
    if os.environ.get("FACTORY_COMMIT"):
        return os.environ["FACTORY_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _driver() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def device_info() -> dict:
    """The machine the run is on: GPU name and capability, driver, torch and its CUDA, the commit."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": p.name, "capability": [p.major, p.minor], "sms": p.multi_processor_count,
            "driver": _driver(), "torch": torch.__version__, "cuda": torch.version.cuda, "commit": _git_commit()}


class RunRecord:
    """Collects each launched variant's checks; :meth:`write` saves the record."""

    def __init__(self, source: str):
        self.source = source
        self.rows: dict[str, dict] = {}
        self.bundle = None  # the bundle the variants came from (one per record)

    def add(self, bundle, name: str, results: list[dict]) -> None:
        """The checks of one variant of ``bundle`` (each a ``factory.testing`` result: rel_err, tol, ok).
        The cubin's sha256 is the manifest's, checked against the bundle's file (the host library the
        loader ran was checked against the manifest when the bundle was opened)."""
        from .runtime.manifest import file_ok

        if self.bundle is not None and Path(self.bundle.path).resolve() != Path(bundle.path).resolve():
            raise ValueError(f"one run record per bundle: {bundle.path} is not {self.bundle.path}")
        self.bundle = bundle
        entry = bundle.manifest["variants"][name]
        cubin = entry["files"]["cubin"]
        if not file_ok(Path(bundle.path), cubin):
            raise ValueError(f"{name}: {cubin['path']} does not match the manifest; not recording it")
        row = self.rows.setdefault(name, {"name": name, "cubin_sha256": cubin["sha256"], "checks": 0,
                                         "max_rel_err": 0.0, "tol": None, "pass": True})
        for r in results:
            err = r.get("rel_err")
            row["checks"] += 1
            row["max_rel_err"] = None if err is None or row["max_rel_err"] is None else max(row["max_rel_err"], err)
            row["tol"] = r.get("tol", row["tol"])
            row["pass"] = row["pass"] and bool(r.get("ok"))
        if not results:
            row["pass"] = False

    def to_json(self, bundle=None) -> dict:
        rows = []
        for row in sorted(self.rows.values(), key=lambda r: r["name"]):
            err = row["max_rel_err"]
            rows.append({**row, "max_rel_err": None if err is None or err != err or err == float("inf")
                         else float(f"{err:.3g}")})
        return {"format": FORMAT, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **device_info(), "source": self.source,
                "bundle_versions": bundle.manifest.get("versions") if bundle is not None else None,
                "variants": rows}

    def write(self, path: str | Path, bundle=None) -> Path:
        """Write to ``path``; a directory gets ``<date>-<device>.json`` in it.  One variant per line."""
        rec = self.to_json(bundle)
        path = Path(path)
        if path.is_dir() or str(path).endswith("/"):
            slug = re.sub(r"[^a-z0-9]+", "-", rec["device"].lower().replace("nvidia", "")).strip("-")
            path = path / f"{time.strftime('%Y-%m-%d')}-{slug}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        head = {k: v for k, v in rec.items() if k != "variants"}
        lines = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rec["variants"])
        text = json.dumps(head, indent=1)[:-2] + ',\n "variants": [\n' + lines + "\n ]\n}\n"
        json.loads(text)  # well-formed
        path.write_text(text)
        return path
