"""The docs' and the results files' relative links resolve: every ``[text](path)`` in ``docs/*.md`` and
``bench/results/**/*.md`` names a file or folder that exists, and a ``#fragment`` names a heading of
the markdown file it points to (GitHub's anchors). Moving a results file breaks a link here first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("bench/results/**/*.md")])


def _text(md: Path) -> str:
    """The markdown without fenced blocks and code spans, which hold no links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", md.read_text(), flags=re.S))


def anchors(md: Path) -> set[str]:
    """GitHub's anchors of ``md``'s headings: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#{1,6} (.*)$", re.sub(r"```.*?```", "", md.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_anchors_follow_githubs_rule(tmp_path):
    md = tmp_path / "a.md"
    md.write_text("# Title\n\n## The target's `self_attention` plan (2026-11-28, 43dac36)\n")
    assert anchors(md) == {"title", "the-targets-self_attention-plan-2026-11-28-43dac36"}


@pytest.mark.parametrize("md", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(md: Path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(md)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (md.parent / path) if path else md
        if not dest.exists() or (fragment and (dest.suffix != ".md" or fragment not in anchors(dest))):
            broken.append(target)
    assert not broken, f"{md.relative_to(ROOT)}: broken links {broken}"
