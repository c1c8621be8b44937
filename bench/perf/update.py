"""One whole PPO update of the embedded default in its steady state: ``PPOTrainer.update`` on a rollout of
the default's shape (``env.n_envs`` x ``lifecycle.max_epochs``) with ``ppo.replay`` earlier rollouts kept
(every update of a run after the first ``ppo.replay``: 8 x 25 new and 3 x 8 x 25 replayed in the default),
eager vs ``--compile``, and where its time goes.

Rollouts: ``ppo.replay + 1`` real episodes of the default run (built as in the ``episode`` suite: ``Run``
from the config of ``python -m esper.shell.run`` with no arguments) with host training and validation cut
to one batch each (``env.train_batches=1``, ``env.val_batches=1``): the rollouts' shape, keys, legality
masks and the untrained policy's actions are those of the run's first updates; only the hosts were
cheaper to train.

Trainers: the run's eager one and ``PPOTrainer(compile=True)`` (what ``--compile`` builds: each
minibatch step - the LSTM re-scoring, the factored loss, backward, gradient health, clip and AdamW - as
one graph, and GAE, under ``torch.compile(fullgraph=True, dynamic=False)``) on a copy of the same
policy. Each warms up with one update per rollout, as a run's first updates go, so the kept rollouts
fill (the compiled one compiles there, one graph per batch size: their time is in the note, with
inductor's caches as found); graphs compiled after it are counted (recompiles: target 0). Every timed
update then starts from the same state, restored untimed: the eager trainer's after its warm-up (policy,
AdamW moments, observation/reward statistics, generator and the ``ppo.replay`` kept rollouts), on the
first rollout again as the new one, so every sample does the same work (the same target-KL early stop).
Samples alternate eager / compiled (the order flips each round). Ratio: the median over rounds of eager
/ row, both timed in the same round.

Split: a few more updates per trainer with the pieces wrapped by timers (their own rows, not the timed
samples): ``prepare`` (finite check, statistics, reward scaling, GAE, the anchor V re-scoring, the
replayed rollouts' re-scoring, advantage normalization), per minibatch the LSTM re-scoring
(``policy.rescore``), the loss, zero_grad + backward, the gradient-health statistics,
``clip_grad_norm_``, the AdamW step (eager), or the compiled step as a whole (compiled: its pieces are
one graph); ``other`` is the rest of the update (minibatch indexing, the KL-flag sync, metric stacking
and the one readout).
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

import esper.shell.agent.steps as steps_mod
import esper.shell.agent.trainer as trainer_mod
from bench.harness import Context, Row, Stats, SuiteResult, Target, round_ratio, suite
from bench.perf.episode import build_run, default_config

SPLIT = (
    ("prepare (checks, stats, GAE, anchor V, adv. norm)", "prepare"),
    ("minibatch re-scoring (policy.rescore, LSTM)", "evaluate"),
    ("loss (ppo_loss, factored)", "loss"),
    ("zero_grad + backward", "backward"),
    ("gradient health", "grad_health"),
    ("clip_grad_norm_", "clip"),
    ("AdamW step", "step"),
    ("other (indexing, KL flag, metrics, readout)", "other"),
)
SPLIT_COMPILED = (
    ("prepare (checks, stats, GAE, anchor V, adv. norm)", "prepare"),
    ("compiled minibatch steps (one graph each)", "train_step"),
    ("other (indexing, KL flag, metrics, readout)", "other"),
)


@suite("update", help="the default: one whole PPO update, replay kept, eager vs --compile, split", order=40)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="x vs eager")
    torch._dynamo.reset()
    cfg = default_config(train_batches=1, val_batches=1)
    n_envs, replay = cfg.env.n_envs, cfg.ppo.replay
    case = f"default {n_envs}x{cfg.lifecycle.max_epochs}" + (f" + {replay} replayed" if replay else "")
    with tempfile.TemporaryDirectory(prefix="esper-bench-update-") as tmp:
        run_, runner = build_run(cfg, Path(tmp))
        # acting leaves the policy as it was: every rollout is the untrained behaviour policy's
        rollouts = [runner.run(i).rollout for i in range(replay + 1)]
        run_.log.close()
    rollout = rollouts[0]
    eager = run_.trainer
    agent = copy.deepcopy(run_.agent)
    compiled = trainer_mod.PPOTrainer(
        agent, cfg.ppo, compile=True, generator=torch.Generator().manual_seed(cfg.seed + 1)
    )
    trainers = {"eager": eager, "compiled (--compile)": compiled}
    first: dict[str, str] = {}
    for name, tr in trainers.items():  # a run's first updates: the kept rollouts fill, one batch size each
        t0 = time.perf_counter()
        try:
            for r in rollouts:
                tr.update(r.clone())
        except Exception as exc:  # record, never hide
            first[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        first[name] = f"{len(rollouts)} warm-up updates {time.perf_counter() - t0:.1f} s" + (
            " (compile, caches as found)" if tr is compiled else ""
        )
    failed = [k for k, v in first.items() if v.startswith("failed")]
    for name in failed:
        res.rows.append(Row(case, f"whole update, {name}", note=first[name]))
        trainers.pop(name)
    # the common start: the eager trainer's after its warm-up, its replay kept (one batch size from here)
    start = copy.deepcopy(eager.state_dict())
    start_agent = copy.deepcopy(eager.agent.state_dict())

    def restore(tr) -> None:
        tr.agent.load(copy.deepcopy(start_agent))
        tr.load_state_dict(copy.deepcopy(start))

    rounds = ctx.samples
    times: dict[str, list[float]] = {k: [] for k in trainers}
    steps: dict[str, set] = {k: set() for k in trainers}
    envs: dict[str, set] = {k: set() for k in trainers}
    graphs_before = _graphs()
    for r in range(rounds):
        for name, tr in trainers.items() if r % 2 == 0 else reversed(trainers.items()):
            restore(tr)
            batch = rollout.clone()
            t0 = time.perf_counter()
            metrics = tr.update(batch)
            times[name].append(time.perf_counter() - t0)
            steps[name].add(int(metrics["minibatch_steps"]))
            envs[name].add(int(batch.batch_size[0]) + int(metrics.get("replayed_envs", 0)))
    recompiles = _graphs() - graphs_before
    stats = {k: Stats.of(v, 1) for k, v in times.items()}
    base = stats.get("eager")
    for name, s in stats.items():
        note = f"minibatch steps {sorted(steps[name])}; envs {sorted(envs[name])}; {first[name]}"
        res.rows.append(Row(case, f"whole update, {name}", s, base and round_ratio(base, s), note))
    if base and "compiled (--compile)" in stats:
        ratio = round_ratio(base, stats["compiled (--compile)"])
        res.targets.append(Target(f"{case}: whole update, eager / compiled", ratio, ">= 2", ratio >= 2))
        res.targets.append(
            Target(f"graphs compiled during the {rounds} timed rounds (recompiles)", recompiles, "== 0",
                   recompiles == 0)
        )  # fmt: skip
    n_split = 3 if ctx.quick else 9
    for name, tr in trainers.items():
        _split(res, case, name, tr, rollout, restore, n_split)
    res.notes += [
        f"rollout {case}: {cfg.ppo.n_epochs} epochs x {cfg.ppo.n_minibatches} minibatches of whole env "
        f"sequences, policy {cfg.ppo.policy} {cfg.ppo.hidden}/{cfg.ppo.head_hidden}, target_kl "
        f"{cfg.ppo.target_kl}, replay {replay} (the timed updates re-use {replay} kept rollouts); "
        f"on {cfg.env.device} (the default's device), torch threads {torch.get_num_threads()}.",
        f"split rows: medians over {n_split} instrumented updates per trainer (timer overhead included); "
        "the shares are of their own whole-update median.",
    ]
    if ctx.device.type != "cpu":
        res.notes.append(
            f"--device {ctx.device} does not apply: the embedded default runs on {cfg.env.device}."
        )
    return res


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _split(res: SuiteResult, case: str, name: str, tr, rollout, restore, n: int) -> None:
    samples: list[Counter] = []
    split = SPLIT_COMPILED if isinstance(tr.step, steps_mod.CompiledStep) else SPLIT
    with _instrumented(tr) as acc:
        for _ in range(n):
            restore(tr)
            batch = rollout.clone()
            acc.clear()
            t0 = time.perf_counter()
            tr.update(batch)
            whole = time.perf_counter() - t0
            acc["other"] = whole - sum(acc.values())
            acc["whole"] = whole
            samples.append(Counter(acc))
    whole_ms = Stats.of([s["whole"] for s in samples], 1)
    case = f"{case} split, {name}"
    for label, key in split:
        s = Stats.of([x[key] for x in samples], 1)
        res.rows.append(Row(case, label, s, note=f"{100 * s.median_ms / whole_ms.median_ms:.1f}%"))
    res.rows.append(Row(case, "whole update (instrumented)", whole_ms, note="100%"))


@contextmanager
def _instrumented(tr):
    """Timers around the pieces of ``tr.update`` (instance attributes and two module-level functions),
    all removed on exit. Backward is timed from the start of ``zero_grad`` to the start of the
    gradient-health call that follows it."""
    acc: Counter = Counter()
    state = {"in_prepare": False, "zero_grad_start": None}

    def timed(fn, key, *, skip_in_prepare=False):
        def wrapper(*args, **kwargs):
            if skip_in_prepare and state["in_prepare"]:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t0

        return wrapper

    def prepare(fn):
        def wrapper(*args, **kwargs):
            state["in_prepare"] = True
            try:
                return timed(fn, "prepare")(*args, **kwargs)
            finally:
                state["in_prepare"] = False

        return wrapper

    def zero_grad(fn):
        def wrapper(*args, **kwargs):
            state["zero_grad_start"] = time.perf_counter()
            return fn(*args, **kwargs)

        return wrapper

    def grad_health(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            if state["zero_grad_start"] is not None:
                acc["backward"] += t0 - state["zero_grad_start"]
                state["zero_grad_start"] = None
            try:
                return fn(*args, **kwargs)
            finally:
                acc["grad_health"] += time.perf_counter() - t0

        return wrapper

    with ExitStack() as stack:
        if isinstance(tr.step, steps_mod.CompiledStep):  # compiled: the step is one graph, timed as a whole
            for obj, attr, fn in [
                (tr, "prepare", prepare(tr.prepare)),
                (tr.step, "graph", timed(tr.step.graph, "train_step")),
            ]:
                stack.enter_context(_patched(obj, attr, fn))
            yield acc
            return
        patches = [
            (tr, "prepare", prepare(tr.prepare)),
            (tr.step.learner, "rescore", timed(tr.step.learner.rescore, "evaluate", skip_in_prepare=True)),
            (tr.step.learner, "loss_fn", timed(tr.step.learner.loss_fn, "loss")),
            (tr.optimizer, "zero_grad", zero_grad(tr.optimizer.zero_grad)),
            (tr.optimizer, "step", timed(tr.optimizer.step, "step")),
            (steps_mod, "grad_health", grad_health(steps_mod.grad_health)),
            (torch.nn.utils, "clip_grad_norm_", timed(torch.nn.utils.clip_grad_norm_, "clip")),
        ]
        for obj, attr, fn in patches:
            stack.enter_context(_patched(obj, attr, fn))
        yield acc


@contextmanager
def _patched(obj, attr: str, value):
    """Set ``obj.attr``; on exit restore it (an instance attribute shadowing a method is deleted)."""
    had = attr in vars(obj) if hasattr(obj, "__dict__") else True
    saved = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, attr, saved)
        else:
            delattr(obj, attr)
