"""One whole episode and one whole PPO update of the embedded default, as ``python -m esper.shell.run``
runs them: wall time split by phase, and the share of it that is neither host training nor validation.

The run is built as ``python -m esper.shell.run`` builds it with no arguments (``resolve_config`` of an
empty command line: the ``default`` preset, MNIST-1D, 8 envs x 25 epochs, the hosts trained as one batch
where ``env.host_step`` allows) and the objects come from :class:`esper.shell.runtime.training.TrainingRun`
in a temporary run directory. One measured iteration is the body of ``TrainingRun.train``'s loop: the
episode (``EpisodeRunner.run``), its event-log writes, ``PPOTrainer.update``, the update's event and
anomaly check, and the checkpoint. Left out: the progress bar and the end-of-run report. The first
iteration (update 0) is a warm-up and not measured; then ``--episodes`` N are (default 5, 2 with
``--quick``).

Phases of the episode are the environment's own timings (``EpisodeResult.timings``, seconds summed over
the steps): ``host_training`` and ``validation`` (validation with every live seed's counterfactual), from
the host bank; ``governor_and_observation``, ``lifecycle_reward``, ``apply`` (seed modules built or
removed), ``final_evaluation``; ``policy`` (one batched forward per step and the bootstrap). The rest of
the episode is timed by wrapping ``VecEnv.reset`` and the rollout's assembly (rewards, epoch events,
summaries); whatever is still left is reported as ``episode: unaccounted``, never hidden. Every row is
the median over the measured iterations; the shares are of the summed wall time, so they add up to 100%.

Target (the issue's): everything that is not host training or validation + counterfactual under 5% of
the wall time of the embedded default.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from bench.harness import Context, Row, Stats, SuiteResult, Target, suite

FULL_EPISODES, QUICK_EPISODES = 5, 2
CASE = "default 8 envs x 25 epochs"
#: (row label, key): rollout timings first, in the runner's order, then the rest of the iteration.
HOST, VALIDATION = "host training", "validation + counterfactual"
PHASES = (
    (HOST, "host_training"),
    (VALIDATION, "validation"),
    ("governor + observation", "governor_and_observation"),
    ("policy inference", "policy"),
    ("lifecycle + reward", "lifecycle_reward"),
    ("apply (build/remove seeds)", "apply"),
    ("final evaluation (val + test)", "final_evaluation"),
    ("env.reset (fresh hosts, loaders, first epoch)", "reset"),
    ("rollout assembly (rewards, events, summaries)", "assembly"),
    ("episode: unaccounted", "episode_rest"),
    ("event log writes", "event_log"),
    ("PPO update", "update"),
    ("update event + anomaly check", "update_log"),
    ("checkpoint", "checkpoint"),
)
#: The phases the issue lists besides host training and validation.
LISTED = ("governor_and_observation", "policy", "lifecycle_reward", "apply", "update")
ROLLOUT_KEYS = (
    "host_training",
    "validation",
    "governor_and_observation",
    "policy",
    "lifecycle_reward",
    "apply",
    "final_evaluation",
)


def default_config(**env_overrides):
    """The config of ``python -m esper.shell.run`` with no arguments (``env`` fields overridable)."""
    import dataclasses

    from esper.shell.run import build_parser, resolve_config

    cfg = resolve_config(build_parser().parse_args([]))
    if env_overrides:
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, **env_overrides))
    return cfg


def build_run(cfg, run_dir: Path):
    """``esper.shell.runtime.training.TrainingRun`` and the ``EpisodeRunner`` its ``train`` loop would use (no
    progress bar)."""
    from esper.shell.env.rollout import EpisodeRunner
    from esper.shell.runtime.training import TrainingRun

    run = TrainingRun(cfg, run_dir)
    run.open_log(resume=False)
    runner = EpisodeRunner(run.env, run.controller)
    return run, runner


class Clock:
    """Accumulates the seconds spent in wrapped callables, by key."""

    def __init__(self) -> None:
        self.acc: Counter = Counter()

    def wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.acc[key] += time.perf_counter() - start

        setattr(obj, name, timed)

    def count_first_epoch(self, env) -> None:
        """After each (wrapped) reset, the seconds of the first epoch it measured (already in the
        environment's timings, so the reset row excludes them)."""
        fn = env.reset

        def reset(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.acc["first_epoch"] += sum(env.timings.values())
            return out

        env.reset = reset


def iteration(run, runner, update: int, clock: Clock) -> dict[str, float]:
    """One iteration of ``TrainingRun.train``'s loop, timed by phase (seconds); ``wall`` is the whole."""
    clock.acc.clear()
    t0 = time.perf_counter()
    result = runner.run(update)
    t1 = time.perf_counter()
    run._log_episodes(update, result)
    t2 = time.perf_counter()
    metrics = run.trainer.update(result.rollout)
    t3 = time.perf_counter()
    run.log.write("ppo_update", update=update + 1, **metrics)
    for anomaly in run.detector.check(metrics):
        run.log.write("anomaly", update=update + 1, **anomaly.as_dict())
    t4 = time.perf_counter()
    if (update + 1) % run.cfg.checkpoint_every == 0 or update + 1 == run.cfg.updates:
        run.save(run.boundary(update + 1))
    t5 = time.perf_counter()
    out = {k: float(result.timings.get(k, 0.0)) for k in ROLLOUT_KEYS}
    out.update({k: float(clock.acc[k]) for k in ("reset", "assembly")})
    # reset trains and measures the first epoch, which the environment's timings count already
    out["reset"] = max(0.0, out["reset"] - float(clock.acc["first_epoch"]))
    out["episode_rest"] = (t1 - t0) - sum(out.values())
    out.update(event_log=t2 - t1, update=t3 - t2, update_log=t4 - t3, checkpoint=t5 - t4, wall=t5 - t0)
    out["episode"] = t1 - t0
    out["update_steps"] = metrics.get("minibatch_steps", 0)
    out["early_stopped"] = float(bool(metrics.get("early_stopped", False)))
    return out


@suite(
    "episode",
    help="embedded default: one episode + PPO update, wall time by phase, non-host share (< 5%)",
    order=50,
)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="-")
    n = ctx.episodes or (QUICK_EPISODES if ctx.quick else FULL_EPISODES)
    cfg = default_config()
    with tempfile.TemporaryDirectory(prefix="esper-bench-episode-") as tmp:
        run_, runner = build_run(cfg, Path(tmp))
        clock = Clock()
        clock.wrap(run_.env, "reset", "reset")
        clock.count_first_epoch(run_.env)
        clock.wrap(runner, "_assemble", "assembly")
        clock.wrap(runner, "_episode_summaries", "assembly")
        warm = iteration(run_, runner, 0, clock)
        samples = [iteration(run_, runner, u, clock) for u in range(1, n + 1)]
        run_.log.close()
    _report(res, cfg, warm, samples)
    if ctx.device.type != "cpu":
        res.notes.append(
            f"--device {ctx.device} does not apply: the embedded default runs on {cfg.env.device}."
        )
    return res


def _report(res: SuiteResult, cfg, warm: dict[str, float], samples: list[dict[str, float]]) -> None:
    total = sum(s["wall"] for s in samples)
    share = {key: sum(s[key] for s in samples) / total for _, key in PHASES}
    for label, key in PHASES:
        stats = Stats.of([s[key] for s in samples], 1)
        note = f"{100 * share[key]:.2f}% of wall"
        if key == "validation":
            note += "; validation and every live seed's counterfactual pass"
        if key == "update":
            steps = sorted({int(s["update_steps"]) for s in samples})
            stops = int(sum(s["early_stopped"] for s in samples))
            note += f"; minibatch steps {steps} ({cfg.ppo.n_epochs} epochs x {cfg.ppo.n_minibatches} max)"
            note += f", KL early stop in {stops}/{len(samples)}"
        res.rows.append(Row(CASE, label, stats, note=note))
    res.rows.append(
        Row(
            CASE, "total: one training-loop iteration", Stats.of([s["wall"] for s in samples], 1), note="100%"
        )
    )
    res.rows.append(
        Row(CASE, "warm-up iteration (update 0, not in the rows above)", Stats.of([warm["wall"]], 1))
    )
    non_host = 1.0 - share["host_training"] - share["validation"]
    res.targets.append(
        Target(
            "share of wall not host training or validation + counterfactual, %",
            100 * non_host,
            "< 5",
            non_host < 0.05,
        )
    )
    listed = sum(share[k] for k in LISTED)
    others = sorted(
        ((share[k], label) for label, k in PHASES if k not in ("host_training", "validation")), reverse=True
    )
    walls = ", ".join(f"{s['wall']:.1f}" for s in samples)
    res.notes += [
        f"{len(samples)} measured iteration(s) after one warm-up; shares are of the summed wall time "
        f"({total:.1f} s); iteration walls: {walls} s.",
        f"warm-up iteration {warm['wall']:.1f} s: host training {warm['host_training']:.1f} s, validation "
        f"{warm['validation']:.1f} s, PPO update {warm['update']:.2f} s, the rest "
        f"{warm['wall'] - warm['host_training'] - warm['validation'] - warm['update']:.2f} s.",
        f"the issue's listed phases alone (governor + observation, policy, lifecycle + reward, apply, PPO "
        f"update): {100 * listed:.2f}% of wall; everything else besides host training and validation: "
        f"{100 * (non_host - listed):.2f}%.",
        "largest non-host phases: " + ", ".join(f"{label} {100 * s:.2f}%" for s, label in others[:3]) + ".",
        f"config: {cfg.env.task}, {cfg.env.n_envs} envs x {cfg.lifecycle.max_epochs} epochs, batch "
        f"{cfg.env.batch_size}, host step {'batched' if cfg.env.batched else 'per env'}, policy "
        f"{cfg.ppo.hidden}/{cfg.ppo.head_hidden}, device {cfg.env.device}, torch threads "
        f"{torch.get_num_threads()}.",
    ]
