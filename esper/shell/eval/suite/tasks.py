"""The suite's task map and the names of its rows: which preset trains each task, which controllers each
seed is evaluated with, the final draw of each training seed, and the rows a kept arm adds beside the
judged one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.eval.search import PLAN_SEARCH_CAP

#: Suite task -> the preset that trains it (``python -m esper.shell.run --preset``).
SUITE: dict[str, str] = {
    "mnist1d": "mnist1d",
    "mnist1d_deep": "mnist1d_deep",
    "longrange": "longrange",
    "digits_shallow": "digits_shallow",
    "recall": "recall",
}
#: The default task: the one every earlier result is on, judged at each budget beside the families (issue 89).
DEFAULT_TASK = "mnist1d"
#: A family's per-host oracle (issue 89): on each fresh host the best of the family's enumerated fixed plans,
#: evaluated on that host. What no constant plan can beat, so what a controller that reads the host can
#: close the gap to.
ORACLE = "oracle_per_host"
#: The learned controller's readouts: sampled as trained, and each head's most likely action.
LEARNED = ("ppo", "ppo_greedy")
#: Baselines that spend nothing before the evaluation, and the tuned heuristic (which searches).
BASELINES = ("static", "random", "heuristic", "heuristic_tuned", "grow_all")
#: ``plan_search``'s budgets, as multiples of the learned controller's training compute.
PLAN_MULTIPLES = (0.25, 0.5, 1.0, 2.0)
#: Evaluation episodes (fresh hosts) per training seed.
EVAL_EPISODES = 10
#: The final draw of a generated task for training seed k: data seed ``FINAL_DATA_SEED + k`` (the
#: selection draw is the task's own, mnist1d 42, longrange 7).
FINAL_DATA_SEED = 100_000
#: Where each (task, seed)'s evaluation goes inside its run directory.
EVAL_DIR = "eval-suite"
#: The learned controller's most grown plan, grown as a fixed plan on the same hosts: the row that
#: splits a gap to ``plan_search`` into the plan chosen and how it was grown (timing, blending).
OWN_PLAN = "ppo_greedy_plan"
#: The greedy controller, fossilizing wherever FOSSILIZE is legal: how much of the growing part is
#: the seeds kept late (``esper.shell.eval.controllers.FOSSILIZING_READOUTS``).
FOSSILIZING = "ppo_greedy_fossilize"
#: ``plan_search@1x``'s best plan within the learned controller's parameter cap (by the search's scores on
#: the training hosts), grown as a fixed plan on the same hosts: what the cap costs at equal compute,
#: since the search has none. Evaluated into ``RUN_DIR/OUT-in-cap``.
IN_CAP = "plan_search_in_cap"
#: The evaluations of a seed, by folder: the table's, the diagnosis rows, the plan within the cap.
EVALUATIONS = (EVAL_DIR, f"{EVAL_DIR}-diagnosis", f"{EVAL_DIR}-in-cap")
#: Baselines that try harder (issue 89), evaluated only with ``python -m esper.shell.suite --trying``, into
#: ``RUN_DIR/eval-suite-trying`` (:data:`TRYING_DIR`), so that a run without it evaluates, pools and renders
#: as before: the static network at ``grow_all``'s final size, the greedy what-if probe, the heuristic with
#: a widened grid, and the plan search over schedules with their timing and blend at equal compute.
TRYING = ("born_big", "probe", "heuristic_tuned_wide", "plan_search_timed@1x")
#: The row of ``--trying`` that grows the learned controller's most grown plan from the start
#: (``born_big:PLAN`` of ``ppo_greedy``'s plan on the seed; its compute the controller's).
BORN_OWN = "born_big:ppo_greedy"
#: Where a seed's ``--trying`` rows are evaluated.
TRYING_DIR = f"{EVAL_DIR}-trying"


def plan_name(multiple: float) -> str:
    """``plan_search@0.25x``: plan search at ``multiple`` times the learned controller's compute."""
    return f"plan_search@{multiple:g}x"


#: The plan search at equal compute over only the plans within the learned controller's parameter cap
#: (``esper.shell.eval.search``): the search that looks for the best plan under the controller's budget,
#: beside ``plan_search@1x``, which has none. Evaluated where the task's preset has a cap.
CAP_SEARCH = f"{PLAN_SEARCH_CAP}@1x"
CONTROLLERS = (*LEARNED, *BASELINES[:-1], *(plan_name(m) for m in PLAN_MULTIPLES), CAP_SEARCH, BASELINES[-1])


def controllers_for(cfg: RunConfig) -> tuple[str, ...]:
    """The controllers a seed trained with ``cfg`` is evaluated with: :data:`CONTROLLERS`, less
    :data:`CAP_SEARCH` where the learned controller has no parameter cap to search within."""
    return CONTROLLERS if cfg.ppo.has_param_cap else tuple(n for n in CONTROLLERS if n != CAP_SEARCH)


def kept_has_cap(task: str, run_config: dict[str, Any] | None) -> bool:
    """Whether the controller of a kept run of ``task`` (its settings as ``config.json`` holds them) had a
    parameter cap: its ``ppo.param_cap`` or ``ppo.param_cap_share``, each the task's preset's where the
    settings do not give it."""
    base = preset(SUITE[task]).ppo
    ppo = (run_config or {}).get("ppo", {})
    return ppo.get("param_cap", base.param_cap) > 0 or ppo.get("param_cap_share", base.param_cap_share) > 0


def final_data_seed(task: str, k: int) -> int | None:
    """The final draw's data seed of training seed ``k`` (None for a fixed dataset: its test split)."""
    return FINAL_DATA_SEED + k if preset(SUITE[task]).env.task in GENERATED_TASKS else None


def beside_name(name: str, arm_dir: Path) -> str:
    """A learned row of the arm kept in ``arm_dir``, beside the judged arm's: ``ppo_greedy[default]``."""
    return f"{name}[{arm_dir.name}]"


def beside_readout(row: str) -> str | None:
    """The learned readout a :func:`beside_name` row stands for (``ppo_greedy[default]`` → ``ppo_greedy``);
    None for any other row."""
    base, bracket, rest = row.partition("[")
    return base if bracket and rest.endswith("]") and base in LEARNED else None


__all__ = [
    "BASELINES", "BORN_OWN", "CAP_SEARCH", "CONTROLLERS", "DEFAULT_TASK", "EVALUATIONS", "EVAL_DIR",
    "EVAL_EPISODES", "FINAL_DATA_SEED", "FOSSILIZING", "IN_CAP", "LEARNED", "ORACLE", "OWN_PLAN",
    "PLAN_MULTIPLES", "SUITE", "TRYING", "TRYING_DIR", "beside_name",
    "beside_readout", "controllers_for", "final_data_seed", "kept_has_cap", "plan_name",
]  # fmt: skip
