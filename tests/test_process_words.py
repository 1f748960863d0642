"""The product says what the code does and what evidence it has, never how it was developed: no
work sessions or periods, issue numbers, "the lab", device-run transfer limits, "merged tree" or
numbered runs in code, tests, scripts, examples, README, docs or the manifest text the builder
writes (all of that is in factory/).  Development history lives in notes/ only.

Each pattern below is one development word in the forms it has been written; ``ALLOWED`` lists the
legitimate uses that contain one (pytest's session scope); a POSIX "new session", a CLI option
``--runs N`` and "issue" as the verb do not match.  Nothing is
imported: the files are read as text.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("factory", "scripts", "tests", "examples", "docs", "README.md", "pyproject.toml")
TEXT = {".py", ".md", ".c", ".h", ".cpp", ".toml", ".txt", ".json", ".cfg", ".ini", ".sh"}

PATTERNS = {
    "a work session": r"(?<!new )(?<!process )\bsessions?\b",  # not a POSIX process session
    "a numbered issue or 'the issue'": r"\bissue ?#?\d+|\bthe issue'?s?\b(?! (?:slots?|rate|width|queue|port)\b)"
                                        r"|\bissue's\b|[\"']issue[\"']|(?-i:\bISSUE_)|\bissue[-_]grid\b",
    "the lab": r"\b(?:the|our|a) lab\b|\blab's\b",
    "a transfer or carry limit": r"\btransfer limits?\b|\bMiB carry\b|\bcarry limits?\b|\bdevice budget\b",
    "the merged tree": r"\bmerged (?:tree|bundle)\b",
    "numbered runs": r"(?<![-\w])\bruns? \d+(?:\s*[-–]\s*\d+)?(?=\s*[),.;:(]|\s*$|\s+(?:and|to|of|above|below|in|on|at|with)\b)",
    "a work period": r"\b(?:work )?periods? \d+\b|\bnumbered (?:work )?periods?\b",
}

# (path, text on the line) of legitimate uses.
ALLOWED = [
    ("tests/conftest.py", '@pytest.fixture(scope="session")'),
]


def _files(root: Path):
    for name in SCANNED:
        p = root / name
        if p.is_file():
            yield p
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and f.suffix in TEXT and "__pycache__" not in f.parts:
                    yield f


def process_words(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """``path:line: [what] text`` for every line of the scanned files that names the development
    process (``skip``: files left out, relative to ``root``)."""
    found = []
    for f in _files(root):
        rel = f.relative_to(root).as_posix()
        if rel in skip:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if any(rel == p and text in line for p, text in ALLOWED):
                continue
            for what, pat in PATTERNS.items():
                if re.search(pat, line, re.IGNORECASE):
                    found.append(f"{rel}:{n}: [{what}] {line.strip()[:140]}")
    return found


def test_no_development_process_words_outside_notes():
    found = process_words(ROOT, skip=("tests/test_process_words.py",))
    assert not found, "development-process words outside notes/ (say what the code does):\n" + "\n".join(found)


def test_the_word_check_catches_each_pattern_and_spares_legitimate_uses(tmp_path):
    bad = {
        "factory/a.py": "# Chosen in session 5 on the lab's H100\n",
        "factory/b.py": "x = 1  # issue #3 asks for it; see the issue's grid\n",
        "docs/c.md": "Measured in runs 9-11 on the merged tree, under the 64 MiB carry limit.\n",
        "scripts/d.py": 'p.add_argument("--grid", choices=["default", "issue"])  # work period 4\n',
        "tests/conftest.py": '@pytest.fixture(scope="session")\ndef f(): pass  # built once per session\n',
    }
    good = {
        "factory/e.py": "# warp 0 issues the MMA; the softmax's issue slots; it runs 2 CTAs per SM\n"
                        "issue_overlap = 0.1  # the kernel issues 96 MUFU.EX2 per row\n",
        "scripts/f.py": '"""python3 scripts/cold_start.py --runs 5; the child runs in a new session"""\n',
        "README.md": "Scales: block-scaled operands carry their own scales.\n",
    }
    for name, text in {**bad, **good}.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    found = process_words(tmp_path)
    hit = {line.split(":")[0] for line in found}
    assert hit == set(bad), found
    whats = {line.split("[")[1].split("]")[0] for line in found}
    assert whats == set(PATTERNS), whats
    assert sum(ln.startswith("tests/conftest.py") for ln in found) == 1, found
