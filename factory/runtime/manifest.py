"""Reading a bundle's manifest and checking its files (standard library only).

A manifest is an untrusted document: :func:`load_manifest` bounds its size and nesting, checks the
schema of every field the loader, the host library's link step and the command line read (an error
names the field), and refuses any file path that is absolute or climbs out of the bundle.
:func:`file_problem` checks one file against its record -- inside the bundle once symlinks are
resolved, a regular file, its size, its sha256 -- and :func:`bundle_problems` every file of a
bundle; the loader (runtime/bundle.py), ``verify`` and ``doctor`` all call these, so they agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import MutableMapping
from json.decoder import scanstring
from pathlib import Path, PurePosixPath

from .errors import BundleError

SUPPORTED_SCHEMA = 1
MAX_MANIFEST_BYTES = 64 << 20  # the default bundle's manifest (462 variants) is ~3 MB
MAX_DEPTH = 24                 # nesting of objects and arrays (a built manifest has 7)
MAX_FILE_BYTES = 1 << 31       # any one file of the bundle (a host library is ~100 MB at most)
MAX_RANK = 6                   # fx_select.h FX_MAX_RANK / FX_MAX_ARGS
MAX_ARGS = 20
PROOFS = ("executed", "portability-build", "compiled", "sass-only")  # docs/proof.md
FILE_KINDS = ("cubin", "header", "object")  # what the builder records per variant


def manifest_text(m: dict) -> str:
    """The manifest as the builder writes it: compact JSON (no indentation: a third of the bytes of
    an indented one; ``python -m json.tool`` shows it indented)."""
    return json.dumps(m, separators=(",", ":")) + "\n"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CTYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*( \*)?\Z")  # written into the host library's C glue
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_INT_TYPES = ("int32_t", "int64_t")
_SCALAR_CTYPES = {"f32": "float", "i32": "int32_t"}


class _Bad(Exception):
    """A schema violation at ``where`` (a dotted field path)."""

    def __init__(self, where: str, what: str):
        super().__init__(where, what)
        self.where, self.what = where, what


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise _Bad(where, what)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _obj(d, where: str) -> dict:
    _need(isinstance(d, dict), where, f"must be a JSON object, got {type(d).__name__}")
    return d


def _field(d: dict, key: str, where: str):
    _need(key in d, f"{where}.{key}" if where else key, "is missing")
    return d[key]


def _str(x, where: str, pattern: re.Pattern | None = None, what: str = "") -> str:
    if type(x) is str and (pattern is None or pattern.match(x)):  # (the common case, fast)
        return x
    _need(isinstance(x, str), where, f"must be a string, got {type(x).__name__}")
    if pattern is not None:
        _need(bool(pattern.match(x)), where, f"{x[:80]!r} is not {what}")
    return x


def _int(x, where: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if type(x) is int and lo <= x <= hi:  # (the common case, fast)
        return x
    _need(_is_int(x), where, f"must be an integer, got {type(x).__name__}")
    _need(lo <= x <= hi, where, f"{x} is outside [{lo}, {hi}]")
    return x


def _int_list(x, where: str, n_max: int = 8) -> None:
    _need(isinstance(x, list) and len(x) <= n_max, where, f"must be a list of at most {n_max} integers")
    for i, v in enumerate(x):
        _int(v, f"{where}[{i}]", 0, 2**31 - 1)


def _depth(value) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest, stack = 1, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
            if d > MAX_DEPTH:
                break
        for c in v.values() if type(v) is dict else v:
            if type(c) is dict or type(c) is list:
                stack.append((c, d + 1))
    return deepest


def check_path(rel, where: str) -> str:
    """A file path of the manifest: relative, POSIX, and naming no parent directory."""
    _str(rel, where)
    p = PurePosixPath(rel)
    _need(rel != "" and "\\" not in rel and "\0" not in rel, where, f"{rel[:80]!r} is not a file path")
    _need(not p.is_absolute(), where, f"{rel[:80]!r} is absolute: files must lie inside the bundle")
    _need(".." not in p.parts, where, f"{rel[:80]!r} climbs out of its folder: files must lie inside the bundle")
    _need(len(rel) <= 1024 and all(len(part.encode()) <= 255 for part in p.parts), where,
          f"{rel[:80]!r}... is longer than a file path can be")
    return rel


def _file_record(rec, where: str) -> None:
    _obj(rec, where)
    check_path(_field(rec, "path", where), f"{where}.path")
    _str(_field(rec, "sha256", where), f"{where}.sha256", _SHA256, "a sha256 (64 lowercase hex digits)")
    _int(_field(rec, "bytes", where), f"{where}.bytes", 0, MAX_FILE_BYTES)


def _signature(sig, where: str) -> None:
    _obj(sig, where)
    args = _field(sig, "args", where)
    _need(isinstance(args, list) and 0 < len(args) <= MAX_ARGS, f"{where}.args",
          f"must be a list of 1 to {MAX_ARGS} arguments")
    for i, a in enumerate(args):
        w = f"{where}.args[{i}]"
        _obj(a, w)
        _str(_field(a, "name", w), f"{w}.name", _IDENT, "an identifier")
        kind = _field(a, "kind", w)
        _need(kind in ("tensor", "scalar"), f"{w}.kind", f"{kind!r} is not 'tensor' or 'scalar'")
        _str(_field(a, "dtype", w), f"{w}.dtype")
        if kind == "scalar":
            _need(a["dtype"] in ("f32", "i32"), f"{w}.dtype", f"{a['dtype']!r}: a scalar is f32 or i32")
            continue
        shape, stride = _field(a, "shape", w), _field(a, "stride", w)
        for key, modes in (("shape", shape), ("stride", stride)):
            _need(isinstance(modes, list) and 0 < len(modes) <= MAX_RANK, f"{w}.{key}",
                  f"must be a list of 1 to {MAX_RANK} modes")
            for m, d in enumerate(modes):
                if isinstance(d, str):
                    _str(d, f"{w}.{key}[{m}]", _IDENT, "a size symbol")
                else:
                    _int(d, f"{w}.{key}[{m}]", 0, 2**62)
        _need(len(shape) == len(stride), f"{w}.stride", f"rank {len(stride)} differs from the shape's {len(shape)}")
        align = _int(_field(a, "align", w), f"{w}.align", 1, 16)
        _need(16 % align == 0, f"{w}.align", f"{align} does not divide 16")
    div = _obj(sig.get("divisibility", {}), f"{where}.divisibility")
    for s, d in div.items():
        _int(d, f"{where}.divisibility.{s}", 1, 1 << 20)


def _abi(abi, sig: dict, name: str, where: str) -> None:
    _obj(abi, where)
    _str(_field(abi, "wrapper", where), f"{where}.wrapper", _IDENT, "an identifier")
    params, structs = _field(abi, "params", where), _obj(_field(abi, "structs", where), f"{where}.structs")
    _need(isinstance(params, list) and len(params) == len(sig["args"]) + 2, f"{where}.params",
          f"must list the module, the {len(sig['args'])} arguments of the signature and the stream")
    for i, p in enumerate(params):
        w = f"{where}.params[{i}]"
        _need(isinstance(p, list) and len(p) == 2, w, "must be a [C type, parameter name] pair")
        _str(p[0], f"{w}[0]", _CTYPE, "a C type name")
        _str(p[1], f"{w}[1]", _IDENT, "an identifier")
    for sname, st in structs.items():
        w = f"{where}.structs.{sname[:80]}"
        _need(bool(_IDENT.match(sname)), w, "is not an identifier")
        _obj(st, w)
        _need(_field(st, "shape_ctype", w) in _INT_TYPES, f"{w}.shape_ctype", "must be int32_t or int64_t")
        _need(_field(st, "stride_ctype", w) in _INT_TYPES, f"{w}.stride_ctype", "must be int32_t or int64_t")
        _int(_field(st, "n_shapes", w), f"{w}.n_shapes", 0, MAX_RANK)
        _int(_field(st, "n_strides", w), f"{w}.n_strides", 0, MAX_RANK)
    _need(params[0][0] == f"{name}_Kernel_Module_t *", f"{where}.params[0][0]", f"must be {name}_Kernel_Module_t *")
    _need(params[-1][0] == "cudaStream_t", f"{where}.params[{len(params) - 1}][0]", "must be cudaStream_t")
    for i, a in enumerate(sig["args"]):
        ctype = params[i + 1][0]
        w = f"{where}.params[{i + 1}]"
        if a["kind"] == "scalar":
            want = _SCALAR_CTYPES[a["dtype"]]
            _need(ctype == want, f"{w}[0]", f"{ctype!r}: {a['name']} is a {a['dtype']} scalar, passed as {want}")
            continue
        st = structs.get(ctype.rstrip(" *"))
        _need(ctype.endswith(" *") and st is not None, w, f"{ctype!r}: no struct of that name in abi.structs")
        dyn = (sum(isinstance(d, str) for d in a["shape"]), sum(isinstance(d, str) for d in a["stride"]))
        _need(dyn == (st["n_shapes"], st["n_strides"]), w,
              f"struct {ctype.rstrip(' *')} holds {st['n_shapes']} sizes and {st['n_strides']} strides, the "
              f"signature's {a['name']} has {dyn[0]} and {dyn[1]}")


# Optional fields of a variant the loader, the selection or the command line read: their types.
_OPTIONAL = {
    **{k: "int" for k in ("stages", "threads", "split_k", "splits", "head_dim", "ctas_per_sm", "decode_rows",
                          "kv_splits", "min_seqlen_q", "rows_per_cta", "max_m", "k_multiple", "swizzle",
                          "cta_group", "smem_bytes", "tmem_columns", "acc_stages", "persistent_ctas")},
    **{k: "ints" for k in ("tile", "cluster", "mma_tile", "epi_tile")},
    **{k: "bool" for k in ("causal", "varlen", "pack_gqa", "preferred", "pdl", "swap_ab", "scaled", "swizzle_exact")},
    **{k: "str" for k in ("dtype", "schedule", "raster", "format", "structure")},
    **{k: "dict" for k in ("config", "dtypes", "layout", "constraints", "sass", "workspace", "packed_b",
                           "registers_per_role")},
}
_RESOURCES = ("registers", "dynamic_smem_bytes", "static_smem_bytes", "stack_frame_bytes", "spill_instructions")


def _variant(key: str, v, where: str) -> None:
    _obj(v, where)
    name = _str(_field(v, "name", where), f"{where}.name", _IDENT, "an identifier")
    _need(name == key, f"{where}.name", f"{name!r} differs from its key")
    _need(len(name) <= 200, f"{where}.name", "is longer than 200 characters")
    for k in ("op", "family", "target"):
        _str(_field(v, k, where), f"{where}.{k}")
    proof = _field(v, "proof", where)
    _need(proof in PROOFS, f"{where}.proof", f"{proof!r} is not one of {', '.join(PROOFS)}")
    files = _obj(_field(v, "files", where), f"{where}.files")
    for kind in FILE_KINDS:
        _need(kind in files, f"{where}.files.{kind}", f"is missing (every variant lists its {', '.join(FILE_KINDS)})")
    for kind, rec in files.items():
        _file_record(rec, f"{where}.files.{kind[:40]}")
    res = _obj(_field(v, "resources", where), f"{where}.resources")
    for k in _RESOURCES:
        _int(_field(res, k, f"{where}.resources"), f"{where}.resources.{k}", 0, 1 << 30)
    for kname, k in _obj(res.get("kernels", {}), f"{where}.resources.kernels").items():
        w = f"{where}.resources.kernels.{kname[:80]}"
        for f in ("registers", "static_smem_bytes", "stack_frame_bytes", "code_bytes"):
            if f in _obj(k, w):
                _int(k[f], f"{w}.{f}", 0, 1 << 30)
    reqs = _field(v, "sass_requirements", where)
    _need(isinstance(reqs, list), f"{where}.sass_requirements", "must be a list of patterns")
    for i, r in enumerate(reqs):
        _str(r, f"{where}.sass_requirements[{i}]")
        try:
            re.compile(r)
        except (re.error, RecursionError, OverflowError) as e:
            raise _Bad(f"{where}.sass_requirements[{i}]", f"is not a regular expression ({e})") from None
    _signature(_field(v, "signature", where), f"{where}.signature")
    _abi(_field(v, "abi", where), v["signature"], name, f"{where}.abi")
    for k, kind in _OPTIONAL.items():
        if k not in v:
            continue
        x, w = v[k], f"{where}.{k}"
        if kind == "int":
            _int(x, w, 0, 2**31 - 1)
        elif kind == "ints":
            _int_list(x, w)
        elif kind == "bool":
            _need(isinstance(x, bool), w, f"must be true or false, got {type(x).__name__}")
        elif kind == "str":
            _str(x, w)
        else:
            _obj(x, w)
    for k in ("dtypes", "layout"):
        for sub, x in v.get(k, {}).items():
            _str(x, f"{where}.{k}.{sub[:40]}")
    if "registers_per_role" in v:
        for role, n in v["registers_per_role"].items():
            _int(n, f"{where}.registers_per_role.{role[:40]}", 0, 1024)
    if "persistent" in v:
        pers = _obj(v["persistent"], f"{where}.persistent")
        _int(_field(pers, "cluster_ctas", f"{where}.persistent"), f"{where}.persistent.cluster_ctas", 1, 64)
    if v.get("fp8_accumulation") is not None:
        _str(v["fp8_accumulation"], f"{where}.fp8_accumulation")


def validate(m) -> None:
    """Raise ``_Bad`` naming the first field of ``m`` that breaks the manifest schema."""
    _validate_top(m)
    for key, v in m["variants"].items():
        _variant(key, v, f"variants.{key[:120]}")


def _validate_top(m) -> None:
    """``validate`` but for the variants' entries: the document, its host library, evidence and
    versions, and that ``variants`` is an object."""
    _obj(m, "(the document)")
    schema = m.get("schema_version")
    if schema != SUPPORTED_SCHEMA:  # (messages kept apart: they say what to do)
        raise _Bad("schema_version", repr(schema))
    _file_record(_field(m, "host_library", ""), "host_library")
    variants = _field(m, "variants", "")
    _need(isinstance(variants, (dict, LazyVariants)), "variants",
          f"must be a JSON object of variant name -> entry, got {type(variants).__name__}")
    for k in ("versions", "proof_levels"):
        if k in m:
            _obj(m[k], k)
    if "evidence" in m:  # the run records the proof labels rest on (factory/evidence.py)
        records = m["evidence"]
        _need(isinstance(records, list), "evidence", f"must be a list of file records, got {type(records).__name__}")
        for i, rec in enumerate(records):
            _file_record(rec, f"evidence[{i}]")


def _read(bundle: str | Path) -> tuple[Path, bytes, os.stat_result]:
    """The manifest's path, its bytes (bounded) and the status of the file they were read from."""
    p = Path(bundle) / "manifest.json"
    if not p.exists():
        raise BundleError(f"{bundle}: no manifest.json (is this a bundle? build one with "
                          f"`python -m factory build` or scripts/build_bundle.py)")
    if not p.is_file():
        raise BundleError(f"{p}: not a regular file; rebuild the bundle")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
            st = os.fstat(f.fileno())
    except OSError as e:
        raise BundleError(f"{p}: cannot be read ({e})") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{p}: larger than {MAX_MANIFEST_BYTES} bytes, more than any bundle's manifest; "
                          f"rebuild the bundle")
    return p, raw, st


def _parse(p: Path, raw: bytes, spans: bool = False):
    """The parsed document (depth-checked, a JSON object of a schema this loader reads); with
    ``spans``, also each variant entry's (start, end) in ``raw`` (None where they cannot be told:
    a manifest that is not ASCII or not one object holding a ``variants`` object).  Where spans
    are given, only the document outside ``variants`` and each entry's own nesting are checked
    for depth here; an entry's depth is checked with the rest of it on first use."""
    found = None
    try:
        if spans and raw.isascii():
            found = _split(raw.decode("ascii"))
        m = found[0] if found is not None else json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise BundleError(f"{p}: nested deeper than {MAX_DEPTH} levels; not a manifest: rebuild the bundle") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleError(f"{p}: not a readable manifest ({e}); rebuild the bundle") from None
    deep = (_depth(m) > MAX_DEPTH if found is None else
            any(_depth(v) + 1 > MAX_DEPTH for k, v in m.items() if k != "variants"))
    if deep:
        raise BundleError(f"{p}: nested deeper than {MAX_DEPTH} levels; not a manifest: rebuild the bundle")
    if not isinstance(m, dict):
        raise BundleError(f"{p}: not a manifest (a JSON object is expected); rebuild the bundle")
    schema = m.get("schema_version")
    if schema != SUPPORTED_SCHEMA:
        if _is_int(schema) and schema > SUPPORTED_SCHEMA:
            raise BundleError(f"{p}: manifest schema {schema} is newer than this loader, which reads schema "
                              f"{SUPPORTED_SCHEMA}: upgrade kernel-factory, or rebuild the bundle with this version")
        raise BundleError(f"{p}: manifest schema {schema!r}, this loader reads {SUPPORTED_SCHEMA}: rebuild the bundle")
    return (m, None if found is None else found[1]) if spans else m


def load_manifest(bundle: str | Path) -> dict:
    """The bundle's manifest, parsed and checked (module docstring); BundleError names the field
    that is wrong."""
    p, raw, _st = _read(bundle)
    m = _parse(p, raw)
    try:
        validate(m)
    except _Bad as e:
        raise BundleError(f"{p}: field {e.where} {e.what}; rebuild the bundle") from None
    return m


# --- the runtime's manifest: each variant entry checked on first use ---------------------------------
_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder().scan_once


def _split(text: str):
    """``json.loads(text)`` of a document ``{..., "variants": {name: entry, ...}, ...}`` and each
    entry's (start, end) in ``text``, or None where ``text`` is not such a document (``json.loads``
    then says what is wrong).  Duplicate keys keep the last, as ``json.loads`` does."""
    ws = _WS.match

    def members(i, on_value):  # text[i] == "{": call on_value(key, i) for each member; the end
        i = ws(text, i + 1).end()
        if text.startswith("}", i):
            return i + 1
        while True:
            if not text.startswith('"', i):
                return None
            key, i = scanstring(text, i + 1)
            i = ws(text, i).end()
            if not text.startswith(":", i):
                return None
            i = on_value(key, ws(text, i + 1).end())
            if i is None:
                return None
            i = ws(text, i).end()
            if text.startswith(",", i):
                i = ws(text, i + 1).end()
            elif text.startswith("}", i):
                return i + 1
            else:
                return None

    doc: dict = {}
    spans: dict = {}
    tops: dict = {}  # the other members' (start, end)

    def entry(key, i):
        try:
            doc["variants"][key], end = _SCAN(text, i)
        except StopIteration:
            return None
        spans[key] = (i, end)
        return end

    def top(key, i):
        if key == "variants" and text.startswith("{", i):
            doc["variants"] = {}
            spans.clear()
            return members(i, entry)
        try:
            doc[key], end = _SCAN(text, i)
        except StopIteration:
            return None
        tops[key] = (i, end)
        return end

    i = ws(text, 0).end()
    if not text.startswith("{", i):
        return None
    end = members(i, top)
    if end is None or ws(text, end).end() != len(text) or not isinstance(doc.get("variants"), dict):
        return None
    tops.pop("variants", None)  # (a "variants" that is not an object, followed by one that is)
    spans[None] = tops
    return doc, spans


class LazyVariants(MutableMapping):
    """A manifest's ``variants`` whose entries are parsed (from the manifest's bytes) and checked
    against the schema (``_variant``, and their nesting depth) on first use, so that opening a
    bundle of hundreds of variants checks only the ones it runs.  Each entry's ``op`` and
    ``target`` are known without checking it (``light``): the candidates of an op are found by
    them, and the entries chosen are checked when read.  An entry that breaks the schema raises
    BundleError naming the field, as ``load_manifest`` would, when it is read."""

    def __init__(self, where: Path, raw: bytes | None, index: dict, parsed: dict | None = None):
        self._where, self._raw = where, raw
        self._index = index          # name -> (op, target, start, end) (start, end: None without raw)
        self._parsed = parsed or {}  # name -> entry parsed, not yet checked
        self._checked: dict = {}     # name -> entry checked

    def light(self, name: str) -> tuple:
        """(op, target) of ``name`` as its entry says (None, None where they are not strings)."""
        return self._index[name][:2]

    def __getitem__(self, name):
        e = self._checked.get(name)
        if e is not None:
            return e
        op, target, start, end = self._index[name]
        e = self._parsed.pop(name, None)
        if e is None:
            try:
                e = json.loads(self._raw[start:end])
            except (ValueError, RecursionError) as x:
                raise BundleError(f"{self._where}: variants.{name[:120]} is not readable ({x}); "
                                  f"rebuild the bundle") from None
        if _depth(e) + 2 > MAX_DEPTH:
            raise BundleError(f"{self._where}: nested deeper than {MAX_DEPTH} levels; not a manifest: "
                              f"rebuild the bundle")
        try:
            _variant(name, e, f"variants.{name[:120]}")
        except _Bad as x:
            raise BundleError(f"{self._where}: field {x.where} {x.what}; rebuild the bundle") from None
        if (e["op"], e["target"]) != (op, target):  # (an index from the open cache that is not this entry's)
            raise BundleError(f"{self._where}: variants.{name[:120]} differs from what was read at open; "
                              f"reopen the bundle")
        self._checked[name] = e
        return e

    def __setitem__(self, name, entry) -> None:  # (tests and tools that edit a manifest in memory)
        self._index[name] = (entry.get("op"), entry.get("target"), None, None)
        self._parsed.pop(name, None)
        self._checked[name] = entry

    def __delitem__(self, name) -> None:
        del self._index[name]
        self._parsed.pop(name, None)
        self._checked.pop(name, None)

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name) -> bool:
        return name in self._index


def _light(e) -> tuple:
    if type(e) is not dict:
        return None, None
    op, target = e.get("op"), e.get("target")
    return (op if type(op) is str else None), (target if type(target) is str else None)


def open_manifest(bundle: str | Path, cache=None):
    """For the runtime: ``(manifest, host_library_problem, remembered)`` where the manifest's ``variants`` is a
    :class:`LazyVariants` (each entry checked on first use) and the rest of it is checked as
    ``load_manifest`` checks it.  ``cache`` (runtime/open_cache.py) may remember, for a manifest
    file whose device, inode, size, mtime and ctime are unchanged, where each entry lies in it,
    and for a host library file likewise unchanged, that its sha256 was the manifest's: a
    remembered open reads the manifest's bytes but parses only the entries it uses, and does not
    hash the host library again."""
    p, raw, st = _read(bundle)
    hit = cache.lookup(p, raw, st) if cache is not None else None
    spans = None
    if hit is not None:  # (the document outside the variants parsed from the manifest's bytes)
        tops, index = hit
        try:
            m = {k: json.loads(raw[start:end]) for k, (start, end) in tops.items()}
        except (ValueError, RecursionError) as e:
            raise BundleError(f"{p}: not a readable manifest ({e}); rebuild the bundle") from None
        if any(_depth(v) + 1 > MAX_DEPTH for v in m.values()):
            raise BundleError(f"{p}: nested deeper than {MAX_DEPTH} levels; not a manifest: rebuild the bundle")
        m["variants"] = LazyVariants(p, raw, index)
    else:
        m, spans = _parse(p, raw, spans=True)
        if spans is None:  # (parsed whole: every entry is at hand)
            variants = m.get("variants") if isinstance(m.get("variants"), dict) else None
            index = {k: (*_light(v), None, None) for k, v in variants.items()} if variants is not None else None
            parsed = variants
        else:
            index = {k: (*_light(v), *spans[k]) for k, v in m["variants"].items()}
            parsed = m["variants"]
            tops = spans[None]
        if index is not None:
            m["variants"] = LazyVariants(p, raw, index, dict(parsed))
    try:
        _validate_top(m)
    except _Bad as e:
        raise BundleError(f"{p}: field {e.where} {e.what}; rebuild the bundle") from None
    lib = m["host_library"]
    if hit is not None and cache.library_ok(bundle, lib):
        return m, None, True
    problem = host_library_problem(bundle, m)
    if problem is None and cache is not None and hit is None and spans is not None:
        cache.store(p, st, tops, index, bundle, lib)
    return m, problem, False


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_problem(bundle: str | Path, rec: dict) -> str | None:
    """What is wrong with the file ``rec`` (a checked manifest file record) names, or None: it
    must resolve (symlinks followed) to a regular file inside the bundle, of the recorded size
    and sha256."""
    root = Path(bundle).resolve()
    p = Path(bundle) / rec["path"]
    try:
        real = p.resolve()
    except (OSError, RuntimeError) as e:  # (a symlink loop)
        return f"cannot be resolved ({e})"
    if real != root and root not in real.parents:
        return f"lies outside the bundle (it resolves to {real})"
    try:
        st = real.stat()
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    size = st.st_size
    if size != rec["bytes"]:
        return f"is truncated or altered ({size} bytes, the manifest says {rec['bytes']})"
    try:
        digest = sha256_file(real)
    except OSError as e:
        return f"cannot be read ({e})"
    if digest != rec["sha256"]:
        return "is altered (its sha256 differs from the manifest's)"
    return None


def file_ok(bundle: str | Path, rec: dict) -> bool:
    return file_problem(bundle, rec) is None


def describe(bundle: str | Path, owner: str, rec: dict, problem: str) -> str:
    """The one wording of a file problem, for the loader's errors, ``verify`` and ``doctor``."""
    return f"{Path(bundle) / rec['path']}: {owner} {problem}"


def host_library_problem(bundle: str | Path, m: dict) -> str | None:
    problem = file_problem(bundle, m["host_library"])
    return None if problem is None else describe(bundle, "host library", m["host_library"], problem)


def variant_problems(bundle: str | Path, name: str, entry: dict) -> list[str]:
    """The problems of variant ``name``'s files (all its files, in a fixed order)."""
    out = []
    for kind, rec in sorted(entry["files"].items()):
        problem = file_problem(bundle, rec)
        if problem is not None:
            out.append(describe(bundle, f"{name}'s {kind}", rec, problem))
    return out


def bundle_problems(bundle: str | Path, m: dict) -> list[str]:
    """Every file problem of a bundle whose manifest ``m`` was checked by :func:`load_manifest`:
    the host library's, then each variant's, by name."""
    lib = host_library_problem(bundle, m)
    return ([lib] if lib else []) + [p for name, v in sorted(m["variants"].items())
                                     for p in variant_problems(bundle, name, v)]
