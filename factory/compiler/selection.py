"""The selection tables of the host library: generated from the manifest's variant entries (and the
bundle's ``tuning.json``) into C, read by ``csrc/fx_select.c`` (the selection algorithm of
``factory/runtime`` ported once, table-driven; ``csrc/fx_select.h`` has the table types).

What is generated here is data only: per variant the fields the Python selection reads (dtypes,
majorness, tile, cluster, split counts, flags, the early_b twin, the attention fields), its
argument contract (``loader.Binder.check``: symbolic sizes, divisors, fixed modes, pointer
alignment, 32-bit size slots) and a ``fx_bind_<name>`` function that fills the header's structs and
calls ``fx_launch_<name>``; the targets; the cost model's constants (``tuning.MODEL``); the tuning
table's buckets and winners with the device they were measured on.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..atoms.targets import KNOWN_CAPABILITIES, TARGETS
from ..runtime import cost_sm100, tuning

# fx_dtype_t (csrc/fx_api.h); a dtype C callers cannot name maps to -1 and matches nothing.
DTYPE_IDS = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4}
MAJOR_IDS = {"k": 1, "m": 2, "n": 3}
FAMILY_IDS = {"sm80": 1, "sm90": 2, "sm100": 3, "decode": 4, "sm90_decode": 5, "sm90_grouped": 9,
              "sm100_grouped": 10}
OP_IDS = {"gemm": 1, "attention": 2, "gemm_blockscaled": 3, "attention_kvcache": 4, "attention_fp8": 5,
          "gemm_grouped": 9, "rms_norm": 11, "fp8_rows": 12, "rope_kvcache": 13}
# the grouped GEMM's layouts (fx_variant.grouped)
GROUPED_IDS = {"contig": 1, "masked": 2}
# fx_block_format_t (csrc/fx_api.h)
FORMAT_IDS = {"mxf8e4m3": 1, "mxf8e5m2": 2, "nvf4": 3}
ACC_IDS = {"promoted": 1, "fast": 2}
MAX_RANK, MAX_SYMS, MAX_ARGS = 6, 64, 20  # as csrc/fx_select.h
MAX_TARGET_CCS = 8  # FX_MAX_TARGET_CCS
# tuning.MODEL's and cost_sm100.MODEL's keys in fx_model's / fx_model_sm100's order (defined there:
# the order fx_cost_model_set reads them in): a key added to a Python model must be ported to C.
MODEL_KEYS = tuning.MODEL_KEYS
SM100_MODEL_KEYS = cost_sm100.MODEL_KEYS


def c_str(s: str) -> str:
    out = []
    for ch in s.encode():
        c = chr(ch)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= ch < 127:
            out.append(c)
        else:
            out.append(f"\\{ch:03o}")
    return '"' + "".join(out) + '"'


def c_double(x: float) -> str:
    r = repr(float(x))  # the shortest string that reads back as the same double
    return r if any(ch in r for ch in ".eEn") else r + ".0"


def attention_limits() -> tuple[tuple[int, ...], int]:
    """HEAD_DIMS and _GRID_YZ_MAX of runtime/attention.py, read from its source (importing it
    imports torch)."""
    src = (Path(__file__).resolve().parents[1] / "runtime" / "attention.py").read_text()
    found = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("HEAD_DIMS", "_GRID_YZ_MAX"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return tuple(found["HEAD_DIMS"]), int(found["_GRID_YZ_MAX"])


def tuning_for(bundle: Path, manifest_sha256: str) -> tuple[dict | None, str]:
    """The bundle's tuning.json when it was measured for this manifest (``tuning.read``; the
    device is checked at run time against the caller's), else (None, why not)."""
    data, why = tuning.read(bundle, manifest_sha256)
    if data is None:
        return None, why
    dev = data.get("device", {})
    if not isinstance(dev.get("name"), str) or not dev["name"] or not isinstance(dev.get("sm_count"), int):
        return None, "tuning.json names no device"
    return data, "ok"


def _shape32(entry: dict, i: int) -> int:
    ctype = entry["abi"]["params"][1 + i][0]
    st = entry["abi"]["structs"].get(ctype.rstrip(" *"))
    return int(bool(st) and st["shape_ctype"] == "int32_t")


def _contract(prefix: str, entry: dict) -> tuple[list[str], str, int, str, int]:
    """C definitions of one variant's argument table; returns (definitions, args symbol, n_args,
    divisors symbol, n_syms)."""
    sig = entry["signature"]
    syms: list[str] = []
    defs, rows = [], []
    for i, a in enumerate(sig["args"]):
        if a["kind"] != "tensor":
            rows.append(f'{{{c_str(a["name"])}, 1, 0, 0, 1, 0, 0}}')
            continue
        if len(a["shape"]) > MAX_RANK:
            raise ValueError(f"{entry['name']}.{a['name']}: rank {len(a['shape'])} > {MAX_RANK}")
        dims = []
        for d in (*a["shape"], *a["stride"]):
            if isinstance(d, str):
                if d not in syms:
                    syms.append(d)
                dims.append(f"{{{syms.index(d)}, 0}}")
            else:
                dims.append(f"{{-1, {int(d)}LL}}")
        r = len(a["shape"])
        defs.append(f"static const fx_dim {prefix}_d{i}[] = {{{', '.join(dims)}}};")
        rows.append(f'{{{c_str(a["name"])}, 0, {r}, {_shape32(entry, i)}, {int(a["align"])}, '
                    f'{prefix}_d{i}, {prefix}_d{i} + {r}}}')
    if len(sig["args"]) > MAX_ARGS or len(syms) > MAX_SYMS:
        raise ValueError(f"{entry['name']}: more arguments or symbols than csrc/fx_select.h holds")
    if any(int(a.get("align", 1)) <= 0 or 16 % int(a.get("align", 1)) for a in sig["args"] if a["kind"] == "tensor"):
        raise ValueError(f"{entry['name']}: a pointer alignment that does not divide 16")
    divs = [int(sig.get("divisibility", {}).get(s, 1)) for s in syms]
    defs.append(f"static const fx_arg {prefix}_args[] = {{{', '.join(rows)}}};")
    defs.append(f"static const int64_t {prefix}_div[] = {{{', '.join(f'{d}LL' for d in divs) or '0'}}};")
    return defs, f"{prefix}_args", len(sig["args"]), f"{prefix}_div", len(syms)


def bind_function(entry: dict) -> str:
    """``fx_bind_<name>(values, stream)``: the header's structs filled from the specs (the
    compiler checks the field names and types), then ``fx_launch_<name>``."""
    name, abi = entry["name"], entry["abi"]
    lines = [f"static int32_t fx_bind_{name}(const fx_value *v, cudaStream_t stream) {{"]
    ptrs = []
    for i, (a, (ctype, _p)) in enumerate(zip(entry["signature"]["args"], abi["params"][1:])):
        if a["kind"] == "tensor":
            stype = ctype.rstrip(" *")
            st = abi["structs"][stype]
            dyn_shape = [m for m, d in enumerate(a["shape"]) if isinstance(d, str)]
            dyn_stride = [m for m, d in enumerate(a["stride"]) if isinstance(d, str)]
            if (len(dyn_shape), len(dyn_stride)) != (st["n_shapes"], st["n_strides"]):
                raise ValueError(f"{name}.{a['name']}: header struct {st} does not match the signature")
            init = [f".data = (void *)v[{i}].t.ptr"]
            if dyn_shape:
                init.append(".dynamic_shapes = {" + ", ".join(f"({st['shape_ctype']})v[{i}].t.shape[{m}]"
                                                             for m in dyn_shape) + "}")
            if dyn_stride:
                init.append(".dynamic_strides = {" + ", ".join(f"({st['stride_ctype']})v[{i}].t.stride[{m}]"
                                                              for m in dyn_stride) + "}")
            lines.append(f"    {stype} a{i} = {{{', '.join(init)}}};")
        elif ctype == "float":
            lines.append(f"    float a{i} = v[{i}].f;")
        elif ctype == "int32_t":
            lines.append(f"    int32_t a{i} = v[{i}].i;")
        else:
            raise ValueError(f"{name}.{a['name']}: scalar type {ctype} not supported")
        ptrs.append(f"&a{i}")
    ptrs.append("&stream")
    lines.append(f"    void *args[] = {{{', '.join(ptrs)}}};")
    lines.append(f"    return fx_launch_{name}(args);")
    lines.append("}")
    return "\n".join(lines)


def _workspace_form(e: dict) -> int:
    """fx_variant.workspace: 0 none, 1 (split_k, M, N) partials, 2 the "tiles" form of the in-kernel
    split-K fix-up (fx_select.c FX_WORKSPACE_TILES), 3 the arrival counters of a decode variant whose
    last split merges the others (FX_WORKSPACE_COUNTERS), 4 the GEMM tail split's (FX_WORKSPACE_TAIL), 5 the
    tile counters of a dynamic persistent attention variant (FX_WORKSPACE_TILE_COUNTERS)."""
    if "workspace" not in e:
        return 0
    return {"tiles": 2, "counters": 3, "tail": 4, "tile_counters": 5}.get(e["workspace"].get("form"), 1)


def _page_size_mask(entry: dict) -> int:
    """Bit i set: the variant takes pages of 2^i rows (manifest ``page_sizes``, or ``page_size``)."""
    sizes = list(entry.get("page_sizes") or ([entry["page_size"]] if entry.get("page_size") else []))
    if any(s <= 0 or s & (s - 1) or s > 2 ** 30 for s in sizes):
        raise ValueError(f"{entry['name']}: page sizes must be powers of two")
    return sum(1 << (s.bit_length() - 1) for s in set(sizes))


EPILOGUE_FLAGS = {"bias": 1, "silu_mul": 2, "residual": 4, "fp8_groups": 8}  # fx_api.h fx_gemm_epilogue_flags_t


def _epilogue_flags(entry: dict) -> int:
    fields = entry.get("epilogue") or []
    if not isinstance(fields, list) or any(f not in EPILOGUE_FLAGS for f in fields):
        raise ValueError(f"{entry.get('name')}: unknown epilogue fields {fields!r}")
    return sum(EPILOGUE_FLAGS[f] for f in set(fields))


def _rowwise_flags(entry: dict) -> int:
    """fx_variant.rowwise (csrc/fx_select.h FX_RW_*): rms_norm's residual add and e4m3 output,
    rope_kvcache's neox / block-table / e4m3-cache forms."""
    if entry.get("op") == "rms_norm":
        return (1 if entry.get("residual") else 0) | (2 if entry.get("quant") else 0)
    if entry.get("op") == "rope_kvcache":
        return ((4 if entry.get("neox") else 0) | (8 if entry.get("table") else 0)
                | (16 if entry.get("cache_dtype", entry.get("dtype")) == "e4m3" else 0))
    return 0


def _occupancy_kernel(entry: dict) -> str:
    kernels = entry.get("resources", {}).get("kernels", {})
    if not kernels:
        return "NULL"
    return c_str(max(kernels, key=lambda k: kernels[k].get("code_bytes", 0)))


def target_row(t) -> str:
    """One fx_target: capability, specificity and the recorded compute capabilities (Target.runs_on)."""
    if len(t.ccs) > MAX_TARGET_CCS:
        raise ValueError(f"{t.name}: more than {MAX_TARGET_CCS} compute capabilities (csrc/fx_select.h)")
    ccs = ", ".join(f"{{{a}, {b}}}" for a, b in t.ccs) or "{0, 0}"
    return f"{{{c_str(t.name)}, {t.capability[0]}, {t.capability[1]}, {t.specificity}, {len(t.ccs)}, {{{ccs}}}}}"


def _attn_sched(e: dict) -> int:
    """fx_variant.attn_sched: 0 one tile per CTA, 1 persistent, 2 persistent with O through Q's
    slabs (the manifest's tile_scheduler)."""
    ts = e.get("tile_scheduler")
    if not isinstance(ts, dict) or not ts.get("persistent"):
        return 0
    return 2 if ts.get("o_smem") == "q slabs" else 1


def tables(entries: dict[str, dict], tuning_data: dict | None) -> str:
    """The C tables for ``entries`` (the manifest's variants, in manifest order) and the tuning
    table ``tuning_data`` (already matched to this manifest, or None)."""
    names = list(entries)
    index = {n: i for i, n in enumerate(names)}
    used_targets = sorted({e["target"] for e in entries.values() if e["target"] in TARGETS})
    tindex = {t: i for i, t in enumerate(used_targets)}
    out = ['/* --- selection tables (factory.compiler.selection) --- */', '#include "fx_select.h"']
    rows = []
    for i, (n, e) in enumerate(entries.items()):
        defs, args, n_args, divs, n_syms = _contract(f"fx_c{i}", e)
        out += defs
        dt = e.get("dtypes", {})
        lay = e.get("layout", {})
        cfg = e.get("config", {})
        tile = list(e.get("tile") or [])[:3]
        tile += [0] * (3 - len(tile))
        cluster = list(e.get("cluster", [1, 1]))
        twin = n + "_eb"
        twin_i = index[twin] if twin in entries and entries[twin].get("config", {}).get("early_b") else i
        pers = e.get("persistent")
        cpsm = e.get("ctas_per_sm", 0)
        if "ctas_per_sm" in e and not cpsm:
            raise ValueError(f"{n}: ctas_per_sm must be positive")
        a_dt = dt.get("a")
        rows.append("{" + ", ".join(str(x) for x in (
            c_str(n), OP_IDS.get(e.get("op"), 0), FAMILY_IDS.get(e.get("family"), 0), tindex.get(e["target"], -1),
            DTYPE_IDS.get(a_dt, -1), DTYPE_IDS.get(dt.get("c"), -1),
            MAJOR_IDS.get(lay.get("a"), 0), MAJOR_IDS.get(lay.get("b"), 0),
            "{" + ", ".join(str(int(t)) for t in tile) + "}", "{" + ", ".join(str(int(c)) for c in cluster) + "}",
            int(e.get("split_k", 1)), int(e.get("threads", 0)), int(e.get("swizzle", 1)),
            int(bool(e.get("swizzle_exact"))),
            int(e.get("persistent_ctas", 0)), int(pers["cluster_ctas"]) if pers else 0,
            int(bool(e.get("swap_ab"))), int(e.get("schedule", "coop") == "pp"), int(bool(cfg.get("deep"))),
            int(bool(cfg.get("early_b"))), ACC_IDS.get(e.get("fp8_accumulation"), 0), _workspace_form(e),
            twin_i, c_double(tuning._PEAK_TFLOPS.get(a_dt, 800.0)), tuning._BYTES.get(a_dt, 2),
            tuning._BYTES.get(dt.get("c"), 2),
            DTYPE_IDS.get(e.get("dtype"), -1), int(e["head_dim"]) if isinstance(e.get("head_dim"), int) else -1,
            int(bool(e.get("causal"))), int(bool(e.get("varlen"))), int(bool(e.get("pack_gqa"))),
            int(bool(e.get("preferred"))), int(e.get("splits", 1)), int(e.get("stages", 0)),
            int(e.get("min_seqlen_q", 0)), int(cpsm), int(e.get("decode_rows", 0)), int(e.get("kv_splits", 0)), int(bool(e.get("pdl"))),
            DTYPE_IDS.get(e.get("kv_dtype"), -1), int(bool(e.get("paged"))), _page_size_mask(e),
            int(bool(e.get("local"))), int(bool(e.get("softcap"))), int(bool(e.get("sinks"))),
            n_args, args, n_syms, divs,
            f"fx_load_{n}", f"fx_bind_{n}", f"&fx_module_{n}.module",
            _occupancy_kernel(e) if pers else "NULL", int(e.get("resources", {}).get("dynamic_smem_bytes", 0)),
            int((e.get("mma_tile") or tile)[0]), int(e.get("cta_group", 1)),
            c_double(cost_sm100.flops_per_clk(a_dt) if a_dt else 0.0),
            int(e.get("max_m", 0)), int(e.get("rows_per_cta", 0)), FORMAT_IDS.get(e.get("format"), 0),
            GROUPED_IDS.get(e.get("grouped"), 0), _epilogue_flags(e),
            int(e.get("v_layout") == "bhds"),
            int(e.get("max_n", 0)), _rowwise_flags(e), _attn_sched(e),
        )) + "}")
    out.append(f"const fx_variant fx_variants[] = {{\n  {(',' + chr(10) + '  ').join(rows)}\n}};")
    out.append(f"const int32_t fx_n_variants = {len(rows)};")
    out.append(f"fx_state fx_states[{max(1, len(rows))}];")
    trows = [target_row(TARGETS[t]) for t in used_targets]
    out.append(f"const fx_target fx_targets[] = {{{', '.join(trows) or '{NULL, 0, 0, 0, 0, {{0, 0}}}'}}};")
    out.append(f"const int32_t fx_n_targets = {len(trows)};")

    buckets = []
    if tuning_data is not None:
        for key, b in tuning_data.get("buckets", {}).items():
            w = b.get("winner") or None
            bc = (b.get("b_constant") or {}).get("winner") or None
            pk = b.get("packed") or {}
            row = (index.get(w, -1), index.get(bc, -1), index.get(pk.get("winner") or None, -1),
                   index.get(pk.get("b_constant_winner") or None, -1))
            if max(row) >= 0:
                buckets.append((key.encode(), *row))
        # attention buckets ("attention:..." keys, tuning.attention_bucket_key) in the same table
        for key, b in tuning_data.get("attention", {}).items():
            wi = index.get(b.get("winner") or None, -1)
            if wi >= 0:
                buckets.append((key.encode(), wi, -1, -1, -1))
    buckets.sort()
    brows = [f"{{{c_str(k.decode())}, {w}, {b}, {p}, {pb}}}" for k, w, b, p, pb in buckets]
    out.append(f"const fx_bucket fx_buckets[] = {{{', '.join(brows) or '{NULL, -1, -1, -1, -1}'}}};")
    out.append(f"const int32_t fx_n_buckets = {len(brows)};")
    dev = (tuning_data or {}).get("device", {})
    out.append(f"const char fx_tuning_device[] = {c_str(dev.get('name', '') if tuning_data else '')};")
    out.append(f"const int32_t fx_tuning_sm_count = {int(dev.get('sm_count', 0)) if tuning_data else 0};")

    if set(tuning.MODEL) != set(MODEL_KEYS):
        raise ValueError(f"tuning.MODEL has keys {sorted(set(tuning.MODEL) ^ set(MODEL_KEYS))} that csrc/fx_select.c "
                         f"does not port (or no longer has): port the cost model change to C")
    consts = [c_double(tuning.MODEL[k]) for k in MODEL_KEYS] + [c_double(tuning._STREAM_TBS), f"{int(tuning._L2_BYTES)}LL"]
    out.append(f"const fx_model fx_model_constants = {{{', '.join(consts)}}};")
    if set(cost_sm100.MODEL) != set(SM100_MODEL_KEYS):
        raise ValueError(f"cost_sm100.MODEL has keys {sorted(set(cost_sm100.MODEL) ^ set(SM100_MODEL_KEYS))} that "
                         f"csrc/fx_select.c does not port (or no longer has): port the cost model change to C")
    b200 = cost_sm100.B200
    consts = ([c_double(cost_sm100.MODEL[k]) for k in SM100_MODEL_KEYS]
              + [c_double(cost_sm100.CLOCK_GHZ), c_double(b200["hbm_tbs"]), f"{int(b200['l2_bytes'])}LL"])
    out.append(f"const fx_model_sm100 fx_model_sm100_constants = {{{', '.join(consts)}}};")
    out.append(f"const int32_t fx_known_ccs[][2] = {{{', '.join(f'{{{a}, {b}}}' for a, b in KNOWN_CAPABILITIES)}}};")
    out.append(f"const int32_t fx_n_known_ccs = {len(KNOWN_CAPABILITIES)};")
    head_dims, grid_max = attention_limits()
    out.append(f"const int32_t fx_attention_head_dims[] = {{{', '.join(str(d) for d in head_dims)}}};")
    out.append(f"const int32_t fx_n_attention_head_dims = {len(head_dims)};")
    out.append(f"const int64_t fx_attention_grid_yz_max = {grid_max}LL;")
    ops = {op: sum(1 for e in entries.values() if e.get("op") == op) for op in OP_IDS}
    tuned = (f"tuning: {dev['name']} ({dev['sm_count']} SMs), {len(brows)} buckets" if tuning_data
             else "tuning: none (cost model)")
    summary = f"{len(rows)} variants ({ops['gemm']} gemm, {ops['attention']} attention); {tuned}"
    out.append(f"const char fx_selection_summary[] = {c_str(summary)};")
    return "\n".join(out) + "\n"

