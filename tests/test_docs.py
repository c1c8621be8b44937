"""The documentation stays true to the repository.

- The README is a front door: at most :data:`README_MAX_LINES` lines; everything else lives in docs/.

- ``docs/findings.md`` has an entry for every finding ID a test is named after, and every test it cites
  still exists (found by function name, so moving a test file does not break the page).
- Every relative link in the README and the docs points at a file or directory that ships, and every
  ``#anchor`` into a markdown file names one of its headings. The one exception is the experiment log's
  record: a link of ``docs/experiment-log.md`` into ``bench/`` may name a file that left HEAD, if the
  revision its section "Where the removed code and files are" names holds it.
- Nothing cites a document the repository does not ship (the design notes, the findings register and
  the reviews that lived beside the repository while it was built).
- ``docs/operations.md``'s list of what a ``--resume`` may change is the code's (``RESUMABLE`` and
  ``SHAPE_FIELDS`` in ``esper/shell/run.py``; issue 102).
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FINDINGS = ROOT / "docs" / "findings.md"

#: A test named after findings: ``test_C4_H5_...`` names C4 and H5.
TEST_DEF = re.compile(r"^\s*def (test_((?:[A-Z]\d+_)+)\w*)\s*\(", re.M)


def _python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def _test_functions() -> dict[str, list[str]]:
    """Every ``def test_...`` under tests/: name -> the files (relative) that define it."""
    out: dict[str, list[str]] = {}
    for path in _python_files("tests"):
        for name in re.findall(r"^\s*def (test_\w+)\s*\(", path.read_text(), flags=re.M):
            out.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return out


def _finding_tests() -> dict[str, set[str]]:
    """Finding ID -> the names of the tests named after it."""
    out: dict[str, set[str]] = {}
    for path in _python_files("tests"):
        for name, ids in TEST_DEF.findall(path.read_text()):
            for finding in re.findall(r"[A-Z]\d+", ids):
                out.setdefault(finding, set()).add(name)
    return out


def _without_code(text: str) -> str:
    """``text`` with fenced code blocks blanked (line count kept) and inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def _headings(text: str) -> list[str]:
    return re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _without_code(text), flags=re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading anchors on its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _headings(md.read_text()):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


#: The README's length limit (issue 43): a pitch, a quick start, the current result, and links.
README_MAX_LINES = 300


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move the detail to a page under docs/ "
        "and link it"
    )


# ------------------------------------------------------------------------------------------------ (a)
def test_every_finding_id_in_a_test_name_has_an_entry():
    assert FINDINGS.is_file(), "docs/findings.md is missing"
    doc = FINDINGS.read_text()
    by_id = _finding_tests()
    assert by_id, "no test is named after a finding: the scan is broken"
    headings = _headings(doc)
    missing = sorted(finding for finding in by_id if not any(re.match(rf"{finding}\b", h) for h in headings))
    defined = _test_functions()
    cited = set(re.findall(r"`(test_\w+)`", doc))
    unknown = sorted(cited - defined.keys())
    named = set().union(*by_id.values())
    uncited = sorted(named - cited)
    problems = []
    if missing:
        problems.append(f"finding IDs named by tests with no heading in docs/findings.md: {missing}")
    if unknown:
        problems.append(f"docs/findings.md cites tests that no longer exist under tests/: {unknown}")
    if uncited:
        problems.append(f"tests named after a finding that docs/findings.md does not cite: {uncited}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ (b)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)


def _markdown_files() -> list[Path]:
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "bench" / "results").rglob("*.md"),
    ]
    return sorted({p for p in files if p.is_file()})


#: The experiment log, whose links into ``bench/`` may name files kept only at :func:`_removed_at`.
EXPERIMENT_LOG = ROOT / "docs" / "experiment-log.md"


def _removed_at() -> str | None:
    """The revision the experiment log's section "Where the removed code and files are" names."""
    text = EXPERIMENT_LOG.read_text()
    section = re.search(r"^## Where the removed code and files are\n(.*?)(?=^## )", text, flags=re.S | re.M)
    found = re.search(r"\b[0-9a-f]{7,40}\b", section.group(1)) if section else None
    return found.group(0) if found else None


@cache
def _paths_at(rev: str) -> frozenset[str] | None:
    """Every file and directory under ``bench/`` at ``rev``, or None where git cannot say (no git, or a
    clone without that revision): the link is then taken on the section's word."""
    try:
        proc = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", "bench"], cwd=ROOT,
                              capture_output=True, text=True, check=False)  # fmt: skip
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    files = proc.stdout.split()
    return frozenset(files) | {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}


def _kept_at_removal(md: Path, resolved: Path) -> bool:
    """Whether ``resolved``, linked from ``md`` and missing from the working tree, is a file of the log's
    record that left HEAD: under ``bench/``, and at the revision the log names."""
    bench = ROOT / "bench"
    if md != EXPERIMENT_LOG or not resolved.is_relative_to(bench) or (rev := _removed_at()) is None:
        return False
    paths = _paths_at(rev)
    return paths is None or resolved.relative_to(ROOT).as_posix() in paths


def test_relative_links_resolve():
    broken = []
    for md in _markdown_files():
        text = _without_code(md.read_text())
        for lineno, line in enumerate(text.splitlines(), 1):
            for target in [*LINK.findall(line), *REF_LINK.findall(line)]:
                target = target.strip("<>")
                if re.match(r"^(https?:|mailto:|#)", target):
                    continue
                path, _, anchor = target.partition("#")
                where = f"{md.relative_to(ROOT).as_posix()}:{lineno}: {target}"
                base = ROOT if path.startswith("/") else md.parent
                resolved = (base / unquote(path.lstrip("/"))).resolve()
                if not resolved.is_relative_to(ROOT):
                    broken.append(f"{where} (outside the repository)")
                elif not resolved.exists():
                    if not _kept_at_removal(md, resolved):
                        broken.append(f"{where} (no such file or directory)")
                elif anchor and resolved.suffix == ".md" and unquote(anchor) not in _anchors(resolved):
                    broken.append(f"{where} (no heading with anchor #{anchor})")
    assert not broken, f"{len(broken)} broken relative link(s):\n" + "\n".join(broken)


# ------------------------------------------------------------------------------------------------ (c)
#: A pattern that cites a document, and the file name whose presence in the repository makes the
#: citation fine (None: it never ships, e.g. a path outside the repository).
CITATIONS: dict[str, str | None] = {
    "DESIGN.md": "DESIGN.md",
    "FINDINGS.md": "FINDINGS.md",
    "STYLE.md": "STYLE.md",
    "original-system.md": "original-system.md",
    "reference §": "original-system.md",
    "../shared": None,
}


def _shipped_names() -> set[str]:
    skip = {".git", "__pycache__", ".venv", "venv", "runs", ".pytest_cache", ".hypothesis"}
    names = set()
    for _, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip]
        names.update(files)
    return names


def test_no_citation_of_unshipped_documents():
    shipped = _shipped_names()
    forbidden = [pat for pat, name in CITATIONS.items() if name is None or name not in shipped]
    files = [*_python_files("esper", "tests", "bench"), ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    this = Path(__file__).resolve()
    offences = []
    for path in sorted({p for p in files if p.is_file() and p.resolve() != this}):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for pat in forbidden:
                if pat in line:
                    offences.append(
                        f"{path.relative_to(ROOT).as_posix()}:{lineno}: cites {pat!r}: {line.strip()}"
                    )
    assert not offences, (
        f"{len(offences)} citation(s) of documents the repository does not ship:\n" + "\n".join(offences)
    )


OPERATIONS = ROOT / "docs" / "operations.md"


def _backticked(text: str) -> list[str]:
    """The code spans of ``text``, a section's ``x.*`` read as the prefix ``x.`` (as the code writes it)."""
    return [s[:-1] if s.endswith(".*") else s for s in re.findall(r"`([^`]+)`", text)]


def test_issue102_the_resume_list_in_operations_md_is_the_codes():
    """The fields ``docs/operations.md`` says a resume may change (the code spans after "`RESUMABLE` in
    `esper/shell/run.py`:" up to the ";") and those it keeps fixed within them (after "`SHAPE_FIELDS`",
    from its ":" to the ")") are ``RESUMABLE`` and ``SHAPE_FIELDS``, in the code's order."""
    from esper.shell.run import RESUMABLE, SHAPE_FIELDS

    text = " ".join(OPERATIONS.read_text().split())
    listed = re.search(r"`RESUMABLE` in `esper/shell/run\.py`:([^;]*);", text)
    shapes = re.search(r"`SHAPE_FIELDS`[^:]*:([^)]*)\)", text)
    assert listed and shapes, "docs/operations.md no longer lists RESUMABLE and SHAPE_FIELDS (Resume)"
    assert tuple(_backticked(listed.group(1))) == RESUMABLE, (
        f"docs/operations.md lists {_backticked(listed.group(1))} as RESUMABLE; esper/shell/run.py has "
        f"{RESUMABLE}"
    )
    assert tuple(_backticked(shapes.group(1))) == SHAPE_FIELDS, (
        f"docs/operations.md lists {_backticked(shapes.group(1))} as SHAPE_FIELDS; esper/shell/run.py has "
        f"{SHAPE_FIELDS}"
    )
