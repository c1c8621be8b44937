"""Episodes of fixed plans, run once: the evaluation's and the plan searches' episodes kept on disk and
read back number for number.

**What is kept.** Only episodes whose controller is a fixed plan: a spec (:func:`grow_spec`,
:func:`born_spec`, :data:`STATIC`) says everything the controller does (the plan, each slot's first
epoch, the blend; the seeds born in), and :func:`spec_controller` builds the controller from the specs
alone, whichever name asked for them (``grow_all``, ``grow:PLAN``, a plan search's choice, ``born_big``,
``born_big:CONTROLLER``, a search's candidates). A learned controller, ``random``, the heuristics and the
probe are never kept.

**What an episode depends on.** Its spec and host seed, the run's settings (every config field that can
change an episode: :func:`config_digest`), the task and its data draw, the intra-op threads, and, on the
batched host step, the batch it ran in: the envs of one batch train as one stacked computation, whose
kernels (a grouped convolution's input gradient, for one) are not bit for bit the same for another
batch shape, so the same (spec, host) run beside other envs can end a few tenths of a point apart after
25 epochs, and on a family's host up to a few points (docs/suite.md; docs/experiment-log.md, 2026-12-07).
So on the batched step the unit kept and read is a **batch**: the ordered
(spec, host) pairs of one :class:`~esper.shell.env.vecenv.VecEnv`, read only where the same batch is asked
for again. On the per-env step (the transformer hosts, ``env.host_step per_env``) an episode depends on
its own pair alone (a test holds it), and a pair is read wherever it is asked for.

Either way a run with the store runs exactly the batches it runs without one, less those it reads: its
numbers are the uncached run's, bit for bit (``tests/shell/eval/test_store.py``).

**On disk.** ``STORE_FILE`` in a run's search cache (``RUN_DIR/search/``, shared by every search, budget
and evaluation of the run on that task): one JSON line per batch run, under a key of the store's version,
the config digest, the task, its data draw and the threads. A line of another key is ignored (another
evaluation draw, other settings, an older store, whole records of an older :data:`RECORD_VERSION`: kept
before the episodes' FLOPs were counted), and so is a last line cut short by a crash. The searches keep
only what they read of an episode (its final validation accuracy and parameters added:
``esper.shell.eval.search.SEARCH_FIELDS``, about 100 bytes a line's episode against 1.5 kB whole), under a
key of their own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from esper.core.spec import ALPHA_TARGETS, DEFAULT_BLEND, Style, Tempo
from esper.shell.baselines.simple import GrowAllController, StaticController
from esper.shell.common.fields import to_dict
from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task
from esper.shell.eval.runner import MakeController, batches_of, run_hosts

#: Bumped when what a kept episode means changes: lines of another version are not read.
STORE_VERSION = 1
#: The store's file in a run's search cache directory.
STORE_FILE = "episode-store.jsonl"
#: Bumped when what a whole record holds grows (2: an episode's FLOPs, :mod:`esper.shell.host.flops`): a
#: store of whole records (an evaluation's) reads no line of another, so every record it reads holds what
#: one holds today (a batch kept before runs again, to the same numbers); a search's store keeps only what
#: it reads, and is not concerned.
RECORD_VERSION = 2
#: The controller that never grows.
STATIC = "static"
GROW, BORN = "grow:", "born:"
#: Between a slot's blueprint and its first epoch, and before each blend setting (as ``grow:`` names).
EPOCH_SEP, BLEND_SEP = ":", "@"


def config_digest(cfg: RunConfig) -> str:
    """Every config field (the run seed among them) but the ones that cannot change an episode, hashed."""
    d = to_dict(cfg)
    for k in ("progress", "report", "run_dir", "name", "threads", "checkpoint_every", "eval_episodes"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- specs
def grow_spec(plan: Mapping[int, int], slot_names: Sequence[str], blueprint_names: Sequence[str], *,
              at: Mapping[int, int] | None = None, style: int = int(DEFAULT_BLEND["style"]),
              tempo: int = int(DEFAULT_BLEND["tempo"]),
              alpha: int = int(DEFAULT_BLEND["alpha_target"])) -> str:  # fmt: skip
    """A fixed schedule's spec: ``grow:b0=conv_heavy:7+b2=norm@LINEAR_ADD@FAST@1.0``, the slots in slot
    order, each slot's first epoch where one is given, the blend always written out (``alpha``: the
    index of :data:`~esper.core.spec.ALPHA_TARGETS`). Two schedules with one spec act alike."""
    at = at or {}
    parts = [f"{slot_names[s]}={blueprint_names[b]}" + (f"{EPOCH_SEP}{at[s]}" if s in at else "")
             for s, b in sorted(plan.items())]  # fmt: skip
    blend = BLEND_SEP.join((Style(style).name, Tempo(tempo).name, repr(float(ALPHA_TARGETS[alpha]))))
    return f"{GROW}{'+'.join(parts)}{BLEND_SEP}{blend}"


def born_spec(plan: Mapping[int, int], slot_names: Sequence[str], blueprint_names: Sequence[str]) -> str:
    """``born_big``'s spec: ``born:b0=conv_heavy+b2=norm`` (its seeds in at alpha 1 from epoch 0)."""
    return BORN + "+".join(f"{slot_names[s]}={blueprint_names[b]}" for s, b in sorted(plan.items()))


def _plan_of(body: str, slot_names: Sequence[str], blueprint_names: Sequence[str]):
    plan, at = {}, {}
    for part in body.split("+") if body else []:
        slot, _, rest = part.partition("=")
        blueprint, colon, epoch = rest.partition(EPOCH_SEP)
        s = list(slot_names).index(slot)
        plan[s] = list(blueprint_names).index(blueprint)
        if colon:
            at[s] = int(epoch)
    return plan, at


def spec_controller(specs: Sequence[str], env, lifecycle):
    """The controller of a batch whose env ``i`` grows ``specs[i]`` (one kind in a batch: all ``grow:``,
    all ``born:`` or all :data:`STATIC`), built from the specs alone."""
    kinds = {STATIC if s == STATIC else s[: s.index(":") + 1] for s in specs}
    if len(kinds) != 1 or not kinds <= {STATIC, GROW, BORN}:
        raise ValueError(f"spec_controller: one kind of spec per batch, got {sorted(kinds)}")
    names, blueprints = env.slot_names, env.blueprint_names
    if kinds == {STATIC}:
        return StaticController()
    if kinds == {BORN}:
        return _Born([_plan_of(s.removeprefix(BORN), names, blueprints)[0] for s in specs])
    made = []
    for s in specs:
        body, *blend = s.removeprefix(GROW).split(BLEND_SEP)
        plan, at = _plan_of(body, names, blueprints)
        made.append((plan, at, Style[blend[0]], Tempo[blend[1]], float(blend[2])))
    return GrowAllController([m[0] for m in made], lifecycle, at=[m[1] for m in made],
                             style=[m[2] for m in made], tempo=[m[3] for m in made],
                             alpha_target=[m[4] for m in made])  # fmt: skip


class _Born(StaticController):
    """``born_big`` with a plan per env (a batch of one spec gives every env the same): the plans' seeds
    built in before the first epoch (:attr:`~esper.shell.env.vecenv.VecEnv.born`), then WAIT."""

    def __init__(self, plans: Sequence[Mapping[int, int]]) -> None:
        self.plans = [{int(s): int(b) for s, b in p.items()} for p in plans]

    def prepare_env(self, env) -> None:
        env.born = [dict(p) for p in self.plans]


# ----------------------------------------------------------------------------------------------- store
class EpisodeStore:
    """The fixed-plan episodes of one run on one task and data draw, kept in ``path`` (JSON lines, one per
    batch run; see the module). :func:`run_specs` reads and adds to it. ``ran`` and ``read`` count the
    episodes this instance ran and read. ``fields``: keep only these of each record (a search reads two
    of an episode's twenty; the evaluation keeps them all); part of the key, so a store of other fields
    reads none of these lines."""

    def __init__(self, path: Path, cfg: RunConfig, task: Task, fields: Sequence[str] | None = None) -> None:
        self.path = path
        self.fields = tuple(fields) if fields is not None else None
        kept = f":{','.join(self.fields)}" if self.fields is not None else f":records{RECORD_VERSION}"
        self.key = (f"v{STORE_VERSION}:{config_digest(cfg)}:{task.name}:{task.data_seed}:"
                    f"threads{torch.get_num_threads()}{kept}")  # fmt: skip
        #: Whether an episode depends on its own (spec, host) alone: the per-env host step.
        self.by_pair = not cfg.env.batched
        self.batches: dict[tuple[tuple[str, int], ...], list[dict]] = {}
        self.pairs: dict[tuple[str, int], dict] = {}
        self.ran = self.read = 0
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short
                if isinstance(rec, dict) and rec.get("key") == self.key:
                    self._index(tuple((str(s), int(h)) for s, h in rec["pairs"]), rec["records"])

    def _index(self, batch: tuple[tuple[str, int], ...], records: list[dict]) -> None:
        self.batches[batch] = records
        for pair, r in zip(batch, records, strict=True):
            self.pairs.setdefault(pair, r)

    def get(self, batch: Sequence[tuple[str, int]]) -> list[dict] | None:
        """The records of ``batch`` (its pairs in order) where kept, else None."""
        batch = tuple(batch)
        if batch in self.batches:
            return [dict(r) for r in self.batches[batch]]
        if self.by_pair and all(p in self.pairs for p in batch):
            return [{**self.pairs[p], "env": i} for i, p in enumerate(batch)]  # its place in this batch
        return None

    def put(self, batch: Sequence[tuple[str, int]], records: Sequence[dict]) -> None:
        """Keep one batch's records (appended to the file at once: a run stopped later keeps it)."""
        batch = tuple((str(s), int(h)) for s, h in batch)
        if self.fields is not None:
            records = [{k: r[k] for k in self.fields} for r in records]
        records = json.loads(json.dumps(list(records)))  # as they will be read back
        self._index(batch, records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": self.key, "pairs": [list(p) for p in batch], "records": records}) + "\n"
        with self.path.open("a+b") as f:
            cut = f.tell() > 0 and (f.seek(-1, 2), f.read(1))[1] != b"\n"  # a last line cut short
            f.write(("\n" if cut else "").encode() + line.encode())


def run_specs(cfg: RunConfig, task: Task, pairs: Sequence[tuple[str, int]], *,
              store: EpisodeStore | None = None, on_epoch=None, width: int | None = None,
              wrap: Callable[[Any, Any], Any] | None = None,
              on_result=None) -> tuple[list[dict], int]:  # fmt: skip
    """One episode of each ``(spec, host seed)`` pair, ``width`` (default ``cfg.env.n_envs``) side by side
    in their order (on a family, each member's pairs together: the batches of
    :func:`~esper.shell.eval.runner.batches_of`, with a store as without one), each batch's controller
    :func:`spec_controller` of its specs: :func:`~esper.shell.eval.runner.run_hosts`'s records, and how
    many were read from ``store`` rather than run. With a store, each batch that is kept is read (on the
    per-env step: each pair kept, wherever it ran), every other batch runs as it would without one and is
    kept. ``wrap(controller, env)`` and ``on_result``: as ``run_hosts`` hands them on
    (episodes kept as a dataset; give them without a store, so that every episode runs)."""
    pairs = [(str(s), int(h)) for s, h in pairs]

    def make_for(chunk: Sequence[tuple[str, int]]) -> MakeController:
        def make(env, batch: list[int]):
            ctl = spec_controller([chunk[k][0] for k in batch], env, cfg.lifecycle)
            return ctl if wrap is None else wrap(ctl, env)

        return make

    width, T = width or cfg.env.n_envs, cfg.lifecycle.max_epochs
    if store is None:
        return run_hosts(cfg, task, make_for(pairs), [h for _, h in pairs], on_epoch=on_epoch,
                         on_result=on_result, width=width), 0  # fmt: skip
    # the batches run_hosts runs without a store (on a family, each member's hosts together), so that a
    # batch kept is the batch the uncached run trains, env for env
    where = batches_of(task, [h for _, h in pairs], width)
    chunks = [[pairs[k] for k in batch] for batch in where]
    out: list[list[dict] | None] = [store.get(c) for c in chunks]
    todo = [c for c, got in zip(chunks, out) if got is None]
    if store.by_pair and todo:  # an episode is its pair's alone: run only the pairs not kept, once each
        missing = list(dict.fromkeys(p for c in todo for p in c if p not in store.pairs))
        todo = [missing[i : i + width] for i in range(0, len(missing), width)]
    for chunk in todo:
        records = run_hosts(cfg, task, make_for(chunk), [h for _, h in chunk], on_epoch=on_epoch,
                            on_result=on_result, width=width)  # fmt: skip
        store.put(chunk, records)
        store.ran += len(chunk)
    read = len(pairs) - sum(len(c) for c in todo)
    if on_epoch is not None and read:
        on_epoch({"epoch": T, "envs": read * T})  # the episodes read: their epochs at once
    for k, c in enumerate(chunks):
        if out[k] is None:
            out[k] = store.get(c)
            assert out[k] is not None
    store.read += read
    ordered: list[dict] = [{}] * len(pairs)
    for batch, got in zip(where, out, strict=True):
        for k, r in zip(batch, got, strict=True):  # type: ignore[arg-type]
            ordered[k] = r
    return ordered, read


__all__ = [
    "BORN", "GROW", "STATIC", "STORE_FILE", "STORE_VERSION", "EpisodeStore", "born_spec", "config_digest",
    "grow_spec", "run_specs", "spec_controller",
]  # fmt: skip
