"""Every figure the front pages quote from a committed results file is that file's (issue 88, "every figure
traced").

For README.md, docs/results.md, docs/suite.md and docs/performance.md:

- Every link into ``bench/results/`` resolves to a file that ships.
- **Tables.** A row's sources are the results files it links, else its table's: those the header
  links, else those its caption links (the paragraph just before it, else the one just after it, within
  its section). Every decimal figure of every cell but the first (the row's label) must be one of its
  sources' numbers, rounded as shown, and so must every integer of a cell that starts with a figure (a
  column of figures, not of prose); every ``mean [low, high]`` must be an interval of its sources as a
  whole (the three together, not each anywhere in the file).
- **Sentences.** A sentence that links a results file (a link, or a code span naming a file that exists)
  is read against the files it links: each of its decimal figures (``79.8``, ``0.913``, ``2.49x``) and
  its intervals, as for a table. Its integers are not read (seeds, counts, dates, thread and core counts
  are integers).
- **Suite tables** (a ``| task |`` table whose source is a suite results file with ``tasks``): each
  controller column's mean and interval is that task's controller's, to the shown precision (the
  reading ``tests/test_readme.py`` first gave the README's suite table, which now calls it here).

A source is a results file and its sibling of the other kind (``X.md`` and ``X.json``): a figure may
be in either. Its numbers are every number written in the ``.md``, and every number of the ``.json``
(those written in its strings too) but the entries of lists longer than :data:`LONG` (per-episode
records, which would match almost any figure). A figure matches a number if it is that number rounded
to the figure's decimals (sign aside: "trails by 1.05" quotes -1.05).

What it does not check: sentences that name no results file (the experiment log's figures, prose
between a link and the next), integers in sentences and in prose cells, figures derived from a file's
numbers (a difference, a ratio), and which row or column of a file a figure came from: outside suite
tables and intervals, a figure may match any number of its sources (a gain share of 0.92 changed to
0.93 passes if the file also holds 0.93).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = ("README.md", "docs/results.md", "docs/suite.md", "docs/performance.md")

LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]*)`")
#: A figure: digits with an optional decimal part, ``x`` (a ratio) allowed after it, nothing else glued on
#: (``4x25``, ``9223a0c``, ``2.13.0``, ``p90``, a date are not figures).
FIGURE = re.compile(
    r"(?<![\w.\-/@])(?!\d{4}-\d\d-\d\d)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?=x?(?![\w.]*\d)(?![\w]))"
)
INTERVAL = re.compile(r"([-+]?\d+(?:\.\d+)?) \[([-+]?\d+(?:\.\d+)?), ([-+]?\d+(?:\.\d+)?)\]")
#: Words after which a decimal is a version, not a figure.
VERSION_OF = re.compile(r"(?:torch|Python|Triton|CUDA|version)\s*$", re.I)


# ------------------------------------------------------------------------------------------ the pages


@dataclass
class Block:
    """A paragraph, a list item or a table of a page, with the line it starts on."""

    kind: str  # "text" or "table"
    line: int
    lines: list[str] = field(default_factory=list)
    section: int = 0  # index of the heading it is under

    @property
    def text(self) -> str:
        return " ".join(ln.strip() for ln in self.lines)


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    cur: Block | None = None
    fenced = False
    section = 0
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            cur = None
            continue
        if fenced:
            continue
        if not line or line.startswith("#"):
            section += line.startswith("#")
            cur = None
            continue
        kind = "table" if line.startswith("|") else "text"
        item = kind == "text" and re.match(r"(?:[-*+]|\d+\.)\s", line) is not None
        if cur is None or cur.kind != kind or item:
            cur = Block(kind, i, section=section)
            out.append(cur)
        cur.lines.append(line)
    return out


def resolve(target: str, page: Path) -> Path | None:
    """The results file a link of ``page`` points at (anchor dropped), or None if it points elsewhere."""
    path = target.split("#", 1)[0]
    if not path or "://" in path:
        return None
    full = (page.parent / path).resolve()
    try:
        full.relative_to(RESULTS)
    except ValueError:
        return None
    return full


def sources(text: str, page: Path) -> set[Path]:
    """The results files (``.md``/``.json``) ``text`` links or names in a code span."""
    out = set()
    for _, target in LINK.findall(text):
        path = resolve(target, page)
        if path is not None and path.suffix in (".md", ".json") and path.name != "README.md":
            out.add(path)
    for span in CODE.findall(text):
        for word in span.split():
            if (
                word.startswith("bench/results/")
                and word.endswith((".md", ".json"))
                and (ROOT / word).is_file()
            ):
                out.add(ROOT / word)
    return out


def prose(text: str) -> str:
    """``text`` with code spans, link targets and images dropped (link texts kept) and emphasis removed."""
    text = CODE.sub(" ", text)
    text = LINK.sub(lambda m: " " if m.group(0).startswith("!") else m.group(1), text)
    return text.replace("**", "").replace("__", "")


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(\[*`])", text)


# ---------------------------------------------------------------------------------------- the figures


@dataclass(frozen=True)
class Figure:
    text: str
    value: float
    decimals: int


def figures(text: str, *, integers: bool) -> list[Figure]:
    out = []
    for m in FIGURE.finditer(text):
        whole, frac = m.group(1), m.group(2) or ""
        if not frac and not integers:
            continue
        if frac and VERSION_OF.search(text[: m.start()]):
            continue
        out.append(Figure(m.group(0), float(whole.replace(",", "") + frac), max(len(frac) - 1, 0)))
    return out


def intervals(text: str) -> list[tuple[Figure, Figure, Figure]]:
    def fig(s: str) -> Figure:
        frac = s.split(".", 1)[1] if "." in s else ""
        return Figure(s, float(s), len(frac))

    return [(fig(a), fig(b), fig(c)) for a, b, c in INTERVAL.findall(text.replace("−", "-"))]


# ------------------------------------------------------------------------------------ what files hold

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers_in(text: str) -> list[float]:
    return [float(s.replace(",", "")) for s in NUMBER.findall(text)]


#: A JSON list longer than this is a record of episodes or steps, not a summary: its numbers are not read.
LONG = 12


def _walk(obj, out: list[float], triples: list[tuple[float, float, float]]) -> None:
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        out.append(float(obj))
    elif isinstance(obj, str):
        out.extend(_numbers_in(obj))
        triples.extend(_triples_in(obj))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _walk(value, out, triples)
            # a mean beside its interval: "X_mean" and "X_ci95", or "mean" and "ci95"
            if isinstance(key, str) and key.endswith("mean") and isinstance(value, (int, float)):
                ci = obj.get(key[: -len("mean")] + "ci95")
                if isinstance(ci, list) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
                    triples.append((float(value), float(ci[0]), float(ci[1])))
    elif isinstance(obj, list):
        if len(obj) > LONG:
            return  # per-episode and per-step records: not what a page quotes, and they would match anything
        for value in obj:
            _walk(value, out, triples)
        if len(obj) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            lo, hi = obj  # an interval with its middle: a paired difference is often stored as [lo, hi]
            triples.append(((lo + hi) / 2, float(lo), float(hi)))


def _triples_in(text: str) -> list[tuple[float, float, float]]:
    return [tuple(float(x) for x in t) for t in INTERVAL.findall(text.replace("−", "-"))]


@dataclass
class Evidence:
    files: tuple[Path, ...]
    numbers: list[float]  # absolute values, sorted
    triples: list[tuple[float, float, float]]

    def has(self, f: Figure) -> bool:
        tol, value = 0.5 * 10.0**-f.decimals + 1e-9, abs(f.value)
        i = bisect.bisect_left(self.numbers, value - tol)
        return i < len(self.numbers) and self.numbers[i] <= value + tol

    def has_interval(self, t: tuple[Figure, Figure, Figure]) -> bool:
        def near(f: Figure, v: float) -> bool:
            return abs(f.value - v) <= 0.5 * 10.0**-f.decimals + 1e-9

        return any(near(t[0], mean) and near(t[1], lo) and near(t[2], hi) for mean, lo, hi in self.triples)


@cache
def _file_evidence(path: Path) -> tuple[list[float], list[tuple[float, float, float]]]:
    text = path.read_text()
    if path.suffix == ".json":
        numbers: list[float] = []
        triples: list[tuple[float, float, float]] = []
        _walk(json.loads(text), numbers, triples)
        return numbers, triples
    return _numbers_in(text), _triples_in(text)


def evidence(paths: set[Path]) -> Evidence:
    files = set()
    for p in paths:
        files.add(p)
        sibling = p.with_suffix(".json" if p.suffix == ".md" else ".md")
        if sibling.is_file():
            files.add(sibling)
    numbers: list[float] = []
    triples: list[tuple[float, float, float]] = []
    for p in sorted(files):
        if p.is_file():
            n, t = _file_evidence(p)
            numbers += n
            triples += t
    return Evidence(tuple(sorted(files)), sorted(abs(x) for x in numbers), triples)


# --------------------------------------------------------------------------------------------- checks


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def table_sources(page: Path, found: list[Block], i: int) -> set[Path]:
    table = found[i]
    own = sources(table.lines[0], page)  # the header's (a row's own links are that row's)
    if own:
        return own
    for j in (i - 1, i + 1):
        if 0 <= j < len(found) and found[j].kind == "text" and found[j].section == table.section:
            near = sources(found[j].text, page)
            if near:
                return near
    return set()


@dataclass
class Miss:
    page: str
    line: int
    what: str
    files: tuple[Path, ...]

    def __str__(self) -> str:
        names = ", ".join(p.relative_to(ROOT).as_posix() for p in self.files)
        return f"{self.page}:{self.line}: {self.what} not in {names}"


def check_page(name: str) -> tuple[list[Miss], int]:
    """The figures of one page its results files do not hold, and how many figures were read."""
    page = ROOT / name
    found = blocks(page.read_text())
    misses: list[Miss] = []
    read = 0

    def read_text(text: str, ev: Evidence, line: int, *, integers: bool) -> None:
        nonlocal read
        plain = prose(text)
        spans = [m.span() for m in INTERVAL.finditer(plain)]
        for t in intervals(plain):
            read += 1
            if not ev.has_interval(t):
                misses.append(Miss(name, line, f"interval {t[0].text} [{t[1].text}, {t[2].text}]", ev.files))
        for f in figures(_outside(plain, spans), integers=integers):
            read += 1
            if not ev.has(f):
                misses.append(Miss(name, line, f"figure {f.text}", ev.files))

    for i, block in enumerate(found):
        if block.kind == "table":
            src = table_sources(page, found, i)
            for k, row in enumerate(block.lines[2:], 2):  # past the header and the rule
                row_src = sources(row, page) or src
                if not row_src:
                    continue
                ev = evidence(row_src)
                for cell in cells(row)[1:]:
                    # a cell that starts with a figure is a figure column: its integers are read too
                    starts = re.match(r"[*+\-]*\d[\d,.]*[x%]?(?:\s|\*|$)", prose(cell).strip()) is not None
                    read_text(cell, ev, block.line + k, integers=starts)
        else:
            for sentence in sentences(block.text):
                src = sources(sentence, page)
                if src:
                    read_text(sentence, evidence(src), block.line, integers=False)
    return misses, read


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    for a, b in reversed(spans):
        text = text[:a] + " " + text[b:]
    return text


def suite_tables(name: str) -> list[tuple[int, Path, list[str], list[list[str]]]]:
    """The ``| task |`` tables of a page whose source is a suite results file with ``tasks``: each table's
    line, that file, its header and its rows."""
    page = ROOT / name
    found = blocks(page.read_text())
    out = []
    for i, block in enumerate(found):
        if block.kind != "table" or cells(block.lines[0])[0] not in ("task", "suite task"):
            continue
        for src in sorted(table_sources(page, found, i)):
            path = src.with_suffix(".json")
            if path.is_file() and "tasks" in json.loads(path.read_text()):
                out.append((block.line, path, cells(block.lines[0]), [cells(r) for r in block.lines[2:]]))
    return out


def check_suite_table(path: Path, header: list[str], rows: list[list[str]]) -> int:
    """Every controller column's mean (and interval, where shown) of every row is the task's controller's
    in ``path``, rounded as shown; returns how many cells were read."""
    tasks = json.loads(path.read_text())["tasks"]
    names = [re.sub(r"\s*\(.*\)$", "", h.replace("`", "")).strip() for h in header]
    checked = 0
    for row in rows:
        task = row[0].replace("`", "")
        if task not in tasks:
            continue
        for col, cell in zip(names[1:], row[1:]):
            numbers = [float(x) for x in re.findall(r"-?\d+\.\d", cell.replace("*", ""))]
            if col not in tasks[task]["controllers"] or not numbers:
                continue
            c = tasks[task]["controllers"][col]
            want = [c["test_acc_mean"]] + (list(c["test_acc_ci95"]) if len(numbers) == 3 else [])
            assert len(numbers) == len(want), (path.name, task, col, cell)
            for got, w in zip(numbers, want):
                assert got == pytest.approx(w, abs=0.051), (path.name, task, col, cell, want)
            checked += 1
    return checked


@pytest.mark.parametrize("name", PAGES)
def test_suite_tables_quote_their_tasks_controllers(name):
    """A suite table's cells are read by task and controller, not only as numbers somewhere in the file."""
    for line, path, header, rows in suite_tables(name):
        assert check_suite_table(path, header, rows) >= len(rows), f"{name}:{line}: too few cells read"


@pytest.mark.parametrize("name", PAGES)
def test_results_links_resolve(name):
    page = ROOT / name
    text = page.read_text()
    links = [t for _, t in LINK.findall(text) if resolve(t, page) is not None]
    assert links, f"{name} links no results file"
    missing = [t for t in links if not resolve(t, page).exists()]
    assert not missing, f"{name} links results files that do not ship: {missing}"


@pytest.mark.parametrize("name", PAGES)
def test_figures_quote_the_results_files_they_name(name):
    misses, read = check_page(name)
    assert read, f"{name}: no figure read"
    assert not misses, (
        f"{len(misses)} figures of {name} are not in the results files they name:\n"
        + "\n".join(map(str, misses))
    )
