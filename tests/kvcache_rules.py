"""The attention_kvcache selection rules stated in Python: the reference that
tests/test_attention_kvcache.py checks the host library's ``fx_attention_kvcache_select``
(csrc/fx_select.c, the one implementation the runtime calls) against, problem by problem, and
the specification a new family's rule follows (``FAMILIES``: (family, rule), best first; the
first rule that answers wins; within a family the variants with the fewest extra switches).
``decode_split_count`` / ``decode_pick`` are the dense decode rule as runtime/attention.py stated
it before the selection moved to C (H100 measurements: notes/attention-decode.md)."""

from __future__ import annotations

from typing import Callable

from factory.runtime.errors import NoVariantError
from factory.runtime.kvcache import DECODE_MAX_SEQLEN_Q, Problem, _admits, _missing

DECODE_ROWS = 16
_L2_BYTES = 50 * 1024 * 1024


def decode_split_count(groups: int, key_tiles: int, kv_bytes: int, row_blocks: int, sms: int,
                       available, l2_bytes: int = _L2_BYTES, rows: int = 0) -> int:
    """Split-KV count of a decode-family variant for ``groups`` = batch · kv heads · row blocks
    CTAs per split (``row_blocks`` = ceil(Hq/Hkv · Sq / 16) per kv head) over ``key_tiles`` key
    tiles of ``kv_bytes`` K and V.  H100 (notes/attention-decode.md, 132 SMs, 2 CTAs
    per SM; the best split of every measured shape):
      * groups >= 3/4 of the SMs: 1 (B16 H32/8, 128 groups: split 2 ran 10.8 µs vs 8.3 at Sk512;
        B4 H32/32 Sk1024 28.5 vs 25.7);
      * fewer: the fewest splits, at least 2, that give more than SMs/4 CTAs, or more than
        SMs/2 when a kv head has several row blocks (each CTA reads the whole K/V): 64 CTAs for
        8, 16 or 32 groups (B4 H32/8 Sk4096: 2 splits 29.1 µs, 4 splits 30.7; B2 Sk16384: 4
        splits 50.0, 8 splits 52.7), 128 for 64 groups (B8 Sk1024: 10.0 vs 12.1 unsplit), 4 for
        B1 H32/8 Sq16 (58.5 µs, 2 splits 76.9);
      * every split keeps at least 2 key tiles (B1 Sk512, 8 tiles: 4 splits 6.4 µs, 8 splits 7.4);
      * when that is the largest cluster split (8), K/V fit in L2 and 32 splits keep 2 tiles each:
        32 (merged by the second kernel; B1 H32/8 Sk4096 10.1 µs vs 11.3, Sk8192 12.5 vs 15.8),
        unless more than 64 query rows (``rows`` = B·Hq·Sq) would be merged and the cluster split
        keeps fewer than 16 tiles each: the second kernel reads 32 fp32 partials per row (H100,
        4k keys: MQA B8 H16/1 8 splits with PDL 11.0 µs, 32: 16.0; B1 H32/8 Sq4 11.3 vs 16.6;
        B1 H64/8, 64 rows, 10.6 vs 10.8; B1 H32/8, 32 rows, 10.6 vs 9.5).
    ``available``: {splits: merged in a cluster?} of the built variants."""
    if groups * 4 >= 3 * sms:
        return 1
    target = sms // 2 if row_blocks > 1 else sms // 4
    fits = sorted(sp for sp in available if sp == 1 or key_tiles >= 2 * sp)
    cl = [sp for sp in fits if sp >= 2 and available[sp]]
    n = next((sp for sp in cl if groups * sp > target), cl[-1] if cl else 1)
    big = [sp for sp in fits if not available[sp] and sp > n]
    if (cl and n == max(sp for sp in available if available[sp]) and kv_bytes <= l2_bytes and big
            and (rows <= 64 or key_tiles >= 16 * n)):
        n = big[-1]
    return n


def decode_pick(entries: list[dict], decode: tuple, causal: bool, sms: int,
                l2_bytes: int = _L2_BYTES) -> dict | None:
    """The decode-family entry for a dense problem ``decode`` = (batch, Hq, Hkv, Sq, Sk), or None
    when the family does not serve it: Sq > 16, or Sq > 1 without causal masking (the family is
    built bottom-right causal; with one query that equals no mask).  Entries of one tile config
    (the preferred one where several are built), split count by :func:`decode_split_count`."""
    b, hq, hkv, sq, sk = decode
    entries = [e for e in entries if e.get("causal") and not _last(e)]
    if not entries or sq > DECODE_MAX_SEQLEN_Q or (sq > 1 and not causal) or hkv <= 0:
        return None
    pref = [e for e in entries if e.get("preferred")] or entries
    tile = list(pref[0]["tile"])
    same = [e for e in pref if list(e["tile"]) == tile]
    row_blocks = -(-(hq // hkv) * sq // DECODE_ROWS)
    kv_bytes = 2 * b * sk * hkv * same[0]["head_dim"] * (2 if same[0]["dtype"] in ("bf16", "f16") else 4)
    avail = {int(e["kv_splits"]): e["cluster"][0] > 1 for e in same}
    groups = b * hkv * row_blocks
    n = decode_split_count(groups, -(-sk // tile[1]), kv_bytes, row_blocks, sms, avail, l2_bytes, rows=b * hq * sq)
    # PDL: for the second-kernel split, and for a cluster split whose grid leaves half the SMs
    # idle (H100: B1-B4 -0.6 to -0.9 µs; grids of ~128 CTAs lost up to 18 %, DEFAULT's note).
    pdl = n > 1 and (not avail.get(n) or 2 * groups * n <= sms)
    if same[0]["head_dim"] >= 128 and (w := _wide_pick(entries, n, groups, same[0]["head_dim"], sms)) is not None:
        return w  # the 8-warp build where built and the grid leaves half the SMs idle
    fits = [e for e in same if int(e["kv_splits"]) == n]
    return next((e for e in fits if bool(e.get("pdl")) == pdl), fits[0] if fits else None)


def _last(e: dict) -> bool:
    """A variant whose last split merges the others (workspace form "counters")"""
    return (e.get("workspace") or {}).get("form") == "counters"


def _switch_cost(e: dict) -> int:
    return sum(bool(e.get(s)) for s in ("local", "softcap", "sinks"))


def paged_split_count(groups: int, key_tiles: int, sms: int, available: dict, head_dim: int = 128,
                      fp8: bool = False, rows: int | None = None) -> int:
    """Split-KV count of a paged decode variant for ``groups`` = batch · kv heads · row blocks
    CTAs per split over ``key_tiles`` tiles of the cache's capacity; ``available``: {splits:
    merged in a cluster?}.  The paged kernel spends more instructions per key tile than the dense
    one (a page lookup and an address per row), so it wants more resident CTAs than the dense
    rule gives.  H200 (notes/attention-kvcache.md, page 16, every split timed by name):
      * groups >= 3/4 of the SMs: 1 (as the dense rule);
      * else the fewest splits, each keeping at least 4 key tiles, that give ~2 CTAs per SM
        (groups · splits >= 1.9 · SMs): B1 H32/8 32k 32 splits 39.6 µs (8: 61.6), B8 H64/8 D64
        8k 4 splits 42.7 (2: 53.7); none reaches it: the most that keep 4 tiles (MQA B8 H16/1 4k:
        8 splits 13.2, 32: 15.4);
      * an 8-CTA cluster split whose grid passes one CTA per SM packs into clusters badly: the
        32-split instead where built (B4 H64/8 32k: 8 splits 172 µs, 32: 140, 4: 149), for bf16/f16
        caches at head_dim >= 128 only where its splits keep >= 8 tiles each, else the step-down
        below (B4 H32/8 8k page 16, 32 splits of 4 tiles: H100 58.3 µs, 4 splits 54.8; H200 49.1
        vs 43.8);
      * head_dim >= 128 (184 registers at D128, two 64 KB stages at D256): a cluster split whose
        grid still passes one CTA per SM steps down to the largest cluster split that does not
        (H100, B8 H32/8 D128 8k page 16: splits 1: 117 µs, 2: 97, 4: 117, 8: 110, 32: 105);
      * fp8 e4m3 caches: the same early unsplit (H100, the warp-own direct build, B16 H32/8 4k page
        16/64: unsplit 54.1/51.7 µs, 2 splits 56.2/56.5) and step-down (B8 H32/8 8k: 2 splits 55.7 µs,
        4: 67.3, 32: 67.0);
      * bf16/f16 caches of at most 32 query rows (``rows`` = B·Hq·Sq): a split merged by the second
        kernel (32) needs only 2 tiles each (H100 page 16, 4k keys: B1 H32/8 32 splits 9.5 µs, the
        8-cluster 11.3-12.2; B2 H16/1 9.4 vs 11.1-12.9; MQA B8 H16/1, 128 rows: 16.2 vs 12.1)."""
    if groups * 4 >= 3 * sms:
        return 1
    short = not fp8 and rows is not None and rows <= 32  # the second kernel merges few rows
    fits = sorted(s for s in available
                  if s == 1 or key_tiles >= 4 * s or (short and not available[s] and key_tiles >= 2 * s))
    n = next((s for s in fits if groups * s >= 1.9 * sms), fits[-1])
    if n > 1 and available.get(n) and n >= 8 and groups * n > sms:
        # (bf16/f16 head_dim >= 128: only where each of its splits keeps >= 8 tiles, else the step-down)
        big = [s for s in fits if s > n and not available[s] and (fp8 or head_dim < 128 or key_tiles >= 8 * s)]
        if big:
            n = big[0]
    if (fp8 or head_dim >= 128) and n > 1 and available.get(n) and groups * n > sms:
        down = [s for s in fits if s >= 2 and available[s] and groups * s <= sms]
        if down:
            n = down[-1]
    return n


def _pick_decode(entries: list[dict], p: Problem, sms: int) -> dict | None:
    """sm90_decode: dense q with at most 16 queries (packed rows of one kv head).  Split-KV count:
    paged caches by :func:`paged_split_count`, dense ones by the dense rule
    (:func:`runtime.attention.decode_pick`), both on the cache's capacity (fixed for a graph)."""
    if p.varlen_q or p.seqlen_q > DECODE_MAX_SEQLEN_Q:
        return None
    shape = (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.max_seqlen_k)
    row_blocks = -(-(p.heads_q // p.heads_kv) * p.seqlen_q // DECODE_ROWS) if p.heads_kv > 0 else 0
    groups = p.batch * p.heads_kv * row_blocks
    last = [e for e in entries if _last(e)]
    entries = [e for e in entries if not _last(e)]
    if (e := _last_pick(last, p, groups, sms)) is not None:
        return e
    if p.page_size is None:
        return decode_pick(entries, shape, True, sms)
    pref = [e for e in entries if e.get("preferred")] or entries
    tile = list(pref[0]["tile"])
    same = [e for e in pref if list(e["tile"]) == tile]
    avail = {int(e["kv_splits"]): e["cluster"][0] > 1 for e in same}
    n = paged_split_count(groups, -(-p.max_seqlen_k // tile[1]), sms, avail, p.head_dim, p.kv_dtype == "e4m3",
                          rows=p.batch * p.heads_q * p.seqlen_q)
    if p.kv_dtype == "e4m3" and 2 * groups * n <= sms:
        # grids that leave half the SMs idle: the fp8 build of one CTA per SM (8 warps) of that split
        # count, its PDL twin first, where built (H100, warp-own builds, page 16/64: MQA B8 H16/1 4k at
        # 8 splits 11.8/11.7 µs vs 12.3/12.1; at one CTA per SM and more it loses or ties: B8 H32/8
        # 8k, 2 splits, 56.4/56.3 vs 55.7/53.8)
        wide = [e for e in entries if not e.get("preferred") and int(e["kv_splits"]) == n and e.get("ctas_per_sm") == 1]
        if wide:
            return next((e for e in wide if e.get("pdl")), wide[0])
    if p.kv_dtype != "e4m3" and (e := _wide_pick(entries, n, groups, p.head_dim, sms)) is not None:
        return e
    return next((e for e in same if int(e["kv_splits"]) == n), None)


def _last_pick(last: list[dict], p: Problem, groups: int, sms: int) -> dict | None:
    """The builds whose last split merges the others (one launch, no cluster), where built, for
    head_dim >= 128 (H100, notes/attention-kvcache.md, every variant timed by name in one run; page
    16 unless said):
      * the 8-warp 128-key-tile build (one CTA per SM) at the largest of 32 and 16 splits whose grid
        is more than a quarter of the SMs and at most all of them, each split keeping >= 2 tiles:
        MQA H16/1 B8 4k 10.5 µs (the 8-cluster's 8-warp build 12.0; page 64 10.4 vs 11.1, page 1
        10.4 vs 11.8, dense cache 10.1 vs 10.8, mixed lengths 9.9 vs 11.4), B4 4k 9.9 vs 11.1, B8 8k
        13.4 vs 18.6 (the 32-split's second kernel), B8 16k 32.0 vs 35.2, B4 H16/2 8k 12.3 vs 14.1,
        B1 H32/8 4k 9.0 vs 9.5, 32 splits: B2 H16/1 16k 12.7 vs 14.0; not where the grid is smaller
        (B2 H16/1 4k 16 splits 9.6 vs 9.3) or a split keeps one tile (B8 2k: 9.2 vs 9.3; B8 1k 8.6 vs
        8.2);
      * else the 4-warp build (two CTAs per SM) at 16 splits where that grid is at most two CTAs
        per SM and each split keeps >= 4 of its 64-key tiles: MQA B16 4k 15.6 vs 18.4 (B4 H32/8 8k,
        512 CTAs: 55.5 vs 54.3, not taken).
    head_dim 64: slower than the rule's pick on every shape measured (B16 H32/8 4k 59.5 vs 51.1).
    e4m3 caches take the same rule where such builds exist (the default tier: the 8-warp build at 16
    splits): MQA B8 4k page 16 10.6 µs vs 12.1 for the fp8 pick before (page 64 10.7 vs 12.0), B1
    H32/8 32k 33.5 vs 34.4."""
    if p.head_dim < 128 or not last:
        return None
    sk = p.max_seqlen_k

    def built(splits: int, per_sm: int):
        return next((e for e in last if int(e["kv_splits"]) == splits and e.get("ctas_per_sm") == per_sm
                     and not e.get("pdl")), None)

    for s in (32, 16):
        if 4 * groups * s > sms and groups * s <= sms and sk >= 256 * s and (e := built(s, 1)) is not None:
            return e
    if sms < groups * 16 <= 2 * sms and sk >= 16 * 256:
        return built(16, 2)
    return None


def _wide_pick(entries: list[dict], n: int, groups: int, head_dim: int, sms: int) -> dict | None:
    """The bf16/f16-cache build of 8 warps over 128-key tiles (not preferred; one CTA per SM by the
    manifest's estimate), where built, for the split count ``n`` of the preferred build (H100,
    notes/attention-kvcache.md, every variant timed by name in one run):
      * head_dim 64 (124 registers, 96 KB: two such CTAs per SM, the warps of four default ones): at
        half the split count, at least 1, where that grid is at most 4 CTAs per SM (B8 H64/8 8k page
        64: 2 splits 50.5 µs, the preferred build's 4: 55.2; B16 H32/8 4k: unsplit 51.4 vs 59.9;
        B64 H32/8 1k: 53.5 vs 55.5; B128 H16/1 2k: 28.6 vs 31.7, mixed lengths 17.1 vs 23.3; past
        4 CTAs per SM it loses: B256 H32/8 512 102.1 vs 98.7, B32 H32/32 1k 98.2 vs 95.5);
      * head_dim >= 128 (192 KB: one CTA per SM): at the same split count where that grid leaves
        half the SMs idle, so that a CTA's chain of tiles is what bounds it (MQA B8 H16/1 4k,
        8 splits: page 16 12.3 µs vs 13.3, page 64 11.7 vs 13.1, dense cache 10.7 vs 11.5);
        elsewhere within 1-2 % of the preferred build or slower.
    Its PDL twin where built and the grid leaves half the SMs idle (as the dense rule)."""
    half = max(1, n // 2)
    want = (half if groups * half <= 4 * sms else 0) if head_dim <= 64 else (n if 2 * groups * n <= sms else 0)
    fits = [e for e in entries if not e.get("preferred") and e.get("ctas_per_sm") == 1
            and int(e["kv_splits"]) == want]
    pdl = want > 1 and 2 * groups * want <= sms
    return next((e for e in fits if bool(e.get("pdl")) == pdl), fits[0] if fits else None)


def _pick_prefill(entries: list[dict], p: Problem, sms: int) -> dict | None:
    """sm90 (sm_90a: K/V by TMA page boxes, or cp.async row gathers for any page size) and sm80
    (cp.async row gathers; Ampere/Ada/sm_120, and the sm_90 build): any seqlen_q, dense or packed
    q.  The variant taking the fewest page sizes (a TMA page-box build over a gather build, when
    the page size is one it takes), then the default tile; the first of equals."""
    return min(entries, key=lambda e: (len(e.get("page_sizes") or ()), not e.get("preferred")))


# (family, rule): best first.  A rule gets the family's variants that implement the problem
# (fewest extra switches first) and returns one, or None when the family does not serve it.
FAMILIES: list[tuple[str, Callable[[list[dict], Problem, int], dict | None]]] = [
    ("sm90_decode", _pick_decode),
    ("sm90", _pick_prefill),
    ("sm80", _pick_prefill),
]


def register_family(family: str, rule: Callable[[list[dict], Problem, int], dict | None],
                    before: str | None = None) -> None:
    """Add (or replace) a family's rule in :data:`FAMILIES`, before family ``before`` (else last)."""
    FAMILIES[:] = [(f, r) for f, r in FAMILIES if f != family]
    at = next((i for i, (f, _) in enumerate(FAMILIES) if f == before), len(FAMILIES))
    FAMILIES.insert(at, (family, rule))


def select(candidates: list[dict], p: Problem, sms: int = 132) -> dict:
    """The manifest entry for problem ``p`` (candidates best target first), or NoVariantError
    saying what is missing."""
    fit = [e for e in candidates if _admits(e, p)]
    for family, rule in FAMILIES:
        mine = [e for e in fit if e.get("family") == family]
        if not mine:
            continue
        least = min(_switch_cost(e) for e in mine)
        e = rule([e for e in mine if _switch_cost(e) == least], p, sms)
        if e is not None:
            return e
    raise NoVariantError(_missing(candidates, p))
