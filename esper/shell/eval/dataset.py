"""Episodes kept as a dataset: any controller's evaluation episodes, written to disk for an offline
learner (``python -m esper.shell.evaluate RUN_DIR --save-episodes DIR``; read back by
``python -m esper.shell.run --pretrain DIR`` and ``--offline DIR``, :mod:`esper.shell.agent.pretrain`).

:class:`EpisodeRecorder` wraps a controller: it acts exactly as the controller does and presents itself
to the :class:`~esper.shell.env.rollout.EpisodeRunner` as a learner, so the runner assembles its steps
into the rollout TensorDict the PPO trainer reads (the same rewards, done flags and ``is_init``).
:class:`EpisodeDataset` collects those rollouts, one dataset per controller, and writes each to
``DIR/<controller>/``:

- ``td/``: a TensorDict ``[N]`` (N episodes) saved with :meth:`TensorDict.memmap`
  (:meth:`TensorDict.load_memmap` reads it):

  - ``steps [N, T]``: ``raw_observation`` (the observation before normalization), per head of
    :data:`~esper.core.spec.HEADS` ``(head, "action")`` and ``(head, "action_mask")`` (the mask the
    action was taken under: a policy's own, narrowed by its parameter cap; else the env's legality,
    :func:`esper.core.masks.action_masks`), ``is_init``, and under ``next`` ``raw_reward``, ``done``,
    ``truncated``, ``terminated``, as :meth:`EpisodeRunner._assemble` writes them;
  - ``final [N]``: the post-action ``raw_observation`` after the last step and its ``op_mask`` (the env's
    op legality), what a truncated episode bootstraps from;
  - ``layout [N]``: the host's layout tensors (``germination_cost``, ``slot_features``, ``descriptors``,
    ``log_cost``: :class:`~esper.shell.host.descriptors.HostLayout`), one row per episode.

- ``meta.json``: the format, the controller, the task and host family, the slot and blueprint names and
  widths, the observation length, the action heads' sizes, the episode length, the discount, the reward
  mode, the evaluation seed, one entry per episode (host seed, return, final test accuracy, parameters
  added, what was grown), the revision, the machine and the date.

What the policy reads is rebuilt from these by the learner (:meth:`esper.shell.agent.agent.Agent.
policy_input` on the raw observation, the op legality bits, ``op``'s ``action_mask``, and the layout),
with its own observation statistics: a dataset serves the flat and the set policy alike, and no
behaviour policy's statistics or recurrent state is kept. Stored sequences are whole episodes
(``is_init`` on step 0), so a learner re-scores them from the zero recurrent state, the state every
episode starts in. Behaviour log-probabilities are not kept (a rule has none): a dataset serves
behaviour cloning and the IQL-family learner (:mod:`esper.core.offline`), not PPO's ratio.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from esper.core.masks import action_masks
from esper.core.spec import HEADS
from esper.shell.common.revision import git_revision, machine
from esper.shell.config.presets import RunConfig
from esper.shell.env.rollout import Controller, EpisodeResult
from esper.shell.env.step import StepInput
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.descriptors import HostLayout

#: The dataset format's version (``meta.json``'s ``format``).
FORMAT = 1
#: The layout tensors kept per episode.
LAYOUT_TENSORS = ("germination_cost", "slot_features", "descriptors", "log_cost")
#: What must agree between datasets read together (and between a dataset and the learner).
SHAPE_META = ("obs_dim", "action_sizes", "max_epochs", "slot_names", "blueprint_names")


class EpisodeRecorder:
    """A controller that acts as ``inner`` does and keeps, for the runner's rollout, what an offline
    learner reads (the module docstring); :attr:`final` holds the post-action step after the episode."""

    learns = True

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.final: TensorDict | None = None

    def begin(self, n_envs: int) -> None:
        self.inner.begin(n_envs)
        self.final = None

    def seed_envs(self, host_seeds: list[int]) -> None:
        self.inner.seed_envs(host_seeds)

    def explain(self) -> list[str] | None:
        return self.inner.explain()

    def act(self, step: StepInput) -> TensorDict:
        out = self.inner.act(step)
        device = step.raw_obs.device
        E = step.raw_obs.shape[0]
        actions = {h: out[h, "action"].to(device) for h in HEADS}
        given = all((h, "action_mask") in out.keys(include_nested=True) for h in HEADS)
        masks = (
            {h: out[h, "action_mask"].to(device) for h in HEADS}
            if given
            else action_masks(step.legal, actions["op"], actions["slot"], actions["blueprint"])
        )
        kept = TensorDict(
            {h: TensorDict({"action": actions[h], "action_mask": masks[h]}, [E]) for h in HEADS}, [E]
        )
        kept["raw_observation"] = step.raw_obs
        kept["state_value"] = torch.zeros(E, device=device)  # the runner's rollout has one; not kept
        return kept

    def bootstrap(self, step: StepInput) -> torch.Tensor:
        E = step.raw_obs.shape[0]
        self.final = TensorDict({"raw_observation": step.raw_obs, "op_mask": step.legal["op"]}, [E])
        return torch.zeros(E, device=step.raw_obs.device)


def episode_batch(result: EpisodeResult, recorder: EpisodeRecorder, layout: HostLayout) -> TensorDict:
    """One batch of a recorder's episodes as dataset rows ``[E]`` (the module docstring), on the CPU."""
    steps = result.rollout.exclude("state_value", ("next", "state_value"))
    E = steps.batch_size[0]
    rows = TensorDict(
        {
            "steps": steps,
            "final": recorder.final,
            "layout": TensorDict(
                {k: getattr(layout, k).expand(E, *getattr(layout, k).shape) for k in LAYOUT_TENSORS}, [E]
            ),
        },
        batch_size=[E],
    )
    return rows.to("cpu")


class EpisodeDataset:
    """Collects the episodes of the controllers an evaluation runs and writes one dataset per controller
    (:meth:`save`). :meth:`wrap` the controller of each batch; :meth:`take` each batch's result."""

    def __init__(self, cfg: RunConfig, *, eval_seed: int) -> None:
        self.cfg, self.eval_seed = cfg, eval_seed
        self.rows: dict[str, list[TensorDict]] = {}
        self.episodes: dict[str, list[dict]] = {}
        self.env_meta: dict[str, dict] = {}
        self._open: tuple[str, EpisodeRecorder, VecEnv] | None = None

    def wrap(self, name: str, controller: Controller, env: VecEnv) -> EpisodeRecorder:
        recorder = EpisodeRecorder(controller)
        self._open = (name, recorder, env)
        return recorder

    def take(self, result: EpisodeResult) -> None:
        """Keep the batch the last :meth:`wrap`'s recorder acted in."""
        if self._open is None:
            raise RuntimeError("EpisodeDataset.take: no controller was wrapped for this batch")
        name, recorder, env = self._open
        self._open = None
        self.rows.setdefault(name, []).append(episode_batch(result, recorder, env.layout))
        keep = ("host_seed", "return", "final_test_acc", "final_val_acc", "params_added", "grown")
        self.episodes.setdefault(name, []).extend({k: ep[k] for k in keep} for ep in result.episodes)
        self.env_meta[name] = env_meta(env)

    def save(self, out: Path) -> list[Path]:
        """Write every controller's dataset to ``out/<controller>/``; returns their directories."""
        written = []
        for name, parts in self.rows.items():
            path = Path(out) / dataset_name(name)
            if path.exists():
                raise FileExistsError(f"--save-episodes: {path} exists; choose another directory")
            td = torch.cat(parts, 0)
            path.mkdir(parents=True)
            td.memmap(path / "td", num_threads=0)
            meta = {
                "format": FORMAT,
                "controller": name,
                "episodes": len(self.episodes[name]),
                **self.env_meta[name],
                "gamma": self.cfg.ppo.gamma,
                "reward_mode": self.cfg.reward.mode.name,
                "terminal_at_limit": self.cfg.lifecycle.terminal_at_limit,
                "eval_seed": self.eval_seed,
                "per_episode": self.episodes[name],
                "git_rev": git_revision(),
                "machine": machine(),
                "date": time.strftime("%Y-%m-%d"),
            }
            (path / "meta.json").write_text(json.dumps(meta, indent=2))
            written.append(path)
        return written


def env_meta(env: VecEnv) -> dict:
    """What a dataset's ``meta.json`` records of the env its episodes ran in."""
    layout = env.layout
    return {
        "task": env.task.name,
        "family": layout.family,
        "slot_names": list(layout.slot_names),
        "slot_widths": list(layout.slot_widths),
        "blueprint_names": list(layout.blueprint_names),
        "host_params": int(layout.host_params),
        "grow_all_params": float(layout.grow_all_params),
        "obs_dim": int(env.obs_dim),
        "action_sizes": dict(env.spec.sizes),
        "max_epochs": int(env.lifecycle.max_epochs),
    }


def dataset_name(controller: str) -> str:
    """A controller's dataset directory name: its name with every character but letters, digits and
    ``._=+@-`` made ``_`` (``grow:b0=conv_heavy`` -> ``grow_b0=conv_heavy``)."""
    return re.sub(r"[^A-Za-z0-9._=+@-]", "_", controller)


def load_dataset(spec: str) -> tuple[TensorDict, dict]:
    """The episodes of ``spec``, comma-separated paths each a dataset directory or a directory of them
    (``--save-episodes``' output: every controller's), joined into one TensorDict ``[N]`` in memory.
    Returns it and the merged meta (the first dataset's, with ``controllers`` and ``episodes`` of all).
    One-line errors: no dataset found, another format, or datasets whose shapes disagree
    (:data:`SHAPE_META`)."""
    paths: list[Path] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        root = Path(part)
        if (root / "meta.json").is_file():
            paths.append(root)
        elif root.is_dir():
            found = sorted(p.parent for p in root.glob("*/meta.json"))
            if not found:
                raise ValueError(f"{root}: no dataset in it (a directory of evaluate --save-episodes)")
            paths += found
        else:
            raise ValueError(f"{root}: not found (a directory written by evaluate --save-episodes)")
    if not paths:
        raise ValueError("no dataset given")
    tds, metas = [], []
    for path in paths:
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path / 'meta.json'}: unreadable ({e})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: dataset format {meta.get('format')!r}, this version reads {FORMAT}")
        if metas:
            differ = [k for k in SHAPE_META if meta.get(k) != metas[0].get(k)]
            if differ:
                raise ValueError(f"{path}: its {', '.join(differ)} differ from {paths[0]}'s (one shape only)")
        tds.append(TensorDict.load_memmap(path / "td").to_tensordict())
        metas.append(meta)
    merged = dict(metas[0])
    merged.pop("per_episode", None)
    merged["controllers"] = [m["controller"] for m in metas]
    merged["episodes"] = sum(int(m["episodes"]) for m in metas)
    merged["paths"] = [str(p) for p in paths]
    return torch.cat(tds, 0), merged


def layout_of(data: TensorDict, meta: dict) -> HostLayout:
    """The host layout a dataset's episodes ran on (its first episode's; every episode of one task has
    the same)."""
    first = data["layout"][0]
    return HostLayout(
        family=meta["family"],
        slot_names=tuple(meta["slot_names"]),
        slot_widths=tuple(meta["slot_widths"]),
        blueprint_names=tuple(meta["blueprint_names"]),
        host_params=int(meta["host_params"]),
        germination_cost=first["germination_cost"],
        slot_features=first["slot_features"],
        descriptors=first["descriptors"],
        log_cost=first["log_cost"],
        grow_all_params=float(meta["grow_all_params"]),
    )


__all__ = [
    "FORMAT", "LAYOUT_TENSORS", "SHAPE_META", "EpisodeDataset", "EpisodeRecorder", "dataset_name", "env_meta",
    "episode_batch", "layout_of", "load_dataset",
]  # fmt: skip
