"""Reading a bundle's manifest (standard library only)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import BundleError

SUPPORTED_SCHEMA = 1


def load_manifest(bundle: str | Path) -> dict:
    p = Path(bundle) / "manifest.json"
    if not p.exists():
        raise BundleError(f"{bundle}: no manifest.json (is this a bundle? build one with "
                          f"`python -m factory build` or scripts/build_bundle.py)")
    try:
        m = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleError(f"{p}: not a readable manifest ({e}); rebuild the bundle") from None
    if not isinstance(m, dict):
        raise BundleError(f"{p}: not a manifest (a JSON object is expected); rebuild the bundle")
    schema = m.get("schema_version")
    if schema != SUPPORTED_SCHEMA:
        if isinstance(schema, int) and schema > SUPPORTED_SCHEMA:
            raise BundleError(f"{p}: manifest schema {schema} is newer than this loader, which reads schema "
                              f"{SUPPORTED_SCHEMA}: upgrade kernel-factory, or rebuild the bundle with this version")
        raise BundleError(f"{p}: manifest schema {schema!r}, this loader reads {SUPPORTED_SCHEMA}: rebuild the bundle")
    for key in ("host_library", "variants"):
        if key not in m:
            raise BundleError(f"{p}: manifest has no {key!r}; rebuild the bundle")
    return m


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_ok(bundle: Path, rec: dict) -> bool:
    p = Path(bundle) / rec["path"]
    return p.is_file() and p.stat().st_size == rec["bytes"] and sha256_file(p) == rec["sha256"]
