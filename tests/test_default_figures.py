"""Issue 102: a figure given for *today's default* was measured on today's default.

Every paragraph, list item or table row of the front pages that says "today's default" and links a results
file quotes that file; the file (its ``.json``, or the ``.json`` beside its ``.md``) records the hash of the
configuration it measured (:func:`esper.shell.config.presets.config_hash`; a pooled ``bench.ttq`` file:
the one hash its labels share), and that hash must be the one of
``preset("default")`` as the code stands. A change to the default's configuration (its presets) without the
run that re-measures it fails here, with the figures' page and file named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper.shell.config.presets import config_hash, preset
from tests.test_figures import ROOT, blocks, sources

#: The pages that may state today's default's figures (the experiment log is history, not a claim).
PAGES = tuple(
    p
    for p in ("README.md", *(f"docs/{f.name}" for f in sorted((ROOT / "docs").glob("*.md"))))
    if p != "docs/experiment-log.md"
)
MARK = "today's default"


def default_sources(page: str) -> list[tuple[int, Path]]:
    """``(line, results JSON)`` for every block of ``page`` that names today's default and links a file."""
    path = ROOT / page
    out = []
    for block in blocks(path.read_text()):
        # a table's rows are read one by one (a claims table names today's default in one row of several)
        parts = (
            [(block.line + i, ln) for i, ln in enumerate(block.lines)]
            if block.kind == "table"
            else [(block.line, block.text)]
        )
        for line, text in parts:
            if MARK not in text.lower():
                continue
            for src in sorted(sources(text, path)):
                out.append((line, src.with_suffix(".json")))
    return out


def recorded_hash(path: Path) -> str | None:
    """The configuration hash ``path`` records: its own (``bench.front_door``'s file), or the one hash all
    the labels of a pooled ``bench.ttq`` file share (None if they differ or none is recorded)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return None
    if "config_hash" in data:
        return data["config_hash"]
    hashes = {h for lab in data.values() if isinstance(lab, dict) for h in lab.get("config_hash", [None])}
    return hashes.pop() if len(hashes) == 1 else None


def test_issue102_the_readme_quotes_todays_default_from_a_results_file():
    assert default_sources("README.md"), (
        "README.md gives no figure for today's default from a results file (a block naming \"today's "
        'default" with a link into bench/results/)'
    )


@pytest.mark.parametrize("page", PAGES)
def test_issue102_todays_defaults_figures_were_measured_on_its_configuration(page):
    want = config_hash(preset("default"))
    for line, src in default_sources(page):
        got = recorded_hash(src)
        assert got == want, (
            f"{page}:{line} quotes today's default from {src.relative_to(ROOT)}, which records configuration "
            f"{got or '(none)'}; preset('default') is {want} now: re-measure the default (bench.ttq, then "
            "bench.front_door) and quote the new file, or say which default the figures are"
        )


def test_issue102_the_hash_sees_what_trains_and_not_where_it_writes():
    base = preset("default")
    assert config_hash(preset("default", {"seed": 7, "run_dir": "/tmp/x", "threads": 1})) == config_hash(base)
    for field, value in (("updates", base.updates + 1), ("env.batch_size", 128), ("ppo.lr", 1e-4)):
        assert config_hash(preset("default", {field: value})) != config_hash(base), field


def test_an_option_left_off_leaves_the_hash_and_on_changes_it():
    """:data:`OPTIONS_OFF`: each option's off value is its default (so a configuration that does not set
    it trains as before it existed, and keeps its hash); set to anything else it changes the hash."""
    import dataclasses as dc

    from esper.shell.config.presets import OPTIONS_OFF, RunConfig

    base = preset("default")
    for path, off in OPTIONS_OFF.items():
        section, _, name = path.partition(".")
        default = getattr(getattr(RunConfig(), section), name)
        assert default == off, f"{path}: default {default!r}, listed off at {off!r}"
        on = {"lifecycle.incubate": False, "lifecycle.timeout_ramp": True, "lifecycle.keep_by": "loss",
              "lifecycle.instant_blend": True,
              "lifecycle.g5_min_loss_drop": 0.2}[path]  # fmt: skip
        changed = dc.replace(base, **{section: dc.replace(getattr(base, section), **{name: on})})
        assert config_hash(changed) != config_hash(base), path
