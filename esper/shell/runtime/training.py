"""One training run in one process: :class:`TrainingRun` builds the envs, the learner and the
controller from a config (a resumed run's checkpoint restored), runs the remaining updates, logs every
event, writes a checkpoint at update boundaries, stops on Ctrl-C, SIGTERM, a non-finite update or a
lost process with its last checkpoint intact, and ends with the summary table, the held-out check
(:func:`esper.shell.eval.heldout.heldout_check`) and the report. :func:`provenance` is what
``provenance.json`` and the ``run_start`` event record.

``python -m esper.shell.run`` (:mod:`esper.shell.run`) checks the request, locks the run directory and
starts one; the guarantees its module docstring lists hold here.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import torch

from esper.core.observation import obs_dim
from esper.core.rewards import FLAGS
from esper.shell.agent.agent import Agent, load_error_line
from esper.shell.agent.controller import PPOController
from esper.shell.agent.policy import prior_choices
from esper.shell.agent.pretrain import OfflineLearner
from esper.shell.agent.trainer import build_learner
from esper.shell.baselines.heuristic import HeuristicController
from esper.shell.common.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from esper.shell.common.cli import STOPPED, describe, repeat_line
from esper.shell.common.distributed import SINGLE, Dist, PeerLost, rank_device
from esper.shell.common.fields import to_dict
from esper.shell.common.revision import git_revision, machine
from esper.shell.common.rundir import StopSignals, Terminated
from esper.shell.config.presets import RunConfig
from esper.shell.env.config import EnvConfig
from esper.shell.env.rollout import EpisodeResult, EpisodeRunner, merge_results
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.dataset import layout_of, load_dataset
from esper.shell.eval.heldout import heldout_check
from esper.shell.telemetry.anomaly import AnomalyDetector
from esper.shell.telemetry.console import progress, summary_table
from esper.shell.telemetry.events import EventLog, rewind_events
from esper.shell.telemetry.profiling import UpdateProfiler
from esper.shell.telemetry.report import write_report

#: The command that trains (the one-line errors of a stopped run start with it).
PROG = "python -m esper.shell.run"
CHECKPOINT = "checkpoint.pt"
EVENTS = "events.jsonl"
#: What a checkpoint of this module holds (a file without one of them is refused when resuming): ``agent``
#: (what the controller needs to act), ``learner`` (what resuming training needs besides), the anomaly
#: detector, the RNG states, the config and the progress. An older checkpoint's ``trainer`` entry loads
#: as ``agent`` and ``learner`` (:func:`esper.shell.common.checkpoint.upgrade_payload`).
PAYLOAD_KEYS = ("agent", "learner", "detector", "rng", "config", "progress")


def provenance(cfg: RunConfig, dist: Dist = SINGLE) -> dict:
    import tensordict
    import torchrl

    return {
        "git_rev": git_revision(),
        "machine": machine(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "torchrl": torchrl.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": cfg.env.device,
        "world_size": dist.world,
        "backend": dist.backend,
        "argv": sys.argv,
    }


# --------------------------------------------------------------------------------------------- run
class TrainingRun:
    """Everything one run holds; :meth:`train` is the loop. ``checkpoint`` (a loaded payload) restores
    a resumed run; nothing is written until :meth:`open_log`.

    Under torchrun (``dist``) the process runs its slice of the envs and a replica of the learner;
    the events of every slice are gathered, and only rank 0 writes the run directory. Nothing of the
    checkpoint depends on the world size: a run goes on with any number of processes."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, checkpoint: dict | None = None, dist: Dist = SINGLE
    ) -> None:
        self.cfg, self.dir, self.dist = cfg, run_dir, dist
        torch.manual_seed(cfg.seed)
        first, n = dist.shard(cfg.env.n_envs)
        device = rank_device(cfg.env.device, dist)
        devices = cfg.env.devices if not dist.active else ()
        env_cfg = dataclasses.replace(cfg.env, n_envs=n, device=device, devices=devices)
        #: One VecEnv per training task (``tasks``); update u runs ``cfg.task_of(u)``'s.
        self.envs = build_envs(cfg, env_cfg, first)
        #: The env of ``env.task``: the held-out check's, and the one the learner is built for.
        self.env = self.envs[cfg.env.task]
        self.agent, self.trainer = build_learner(
            cfg.ppo, self.env.spec, device=torch.device(device), seed=cfg.seed, compile=cfg.compile,
            dist=dist, germination_cost=self.env.germination_cost, raw_obs_dim=self.env.obs_dim,
            budget_input=bool(cfg.env.budget_shares),
        )  # fmt: skip
        if cfg.policy == "ppo":  # actions sampled per env, from the global env index: see PPOController
            self.controllers = dict.fromkeys(self.envs, PPOController(self.agent, per_env=True))
        else:
            heuristic = lambda env: HeuristicController(env.blueprint_names, cfg.lifecycle)
            self.controllers = {task: heuristic(env) for task, env in self.envs.items()}
        self.controller = self.controllers[cfg.env.task]
        if cfg.init_from and checkpoint is None:
            init_agent_from(self.agent, Path(cfg.init_from), cfg.ppo.policy)
        #: The episodes of ``pretrain`` or ``offline`` (data, meta) until they are learned from.
        self.dataset = None
        if cfg.offline and checkpoint is not None:
            raise ValueError("an offline run has nothing to resume: evaluate it, or start a new run")
        if (cfg.pretrain or cfg.offline) and checkpoint is None:
            self.dataset = dataset_for(cfg, self.env)
        self.detector = AnomalyDetector(
            cfg.anomaly, target_kl=cfg.ppo.target_kl, updates=cfg.updates, entropy_coef=cfg.ppo.entropy_coef,
            priors=prior_choices(cfg.ppo.blend_bias),
        )  # fmt: skip
        self.start = 0
        self.rows: list[dict] = []
        #: The update of the newest checkpoint on disk (None: none yet).
        self.saved: int | None = None
        self.log: EventLog | None = None
        self.signals = StopSignals()  # inactive unless main() enters it
        if checkpoint is not None:
            self._load(checkpoint)

    def _load(self, ckpt: dict) -> None:
        missing = [k for k in PAYLOAD_KEYS if k not in ckpt]
        if missing:
            raise ValueError(
                f"checkpoint {self.dir / CHECKPOINT} has no {', '.join(map(repr, missing))} entry: it was "
                "not written by python -m esper.shell.run"
            )
        try:
            self.agent.load(ckpt["agent"])
            self.trainer.load_state_dict(ckpt["learner"])
            self.detector.load_state_dict(ckpt["detector"])
            set_rng_state(ckpt["rng"])
            self.start = int(ckpt["progress"]["update"])
            self.rows = list(ckpt["progress"]["rows"])
        except (KeyError, RuntimeError, TypeError, ValueError, AttributeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"checkpoint {self.dir / CHECKPOINT} does not fit this run: {first}") from None
        self.saved = self.start

    def open_log(self, *, resume: bool) -> None:
        """Open ``events.jsonl`` (a resumed run first rewinds it to its checkpoint, see the module
        docstring) and log ``run_start``."""
        path = self.dir / EVENTS
        moved = rewind_events(path, self.start) if resume else 0
        self.log = EventLog(path, append=resume)
        prov = provenance(self.cfg, self.dist)
        names = {"slots": list(self.env.slot_names), "blueprints": list(self.env.blueprint_names)}
        self.log.write("run_start", config=to_dict(self.cfg), provenance=prov, resumed_from=self.start,
                       **names)  # fmt: skip
        if moved:
            self.log.write("log_rewound", update=self.start, discarded=moved, path="events.discarded.jsonl")
            print(f"esper: {moved} event line(s) of updates after the checkpoint (update {self.start}) moved "
                  f"to {path.with_name('events.discarded.jsonl')}", file=sys.stderr)  # fmt: skip

    def boundary(self, update: int) -> dict:
        """The checkpoint payload of the state right now, which must be an update boundary (``update``
        updates done), copied to the CPU so the run can go on changing its own state."""
        payload = {
            "agent": self.agent.state_dict(),
            "learner": self.trainer.state_dict(),
            "detector": self.detector.state_dict(),
            "rng": rng_state(),
            "config": to_dict(self.cfg),
            "progress": {"update": update, "rows": list(self.rows)},
        }
        return _cpu_copy(payload)

    def save(self, payload: dict) -> Path:
        """Write ``payload`` (from :meth:`boundary`) as the checkpoint; Ctrl-C / SIGTERM wait for it."""
        update = payload["progress"]["update"]
        with self.signals.deferred():
            path = save_checkpoint(self.dir / CHECKPOINT, payload)
        self.saved = update
        self._event("checkpoint", update=update, path=str(path))
        return path

    def _event(self, event: str, /, **fields) -> None:
        if not self.dist.is_main:
            return
        if self.log is None:
            self.open_log(resume=False)
        self.log.write(event, **fields)  # type: ignore[union-attr]

    def train(self) -> int:
        """Run the remaining updates; returns the exit status (0, or see :mod:`esper.shell.common.cli`)."""
        cfg = self.cfg
        if self.log is None and self.dist.is_main:
            self.open_log(resume=False)
        if self.dataset is not None:
            phase = "offline" if cfg.offline else "pretrain"
            try:
                self._learn_offline(phase)
            except FloatingPointError as e:  # nothing was saved: the run starts again from scratch
                print(f"{PROG}: error: {phase} stopped: {e}; no checkpoint was written: start the run "
                      "again with saner options (e.g. a lower --offline_rl.lr)", file=sys.stderr)  # fmt: skip
                self._event("run_end", interrupted=True, updates=0, status=STOPPED, reason=str(e))
                return STOPPED
            if cfg.offline:
                if self.dist.is_main:
                    self.save(self.boundary(self.start))
                return self._finish()
        T = cfg.lifecycle.max_epochs
        bar = progress(
            (cfg.updates - self.start) * T, desc=f"{cfg.policy} {'+'.join(cfg.training_tasks)}",
            enabled=cfg.progress and self.dist.is_main,
        )  # fmt: skip
        runners = {t: EpisodeRunner(env, self.controllers[t], on_epoch=lambda ev: bar.update(1))
                   for t, env in self.envs.items()}  # fmt: skip
        several = len(runners) > 1
        last = self.boundary(self.start)  # the state a stop falls back to
        update = self.start
        profiler = (
            UpdateProfiler(self.dir, cfg.profile, self.env.device)
            if cfg.profile and self.dist.is_main
            else None
        )
        if profiler is not None:
            profiler.start()
        graphs_before = seen_graphs = compiled_graphs()
        try:
            for update in range(self.start, cfg.updates):
                t0 = time.perf_counter()
                task = cfg.task_of(update)
                with torch.profiler.record_function("esper.rollout"):
                    result = self._gather(runners[task].run(update))
                tagged = {"task": task} if several else {}  # several tasks: each episode and row says its own
                for ep in result.episodes:
                    ep.update(tagged)
                self._log_episodes(update, result)
                row = {"update": update + 1, **tagged, **_episode_means(result.episodes)}
                flags = _flag_counts(result.episodes)
                row.update(flags)
                steps = len(result.episodes) * T
                self._anomalies(update + 1, self.detector.check_rewards(flags, steps, update=update + 1), bar)
                if self.controller.learns:
                    detail = self.detector.detail_due(update + 1)  # an anomaly not long ago: more detail
                    with torch.profiler.record_function("esper.ppo_update"):
                        metrics = self.trainer.update(result.rollout, detail=detail)
                    steps_and_envs = metrics.pop("detail", None)
                    self._event("ppo_update", update=update + 1, **metrics)
                    if steps_and_envs is not None:
                        self._event("ppo_detail", update=update + 1, **steps_and_envs)
                    self._anomalies(update + 1, self.detector.check(metrics, update=update + 1), bar)
                    if self.trainer.bad_streak >= cfg.ppo.max_bad_updates:
                        n = self.trainer.bad_streak
                        raise FloatingPointError(
                            f"the last {n} PPO update(s) were rolled back (a non-finite loss or gradient "
                            "each time)"
                        )
                    row.update(kl=metrics.get("kl_approx"), entropy=metrics.get("entropy"),
                               ev=metrics.get("explained_variance"))  # fmt: skip
                row["seconds"] = time.perf_counter() - t0
                self.rows.append(row)
                bar.set_postfix(test=f"{row['test_acc']:.1f}", ret=f"{row['return']:.2f}")
                last = self.boundary(update + 1)
                due = (update + 1) % cfg.checkpoint_every == 0 or update + 1 == cfg.updates
                if due and self.dist.is_main:
                    self.save(last)
                if profiler is not None and (profiled := profiler.update_done()) is not None:
                    self._event("profile", update=update + 1, **profiled)
                if (graphs := compiled_graphs()) != seen_graphs:  # --compile: each graph compiled, logged
                    new, seen_graphs = graphs - seen_graphs, graphs
                    self._event("compile", update=update + 1, graphs=graphs - graphs_before, new=new)
            if profiler is not None and profiler.running:  # fewer updates than --profile asked for
                self._event("profile", update=update + 1, **profiler.finish())
            bar.close()
            return self._finish()
        except KeyboardInterrupt as e:
            bar.close()
            if isinstance(e, Terminated):
                return self._stop(last, 143, "stopped by SIGTERM", "")
            return self._stop(last, 130, "interrupted", "")
        except FloatingPointError as e:  # a non-finite rollout, or updates rolled back again and again
            bar.close()
            why = f"stopped during update {update + 1}: {e}"
            return self._stop(last, STOPPED, why, " and saner options (e.g. a lower --ppo.lr)")
        except OSError as e:  # disk full, ...
            bar.close()
            return self._stop(last, STOPPED, f"stopped during update {update + 1}: {describe(e)}", "")
        except PeerLost as e:  # another process died: this one must not wait for it forever
            bar.close()
            return self._stop(last, STOPPED, f"stopped during update {update + 1}: {e}", "")
        finally:
            if profiler is not None:
                profiler.stop()  # a run that stopped early: nothing written

    def _learn_offline(self, phase: str) -> None:
        """``pretrain`` (behaviour cloning before the first PPO update) or ``offline`` (the whole run) on
        the run's dataset (:mod:`esper.shell.agent.pretrain`): one ``offline_epoch`` event per epoch, and
        the PPO trainer continues from the scaled returns' statistics the learner kept."""
        cfg = self.cfg.offline_rl
        data, meta = self.dataset
        algo, epochs = ("bc", cfg.pretrain_epochs) if phase == "pretrain" else (cfg.algo, cfg.epochs)
        learner = OfflineLearner(self.agent, self.cfg.ppo, cfg, seed=self.cfg.seed)
        batch = learner.prepare(data, layout_of(data, meta))
        self._event("offline_start", phase=phase, algo=algo, epochs=epochs, episodes=meta["episodes"],
                    controllers=meta["controllers"], paths=meta["paths"])  # fmt: skip
        log = lambda epoch, m: self._event("offline_epoch", phase=phase, **m)
        reports = learner.fit(batch, algo, epochs, log)
        self.trainer.state.reward_stats = learner.reward_stats
        self.dataset = None
        if self.dist.is_main:
            last = reports[-1]
            print(f"esper: {phase}: {epochs} epochs of {algo} on {meta['episodes']} episodes of "
                  f"{', '.join(meta['controllers'])}: log-likelihood {last['log_likelihood']:.3f}, "
                  f"greedy accuracy {last['accuracy']:.3f}", file=sys.stderr)  # fmt: skip

    def _anomalies(self, update: int, found: list, bar) -> None:
        """Log each finding of ``update`` (an alarm as an ``anomaly`` event, a note as a ``note``) and say
        it on the progress bar."""
        for anomaly in found:
            kind = "anomaly" if anomaly.severity == "alarm" else "note"
            self._event(kind, update=update, **anomaly.as_dict())
            if self.dist.is_main:
                bar.write(f"{kind} at update {update}: {anomaly.kind}: {anomaly.detail}")

    def _gather(self, result: EpisodeResult) -> EpisodeResult:
        """Every process's events of this batch, in global env order (the rollout stays this one's)."""
        if not self.dist.active:
            return result
        mine = dataclasses.replace(result, rollout=None, final=None)
        merged = merge_results(self.dist.gather_objects(mine))
        merged.rollout = result.rollout
        return merged

    def _stop(self, last: dict, status: int, why: str, hint: str) -> int:
        """End a run that cannot go on: write ``last`` (the newest update boundary) if it is newer
        than the checkpoint on disk, and say in one line what happened and how to go on. A process
        other than rank 0 only says why it stopped (rank 0 writes and reports)."""
        done = last["progress"]["update"]
        if not self.dist.is_main:  # rank 0 writes the checkpoint (if it still can)
            line = f"process {self.dist.rank}: {why}; resume the last checkpoint with --resume {self.dir}"
            print(f"{PROG}: error: {line}" if status == STOPPED else f"\nesper: {line}", file=sys.stderr)
            return status
        try:
            with self.signals.deferred(drop=True):  # a second Ctrl-C does not cut this write short
                if self.saved is None or done > self.saved:
                    self.save(last)
        except (FloatingPointError, OSError) as e:
            why += f"; the checkpoint of update {done} could not be written ({describe(e)})"
        if self.saved is None:
            state = "no checkpoint was written; start the run again"
        else:
            where = self.dir / CHECKPOINT
            state = f"the checkpoint of update {self.saved} ({where}) is intact: resume with "
            state += f"--resume {self.dir}"
        line = f"{why}; {state}{hint}"
        print(f"{PROG}: error: {line}" if status == STOPPED else f"\nesper: {line}", file=sys.stderr)
        try:
            self._event("run_end", interrupted=True, updates=done, status=status, reason=why)
            self.log.close()  # type: ignore[union-attr]
        except OSError:
            pass
        return status

    def _finish(self) -> int:
        cfg = self.cfg
        if not self.dist.is_main:
            return 0
        table = summary_table(self.rows, [c for c in SUMMARY_COLUMNS if any(c in r for r in self.rows)])
        print(table)
        check = (
            heldout_check(cfg.for_task(cfg.env.task), self.dir, self.agent.state_dict(), self.env.task)
            if cfg.eval_episodes else None
        )  # fmt: skip
        if check is not None:
            print(check["text"])
            table += "\n\n" + check["text"]
            self._event("heldout_check", **{k: v for k, v in check.items() if k != "text"})
        print(repeat := repeat_line(cfg.seed, torch.get_num_threads()))
        (self.dir / "summary.txt").write_text(f"{table}\n\n{repeat}\n")
        self._event(
            "run_end", interrupted=False, updates=cfg.updates, summary=self.rows[-1] if self.rows else {}
        )
        self.log.close()  # type: ignore[union-attr]
        if cfg.report:
            write_report(self.dir)
            print(f"report: {self.dir / 'report.md'}")
        print(f"run directory: {self.dir}")
        return 0

    def _log_episodes(self, update: int, result) -> None:
        for ev in result.epochs:
            self._event("epoch", update=update + 1, **ev)
        for ev in result.lifecycle:
            self._event("lifecycle", update=update + 1, **ev)
        for ev in result.governor:
            self._event("governor", update=update + 1, **ev)
        for ep in result.episodes:
            self._event("episode", update=update + 1, **ep)
        self._event("timings", update=update + 1, **result.timings)


def compiled_graphs() -> int:
    """The graphs ``torch.compile`` has compiled in this process so far (dynamo's own count). Every compile
    of the run is ``fullgraph=True``: a graph break or a code object past ``recompile_limit`` raises, so
    nothing falls back to eager unseen; a recompile (a new shape, a new constant) is logged as a
    ``compile`` event by the update that caused it."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _cpu_copy(obj):
    """A deep copy of a payload with every tensor cloned to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _cpu_copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def build_envs(cfg: RunConfig, env_cfg: EnvConfig, first: int) -> dict[str, VecEnv]:
    """One :class:`VecEnv` per training task, each ``env_cfg`` (this process's slice of the envs, from
    the global env ``first``) with its task; refused in one line where the learner cannot take their
    shapes (:func:`check_shapes`)."""
    envs = {
        task: VecEnv(
            dataclasses.replace(env_cfg, task=task), cfg.lifecycle, cfg.governor, seed=cfg.seed,
            first_env=first, reward=cfg.reward, gamma=cfg.ppo.gamma, host_group=cfg.ppo.host_group,
        )
        for task in cfg.training_tasks
    }  # fmt: skip
    check_shapes(cfg, envs)
    return envs


def dataset_for(cfg: RunConfig, env: VecEnv) -> tuple:
    """The episodes ``pretrain`` or ``offline`` names (:func:`esper.shell.eval.dataset.load_dataset`),
    refused in one line where this run's learner cannot read them: the flat policy reads one host's
    observation and heads, so a dataset of another shape; either policy, another observation layout."""
    data, meta = load_dataset(cfg.pretrain or cfg.offline)
    where = "pretrain" if cfg.pretrain else "offline"
    same = meta["slot_names"] == list(env.slot_names) and meta["blueprint_names"] == list(env.blueprint_names)
    if cfg.ppo.policy == "flat" and not (same and meta["obs_dim"] == env.obs_dim):
        raise ValueError(
            f"{where}: the dataset's episodes ran on another host ({meta['task']}, {len(meta['slot_names'])} "
            "slots); the flat policy reads one host's shape: pass --ppo.policy set, or a dataset of this task"
        )
    theirs = meta["obs_dim"] - obs_dim(len(meta["slot_names"]), len(meta["blueprint_names"]))
    if theirs != env.obs_dim - obs_dim(env.spec.n_slots, env.spec.n_blueprints):
        raise ValueError(f"{where}: the dataset's observation layout differs from this run's "
                         "(lifecycle.seed_grad_features, lifecycle.grad_gain_features)")  # fmt: skip
    return data, meta


def init_agent_from(agent: Agent, run_dir: Path, policy: str) -> None:
    """``init_from``: ``agent``'s weights and observation statistics from another run's checkpoint (one-line
    errors where it is missing, of another ``ppo.policy`` than ``policy``, or does not fit)."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"init_from: {path} not found (a directory of {PROG} that finished an update)")
    ckpt = load_checkpoint(path, map_location=agent.device)
    theirs = ckpt.get("config", {}).get("ppo", {}).get("policy", "flat")
    if theirs != policy:
        raise ValueError(
            f"init_from {run_dir}: its controller is ppo.policy {theirs}, this run's {policy}: "
            f"pass --ppo.policy {theirs}"
        )
    try:
        agent.load(ckpt["agent"])
    except (KeyError, RuntimeError, ValueError) as e:
        why = f"init_from {run_dir}: its controller does not load into this run's: {load_error_line(e)}"
        raise ValueError(why) from None


def check_shapes(cfg: RunConfig, envs: dict[str, VecEnv]) -> None:
    """Refuse, in one line, training tasks whose hosts differ in shape where the learner cannot take them:
    the flat policy's input and slot and blueprint heads are sized by one host, and a compiled step builds
    one graph per host shape and batch size (``ppo.replay``)."""
    shapes = {(e.spec.n_slots, e.blueprint_names, e.obs_dim) for e in envs.values()}
    if cfg.policy != "ppo" or len(shapes) == 1:
        return
    if cfg.ppo.policy == "flat":
        seen = "; ".join(f"{t} {e.spec.n_slots} slots, {e.task.family} blueprints" for t, e in envs.items())
        raise ValueError(
            f"tasks: the flat policy acts on one host shape, these differ ({seen}); train them with "
            "--ppo.policy set"
        )
    graphs, limit = len(shapes) * (cfg.ppo.replay + 1), torch.compiler.config.recompile_limit
    if cfg.compile and graphs > limit:
        raise ValueError(
            f"tasks: {len(shapes)} host shapes with --compile and ppo.replay={cfg.ppo.replay} need {graphs} "
            f"graphs, over torch.compile's recompile_limit of {limit}: fewer tasks, a smaller --ppo.replay, "
            "or run without --compile"
        )


SUMMARY_COLUMNS = ("update", "task", "return", "test_acc", "val_acc", "params", "fossilized", "pruned",
                   "hacking", "ransomware", "kl", "entropy", "ev", "seconds")  # fmt: skip


def _flag_counts(episodes: list[dict]) -> dict[str, int]:
    """The env-steps of an update's episodes whose reward raised each flag (``hacking``, ``ransomware``)."""
    return {k: sum(int(e.get("reward_flags", {}).get(k, 0)) for e in episodes) for k in FLAGS}


def _episode_means(episodes: list[dict]) -> dict:
    n = max(len(episodes), 1)
    mean = lambda k: sum(e[k] for e in episodes) / n
    return {
        "return": mean("return"),
        "test_acc": mean("final_test_acc"),
        "val_acc": mean("final_val_acc"),
        "params": mean("params_added"),
        "fossilized": mean("n_fossilized"),
        "pruned": mean("n_pruned"),
    }
