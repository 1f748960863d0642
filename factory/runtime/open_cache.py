"""What an earlier open of a bundle found, so that the next process opens it fast (standard
library only).

Opening a bundle reads its manifest and checks the host library's sha256 (tens of MB).  After an
open that found both good, one small JSON file per bundle remembers, for the manifest file and
the host library file each identified by device, inode, size, mtime and ctime (any write changes
the ctime, which no caller can set back):

* where each variant's entry lies in the manifest's bytes, and its op and target, so that the
  next open parses only the entries it uses (runtime/manifest.py: ``LazyVariants`` checks each
  against the schema on first use, as it does without this file);
* where the document's other members lie (parsed from the manifest's bytes and checked at every
  open);
* that the host library's sha256 was the manifest's, so that it is not hashed again.

Nothing here is trusted further than that: a file of another format, of another version of the
manifest checks, for another file status, or unreadable, is ignored and the open checks
everything.  Files written less than ``RACY_S`` seconds after their last change are not
remembered (a change within the file system's timestamp granularity would not show).  The folder
is ``$KERNEL_FACTORY_OPEN_CACHE`` (``off`` or ``0``: no cache), else
``$XDG_CACHE_HOME/kernel-factory/open`` (``~/.cache/...``); it is used only when it is the
user's own and writable by no one else.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

FORMAT = 1
RACY_S = 2.0
_CHECKS: str | None = None  # sha256 of runtime/manifest.py: a cache of other checks is not read


def _checks() -> str:
    global _CHECKS
    if _CHECKS is None:
        with open(Path(__file__).with_name("manifest.py"), "rb") as f:
            _CHECKS = hashlib.sha256(f.read()).hexdigest()
    return _CHECKS


def _key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def default() -> "OpenCache | None":
    """The cache of this user (module docstring), or None where it is off or not safe to use."""
    env = os.environ.get("KERNEL_FACTORY_OPEN_CACHE")
    if env is not None and env.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    if env:
        d = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = Path(base) / "kernel-factory" / "open"
    return OpenCache(d)


class OpenCache:
    def __init__(self, folder: Path):
        self.folder = folder
        self._lib = None  # the host library's record from the last lookup that hit

    def _usable(self) -> bool:
        try:
            st = os.stat(self.folder)
        except OSError:
            return False
        return st.st_uid == os.getuid() and not st.st_mode & 0o022

    def _file(self, manifest: Path) -> Path:
        real = os.path.realpath(manifest)
        return self.folder / (hashlib.sha256(real.encode(errors="surrogateescape")).hexdigest()[:40] + ".json")

    def lookup(self, manifest: Path, raw: bytes, st: os.stat_result):
        """({member: (start, end)} of the document but its variants, {name: (op, target, start,
        end)}) as remembered for this very manifest file, or None."""
        self._lib = None
        try:
            if not self._usable():
                return None
            with open(self._file(manifest), "rb") as f:
                c = json.loads(f.read(64 << 20))
            if not (type(c) is dict and c.get("format") == FORMAT and c.get("checks") == _checks()
                    and c.get("manifest") == _key(st) and len(raw) == st.st_size):
                return None
            top, entries, lib = c["top"], c["variants"], c["host_library"]
            if type(top) is not dict or "variants" in top or type(entries) is not dict or type(lib) is not dict:
                return None
            n = len(raw)
            tops = {}
            for k, (start, end) in top.items():
                if not (type(start) is int and type(end) is int and 0 <= start < end <= n):
                    return None
                tops[k] = (start, end)
            index = {}
            for name, e in entries.items():
                op, target, start, end = e
                if not (type(start) is int and type(end) is int and 0 <= start < end <= n
                        and all(x is None or type(x) is str for x in (op, target))):
                    return None
                index[name] = (op, target, start, end)
            if not (type(lib.get("stat")) is list and type(lib.get("sha256")) is str):
                return None
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
            return None
        self._lib = lib
        return tops, index

    def library_ok(self, bundle: str | Path, rec: dict) -> bool:
        """Whether the host library ``rec`` names is, by its file status, the very file whose
        sha256 the last lookup's open found equal to ``rec``'s, inside the bundle."""
        lib = self._lib
        if lib is None or lib["sha256"] != rec["sha256"]:
            return False
        try:
            root = Path(bundle).resolve()
            real = (Path(bundle) / rec["path"]).resolve()
            if root not in real.parents:
                return False
            st = os.stat(real)
        except (OSError, RuntimeError):
            return False
        return _key(st) == lib["stat"] and st.st_size == rec["bytes"]

    def store(self, manifest: Path, st: os.stat_result, tops: dict, index: dict, bundle: str | Path,
              rec: dict) -> None:
        """Remember an open that read ``manifest`` (status ``st``) and found the host library
        ``rec`` intact just now; nothing where either file changed too recently to tell."""
        try:
            real = (Path(bundle) / rec["path"]).resolve()
            lst = os.stat(real)
            now = time.time_ns()
            racy = int(RACY_S * 1e9)
            if any(now - x < racy for x in (st.st_mtime_ns, st.st_ctime_ns, lst.st_mtime_ns, lst.st_ctime_ns)):
                return
            if _key(os.stat(manifest)) != _key(st):
                return
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self._usable():
                return
            body = {"format": FORMAT, "checks": _checks(), "manifest": _key(st),
                    "top": {k: list(v) for k, v in tops.items()},
                    "variants": {k: list(v) for k, v in index.items()},
                    "host_library": {"stat": _key(lst), "sha256": rec["sha256"]}}
            f = self._file(manifest)
            tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(body, out, separators=(",", ":"))
            os.replace(tmp, f)
        except (OSError, ValueError, TypeError):
            return
