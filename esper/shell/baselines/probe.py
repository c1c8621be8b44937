"""``probe``: a greedy growth probe in the GradMax / Firefly / NORTH class, on the lifecycle as it is.

Candidates incubate, then the best grow. In rounds, per env:

1. **Germinate candidates.** Into every empty slot where GERMINATE is legal, one a step, a candidate:
   the largest blueprint (by its parameters in that slot) not yet tried there that fits what is left of
   the budget (``noop`` never). A candidate incubates as the lifecycle lets any new seed: GERMINATED,
   then TRAINING at alpha 0, the host's forward untouched, the seed learning from a what-if pass on the
   host's residual (:mod:`esper.shell.host.slots`). The round closes when no slot can take one.
2. **Score them.** Once every candidate of the round has trained ``incubate`` epochs, each is scored by
   its measured what-if gain (``whatif_gain``: the validation accuracy with it blended in at alpha 1,
   minus the host's, in points; the env measures it for this controller, :attr:`VecEnv.measure_whatif`,
   whatever G2 reads): ``absolute``, the gain; ``per_param``, the gain per parameter, scaled by the
   parameters of the average ``grow_all`` seed (``unit``), so that a seed of that size scores its gain
   and one threshold reads alike in both modes.
3. **Grow the best, greedily.** In score order: a candidate that scores at least ``threshold`` and fits
   what is left of the budget (``budget`` seed parameters; the learned controller's) is kept and the
   budget charged; every other candidate is pruned (its slot, once its embargo is over, takes the next
   round's candidate, another blueprint). A kept seed is blended in and fossilized as fast as the gates
   allow, with the fixed schedules' blend (LINEAR_ADD, FAST, alpha 1), as ``grow_all``'s are.

Each step it does the first that applies: FOSSILIZE a kept seed G5 allows, ADVANCE a kept seed whose gate
passes, PRUNE a rejected candidate (once ``min_prune_age`` allows: until then it sits at alpha 0, which
changes nothing in the host's forward), GERMINATE a candidate; else WAIT. No candidate is germinated
that could not be blended in before the last epoch. Its settings (``threshold``, ``incubate``,
``score``: :class:`ProbeSettings`) are chosen on training hosts (:mod:`esper.shell.eval.search`).

**What it changes in the lifecycle** (:data:`PROBE_LIFECYCLE`, set on its env by :meth:`prepare_env`):
two settings, and no gate. ``auto_advance`` off: under it (the default preset's) the lifecycle itself
blends every incubating seed whose G2 passes, so a candidate could not stay at alpha 0 to be declined;
the probe advances only the ones it keeps, through the same gates. ``whatif_statistics batch``: the
what-if gain read on each validation batch's own batch-norm statistics, for the host and the candidate
alike; on the host's running statistics, which never saw an incubating seed, a seed before a batch norm
is mis-normalized and under-read (tens of points on the default task), which would rank candidates by
their position rather than their worth. Both are recorded with its search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig, gate_readiness
from esper.core.spec import DEFAULT_BLEND, HEADS, Op, Stage
from esper.shell.baselines.simple import FixedController
from esper.shell.env.step import StepInput

#: How a candidate is scored (:class:`ProbeSettings.score`).
SCORES = ("per_param", "absolute")
#: The lifecycle settings the probe's episodes run with (the module's docstring).
PROBE_LIFECYCLE = {"auto_advance": False, "whatif_statistics": "batch"}
_INCUBATING = (int(Stage.GERMINATED), int(Stage.TRAINING))


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """The probe's settings (the defaults: the search's starting point)."""

    #: A candidate grows only if its score reaches this (points; per the average ``grow_all`` seed with
    #: ``per_param``).
    threshold: float = 2.0
    #: Epochs a candidate trains (incubating, alpha 0; its germination's epoch among them) before its
    #: what-if gain is read.
    incubate: int = 3
    #: ``per_param`` (gain per parameter, in points per average ``grow_all`` seed) or ``absolute``.
    score: str = "per_param"

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"ProbeSettings.score must be one of {SCORES}, got {self.score!r}")
        if not (isinstance(self.incubate, int) and self.incubate >= 1):
            raise ValueError(f"ProbeSettings.incubate must be an integer >= 1, got {self.incubate!r}")


class ProbeController(FixedController):
    """The probe (the module's docstring). ``costs[s][b]``: the seed parameters blueprint ``b`` adds in
    slot ``s``; ``unit``: the parameters of the average ``grow_all`` seed; ``budget``: the seed parameters
    it may add (``math.inf``: no budget). Keyword arguments set :class:`ProbeSettings`; ``per_env`` gives
    each env its own (a search runs its candidates side by side). It acts under ``lifecycle`` with
    :data:`PROBE_LIFECYCLE`, as its env does once :meth:`prepare_env` set it."""

    def __init__(
        self,
        blueprint_names: Sequence[str],
        lifecycle: LifecycleConfig,
        costs: Sequence[Sequence[float]],
        *,
        unit: float,
        budget: float = math.inf,
        per_env: Sequence[ProbeSettings] | None = None,
        **settings: float | int | str,
    ) -> None:
        if per_env is not None and (settings or not per_env):
            raise ValueError("ProbeController: a non-empty per_env list or keywords, not both")
        self.names = tuple(blueprint_names)
        self.lc = dataclasses.replace(lifecycle, **PROBE_LIFECYCLE)
        self.costs = [[float(c) for c in row] for row in costs]
        self.unit = float(unit)
        self.budget = float(budget)
        self.settings = ProbeSettings(**settings)
        self.per_env = list(per_env) if per_env is not None else None
        self.last_reasons: list[str] = []
        self.begin(0)

    def prepare_env(self, env) -> None:
        """The env measures every incubating seed's what-if gain, which the probe scores by, and runs the
        lifecycle with :data:`PROBE_LIFECYCLE`."""
        env.measure_whatif = True
        env.lifecycle = dataclasses.replace(env.lifecycle, **PROBE_LIFECYCLE)

    def begin(self, n_envs: int) -> None:
        if self.per_env is not None and n_envs and len(self.per_env) != n_envs:
            raise ValueError(f"ProbeController: {len(self.per_env)} per-env settings for {n_envs} envs")
        self.n = n_envs
        S = len(self.costs)
        self.state = [{"tried": [set() for _ in range(S)], "keep": set(), "reject": set(), "open": True,
                       "spent": 0.0, "scores": []} for _ in range(n_envs)]  # fmt: skip

    def explain(self) -> list[str]:
        return list(self.last_reasons)

    def _s(self, i: int) -> ProbeSettings:
        return self.per_env[i] if self.per_env is not None else self.settings

    def act(self, step: StepInput) -> TensorDict:
        slots = step.slots
        gates = gate_readiness(slots, step.signals["val_acc"], self.lc)
        read = {k: slots[k].tolist() for k in ("stage", "age", "whatif_gain", "blueprint")}  # one sync
        g5, g23 = gates["g5"].tolist(), (gates["g2"] | gates["g3"]).tolist()
        legal = step.legal["slot_by_op"].tolist()
        epochs = step.signals["epoch"].tolist()
        actions = {h: [0] * self.n for h in HEADS}
        self.last_reasons = []
        for i in range(self.n):
            op, slot, bp, why = self._decide(i, read, g5[i], g23[i], legal[i], int(epochs[i]))
            if op == Op.WAIT and not legal[i][Op.WAIT][slot]:  # WAIT is legal on enabled slots only
                slot = next((k for k, ok in enumerate(legal[i][Op.WAIT]) if ok), slot)
            actions["op"][i], actions["slot"][i], actions["blueprint"][i] = int(op), slot, bp
            for h in ("style", "tempo", "alpha_target"):
                actions[h][i] = int(DEFAULT_BLEND[h])
            self.last_reasons.append(why)
        device = step.raw_obs.device
        return TensorDict(
            {h: TensorDict({"action": torch.tensor(v, device=device)}, [self.n]) for h, v in actions.items()},
            batch_size=[self.n],
        )

    def _decide(self, i: int, read: dict, g5: list, g23: list, legal: list,
                epoch: int) -> tuple[int, int, int, str]:  # fmt: skip
        st, s = self.state[i], self._s(i)
        stage, age, gain = read["stage"][i], read["age"][i], read["whatif_gain"][i]
        S = len(stage)
        live = lambda k: stage[k] not in (int(Stage.DORMANT), int(Stage.EMBARGOED))
        st["reject"] = {k for k in st["reject"] if live(k)}
        for k in sorted(st["keep"]):
            if g5[k] and legal[Op.FOSSILIZE][k]:
                return Op.FOSSILIZE, k, 0, f"kept seed in slot {k} pays: fossilize"
        for k in sorted(st["keep"]):
            if g23[k] and legal[Op.ADVANCE][k]:
                return Op.ADVANCE, k, 0, f"kept seed in slot {k}: advance"
        for k in sorted(st["reject"]):
            if legal[Op.PRUNE][k]:
                return Op.PRUNE, k, 0, f"candidate in slot {k} rejected: prune"
        undecided = [k for k in range(S) if stage[k] in _INCUBATING and k not in st["keep"]
                     and k not in st["reject"]]  # fmt: skip
        if st["open"]:
            T = self.lc.max_epochs
            left = self.budget - st["spent"]
            if epoch + max(s.incubate, self.lc.g2_min_epochs + 2) <= T:  # room to score and blend it
                for k in range(S):
                    if stage[k] != int(Stage.DORMANT) or not legal[Op.GERMINATE][k]:
                        continue
                    bp = self._candidate(k, st["tried"][k], left)
                    if bp is not None:
                        st["tried"][k].add(bp)
                        return Op.GERMINATE, k, bp, f"candidate {self.names[bp]} in slot {k}"
            if undecided:
                st["open"] = False  # the round's candidates are in: they incubate
        if not st["open"] and undecided and all(age[k] + 1 >= s.incubate for k in undecided):
            self._choose(st, s, undecided, gain, read["blueprint"][i])
            st["open"] = True
            return (
                Op.WAIT,
                0,
                0,
                "round scored: "
                + ", ".join(
                    f"{r['slot']}={r['blueprint']} {r['score']:.2f} {r['verdict']}" for r in st["scores"][-1]
                ),
            )
        return Op.WAIT, 0, 0, "incubating" if undecided else "nothing to do"

    def _candidate(self, slot: int, tried: set[int], left: float) -> int | None:
        """The largest blueprint not tried in ``slot`` that fits ``left`` parameters (None: none)."""
        costs = self.costs[slot]
        fits = [b for b, name in enumerate(self.names)
                if name != "noop" and b not in tried and 0 < costs[b] <= left]  # fmt: skip
        return max(fits, key=lambda b: (costs[b], -b)) if fits else None

    def _choose(self, st: dict, s: ProbeSettings, undecided: list[int], gain: list[float],
                blueprint: list[int]) -> None:  # fmt: skip
        """Score the round's candidates and keep the best greedily (the module's docstring)."""
        scored = []
        for k in undecided:
            bp = blueprint[k]
            cost = self.costs[k][bp]
            score = gain[k] * self.unit / cost if s.score == "per_param" else gain[k]
            scored.append((score, k, bp, cost))
        scored.sort(key=lambda r: (-r[0], r[1]))
        rows = []
        for score, k, bp, cost in scored:
            fits = cost <= self.budget - st["spent"]
            verdict = "below" if score < s.threshold else "kept" if fits else "over budget"
            if verdict == "kept":
                st["keep"].add(k)
                st["spent"] += cost
            else:
                st["reject"].add(k)
            rows.append({"slot": k, "blueprint": self.names[bp], "gain": gain[k], "score": score,
                         "verdict": verdict})  # fmt: skip
        st["scores"].append(rows)


__all__ = ["PROBE_LIFECYCLE", "SCORES", "ProbeController", "ProbeSettings"]
