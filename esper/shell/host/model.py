"""The per-env model: one host, its optimizer, one optimizer per live seed, and the epoch loops.

``EnvModel`` is what one environment steps once per RL step: :meth:`EnvModel.train_epoch`, then
:meth:`EnvModel.counterfactual_validation` (validation and every live seed's counterfactual in one
loop). The lifecycle (alpha, stage) is decided elsewhere (``esper.core``) and pushed in with
``host.set_slot``.

Numbers come back as tensors on the host's device, not Python floats, so a vectorized env loop can
queue several envs before its one sync point; call ``float()`` / ``.tolist()`` there. Accuracies are
percentages (0-100), contributions percentage points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from esper.core.lifecycle import WHATIF_STATISTICS
from esper.core.spec import Style
from esper.shell.data.batches import Batch
from esper.shell.host.gradinit import SlotRecorder, SlotStats, init_projection
from esper.shell.host.hosts import Host

#: Cap of the parameter-normalized seed/host gradient ratio (as in the reference G2 gate).
GRAD_RATIO_CAP = 10.0
#: Below this host-gradient norm the ratio is reported as 0.
HOST_NORM_FLOOR = 1e-8


def grad_norm(params: Sequence[nn.Parameter], device: torch.device) -> torch.Tensor:
    """L2 norm over the gradients of ``params`` (missing gradients count as 0); 0-d float32."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]).float())


#: A seed parameter tensor whose gradient norm is below this counts as vanishing (the original's seed
#: gradient threshold).
SEED_VANISH_NORM = 1e-7
#: ... above this as exploding (the host trains with plain SGD, no clip: the original's 100 fits).
SEED_EXPLODE_NORM = 100.0
#: What :func:`seed_grad_stats` measures of each slot, in order.
SEED_GRAD_KEYS = ("grad_ratio", "seed_grad_norm", "seed_grad_vanishing", "seed_grad_exploding")


def seed_grad_stats(host: Host, host_params: Sequence[nn.Parameter]) -> dict[str, torch.Tensor]:
    """Each slot's seed gradients from the current ``.grad``s, ``[S]`` float32 each (:data:`SEED_GRAD_KEYS`):

    - ``grad_ratio``: the parameter-normalized seed/host gradient ratio, ``(seed_norm / host_norm) ·
      sqrt(host_params / seed_params)``, 0 when ``host_norm < HOST_NORM_FLOOR``, capped at
      :data:`GRAD_RATIO_CAP`;
    - ``seed_grad_norm``: the L2 norm of the seed's gradients;
    - ``seed_grad_vanishing``, ``seed_grad_exploding``: the share of the seed's parameter tensors whose
      gradient norm is below :data:`SEED_VANISH_NORM`, above :data:`SEED_EXPLODE_NORM`.

    A missing gradient (a seed the step did not reach, e.g. at alpha 0) counts as 0; an empty or
    parameterless slot is 0 everywhere. Both host banks measure with this one function."""
    return seed_grad_stats_from(seed_grad_norms(host, host_params))


@dataclass
class SeedGradNorms:
    """What :func:`seed_grad_stats` reads of the gradients, taken at one moment
    (:func:`seed_grad_norms`): the L2 norm of each present host gradient, each slot's parameter
    tensors' (None: a missing gradient), and the parameter counts. Later in-place changes of the
    ``.grad``s (a clip, an unscale, ``zero_grad``) do not reach it, so :func:`seed_grad_stats_from`
    computes the statistics of that moment whenever it is called (what :class:`esper.shell.user.Grower`
    defers to the epoch's end, from its last batch's norms)."""

    device: torch.device
    host: list[torch.Tensor]
    n_host: int
    seeds: list[list[torch.Tensor | None]]
    n_seeds: list[int]


def seed_grad_norms(
    host: Host,
    host_params: Sequence[nn.Parameter],
    seed_params: Sequence[Sequence[nn.Parameter]] | None = None,
) -> SeedGradNorms:
    """The per-tensor gradient norms :func:`seed_grad_stats_from` reads (``seed_params``: each slot's
    seed parameters, as ``host.seed_parameters(i)`` lists them; default: listed now)."""
    if seed_params is None:
        seed_params = [host.seed_parameters(i) for i in range(host.n_slots)]
    norm = torch.linalg.vector_norm
    return SeedGradNorms(
        device=host_params[0].device,
        host=[norm(p.grad) for p in host_params if p.grad is not None],
        n_host=_n_params(host_params),
        seeds=[[None if p.grad is None else norm(p.grad) for p in params] for params in seed_params],
        n_seeds=[_n_params(params) for params in seed_params],
    )


def seed_grad_stats_from(g: SeedGradNorms) -> dict[str, torch.Tensor]:
    """:func:`seed_grad_stats` from norms taken by :func:`seed_grad_norms`."""
    device = g.device
    host_norm = torch.zeros((), device=device)  # grad_norm's, from the norms
    if g.host:
        host_norm = torch.linalg.vector_norm(torch.stack(g.host).float())
    n_host = g.n_host
    out = {k: torch.zeros(len(g.seeds), device=device) for k in SEED_GRAD_KEYS}
    for i, (seed, n_seed) in enumerate(zip(g.seeds, g.n_seeds, strict=True)):
        if n_seed == 0:
            continue
        zero = torch.zeros((), device=device)
        norms = torch.stack([zero if n is None else n.float() for n in seed])
        seed_norm = torch.linalg.vector_norm(norms)
        ratio = seed_norm / host_norm.clamp_min(HOST_NORM_FLOOR) * math.sqrt(n_host / n_seed)
        out["grad_ratio"][i] = torch.where(host_norm < HOST_NORM_FLOOR, 0.0, ratio.clamp_max(GRAD_RATIO_CAP))
        out["seed_grad_norm"][i] = seed_norm
        out["seed_grad_vanishing"][i] = (norms < SEED_VANISH_NORM).float().mean()
        out["seed_grad_exploding"][i] = (norms > SEED_EXPLODE_NORM).float().mean()
    return out


def _backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None, inputs=None) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward(inputs=inputs)


def _n_params(params: Sequence[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


class EnvModel:
    """One env's host and optimizers. Host: SGD(host_lr, momentum, weight_decay, Nesterov off). Each
    seed: its own SGD(seed_lr, momentum, seed_weight_decay), created at germination and dropped, with
    its state, at prune. Seeds of every live stage (FOSSILIZED included) are stepped."""

    def __init__(
        self,
        host: Host,
        *,
        host_lr: float = 0.01,
        seed_lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        seed_weight_decay: float = 0.0,
    ):
        self.host = host
        self.host_lr, self.seed_lr = host_lr, seed_lr
        self.momentum, self.seed_weight_decay = momentum, seed_weight_decay
        #: Multiplier of every learning rate (the episode's schedule, :meth:`set_lr_scale`).
        self.lr_scale = 1.0
        self._host_params = host.host_parameters()
        self.host_opt = torch.optim.SGD(
            self._host_params, lr=host_lr, momentum=momentum, weight_decay=weight_decay
        )
        #: slot index -> that seed's optimizer (absent for a seed with no parameters, e.g. noop).
        self.seed_opts: dict[int, torch.optim.SGD] = {}
        #: The slot statistics of the last epoch trained with ``record`` (``lifecycle.grad_init``), else None.
        self.slot_stats: SlotStats | None = None

    @property
    def device(self) -> torch.device:
        return self._host_params[0].device

    # ------------------------------------------------------------------------------- seed lifecycle
    def germinate(
        self, slot_index: int, blueprint_index: int, style: Style | int, *, grad_init: float | None = None
    ) -> int:
        """Build a seed into the slot and give it an optimizer; returns its parameter count. With
        ``grad_init`` (``lifecycle.grad_init_scale``) its projection is initialised from the last recorded
        slot statistics at that scale (:func:`esper.shell.host.gradinit.init_projection`; left as built
        where there are none)."""
        params = self.host.germinate(slot_index, blueprint_index, style)
        if grad_init is not None and self.slot_stats is not None:
            init_projection(self.host.slot(slot_index), self.slot_stats.slot_pairs(slot_index), grad_init)
        if params:
            self.seed_opts[slot_index] = torch.optim.SGD(
                params,
                lr=self.seed_lr * self.lr_scale,
                momentum=self.momentum,
                weight_decay=self.seed_weight_decay,
            )
        return _n_params(params)

    def prune(self, slot_index: int) -> None:
        """Remove the slot's seed from the model and drop its optimizer (momentum state included)."""
        self.host.remove_seed(slot_index)
        self.seed_opts.pop(slot_index, None)

    def set_lr_scale(self, scale: float) -> None:
        """Scale every learning rate to ``scale`` times its base (host_lr for the host, seed_lr for
        the seeds); seeds germinated later start at the current scale."""
        if not (math.isfinite(scale) and scale >= 0.0):
            raise ValueError(f"set_lr_scale: scale must be finite and >= 0, got {scale}")
        self.lr_scale = scale
        bases = [(self.host_opt, self.host_lr)] + [(o, self.seed_lr) for o in self.seed_opts.values()]
        for opt, base in bases:
            for group in opt.param_groups:
                group["lr"] = base * scale

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.host_opt, *self.seed_opts.values()]

    # ----------------------------------------------------------------------------------- training
    def train_epoch(
        self,
        batches: Iterable[Batch],
        *,
        autocast_dtype: torch.dtype | None = None,
        scaler: torch.amp.GradScaler | None = None,
        record: int = 0,
    ) -> dict[str, torch.Tensor]:
        """One pass over ``batches`` (train mode): every optimizer steps on every batch.

        Per batch: the host pass (incubating seeds skipped) back-propagates into the host and every
        blended seed; then, if some seed incubates (GERMINATED, TRAINING), a what-if pass with those
        seeds at alpha 1 (:meth:`~esper.shell.host.hosts.Host.incubating`) back-propagates into their
        parameters only. The reported loss and accuracy are the host pass's.

        Mixed precision: ``autocast_dtype`` runs the forward under ``torch.autocast``; ``scaler`` (this
        env's own GradScaler, finding H12: never shared between envs or streams) scales the loss and
        unscales before every optimizer step.

        Returns 0-d tensors ``loss`` (item-weighted mean), ``acc`` (%), ``n_items``, and per slot
        ``[S]`` the seeds' gradients of the last batch (SGD leaves ``.grad`` untouched,
        :func:`seed_grad_stats`): ``grad_ratio`` (``(seed_norm / host_norm) · sqrt(host_params /
        seed_params)``, 0 for an empty or parameterless slot or when ``host_norm < 1e-8``, capped at
        10), ``seed_grad_norm``, ``seed_grad_vanishing`` and ``seed_grad_exploding``.

        ``record`` (``lifecycle.grad_init_batches`` where the slot statistics are on): the host pass of the
        last ``record`` batches leaves each slot's input and output gradient in :attr:`slot_stats`
        (:mod:`esper.shell.host.gradinit`; training itself is unchanged), and the result adds each slot's
        predicted decrease ``grad_gain`` and ``grad_gain_rms`` ``[S]``.
        """
        host, opts = self.host, self.optimizers()
        host.train()
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        n_items = 0
        amp = torch.autocast(self.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
        incubating = host.incubating_slots()
        what_if = [p for i in incubating for p in host.seed_parameters(i)]
        recorder = SlotRecorder(host.slots, SlotStats(host.n_slots, host.family, record)) if record else None
        unscale = (lambda: float(scaler.get_scale())) if scaler is not None else None
        try:
            for batch in batches:
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                with amp, recorder.recording(unscale) if recorder is not None else nullcontext():
                    loss, n_correct, n = host.loss_and_correct(batch)
                _backward(loss, scaler)
                if what_if:  # incubating seeds learn from a pass with them blended in at alpha 1
                    with host.incubating(incubating), amp:
                        seed_loss, _, _ = host.loss_and_correct(batch)
                    _backward(seed_loss, scaler, inputs=what_if)
                if scaler is not None:
                    for opt in opts:
                        scaler.step(opt)
                    scaler.update()
                else:
                    for opt in opts:
                        opt.step()
                loss_sum += loss.detach().float() * n
                correct += n_correct
                n_items += n
        finally:
            if recorder is not None:
                recorder.close()
        gains = {}
        if recorder is not None:
            self.slot_stats = recorder.stats
            gains = self.slot_stats.gain(self.device)
        if n_items == 0:
            raise ValueError("EnvModel.train_epoch: no batches")
        return {
            "loss": loss_sum / n_items,
            "acc": correct.float() * (100.0 / n_items),
            "n_items": torch.tensor(n_items, device=self.device),
            **seed_grad_stats(self.host, self._host_params),
            **gains,
        }

    def grad_ratios(self) -> torch.Tensor:
        """``[S]`` parameter-normalized seed/host gradient ratio from the current ``.grad``s
        (:func:`seed_grad_stats`)."""
        return seed_grad_stats(self.host, self._host_params)["grad_ratio"]

    # --------------------------------------------------------------------------------- validation
    def counterfactual_validation(
        self, batches: Iterable[Batch], live_slots: Sequence[int] | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Validation and counterfactuals in one loop over ``batches`` (eval mode, inference mode).

        ``live_slots``: slot indices, or a bool ``[S]`` mask, of the seeds to measure; ``None`` means
        every slot holding a seed. Every listed slot must hold a seed (else ``ValueError``).
        Returns ``(loss, acc %, contribution [S])`` with ``contribution[i] = acc − acc(slot i at
        alpha 0)`` in percentage points for each listed slot, 0 elsewhere.

        Finding M18: every live seed gets a finite contribution, alpha 0 included. A seed that cannot
        change the forward value (alpha 0, or GERMINATED/TRAINING, whose output is the host's) has a
        forced pass identical to the real one, so its contribution is exactly 0 and the pass is
        skipped (the real pass's result is reused).
        """
        out = self.measure_validation(batches, live_slots)
        return out["val_loss"], out["val_acc"], out["contribution"]

    def measure_validation(
        self, batches: Iterable[Batch], live_slots: Sequence[int] | torch.Tensor | None = None,
        *, whatif: bool = False, whatif_statistics: str = "running",
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """:meth:`counterfactual_validation`'s loop, as ``val_loss``, ``val_acc`` and ``contribution [S]``,
        ``loss_contribution [S]`` (each listed seed's validation loss at alpha 0 minus ``val_loss``, from the
        same counterfactual passes: positive where the seed lowers the loss; 0 elsewhere), and
        ``whatif_gain [S]``: with ``whatif``, for each listed incubating seed (GERMINATED, TRAINING)
        the accuracy with it blended in at alpha 1 minus the host's, in points (what G2 reads under
        ``lifecycle.g2_evidence what_if``); 0 elsewhere, and everywhere without ``whatif``.
        ``whatif_statistics`` (``lifecycle.whatif_statistics``): ``"running"`` reads both with the
        host's running batch-norm statistics (the host's is then ``val_acc``); ``"batch"`` reads both
        with each batch's own (:meth:`~esper.shell.host.hosts.Host.batch_statistics`; a host without
        batch norms reads the same either way)."""
        if whatif_statistics not in WHATIF_STATISTICS:
            raise ValueError(
                f"whatif_statistics must be one of {WHATIF_STATISTICS}, got {whatif_statistics!r}"
            )
        host = self.host
        slots = self._live_slot_indices(live_slots)
        measured = [i for i in slots if host.slot(i).contributes]
        incubating = [i for i in slots if whatif and host.slot(i).incubating]
        by_batch = bool(incubating) and whatif_statistics == "batch" and bool(host.batch_norms())
        was_training = host.training
        host.eval()
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        cf_correct = torch.zeros(len(measured), dtype=torch.int64, device=self.device)
        cf_loss_sum = torch.zeros(len(measured), device=self.device)
        wi_correct = torch.zeros(len(incubating), dtype=torch.int64, device=self.device)
        wi_base = torch.zeros((), dtype=torch.int64, device=self.device)  # the host's, "batch" only
        n_items = 0
        try:
            with torch.inference_mode():
                for batch in batches:
                    # a staged host keeps each slot's input (``inputs``) and a pass that changes only slot i
                    # resumes there; what-if passes on batch statistics resume from the host's pass on them
                    inputs = None
                    if host.staged and (measured or (incubating and not by_batch)):
                        loss, n_correct, n, inputs = host.loss_and_correct_inputs(batch)
                    else:
                        loss, n_correct, n = host.loss_and_correct(batch)
                    loss_sum += loss * n
                    correct += n_correct
                    n_items += n
                    for k, i in enumerate(measured):
                        with host.counterfactual(i):
                            cf_loss, cf_n_correct = self._pass_loss(batch, i, inputs)
                        cf_correct[k] += cf_n_correct
                        cf_loss_sum[k] += cf_loss * n
                    with host.batch_statistics() if by_batch else nullcontext():
                        if by_batch and host.staged:
                            _, n_base, _, inputs = host.loss_and_correct_inputs(batch)
                            wi_base += n_base
                        elif by_batch:
                            wi_base += host.loss_and_correct(batch)[1]
                        for k, i in enumerate(incubating):
                            with host.slot(i).force_alpha(1.0):
                                wi_correct[k] += self._pass(batch, i, inputs)
        finally:
            host.train(was_training)
        if n_items == 0:
            raise ValueError("EnvModel.counterfactual_validation: no batches")
        acc = correct.float() * (100.0 / n_items)
        contribution = torch.zeros(host.n_slots, device=self.device)
        loss_contribution = torch.zeros(host.n_slots, device=self.device)
        val_loss = loss_sum / n_items
        if measured:
            cf_acc = cf_correct.float() * (100.0 / n_items)
            contribution[torch.tensor(measured, device=self.device)] = acc - cf_acc
            loss_contribution[torch.tensor(measured, device=self.device)] = cf_loss_sum / n_items - val_loss
        whatif_gain = torch.zeros(host.n_slots, device=self.device)
        if incubating:
            wi_acc = wi_correct.float() * (100.0 / n_items)
            base = wi_base.float() * (100.0 / n_items) if by_batch else acc
            whatif_gain[torch.tensor(incubating, device=self.device)] = wi_acc - base
        return {"val_loss": val_loss, "val_acc": acc, "contribution": contribution,
                "loss_contribution": loss_contribution, "whatif_gain": whatif_gain}  # fmt: skip

    def _pass(self, batch: Batch, slot_index: int, inputs: list[torch.Tensor] | None) -> torch.Tensor:
        """The correct count of a validation pass that differs from the kept one only at slot
        ``slot_index``: resumed there from its kept input where ``inputs`` holds them, else whole."""
        return self._pass_loss(batch, slot_index, inputs)[1]

    def _pass_loss(
        self, batch: Batch, slot_index: int, inputs: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_pass`'s mean loss and correct count."""
        if inputs is None:
            return self.host.loss_and_correct(batch)[:2]
        return self.host.loss_and_correct_from(slot_index, inputs[slot_index], batch)[:2]

    def validate(self, batches: Iterable[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, acc %)`` with the real alphas (no counterfactual passes)."""
        loss, acc, _ = self.counterfactual_validation(batches, live_slots=())
        return loss, acc

    def counterfactuals(
        self, batches: Iterable[Batch], live_slots: Sequence[int] | torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[S]`` contributions (see :meth:`counterfactual_validation`)."""
        return self.counterfactual_validation(batches, live_slots)[2]

    def _live_slot_indices(self, live_slots: Sequence[int] | torch.Tensor | None) -> list[int]:
        n = self.host.n_slots
        if live_slots is None:
            return [i for i in range(n) if self.host.slot(i).occupied]
        if isinstance(live_slots, torch.Tensor) and live_slots.dtype == torch.bool:
            if live_slots.shape != (n,):
                raise ValueError(f"live_slots mask must have shape [{n}], got {list(live_slots.shape)}")
            indices = live_slots.nonzero().flatten().tolist()
        else:
            indices = [int(i) for i in live_slots]
        for i in indices:
            if not self.host.slot(i).occupied:
                raise ValueError(
                    f"slot {i} ({self.host.slot_names[i]!r}) is listed as live but holds no seed"
                )
        return sorted(set(indices))


__all__ = [
    "GRAD_RATIO_CAP",
    "HOST_NORM_FLOOR",
    "SEED_EXPLODE_NORM",
    "SEED_GRAD_KEYS",
    "SEED_VANISH_NORM",
    "EnvModel",
    "SeedGradNorms",
    "grad_norm",
    "seed_grad_norms",
    "seed_grad_stats",
    "seed_grad_stats_from",
]
