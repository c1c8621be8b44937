"""The run's configuration: one frozen, slotted dataclass per concern, composed into :class:`RunConfig`,
and every preset in one place (:data:`PRESETS`).

Every field has a doc line (it is the CLI's ``--help``); unknown keys and options are rejected; values
are validated where they are declared. The PPO discount is also the discount of potential-based reward
shaping: there is one ``ppo.gamma`` and the reward functions receive it (finding C1), so the two cannot
disagree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from esper.core.lifecycle import LifecycleConfig
from esper.core.rewards import RewardConfig
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.pretrain import OfflineConfig
from esper.shell.common.fields import check_fields, doc, to_dict, with_overrides
from esper.shell.env.config import TASKS, EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.telemetry.anomaly import AnomalyConfig

#: The run's controller (``--policy``; the PPO network is ``--ppo.policy``,
#: :data:`esper.shell.agent.config.PPO_POLICIES`).
RUN_POLICIES = ("ppo", "heuristic")
#: A run name is one directory name: at most this many characters ...
NAME_MAX = 100
#: ... of letters, digits and these (no path separator, no leading dot: nothing outside --run_dir).
NAME_PUNCTUATION = "._-+=@,"
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9{re.escape(NAME_PUNCTUATION)}]*")


def check_run_name(name: str) -> None:
    """Refuse (one line) a run name that is not a single, portable directory name: ``../../x`` or
    ``a/b`` would write outside ``--run_dir``, and 300 characters exceed what file systems take."""
    if name == "":
        return
    if len(name) > NAME_MAX:
        raise ValueError(f"name must be at most {NAME_MAX} characters, got {len(name)}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"name {name!r}: use letters, digits and {NAME_PUNCTUATION!r}, starting with a letter or digit "
            "(no path separators or '..': the run directory is --run_dir/NAME)"
        )


@dataclass(frozen=True, slots=True)
class RunConfig:
    updates: int = doc(8, "PPO updates to run; each is one batch of n_envs episodes", ge=1)
    seed: int = doc(42, "seed of every random number generator of the run", ge=0)
    policy: str = doc("ppo", "controller: ppo (learns) | heuristic (the reference's rules, no learning)")
    compile: bool = doc(
        False, "torch.compile each PPO minibatch step (LSTM, loss, backward, clip, AdamW) and GAE as graphs"
    )
    run_dir: str = doc("runs", "parent folder of run directories")
    name: str = doc(
        "",
        f"run directory name: letters, digits and {NAME_PUNCTUATION}, at most {NAME_MAX} characters "
        "(empty: <preset>-<timestamp>)",
    )
    checkpoint_every: int = doc(
        1, "write the checkpoint every N updates (also at the end and on Ctrl-C / SIGTERM)", ge=1
    )
    report: bool = doc(True, "write plots and report.md into the run directory at the end")
    eval_episodes: int = doc(
        8,
        "at the end: the controller and the static host on this many fresh hosts, test accuracy (0: skip)",
        ge=0,
    )
    progress: bool = doc(True, "show a progress bar on stderr")
    warnings: bool = doc(
        True, "print a line on stderr for each legal but suspicious setting (esper.shell.config.advice)"
    )
    profile: int = doc(
        0, "profile the first N updates with torch.profiler: a trace and the top operators' table in "
        "RUN_DIR/profile/, the table also in report.md (0: off)", ge=0,
    )  # fmt: skip
    threads: int = doc(
        0, "torch intra-op threads of the process (0: the cores / env.workers, at least 1)", ge=0
    )
    tasks: tuple[str, ...] = doc(
        (), "training tasks (comma-separated): each update's episodes come from one of them, in turn from "
        "the first (round-robin), each on the env section's settings with its own task; env.task must be "
        "one of them (the held-out check's and evaluate's task). Tasks whose hosts differ in shape need "
        "--ppo.policy set (empty: env.task alone)",
    )  # fmt: skip
    init_from: str = doc(
        "", "start the learned controller from this run directory's checkpoint (its weights and observation "
        "statistics; a fresh optimizer, none of its updates): fine-tuning a trained controller on this run's "
        "task (empty: a fresh controller)",
    )  # fmt: skip
    pretrain: str = doc(
        "", "warm-start the learned controller by behaviour cloning on the episodes of this dataset (a "
        "directory of python -m esper.shell.evaluate --save-episodes; comma-separated for several) for "
        "offline_rl.pretrain_epochs passes before its first PPO update (empty: none)",
    )  # fmt: skip
    offline: str = doc(
        "", "train the learned controller from this dataset's episodes alone (offline_rl.algo, "
        "offline_rl.epochs passes): no episode of its own, no PPO update; the run then writes its "
        "checkpoint and runs its held-out check, and evaluate reads it as any run's (empty: PPO)",
    )  # fmt: skip
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    offline_rl: OfflineConfig = field(default_factory=OfflineConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    governor: GovernorConfig = field(default_factory=GovernorConfig)
    anomaly: AnomalyConfig = field(default_factory=AnomalyConfig)

    def torch_threads(self, processes_on_machine: int = 1) -> int:
        """The intra-op thread count to use: ``threads``, or (0) the cores shared out over this
        machine's processes and each one's env workers (tiny host ops gain nothing from more, and
        oversubscribed cores slow every process down). The batched host step takes half its share:
        its kernels gain little past one thread at these sizes (1.2-1.4x from two on the 2-core VM),
        while a thread pool that meets another busy process stalls at every one of its hundreds of
        small parallel regions a step (5x slower, measured beside other runs)."""
        if self.threads:
            return self.threads
        cores = os.cpu_count() or 1
        share = cores // max(processes_on_machine, 1)
        return max(1, share // 2 if self.env.batched else share // self.env.workers)

    def __post_init__(self) -> None:
        check_fields(self)
        for f in dataclasses.fields(self):  # the core sections too (they cannot import this checker)
            if dataclasses.is_dataclass(section := getattr(self, f.name)):
                check_fields(section, f.name)
        if self.policy not in RUN_POLICIES:
            raise ValueError(f"policy must be one of {RUN_POLICIES}, got {self.policy!r}")
        if self.eval_episodes == 1:
            raise ValueError(f"eval_episodes must be 0 or >= 2, got {self.eval_episodes}")
        if not self.run_dir.strip():
            raise ValueError("run_dir must not be empty")
        check_run_name(self.name)
        self._check_tasks()
        if self.init_from and self.policy != "ppo":
            raise ValueError(f"init_from starts a learned controller; policy {self.policy} has none")
        if (self.pretrain or self.offline) and self.policy != "ppo":
            raise ValueError(f"pretrain and offline train the ppo controller; policy {self.policy} has none")
        if self.pretrain and self.offline:
            raise ValueError("pretrain (before PPO) and offline (instead of PPO): give one")
        if self.env.budget_shares and self.ppo.policy != "set":
            raise ValueError("env.budget_shares: only the set policy reads a budget (ppo.policy set)")
        if self.env.budget_shares and self.ppo.param_cap > 0:
            raise ValueError(
                f"env.budget_shares gives each episode its cap; ppo.param_cap ({self.ppo.param_cap:g}) would "
                "be ignored: set it to 0"
            )
        if self.env.n_envs % self.ppo.host_group:
            raise ValueError(
                f"ppo.host_group={self.ppo.host_group} must divide env.n_envs={self.env.n_envs} (whole "
                "groups of envs share a host)"
            )
        if self.env.n_envs % self.ppo.n_minibatches:
            raise ValueError(
                f"ppo.n_minibatches={self.ppo.n_minibatches} must divide env.n_envs={self.env.n_envs} "
                "(minibatches hold whole env sequences)"
            )

    def _check_tasks(self) -> None:
        if not self.tasks:
            return
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"tasks: unknown task(s) {unknown}; tasks: {', '.join(TASKS)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks: {', '.join(self.tasks)} names a task twice")
        if self.env.task not in self.tasks:
            raise ValueError(
                f"env.task {self.env.task!r} is not one of tasks ({', '.join(self.tasks)}): it is the task "
                f"the held-out check and evaluate use; pass --env.task {self.tasks[0]}"
            )
        for task in self.tasks:
            try:
                dataclasses.replace(self.env, task=task)
            except ValueError as e:
                raise ValueError(f"tasks: {task}: {e}") from None

    @property
    def training_tasks(self) -> tuple[str, ...]:
        """The tasks the run trains on (``tasks``, else ``env.task`` alone)."""
        return self.tasks or (self.env.task,)

    def task_of(self, update: int) -> str:
        """The task of update ``update`` (0-based): the training tasks in turn, from the first."""
        tasks = self.training_tasks
        return tasks[update % len(tasks)]

    def for_task(self, task: str) -> RunConfig:
        """This config on ``task`` alone: the env section with its task, no other training task. A data
        seed is a draw of the run's own task: on another task it falls back to that task's own draw."""
        data_seed = self.env.data_seed if task == self.env.task else None
        env = dataclasses.replace(self.env, task=task, data_seed=data_seed)
        return dataclasses.replace(self, env=env, tasks=())


def _flat(sections: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"ppo": {"lr": 1e-4}, "updates": 3}`` -> ``{"ppo.lr": 1e-4, "updates": 3}``."""
    out: dict[str, Any] = {}
    for name, value in sections.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _suite() -> dict[str, Any]:
    """The suite's controller configuration, on its first task (preset ``mnist1d``): MNIST-1D (generated
    by the mnist1d package), a deliberately small 1-D CNN host with three slots, 8 envs, 25-epoch
    episodes, the OBJECTIVE reward, 22 updates. Every suite task and pre-check trains with it; frozen,
    because controllers have run on those tasks (the default, :func:`_default`, may move on)."""
    return dict(
        updates=22,
        env={
            "task": "mnist1d",
            "n_envs": 8,
            "batch_size": 128,
            "host_lr": 0.05,
            "seed_lr": 0.05,
            "lr_schedule": "cosine",
            "workers": 2,
        },
        lifecycle={
            "min_prune_age": 6,
            "auto_advance": True,
            "timeout_fossilizes": True,
            "prune_gate": True,
            "terminal_at_limit": True,
            # G2 also passes on the incubating seed's own what-if gain: the host's gain alone strands
            # seeds where the host cannot learn the task without them (longrange); adopted 2026-12-01 by
            # a rule written before its zero-shot confirmation on fresh hosts (docs/experiment-log.md)
            "g2_evidence": "either",
        },
        reward={"param_weight": 0.0, "param_budget_share": 0.6},
        # Why these settings (README, "Why the controller did not learn at first"): an untrained policy
        # germinates as often as it waits where a slot is free (germinate_bias = wait_bias), so seeds
        # grow early enough to pay and every update shows what each blueprint in each slot is worth,
        # and it rarely re-targets a live seed (3 logits below WAIT); a seed that pays cannot be pruned
        # (prune_gate: PRUNE is for seeds the host does not depend on); a larger step (lr, epochs, KL
        # stop) because 8 episodes an update give ~0.002 KL at the library default, annealed to a tenth
        # so that a policy that has found what pays does not drift off it late in the run; entropy
        # annealed 0.03 -> 0.003 so the slot and blueprint heads explore first and commit by the end,
        # the blueprint head's weighed 3x: which blueprint is a noisy bandit at 8 episodes an update, and
        # at 1x runs committed to the first blueprint that paid well enough in b0 (README, growth bench).
        # Adopted 2026-11-28 by a rule written before the run (docs/experiment-log.md, seeds 80-89):
        # each update also learns from the last 3 updates' episodes (replay) and the blend heads start on
        # the fixed schedules' blend (blend_bias); the episode's last epoch is terminal, not a truncation
        # to bootstrap from the critic, with lambda 1 (terminal_at_limit, gae_lambda: the critic's guess
        # of gains to come had favoured weak hosts); the reward is validation accuracy, parameters free up
        # to 720 added (param_budget), and the learned controller may not hold more than 720
        # (param_cap, the 60 % of grow_all's 1,200; since issue 45 both are stated as that share,
        # param_budget_share and param_cap_share 0.6, so every task reads them in its own host's terms).
        # The run's held-out check reads both the
        # sampled policy and its most likely actions; the rule judged the latter. Its replication on fresh
        # seeds 90-99 read 0.875 of grow_all's gain, under the rule's 0.90 (the same log). The misses never
        # saw conv_heavy in b0 in training, so the blueprint head starts on a capacity prior (size_bias 1:
        # each blueprint about in proportion to its parameters), adopted by the rule on fresh seeds 100-109.
        # The learner cannot hear a step-earlier FOSSILIZE (worth half a point against returns that spread
        # 3-6 at the same epoch), so it kept seeds blending late; FOSSILIZE starts one logit above WAIT where
        # it is legal (fossilize_bias 4), adopted 2026-12-01 by the rule on the suite's four tasks, fresh
        # seeds 300-304 (docs/experiment-log.md: +1.80 [+0.11, +3.49] pooled).
        eval_episodes=6,
        ppo={
            "hidden": 64,
            "head_hidden": 32,
            "lr": 3e-3,
            "lr_end": 3e-4,
            "lr_anneal_updates": 22,
            "n_epochs": 8,
            "target_kl": 0.03,
            "wait_bias": 3.0,
            "germinate_bias": 3.0,
            "entropy_coef": 0.03,
            "entropy_coef_end": 0.003,
            "entropy_anneal_updates": 22,
            "head_entropy_weights": (1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0),
            "replay": 3,
            "blend_bias": 3.0,
            "gae_lambda": 1.0,
            "param_cap_share": 0.6,
            "size_bias": 1.0,
            "fossilize_bias": 4.0,
        },
    )


#: What a suite task's preset may set on top of the suite's configuration (issue 45: one controller
#: configuration for the whole suite): the task and its own sizes (the env's fields: data, host, envs,
#: batches) and the episode's length, never the controller's, the reward's or the lifecycle's other
#: settings.
TASK_SIZE_FIELDS = ("env.", "lifecycle.max_epochs")


#: The default's updates: 8, annealed over 8, on host batches of 256 at learning rate 0.1 (twice the suite's
#: batch and rate). Adopted 2026-12-07 (issue 102) by a rule written before its runs, judged by the worst
#: seed: on eleven fresh training seeds every greedy controller held at least 0.85 of grow_all's gain on
#: its fresh hosts (the worst 0.866) and beat random by at least 10 points on a fresh data draw
#: (docs/experiment-log.md, "A default that learns on every seed"). The 6 updates before it (issue 90)
#: left the README's own seed level with random. The suite keeps its configuration (:func:`_suite`).
DEFAULT_UPDATES = 8


def _default() -> dict[str, Any]:
    """The embedded default: the suite's configuration (:func:`_suite`: MNIST-1D, a small 1-D CNN host
    with three slots, 8 envs, 25-epoch episodes, the OBJECTIVE reward) trained in
    :data:`DEFAULT_UPDATES` updates, its learning rate and entropy annealed over them, the hosts on
    batches of 256 at learning rate 0.1 (fewer, larger steps: each host ends about 3 points lower than
    the suite's; every one of eleven fresh seeds' controllers at 0.85 of grow_all's gain or more)."""
    base = _suite()
    ppo = {**base["ppo"], "lr_anneal_updates": DEFAULT_UPDATES, "entropy_anneal_updates": DEFAULT_UPDATES}
    env = {**base["env"], "batch_size": 256, "host_lr": 0.1, "seed_lr": 0.1}
    return {**base, "updates": DEFAULT_UPDATES, "env": env, "ppo": ppo}


def _on_suite(doc_line: str, **sizes: Any) -> Callable[[], dict[str, Any]]:
    """A suite task's preset: the suite's configuration (:func:`_suite`: its controller, reward and
    lifecycle) with the task's own sizes (``env={...}``, ``lifecycle={"max_epochs": ...}``:
    :data:`TASK_SIZE_FIELDS` only)."""

    def build() -> dict[str, Any]:
        base = _suite()
        out = {**base, "env": {**base["env"], **sizes.get("env", {})}}
        if "lifecycle" in sizes:
            out["lifecycle"] = {**base["lifecycle"], **sizes["lifecycle"]}
        return out

    build.__doc__ = doc_line
    return build


def _digits() -> dict[str, Any]:
    """Handwritten digits (shipped with scikit-learn), a small 2-D CNN host. The host saturates near
    97 %, so growth has little room here: a quick check, not a showcase."""
    return dict(
        updates=20,
        env={"task": "digits", "n_envs": 4, "image_size": 8, "channels": (4, 8, 16), "batch_size": 64},
        ppo={"hidden": 64, "head_hidden": 32, "lr": 1e-3, "entropy_coef": 0.01},
    )


def _stdlib_text() -> dict[str, Any]:
    """Byte-level LM on the Python standard library's own source, transformer host."""
    return dict(
        updates=4,
        env={"task": "stdlib_text", "n_envs": 2, "train_batches": 16, "val_batches": 4},
        ppo={"n_minibatches": 1, "hidden": 64, "head_hidden": 32},
    )


def _cifar10() -> dict[str, Any]:
    """CIFAR-10 from the official binary batches at --env.data_path (GPU recommended)."""
    return dict(
        updates=100,
        env={"task": "cifar10", "n_envs": 4, "batch_size": 128, "device": "cuda", "amp": True},
        ppo={"entropy_coef": 0.1},
    )


def _tinystories() -> dict[str, Any]:
    """TinyStories from a local text file at --env.data_path, byte-level transformer (GPU)."""
    return dict(
        updates=100,
        env={"task": "tinystories", "n_envs": 4, "device": "cuda", "amp": True},
        ppo={"entropy_coef": 0.05},
        reward={"sparse_scale": 0.5},
    )


def _smoke() -> dict[str, Any]:
    """A few seconds end to end: tiny episodes, tiny policy (tests and quick checks)."""
    return dict(
        updates=2,
        env={"task": "mnist1d", "n_envs": 2, "batch_size": 128, "train_batches": 2},
        lifecycle={"max_epochs": 6},
        ppo={"hidden": 16, "head_hidden": 16, "n_epochs": 2, "n_minibatches": 2},
        report=False,
        progress=False,
        eval_episodes=0,
    )


#: Every preset, by name: its changes to :class:`RunConfig`'s defaults, as nested sections.
#: ``default`` is what ``python -m esper.shell.run`` runs with no arguments.
PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "default": _default,
    # the suite's tasks (bench.suite, docs/suite.md): the suite's configuration, their own sizes
    "mnist1d": _suite,
    "mnist1d_deep": _on_suite(
        "MNIST-1D on a deeper host: five pointwise blocks, five slots.", env={"task": "mnist1d_deep"}
    ),
    "longrange": _on_suite(
        "Two distant pulses, same sign or not: only a seed that mixes all positions relates them.",
        env={"task": "longrange"},
    ),
    "retrieval": _on_suite(
        "Is the query's level among the items'? Two channels, related across the whole length; "
        "90-epoch episodes (in 60 the blueprints are not yet apart).",
        env={"task": "retrieval"},
        lifecycle={"max_epochs": 90},
    ),
    "digits_shallow": _on_suite(
        "The digits resized larger, on a shallow 2-D host (two 3x3 blocks).", env={"task": "digits_shallow"}
    ),
    "recall": _on_suite(
        "In-context recall on a transformer host whose positions do not mix: only an attention seed can "
        "recall; the largest blueprint (mlp) acts on each position alone.",
        env={"task": "recall", "batch_size": 32, "host_lr": 0.1, "seed_lr": 0.1},
    ),
    "digits": _digits,
    "stdlib_text": _stdlib_text,
    "cifar10": _cifar10,
    "tinystories": _tinystories,
    "smoke": _smoke,
}


#: Fields of a run that do not change what it trains or how its controller is judged: where it writes, how
#: often it saves, what it prints, its threads, its seed and the size of its end-of-run check.
UNHASHED_FIELDS = (
    "seed", "run_dir", "name", "checkpoint_every", "report", "progress", "warnings", "profile", "threads",
    "eval_episodes",
)  # fmt: skip


#: Options added after the hash, each with the value at which it is off: at that value a configuration
#: trains as it did before the option existed (each option's tests hold it to that), so the field is left
#: out of the hash and the figures measured before it still name the configuration; at any other value it
#: enters the hash. A change of an option's default must leave this table with it.
OPTIONS_OFF: dict[str, Any] = {
    "lifecycle.incubate": True,  # issue 103: no incubation is an option
    "lifecycle.instant_blend": False,  # issue 103: a blend-in of no epoch
    "lifecycle.timeout_ramp": False,  # issue 104: a deadline removal ramped out
    "lifecycle.keep_by": "accuracy",  # issue 104: a seed kept at its deadline by its loss
    "lifecycle.g5_min_loss_drop": 0.05,  # read only by keep_by loss or either
}


def config_hash(cfg: RunConfig) -> str:
    """Twelve hex digits that name what ``cfg`` trains: every field but :data:`UNHASHED_FIELDS`, and but
    the options of :data:`OPTIONS_OFF` where they are off, as ``config.json`` writes them. A results file
    records the hash of the configuration it measured, so that a figure quoted for "the default" can be
    checked against ``preset("default")`` (issue 102)."""
    doc = to_dict(cfg)
    for path, off in OPTIONS_OFF.items():
        section, _, name = path.partition(".")
        if doc.get(section, {}).get(name, off) == off:
            doc[section] = {k: v for k, v in doc[section].items() if k != name}
    kept = {k: v for k, v in doc.items() if k not in UNHASHED_FIELDS}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def preset(name: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The preset ``name`` with dotted-path ``overrides`` (see :func:`with_overrides`), validated once
    on the final values: a preset that needs a field it cannot know (``cifar10``'s ``env.data_path``)
    is built together with that override."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    base = _flat(PRESETS[name]())
    for given, other in _ONE_WAY:  # a budget given one way on the command line replaces the preset's other
        if overrides and given in overrides and other not in overrides and base.get(other):
            base[other] = 0.0
    return with_overrides(RunConfig(), {**base, **(overrides or {})})


#: Settings stated either in parameters or as a share of grow_all's: an override of one clears the
#: preset's other (giving both at once is refused by the config).
_ONE_WAY = (
    ("reward.param_budget", "reward.param_budget_share"),
    ("reward.param_budget_share", "reward.param_budget"),
    ("ppo.param_cap", "ppo.param_cap_share"),
    ("ppo.param_cap_share", "ppo.param_cap"),
)


__all__ = [
    "DEFAULT_UPDATES",
    "NAME_MAX",
    "OPTIONS_OFF",
    "PRESETS",
    "RUN_POLICIES",
    "TASK_SIZE_FIELDS",
    "UNHASHED_FIELDS",
    "RunConfig",
    "check_run_name",
    "config_hash",
    "preset",
]
