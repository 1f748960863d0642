#!/usr/bin/env python3
"""Compact summary of an ncu source-page export (``ncu --import R.ncu-rep --page source --csv
--print-source sass``): the SASS lines with the most warp-stall samples, each with its share of
all samples and its largest stall reasons, and the totals per stall reason.

    python3 scripts/ncu_source_summary.py SOURCE.csv [--top 40] [--out SUMMARY.json]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path


def _num(x: str) -> float | None:
    try:
        return float(x.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def summarize(text: str, top: int = 40) -> dict:
    # The export may start with lines before the CSV header (process / kernel banners).
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"') and "Source" in ln)
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    cols = list(rows[0].keys())
    total_col = next(c for c in cols if "Warp Stall Sampling (All" in c)
    src_col = next(c for c in cols if c.strip().strip('"') == "Source")
    addr_col = next((c for c in cols if c.strip().strip('"') == "Address"), None)
    # Per-reason sample columns: numeric columns besides the totals whose header names a stall.
    reason_cols = [c for c in cols if c != total_col and c.lower().startswith("stall")]
    total = sum(_num(r[total_col]) or 0 for r in rows) or 1.0
    reasons = {c: sum(_num(r[c]) or 0 for r in rows) for c in reason_cols}
    out_rows = []
    for r in sorted(rows, key=lambda r: -(_num(r[total_col]) or 0))[:top]:
        s = _num(r[total_col]) or 0
        per = sorted(((c, _num(r[c]) or 0) for c in reason_cols), key=lambda kv: -kv[1])[:3]
        out_rows.append({"addr": r.get(addr_col, "") if addr_col else "", "sass": r[src_col].strip()[:80],
                         "pct": round(100 * s / total, 2),
                         "top": {c: round(100 * v / total, 2) for c, v in per if v > 0}})
    return {"samples": total, "by_reason_pct": {c: round(100 * v / total, 2) for c, v in
                                                sorted(reasons.items(), key=lambda kv: -kv[1]) if v > 0},
            "top_lines": out_rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out")
    args = ap.parse_args()
    s = summarize(Path(args.csv).read_text(errors="replace"), args.top)
    text = json.dumps(s, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
