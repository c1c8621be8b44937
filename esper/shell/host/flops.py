"""The FLOPs an episode spends: each pass counted once per architecture and batch shape by PyTorch's own
counter (:class:`torch.utils.flop_counter.FlopCounterMode`), then an epoch's are its batches times each
batch's count.

Host epochs do not see a network's size: a grown network and the same network born big spend as many host
epochs and not as many FLOPs. An env's epoch spends, per batch, counted for one env's host and seeds as if
it ran alone (the batched host step stacks several envs' hosts; each is counted as its own host):

- ``train``: the host pass on a training batch, forward and backward, with every seed that acts in it
  (blending, holding, fossilized at alpha above 0; a seed reading the host's activation detached takes no
  gradient into it, one reading it live does);
- ``whatif``: each incubating seed's what-if pass (:meth:`~esper.shell.host.hosts.Host.incubating`): on a
  training batch, the pass from the first incubating slot on, forward and backward into the incubating
  seeds (what the seed's incubation costs; the host pass before that slot is the host's, not run again;
  seeds without parameters train nothing and run no pass, as on both host paths); on a validation batch,
  where the what-if gain is read, each incubating seed's pass at alpha 1 from its slot (and the host's pass
  on the batch's own statistics under ``whatif_statistics batch``);
- ``validation``: the validation pass, forward, and each live seed's counterfactual at alpha 0 (from its
  slot on); a rollback's revalidation and the final hosts' validation are validation too. The held-out test
  split read at the end is the evaluation's, not the episode's, and is not counted.

A pass resumed at a slot is counted from there, as the staged hosts run it (a host that is not staged runs
every pass whole, and is counted so). Counting runs once per key of :class:`FlopCounter`'s cache, on a copy
of the host on its own device fed zeros, with the generators forked (the host, its optimizer state, the
generators and so the episode's numbers are as without it): one batch's step, once per architecture. Where
that fails (out of memory, say) it runs on the meta device, where no kernel runs (the same counts; on a
small host each op costs more there than the real one, the reason it is not the first choice).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from weakref import WeakKeyDictionary

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from esper.shell.data.batches import BatchShape
from esper.shell.host.hosts import Host

#: Where a pass is counted: tensors of shapes and dtypes only.
META = torch.device("meta")
#: What an episode's FLOPs are split into (the module docstring), as its summary names them: ``KIND_flops``.
FLOP_KINDS = ("train", "validation", "whatif")


def count_flops(run: Callable[[], object]) -> int:
    """The FLOPs of what ``run()`` runs (forward passes, and backward passes run inside it), as
    :class:`~torch.utils.flop_counter.FlopCounterMode` counts them: matrix products and convolutions, two
    FLOPs a multiply-add (a bias, a norm or an activation counts nothing); a convolution's backward counts
    its forward once for the weight's gradient and once for the input's, where the input needs one."""
    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


def seed_roles(host: Host, phase: str) -> tuple[tuple[int, str | None, bool, str], ...]:
    """The part of ``host``'s compute graph its seeds decide in ``phase`` (``"train"`` or ``"eval"``): per
    slot whose seed runs in some pass of it, the slot's index, the blueprint, whether a gate is built
    (GATED_GATE's: the one module a style adds; the blends themselves are elementwise and count nothing)
    and the seed's role: ``incubating`` (only the what-if pass runs it), else, training, ``detached`` or
    ``live`` (it acts on the host's activation detached, or live: the input's gradient is then computed),
    validation ``blended``. A seed at alpha 0 out of incubation is skipped by every pass: as if absent."""
    out = []
    for i, slot in enumerate(host.slots):
        if not slot.occupied or not (slot.incubating or slot.alpha > 0.0):
            continue
        if slot.incubating:
            role = "incubating"
        elif phase == "eval":
            role = "blended"
        else:
            role = "live" if slot.reads_live else "detached"
        out.append((i, slot.blueprint, slot.gate is not None, role))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class TrainCost:
    """One training batch's FLOPs: the host pass and the incubating seeds' what-if pass (0: none), each
    forward and backward."""

    host: int
    whatif: int


@dataclasses.dataclass(frozen=True)
class EvalCost:
    """One validation batch's FLOPs, forward: the host's pass, every live seed's counterfactual (summed),
    and every incubating seed's what-if pass at alpha 1 (summed)."""

    host: int
    counterfactual: int
    whatif: int


def _copy(host: Host, device: torch.device) -> Host:
    """``host`` with its seeds, its parameters and buffers on ``device``: on the meta device tensors of
    their shapes (nothing copied, nothing drawn), else copies of them; the rest (slots, stages, alphas)
    copied."""
    meta = device.type == "meta"
    memo: dict[int, object] = {}
    for p in host.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to(device) if meta else p.detach().clone(),
                                   requires_grad=p.requires_grad)  # fmt: skip
    for b in host.buffers():
        memo[id(b)] = b.detach().to(device) if meta else b.detach().clone()
    return copy.deepcopy(host, memo)


def _batch(shape: BatchShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x_shape, x_dtype, y_shape, y_dtype = shape
    zeros = lambda s, dtype: torch.zeros(s, dtype=dtype, device=device)
    return zeros(x_shape, x_dtype), zeros(y_shape, y_dtype)


def _host_pass(host: Host, batch, inputs: list[torch.Tensor]) -> torch.Tensor:
    """The host pass's loss; a staged host leaves each slot's input in ``inputs`` (where a resumed pass
    starts)."""
    if host.staged:
        loss, _, _, kept = host.loss_and_correct_inputs(batch)
        inputs.extend(kept)
        return loss
    return host.loss_and_correct(batch)[0]


def _from_slot(host: Host, slot: int, inputs: list[torch.Tensor], batch) -> torch.Tensor:
    """The loss of a pass that differs from the host pass only from slot ``slot`` on: resumed there from its
    kept input on a staged host, whole otherwise."""
    if host.staged:
        return host.loss_and_correct_from(slot, inputs[slot], batch)[0]
    return host.loss_and_correct(batch)[0]


def train_cost(host: Host, shape: BatchShape, device: torch.device = META) -> TrainCost:
    """Count one training batch of ``shape`` on ``host`` as it stands (the module docstring), on a copy of it
    on ``device``."""
    m = _copy(host, device)
    m.train()
    batch = _batch(shape, device)
    inputs: list[torch.Tensor] = []
    host_flops = count_flops(lambda: _host_pass(m, batch, inputs).backward())
    # the what-if pass, for the incubating seeds that have parameters to train
    incubating = [i for i in m.incubating_slots() if m.seed_parameters(i)]
    if not incubating:
        return TrainCost(host_flops, 0)
    params = [p for i in incubating for p in m.seed_parameters(i)]
    start = min(incubating)
    kept = [x.detach() for x in inputs]

    def whatif() -> None:
        with m.incubating(incubating):
            _from_slot(m, start, kept, batch).backward(inputs=params)

    return TrainCost(host_flops, count_flops(whatif))


def eval_cost(host: Host, shape: BatchShape, device: torch.device = META) -> EvalCost:
    """Count one validation batch of ``shape`` on ``host`` as it stands (eval mode), on a copy of it on
    ``device``."""
    m = _copy(host, device)
    m.eval()
    batch = _batch(shape, device)
    inputs: list[torch.Tensor] = []
    with torch.no_grad():
        host_flops = count_flops(lambda: _host_pass(m, batch, inputs))

        def forced(i: int, alpha: float) -> int:
            with m.slot(i).force_alpha(alpha):
                return count_flops(lambda: _from_slot(m, i, inputs, batch))

        live = [i for i in range(m.n_slots) if m.slot(i).contributes]
        cf = sum(forced(i, 0.0) for i in live)
        wi = sum(forced(i, 1.0) for i in m.incubating_slots())
    return EvalCost(host_flops, cf, wi)


class FlopCounter:
    """Each pass's FLOPs per architecture and batch shape, counted once and kept: a cache keyed by the
    host's architecture (its class and its modules outside the slots, as ``repr`` writes them), its seeds'
    roles (:func:`seed_roles`), the phase (training or validation) and the batch shape. ``runs``: how many
    times it counted (cache misses)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, TrainCost | EvalCost] = {}
        self._host_keys: WeakKeyDictionary[Host, tuple] = WeakKeyDictionary()
        self.runs = 0

    def architecture(self, host: Host, phase: str) -> tuple:
        """The key of ``host``'s compute graph in ``phase`` as it stands: its own modules' (kept per host:
        they do not change over its life) and its seeds' roles (:func:`seed_roles`)."""
        own = self._host_keys.get(host)
        if own is None:
            kids = tuple((name, repr(mod)) for name, mod in host.named_children() if name != "slots")
            own = (type(host).__module__, type(host).__qualname__, kids)
            self._host_keys[host] = own
        return own, seed_roles(host, phase)

    def _cost(self, phase: str, host: Host, shape: BatchShape):
        key = (phase, self.architecture(host, phase), shape)
        cost = self._cache.get(key)
        if cost is None:
            count = train_cost if phase == "train" else eval_cost
            device = next(host.parameters()).device
            try:
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    cost = count(host, shape, device)  # a copy, zero inputs; what it draws is given back
            except RuntimeError:  # out of memory, say: the meta device runs no kernel
                cost = count(host, shape, META)
            self._cache[key] = cost
            self.runs += 1
        return cost

    def train(self, host: Host, shape: BatchShape) -> TrainCost:
        """One training batch's FLOPs (counted at the first call for this architecture and shape)."""
        return self._cost("train", host, shape)

    def eval(self, host: Host, shape: BatchShape) -> EvalCost:
        """One validation batch's FLOPs (counted at the first call for this architecture and shape)."""
        return self._cost("eval", host, shape)

    def epoch(
        self, host: Host, train: Mapping[BatchShape, int], val: Mapping[BatchShape, int], *, whatif: bool,
        whatif_statistics: str = "running",
    ) -> dict[str, int]:  # fmt: skip
        """One measured epoch's FLOPs by kind (:data:`FLOP_KINDS`): ``train`` and ``val`` the epoch's
        batches (shape -> count, ``epoch_shapes()`` of the loaders), then :meth:`validation` of ``val``."""
        out = dict.fromkeys(FLOP_KINDS, 0)
        for shape, n in train.items():
            cost = self.train(host, shape)
            out["train"] += n * cost.host
            out["whatif"] += n * cost.whatif
        for kind, flops in self.validation(host, val, counterfactual=True, whatif=whatif,
                                           whatif_statistics=whatif_statistics).items():  # fmt: skip
            out[kind] += flops
        return out

    def validation(
        self, host: Host, val: Mapping[BatchShape, int], *, counterfactual: bool, whatif: bool = False,
        whatif_statistics: str = "running",
    ) -> dict[str, int]:  # fmt: skip
        """A validation's FLOPs by kind: the host pass on each batch, with ``counterfactual`` every live
        seed's counterfactual, and with ``whatif`` (where an incubating seed is read) every incubating seed's
        pass at alpha 1, plus the host's pass on the batch's own statistics under ``whatif_statistics
        batch`` where the host has batch norms."""
        out = dict.fromkeys(FLOP_KINDS, 0)
        by_batch = whatif and whatif_statistics == "batch" and bool(host.incubating_slots()) and bool(
            host.batch_norms()
        )  # fmt: skip
        for shape, n in val.items():
            cost = self.eval(host, shape)
            out["validation"] += n * (cost.host + (cost.counterfactual if counterfactual else 0))
            if whatif:
                out["whatif"] += n * (cost.whatif + (cost.host if by_batch else 0))
        return out


#: The counter every env shares (its cache serves every episode of the process).
SHARED = FlopCounter()


__all__ = ["FLOP_KINDS", "SHARED", "EvalCost", "FlopCounter", "TrainCost", "count_flops", "eval_cost",
           "seed_roles", "train_cost"]  # fmt: skip
