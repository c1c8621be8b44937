"""Growing the user's network inside the user's own training loop: :class:`Grower`.

Where :func:`esper.shell.user.grow.grow` trains fresh hosts itself, a :class:`Grower` leaves the loop,
the optimizer, the schedule, the data and the precision to the user and joins them the way a callback
does, at two points::

    g = Grower(model, optimizer, val=val_loader, controller="heuristic")    # or a run dir, or a plan
    for epoch in range(g.epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            g.after_backward(x, y, loss=loss, output=out)   # incubating seeds learn; training numbers
            torch.nn.utils.clip_grad_norm_(g.host_parameters(), 1.0)   # if the loop clips: the host's
            optimizer.step()
        scheduler.step()
        g.on_epoch_end()                                    # validate, the controller acts, seeds change
    torch.save(model.state_dict(), "grown.pt")              # g.model is model: the grown network

**The same lifecycle as a run.** Each :meth:`Grower.on_epoch_end` is one RL step of an environment with
one env (:class:`esper.shell.env.vecenv.VecEnv`'s, from the same pure functions of
:mod:`esper.core`): the validation with each live seed's counterfactual (and the what-if readings G2
may ask for; :meth:`esper.shell.host.model.EnvModel.measure_validation`), the signals recorded into the
slot state (:func:`esper.core.lifecycle.record_signals`), the history and the observation, the legality
masks, the controller's action, :func:`esper.core.lifecycle.lifecycle_step` (gates, ramps, timeouts,
embargo), and the seed modules built or removed to match. Incubating seeds (GERMINATED, TRAINING) are
skipped by the network's forward and learn in a what-if pass that :meth:`Grower.after_backward` runs
(the seeds at alpha 1 on the detached activation, batch-norm statistics frozen, the loss
back-propagated into their parameters only; :meth:`esper.shell.host.hosts.Host.incubating`); blended
ones compose by style and alpha (:mod:`esper.shell.host.slots`). The governor's rollback is not run:
the loop is the user's.

**The user's optimizer.** A germinated seed's parameters (its gate's included) join the optimizer as
one new parameter group (``optimizer.add_param_group``: any ``torch.optim`` optimizer; the host's groups
and their state untouched), with the options of the optimizer's defaults and ``seed_group``, and the
weight decay of the user's split: a seed's matrices and kernels (2-D and more) take that of the first
group holding such a host parameter, its biases, norm weights and scales (1-D and less) that of the
first group holding one of those (two groups where they differ; ``seed_group``'s ``weight_decay`` sets
both; :meth:`Grower._host_weight_decay`); its learning rate follows the host's first group (times
``seed_lr_scale``), set at every :meth:`Grower.after_backward`, so the seeds ride the user's schedule. A
pruned seed's groups and their state leave the optimizer. Mixed precision: pass the loop's ``scaler``
(a ``torch.amp.GradScaler``: the what-if loss is scaled with it, so ``scaler.step`` unscales the seeds'
gradients like the host's) and ``autocast_dtype`` (the what-if forward runs under that autocast).

**The host, untouched until a seed blends in.** The Grower draws from a random stream of its own
(:class:`_Random`, seeded by ``seed``, kept in :meth:`Grower.state_dict`): its construction, the
what-if pass (dropout masks) and :meth:`Grower.on_epoch_end` (a shuffled validation loader) leave the
global generators the user's loop draws from as they were, and the what-if pass leaves the batch norms'
statistics and step counts as they were; the loop clips :meth:`Grower.host_parameters` (not
``model.parameters()``, which holds the incubating seeds' what-if gradients). With dropout and clipping,
the host's weights are then a loop's without the Grower, number for number, until the first blend.

**The end.** After ``epochs`` epochs (the controller's episode length) the controller is done: each seed
that changes the forward is made permanent at its alpha (FOSSILIZED), the others are removed with their
groups (:func:`esper.shell.user.grown.freeze_slot`), so ``model`` is the grown network, with the outputs
it had; further epochs train it as a plain network. Its ``state_dict`` loads into a fresh network of its
class (:mod:`esper.shell.user.grown`). :meth:`Grower.state_dict` and :meth:`Grower.load_state_dict`
resume a growth (the docstring of the latter says in which order).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from esper.core.lifecycle import (
    EVENT_KINDS,
    init_slots,
    lifecycle_step,
    record_signals,
)
from esper.core.observation import controller_inputs, init_history, obs_dim, update_history
from esper.core.spec import HEADS, SLOT_FIELDS, ActionSpec, Stage
from esper.shell.common.fields import with_overrides
from esper.shell.common.seeding import derive_seed
from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.step import StepInput
from esper.shell.env.tasks import GROW_ALL_BLUEPRINT
from esper.shell.eval.controllers import PLAN_PREFIX, PPO_CONTROLLERS, make_controller
from esper.shell.eval.episodes import check_names
from esper.shell.eval.fits import check_controller_fits
from esper.shell.eval.search import is_searched
from esper.shell.host.bank import seeded
from esper.shell.host.blueprints import BUILTIN_BLUEPRINTS, param_count
from esper.shell.host.descriptors import describe_host
from esper.shell.host.model import SEED_GRAD_KEYS, EnvModel, seed_grad_norms, seed_grad_stats_from
from esper.shell.host.registry import seed_misfit
from esper.shell.host.slots import SeedSlot, attach_seeds
from esper.shell.user.grow import BASE_PRESET, load_run
from esper.shell.user.grown import describe_seed, freeze_slot
from esper.shell.user.host import Loss, Metric, UserHost

#: Examples of the first validation batch the host runs once to find and check its slots.
PROBE_EXAMPLES = 2
#: model -> the Grower that grows it: one at a time (:class:`Grower` refuses a second).
_GROWING: weakref.WeakKeyDictionary[nn.Module, weakref.ref] = weakref.WeakKeyDictionary()


class LoopHost(UserHost):
    """:class:`UserHost` whose slots stay in the user's network (its ``state_dict`` holds the seeds):
    ``slots`` is a plain list, and :meth:`host_parameters` is the network's parameters but the slots'."""

    def __init__(self, model: nn.Module, **kwargs: Any):
        super().__init__(model, **kwargs)
        slots = list(self.slots)
        del self._modules["slots"]
        self.slots = slots  # type: ignore[assignment]  # the network owns them; the host lists them
        for slot in slots:
            parent, _, leaf = self.slot_paths[slot.name].rpartition(".")
            model.get_submodule(parent)._modules[leaf] = slot

    def host_parameters(self) -> list[nn.Parameter]:
        seeds = {id(p) for s in self.slots for p in s.parameters()}
        return [p for p in self.model.parameters() if id(p) not in seeds]


@dataclass
class _EnvView:
    """What :func:`esper.shell.eval.controllers.make_controller` reads of an env."""

    slot_names: tuple[str, ...]
    blueprint_names: tuple[str, ...]
    spec: ActionSpec
    germination_cost: torch.Tensor
    obs_dim: int
    enabled: tuple[bool, ...]
    task: Any


class _Random:
    """The Grower's own random stream, on the CPU and, on CUDA, the model's device: what its passes
    draw (the what-if pass's dropout masks, a validation loader's shuffle) comes from it, never from the
    global generators the user's loop draws from, so the host draws the same masks and batches as it
    would without the Grower. Inside ``with stream():`` the global generators hold the stream's state;
    after it they are the user's again, and the stream has moved on (:meth:`Grower.state_dict` keeps
    it)."""

    def __init__(self, device: torch.device, seed: int):
        self.cuda = device if device.type == "cuda" else None
        with seeded(device, seed):
            self.state = self._get()

    @staticmethod
    def fork(device: torch.device) -> AbstractContextManager:
        """The global generators (CPU, and ``device``'s on CUDA) restored after the block."""
        return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])

    def _get(self) -> dict[str, torch.Tensor]:
        out = {"cpu": torch.get_rng_state()}
        if self.cuda is not None:
            out["cuda"] = torch.cuda.get_rng_state(self.cuda)
        return out

    def _set(self, state: Mapping[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if self.cuda is not None and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.cuda)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self.fork(self.cuda or torch.device("cpu")):
            self._set(self.state)
            yield
            self.state = self._get()


def _plan_name(plan: Mapping[str, str]) -> str:
    return PLAN_PREFIX + "+".join(f"{slot}={bp}" for slot, bp in plan.items())


def _batches(val: Any) -> Iterable:
    """``val`` as an iterable of ``(x, y)`` batches: a DataLoader (or any re-iterable of batches), or one
    ``(x, y)`` pair of tensors (one batch)."""
    if isinstance(val, (tuple, list)) and len(val) == 2 and all(isinstance(t, torch.Tensor) for t in val):
        return [tuple(val)]
    if isinstance(val, Iterator) or not isinstance(val, Iterable):
        raise ValueError(
            "Grower: val must be a DataLoader (or a list) of (x, y) batches, or one (x, y) pair of tensors; "
            f"got {type(val).__name__} (an iterator is read once: give something it can iterate every epoch)"
        )
    return val


def _check_catalogue(host: LoopHost) -> None:
    """Every blueprint of the host's catalogue builds and runs at every width its slots have (a
    blueprint is checked at registration on one width only); a one-line ValueError names the first that
    does not, the slot and the width. An error, not a blueprint left out of that slot: the catalogue is
    what the controller's blueprint head and masks are sized by, one for every slot."""
    widths: set[int] = set()
    for slot in host.slots:
        if slot.width in widths:
            continue
        widths.add(slot.width)
        for name in host.blueprint_names:
            _, why = seed_misfit(host.family, lambda w, name=name: host.build_seed(name, w), slot.width)
            if why is None:
                continue
            family, registered = host.family, name not in BUILTIN_BLUEPRINTS[host.family]
            fix = "give the slot another width"
            if registered:
                fix = (f"make its builder fit every slot width, or unregister_blueprint({family!r}, "
                       f"{name!r}) before building the Grower")  # fmt: skip
            raise ValueError(
                f"Grower: {'registered ' if registered else ''}blueprint {name!r} ({family}) does not fit "
                f"slot {slot.name!r} of width {slot.width}: {why}; {fix}"
            )


class Grower:
    """Grows ``model`` while the user's loop trains it with ``optimizer`` (the module docstring).

    ``val``: the validation data the controller sees (a DataLoader or list of ``(x, y)`` batches, or one
    ``(x, y)`` pair), read at every :meth:`on_epoch_end`, with a pass per live seed (counterfactuals).
    ``controller``: ``"heuristic"`` (default), any baseline or fixed plan of evaluation
    (``"grow:grow1=conv_light"``, ``"grow_all"``, ``"static"``, ``"random"``), a plan as a dict
    ``{slot: blueprint}``, or a run directory of ``python -m esper.shell.run`` (a ``Path``, or a string
    naming a directory): its trained controller, ``readout`` ``"ppo"`` (sampled, seeded) or
    ``"ppo_greedy"``; a flat-policy run is checked to fit the network
    (:func:`esper.shell.eval.fits.check_controller_fits`). The lifecycle settings are the run's, else the
    ``default`` preset's; ``epochs``: the episode length the controller plans for (default: theirs,
    ``lifecycle.max_epochs``); ``overrides``: ``section.field`` values on top.
    ``example_input``: a small batch the host probes the slots with (default: the first validation
    batch's first two examples); ``family``, ``loss``, ``metric``: as
    :class:`~esper.shell.user.host.UserHost` takes them (defaults: inferred, cross-entropy, top-1).
    ``scaler``, ``autocast_dtype``: the loop's mixed precision; ``seed``: the seeds' initial weights and
    a sampled controller's draws; ``seed_lr_scale``, ``seed_group``: the seeds' parameter groups.

    One-line ValueErrors: a network without slots or with slots that hold seeds already, a blueprint of
    the catalogue that does not build or run at a slot's width (it, the slot and the width named), a
    controller that is not known or does not fit, ``val`` that cannot be read every epoch, a model that
    another Grower (not finished) grows, a slot whose seed is not the one this Grower grows (a network
    state from another checkpoint than the Grower's). A warning, once, when an epoch ends without
    :meth:`after_backward` while seeds live (they would not learn)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        val: Any,
        controller: str | Path | Mapping[str, str] = "heuristic",
        readout: str = "ppo",
        epochs: int | None = None,
        example_input: torch.Tensor | None = None,
        family: str | None = None,
        loss: Loss | None = None,
        metric: Metric | None = None,
        scaler: torch.amp.GradScaler | None = None,
        autocast_dtype: torch.dtype | None = None,
        seed: int = 0,
        seed_lr_scale: float = 1.0,
        seed_group: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Grower: model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"Grower: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        other = _GROWING.get(model)
        if other is not None and other() is not None and not other().finished:
            kind = type(model).__name__
            raise ValueError(
                f"Grower: this {kind} is grown by another Grower (built before, not finished); one Grower "
                f"per model: keep using that one, or build a fresh {kind} (and optimizer) for this one"
            )
        held = [f"{p} ({m.blueprint})" for p, m in model.named_modules()
                if isinstance(m, SeedSlot) and m.occupied]  # fmt: skip
        if held:
            raise ValueError(
                f"Grower: slot(s) {', '.join(held)} hold seeds already (a grown network); a Grower starts "
                "from empty slots: build a fresh network, or resume with Grower.load_state_dict"
            )
        self.device = next(model.parameters()).device
        with _Random.fork(self.device):  # building it draws nothing from the user's generators
            self.optimizer, self.scaler, self.autocast_dtype = optimizer, scaler, autocast_dtype
            self.seed, self.seed_lr_scale = int(seed), float(seed_lr_scale)
            self.seed_group = dict(seed_group or {})
            self.val = _batches(val)
            if example_input is None:
                first = next(iter(self.val), None)
                if first is None:
                    raise ValueError("Grower: val has no batches")
                example_input = first[0][:PROBE_EXAMPLES]
            self.host = LoopHost(model, example_input=example_input.to(self.device), family=family, loss=loss,
                                 metric=metric)  # fmt: skip
            name, cfg, checkpoint, run = self._settings(controller, readout, epochs, overrides)
            self.cfg, self.lifecycle = cfg, cfg.lifecycle
            host, S = self.host, self.host.n_slots
            attach_seeds(host.slots, self.lifecycle.attach_at)
            names = host.blueprint_names
            self.spec = ActionSpec(S, len(names), tuple(i for i, b in enumerate(names) if b == "noop"))
            _check_catalogue(host)
            with torch.random.fork_rng(devices=[]):  # germination costs build every seed once
                cost = host.germination_cost()
            grow_all = GROW_ALL_BLUEPRINT[host.family]
            grow_all_params = sum(param_count(host.build_seed(grow_all, s.width)) for s in host.slots)
            # a controller that reads a budget (env.budget_shares) grows under its largest training share here
            # (override env.budget_shares for another)
            shares = cfg.env.budget_shares
            budget = max(shares) * grow_all_params if shares else None
            self.layout = describe_host(host, cost, grow_all_params, budget_params=budget)
            task = SimpleNamespace(grow_all=grow_all, make_host=lambda: host)
            raw_dim = obs_dim(S, len(names), seed_grads=self.lifecycle.seed_grad_features)
            view = _EnvView(host.slot_names, names, self.spec, cost, raw_dim, (True,) * S, task)
            if name in PPO_CONTROLLERS:
                check_controller_fits(cfg, checkpoint, task, run=run)
            with torch.random.fork_rng(devices=[]):
                self.controller = make_controller(name, cfg, view, checkpoint=checkpoint, seed=self.seed)
            self.controller.begin(1)
            self.controller.seed_envs([self.seed])
            #: The controller's name (evaluation's: ``heuristic``, ``grow:...``, ``ppo``, ...).
            self.controller_name = name
            self._measurer = EnvModel(host)  # its validation loop; its own optimizer is never stepped
            self._host_params = host.host_parameters()
            self._weight_decay = self._host_weight_decay()
            self.slots = init_slots(1, (True,) * S)
            self.history = init_history(1)
            self.epoch = 0
            #: Whether the controller is done (after :attr:`epochs`): the seeds are permanent or gone.
            self.finished = False
            #: slot index -> that seed's parameter groups in the optimizer (:meth:`_add_group`).
            self.groups: dict[int, list[dict]] = {}
            #: Every lifecycle event so far: ``{"epoch", "slot", "kind", "blueprint", ...}``.
            self.events: list[dict] = []
            #: slot index -> the blueprint of the seed the Grower put there (None: none).
            self._seeds: list[str | None] = [None] * S
            self._warned = False  # a forgotten after_backward is said once
            self._reset_epoch()
            #: The Grower's own random stream (:class:`_Random`): what its passes draw.
            self._random = _Random(self.device, derive_seed("grower", self.seed))
            _GROWING[model] = weakref.ref(self)

    # ------------------------------------------------------------------------------------------ setup
    def _host_weight_decay(self) -> dict[bool, float] | None:
        """The weight decay a seed's parameters take, by kind (True: matrices and kernels, 2-D and more;
        False: biases, norm weights, scales, 1-D and less): that of the optimizer's first group holding
        a host parameter of that kind (the first group's where none does); ``seed_group``'s
        ``weight_decay`` for both where it gives one. None: the optimizer has no weight decay."""
        if "weight_decay" in self.seed_group:
            wd = self.seed_group["weight_decay"]
            return {True: wd, False: wd}
        groups = self.optimizer.param_groups
        if "weight_decay" not in groups[0]:
            return None
        host = {id(p): p.dim() >= 2 for p in self._host_params}  # parameter -> its kind
        kinds = [{host[id(p)] for p in g["params"] if id(p) in host} for g in groups]
        return {kind: next((g for g, k in zip(groups, kinds) if kind in k), groups[0])["weight_decay"]
                for kind in (True, False)}  # fmt: skip

    def _settings(self, controller, readout: str, epochs: int | None, overrides) -> tuple:
        """``(controller name, settings, checkpoint or None, the run's name for messages)``."""
        checkpoint, run = None, "the run"
        if isinstance(controller, Mapping):
            controller = _plan_name(controller)
        if isinstance(controller, Path) or (isinstance(controller, str) and Path(controller).is_dir()):
            if readout not in PPO_CONTROLLERS:
                raise ValueError(
                    f"Grower: readout must be one of {', '.join(PPO_CONTROLLERS)}, got {readout!r}"
                )
            cfg, checkpoint = load_run(controller)
            name, run = readout, f"run {controller}"
        elif isinstance(controller, str):
            check_names([controller])
            if controller in PPO_CONTROLLERS:
                raise ValueError(f"Grower: {controller} is a run's controller: pass controller=RUN_DIR")
            if is_searched(controller):
                raise ValueError(f"Grower: {controller} searches on fresh hosts first; use grow() for it")
            cfg, name = preset(BASE_PRESET), controller
        else:
            raise ValueError(
                f"Grower: controller must be a name, a plan dict or a run directory, got {controller!r}"
            )
        changes: dict[str, Any] = {
            "env.device": "cpu",
            "env.devices": (),
            "env.n_envs": 1,
            "ppo.n_minibatches": 1,
            "ppo.host_group": 1,
        }
        if epochs is not None:
            changes["lifecycle.max_epochs"] = int(epochs)
        cfg: RunConfig = with_overrides(cfg, {**changes, **(overrides or {})})
        if cfg.lifecycle.grad_stats:
            raise ValueError(
                "Grower: lifecycle.grad_init and lifecycle.grad_gain_features read slot statistics that only "
                "the env's host training keeps (esper.shell.host.gradinit); the Grower runs without them"
            )
        return name, cfg, checkpoint, run

    @property
    def model(self) -> nn.Module:
        """The user's network: the grown network, seeds in its slots."""
        return self.host.model

    @property
    def epochs(self) -> int:
        """The epochs the controller plans for (``lifecycle.max_epochs``)."""
        return self.lifecycle.max_epochs

    def host_parameters(self) -> list[nn.Parameter]:
        """The network's own parameters, no seed's or gate's: what to clip
        (``clip_grad_norm_(g.host_parameters(), ...)``). ``model.parameters()`` holds the seeds' too, an
        incubating seed's among them, whose what-if gradients would change the host's clipping."""
        return list(self._host_params)

    @property
    def grown(self) -> dict[str, str]:
        """``{slot: blueprint}`` of the seeds that change the forward now."""
        return {s.name: s.blueprint for s in self.host.slots if s.contributes}

    # ------------------------------------------------------------------------------------ the loop
    def after_backward(self, x: torch.Tensor, y: torch.Tensor, *, loss: torch.Tensor | None = None,
                       output: torch.Tensor | None = None) -> None:  # fmt: skip
        """Call after the loop's ``backward`` of batch ``(x, y)`` and before ``optimizer.step()``: the
        incubating seeds' what-if pass (their gradients join the ones the host's backward left), the
        seeds' learning rates set from the host's, and the seeds' gradient statistics. ``loss`` (the
        batch's mean loss) and ``output`` (the network's output) make the training loss and accuracy the
        controller reads; without them it reads the validation ones in their place."""
        if self.finished:
            return
        host = self.host
        if not self._calls:
            self._check_seeds()
            # the seeds' parameters, listed once an epoch: seeds change only at an epoch's end (and a
            # network state loaded in between is refused there, by _check_seeds)
            self._seed_params = [host.seed_parameters(i) for i in range(host.n_slots)]
        self._calls += 1
        host_lr = self.optimizer.param_groups[0]["lr"]
        for groups in self.groups.values():
            for group in groups:
                group["lr"] = host_lr * self.seed_lr_scale
        n = y.numel()
        if loss is not None:  # kept as tensors: no host sync per batch
            self._train_loss = self._train_loss + loss.detach().float() * n
            self._train_n += n
        if output is not None:
            hits = self.host.metric(output.detach(), y)
            self._train_correct = self._train_correct + hits.sum()
            self._train_items += hits.numel()
        incubating = host.incubating_slots()
        if incubating:
            self._whatif(x, y, incubating)
        if any(s.occupied for s in host.slots):  # the statistics of the epoch's last batch: its norms
            # now (a clip or an unscale after this call changes the .grads), the arithmetic at the end
            self._grad_norms = seed_grad_norms(host, self._host_params, self._seed_params)

    def _whatif(self, x: torch.Tensor, y: torch.Tensor, incubating: list[int]) -> None:
        """The incubating seeds' what-if pass on batch ``(x, y)``: forward at alpha 1 on the detached
        activations, the loss back-propagated into their parameters only (the seeds' own work)."""
        host = self.host
        params = [p for i in incubating for p in self._seed_params[i]]
        dtype = self.autocast_dtype
        amp = torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)
        with self._random(), host.incubating(incubating, keep_counts=True), amp:
            seed_loss = host.loss(host.model(x), y)
        (self.scaler.scale(seed_loss) if self.scaler is not None else seed_loss).backward(inputs=params)

    def on_epoch_end(self) -> dict[str, Any]:
        """Call once per epoch, after its training: validate (with every live seed's counterfactual), let
        the controller act, step the lifecycle and build or remove seed modules to match. Returns the
        epoch's ``val_loss``, ``val_acc`` (%), ``events`` (this step's lifecycle events), ``grown``
        and ``finished``. After :attr:`epochs` epochs it only validates."""
        if not self.finished:
            self._check_seeds()
            self._warn_without_after_backward()
        with self._random():
            return self._epoch_end()

    def _epoch_end(self) -> dict[str, Any]:
        measured = self._validate()
        if self.finished:
            return {"epoch": self.epoch, **measured, "events": [], "grown": self.grown, "finished": True}
        self.epoch += 1
        signals = self._signals(measured)
        lc = self.lifecycle
        self.slots = record_signals(self.slots, signals, lc)
        self.history = update_history(self.history, signals)
        raw, legal = controller_inputs(signals, self.history, self.slots, self.spec, lc)
        out = self.controller.act(StepInput(raw, legal, self.slots, signals, self.history, self.layout))
        action = TensorDict({h: out[h, "action"].cpu() for h in HEADS}, batch_size=[1])
        n_blueprints = self.spec.n_blueprints
        new_slots, events = lifecycle_step(self.slots, action, signals, lc, n_blueprints=n_blueprints)
        happened = self._apply(new_slots, events)
        if self.epoch >= lc.max_epochs:
            self._finish()
        self._reset_epoch()
        return {"epoch": self.epoch, **measured, "events": happened, "grown": self.grown,
                "finished": self.finished}  # fmt: skip

    # ------------------------------------------------------------------------------------- measuring
    def _check_seeds(self) -> None:
        """Each slot holds the seed the Grower put there (or none), trained by its parameter group: a
        one-line ValueError where the network's state brought another (loaded from another checkpoint
        than the Grower's state, or after it)."""
        for s, slot in enumerate(self.host.slots):
            tracked = {id(p) for group in self.groups.get(s, []) for p in group["params"]}
            if slot.blueprint == self._seeds[s] and tracked == {id(p) for p in slot.seed_parameters()}:
                continue
            held = f"a {slot.blueprint} seed" if slot.occupied else "no seed"
            known = f"a {self._seeds[s]} seed" if self._seeds[s] else "none"
            raise ValueError(
                f"Grower: slot {slot.name!r} holds {held} that is not the one the Grower grows ({known}, in "
                "its optimizer group): the network's state was loaded from another checkpoint than "
                "Grower.load_state_dict's; load both from one checkpoint"
            )

    def _warn_without_after_backward(self) -> None:
        live = [s.name for s in self.host.slots if s.occupied]
        if live and not self._calls and not self._warned:
            self._warned = True
            warnings.warn(
                f"Grower: an epoch ended without g.after_backward while slot(s) {', '.join(live)} held "
                "seeds: incubating seeds learn only there (and every seed takes its learning rate there); "
                "call g.after_backward(x, y, loss=loss, output=out) after each loss.backward()",
                stacklevel=3,
            )

    def _reset_epoch(self) -> None:
        self._calls = 0  # after_backward calls this epoch
        self._train_loss, self._train_n = torch.zeros(()), 0
        self._train_correct, self._train_items = torch.zeros((), dtype=torch.int64), 0
        self._grad_norms = None  # the last after_backward's gradient norms (with seeds live)

    def _val_batches(self) -> Iterator:
        for batch in self.val:
            yield tuple(t.to(self.device, non_blocking=True) for t in batch)

    def _validate(self) -> dict[str, Any]:
        lc = self.lifecycle
        modes = [(m, m.training) for m in self.host.modules()]  # the user's, module by module
        try:
            out = self._measurer.measure_validation(
                self._val_batches(), whatif=lc.g2_evidence != "host", whatif_statistics=lc.whatif_statistics
            )
        finally:
            for m, training in modes:
                m.training = training
        self._measured = {k: v.detach().float().cpu() for k, v in out.items()}
        return {"val_loss": float(self._measured["val_loss"]), "val_acc": float(self._measured["val_acc"])}

    def _signals(self, measured: dict[str, float]) -> TensorDict:
        m, S = self._measured, self.host.n_slots
        train_loss = float(self._train_loss) / self._train_n if self._train_n else measured["val_loss"]
        items = self._train_items
        train_acc = 100.0 * float(self._train_correct) / items if items else measured["val_acc"]
        seeds = [s.seed_parameters() for s in self.host.slots]
        if self._grad_norms is None:
            grads = {k: torch.zeros(S) for k in SEED_GRAD_KEYS}
        else:
            grads = seed_grad_stats_from(self._grad_norms)
        one = lambda v: torch.tensor([float(v)])
        return TensorDict(
            {
                "epoch": torch.tensor([self.epoch], dtype=torch.int64),
                "train_loss": one(train_loss), "train_acc": one(train_acc),
                "val_loss": m["val_loss"].reshape(1), "val_acc": m["val_acc"].reshape(1),
                "host_params": one(sum(p.numel() for p in self._host_params)),
                "slots": TensorDict(
                    {
                        "contribution": m["contribution"].reshape(1, S),
                        "loss_contribution": m["loss_contribution"].reshape(1, S),
                        "whatif_gain": m["whatif_gain"].reshape(1, S),
                        **{k: v.detach().float().cpu().reshape(1, S) for k, v in grads.items()},
                        "seed_params": torch.tensor([[float(sum(p.numel() for p in ps)) for ps in seeds]]),
                        "alpha": torch.tensor([[s.alpha for s in self.host.slots]], dtype=torch.float32),
                    },
                    batch_size=[1, S],
                ),
            },
            batch_size=[1],
        )  # fmt: skip

    # ---------------------------------------------------------------------------------- the seeds
    def _apply(self, slots: TensorDict, events: TensorDict) -> list[dict]:
        """Make the network match the stepped slot state (as :meth:`VecEnv._apply` does for a host):
        remove pruned seeds and their groups, build germinated ones and add theirs, push alpha and
        stage. Returns the events that happened."""
        fired = {k: events[k][0].tolist() for k in EVENT_KINDS}
        new = {k: slots[k][0].tolist() for k in ("stage", "blueprint", "style", "alpha")}
        old_blueprint = self.slots["blueprint"][0].tolist()
        names = self.host.blueprint_names
        happened = []
        for s, slot in enumerate(self.host.slots):
            if fired["removed"][s]:
                self._remove(s)
            if fired["germinated"][s]:
                self._germinate(s, int(new["blueprint"][s]), int(new["style"][s]))
            slot.set(alpha=min(max(new["alpha"][s], 0.0), 1.0), stage=int(new["stage"][s]))
            for kind in (k for k in EVENT_KINDS if fired[k][s]):
                bp = new["blueprint"][s] if kind == "germinated" else old_blueprint[s]
                stage = Stage(int(new["stage"][s])).name
                happened.append({"epoch": self.epoch, "slot": slot.name, "kind": kind, "stage": stage,
                                 "blueprint": names[int(bp)]})  # fmt: skip
        self.slots = slots
        self.events += happened
        return happened

    def _germinate(self, s: int, blueprint: int, style: int) -> None:
        with seeded(self.device, derive_seed("build", self.seed, self.epoch, s)):
            params = self.host.germinate(s, blueprint, style)
        self._seeds[s] = self.host.slots[s].blueprint
        self._add_group(s, params)

    def _add_group(self, s: int, params: list[nn.Parameter]) -> None:
        if not params:
            return
        host = self.optimizer.param_groups[0]
        options = {**self.seed_group, "lr": host["lr"] * self.seed_lr_scale}
        if "initial_lr" in host:  # an LR scheduler's bookkeeping
            options["initial_lr"] = host["initial_lr"] * self.seed_lr_scale
        decay = self._weight_decay
        parts = [(params, {})]
        if decay is not None and decay[True] != decay[False]:  # the user's split: matrices, the rest
            parts = [([p for p in params if (p.dim() >= 2) is kind], {"weight_decay": decay[kind]})
                     for kind in (True, False)]  # fmt: skip
        elif decay is not None:
            parts = [(params, {"weight_decay": decay[True]})]
        groups = []
        for part, extra in parts:
            if part:
                self.optimizer.add_param_group({"params": part, **extra, **options})
                groups.append(self.optimizer.param_groups[-1])
        self.groups[s] = groups

    def _remove(self, s: int) -> None:
        groups = self.groups.pop(s, [])
        if groups:
            mine = {id(g) for g in groups}
            self.optimizer.param_groups[:] = [g for g in self.optimizer.param_groups if id(g) not in mine]
            for p in (p for g in groups for p in g["params"]):
                self.optimizer.state.pop(p, None)
        self.host.remove_seed(s)
        self._seeds[s] = None

    def _finish(self) -> None:
        """The controller is done: each seed that changes the forward becomes permanent at its alpha,
        the others leave (with their groups)."""
        for s, slot in enumerate(self.host.slots):
            if slot.occupied and not slot.contributes:
                self._remove(s)
            freeze_slot(slot)
        self.finished = True

    # ---------------------------------------------------------------------------------- resuming
    def state_dict(self) -> dict[str, Any]:
        """What resumes the growth at an epoch's end (tensors, numbers and strings only: a checkpoint
        loads it with ``weights_only=True``): the epoch, the slot state and history, each slot's seed
        (its description; the weights are in the network's state dict), the order of the seeds'
        parameter groups, the lifecycle events so far (:attr:`events`), and the controller's own state
        (its recurrent state, a heuristic's counters, a sampler's generator)."""
        return {
            "epoch": self.epoch,
            "finished": self.finished,
            "controller_name": self.controller_name,
            "slots": self.slots.to_dict(),
            "history": self.history.to_dict(),
            "seeds": [describe_seed(s) for s in self.host.slots],
            "groups": list(self.groups),
            "events": [dict(e) for e in self.events],
            "controller": _controller_state(self.controller),
            "random": {k: v.clone() for k, v in self._random.state.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, on a Grower built as the first one was (a fresh network of
        the same class, an optimizer over its parameters, the same controller). Call it before the
        optimizer's ``load_state_dict`` (it adds the seeds' parameter groups that state counts), before
        or after the network's (the seeds are rebuilt from their description; the network's state dict
        then loads their weights). The two states must come from one checkpoint: a slot that holds a
        seed the state does not describe (the network's state loaded before) is refused here, one that
        comes to hold another seed (loaded after) at the next :meth:`after_backward` or
        :meth:`on_epoch_end`; its seed would not be in the optimizer."""
        if state["controller_name"] != self.controller_name:
            raise ValueError(
                f"Grower.load_state_dict: the state is of a growth by {state['controller_name']}, this "
                f"Grower's controller is {self.controller_name}"
            )
        if self.groups or self.epoch:
            raise ValueError("Grower.load_state_dict: load into a fresh Grower (no epoch done yet)")
        for slot, seed in zip(self.host.slots, state["seeds"], strict=True):
            held = (slot.blueprint, int(slot.style))
            if slot.occupied and (not seed or held != (seed["blueprint"], seed["style"])):
                known = f"a {seed['blueprint']} seed" if seed else "none"
                raise ValueError(
                    f"Grower.load_state_dict: slot {slot.name!r} holds a {slot.blueprint} seed (the "
                    f"network's loaded state) where the Grower's state has {known}: the two states come "
                    "from different checkpoints; load both from one"
                )
        for s, (slot, seed) in enumerate(zip(self.host.slots, state["seeds"], strict=True)):
            if not seed:
                continue
            if not slot.occupied:
                with seeded(self.device, derive_seed("build", self.seed, "resume", s)):
                    module = self.host.build_seed(seed["blueprint"], slot.width)
                    slot.install(module, seed["style"], seed["blueprint"])
            slot.to(self.device)
            slot.set(alpha=seed["alpha"], stage=seed["stage"])
            self._seeds[s] = seed["blueprint"]
        for s in state["groups"]:
            self._add_group(s, self.host.seed_parameters(s))
        S = self.host.n_slots
        self.slots = TensorDict(state["slots"], batch_size=[1, S])
        for k, (dtype, _) in SLOT_FIELDS.items():  # a field added since the state was saved starts at 0
            if k not in self.slots.keys():
                self.slots[k] = torch.zeros(1, S, dtype=dtype)
        self.history = TensorDict(state["history"], batch_size=[1])
        self.epoch, self.finished = int(state["epoch"]), bool(state["finished"])
        self.events = [dict(e) for e in state.get("events", [])]
        if "random" in state:
            self._random.state = {k: v.clone() for k, v in state["random"].items()}
        _load_controller_state(self.controller, state["controller"])


def _controller_state(ctl: Any) -> dict[str, Any]:
    """A controller's own state: a PPO controller's recurrent state, a heuristic's per-env counters, a
    sampler's generator (the baselines without state: nothing)."""
    out: dict[str, Any] = {}
    if isinstance(getattr(ctl, "state", None), tuple):
        out["recurrent"] = [t.detach().cpu().clone() for t in ctl.state]
    if hasattr(ctl, "env_state"):
        out["env_state"] = copy.deepcopy(ctl.env_state)
    if isinstance(getattr(ctl, "generator", None), torch.Generator):
        out["generator"] = ctl.generator.get_state()
    if getattr(ctl, "env_generators", None):
        out["env_generators"] = [g.get_state() for g in ctl.env_generators]
    return out


def _load_controller_state(ctl: Any, state: Mapping[str, Any]) -> None:
    if "recurrent" in state:
        ctl.state = tuple(t.to(ctl.device) for t in state["recurrent"])
    if "env_state" in state:
        ctl.env_state = copy.deepcopy(state["env_state"])
    if "generator" in state:
        ctl.generator.set_state(state["generator"])
    for g, s in zip(getattr(ctl, "env_generators", []), state.get("env_generators", [])):
        g.set_state(s)


__all__ = ["Grower", "LoopHost"]
