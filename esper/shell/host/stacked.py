"""Many envs' CNN hosts run as one batch: the forward of ``E`` hosts of one shape, each with its own seeds.

The hosts stay ordinary modules (:class:`~esper.shell.host.hosts.CNNHost`,
:class:`~esper.shell.host.hosts.CNN1dHost`); they hold every parameter and are what everything else
reads (snapshots, counts, the per-env path). This module runs them side by side:

- **Layout.** Env ``e``'s activation is channel block ``e`` of one tensor ``[N, E·C, *spatial]``: a
  convolution of every env is one grouped convolution (``groups = E``), a batch norm is one batch norm
  over ``E·C`` channels (each env's statistics over its own batch), a group norm one group norm with ``E``
  times the groups, and a linear layer one batched matmul.
- **Parameters.** The hosts' own parameters are rows of one leaf tensor per parameter
  (:meth:`StackedHosts.bind_parameters`): the step reads the leaf and the optimizer steps it. The seeds'
  parameters are stacked per step (``torch.stack``, so each env's gradient lands in its own ``.grad``,
  and a seed that took no part in the step keeps ``.grad is None`` and is not stepped, exactly as on the
  per-env path). The batch norms' running statistics are views into one tensor per layer
  (:meth:`StackedHosts.bind_buffers`), updated in place by the stacked batch norm.
- **Seeds differ per env.** At each slot the envs whose seed acts are grouped by blueprint and blend
  style; a group's seeds have one structure, so :func:`run_group` runs them as one module (the
  blueprint's modules interpreted with stacked parameters); the group's activations are gathered from
  and scattered back into the slot's tensor. The groups are fixed for an epoch (:class:`SlotPlan`): a
  step costs about one host's worth of operations plus a few per group, not one host's per env.

Every seed stage keeps its per-env meaning (:mod:`esper.shell.host.slots`): an incubating seed is
skipped by the host pass and trained by a what-if pass over the envs that have one (their host and other
seeds detached, batch-norm statistics untouched: :meth:`StackedHosts.loss`); a blended seed reads the
detached activation, a fossilized one the live activation; alpha 0 skips the seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from esper.core.spec import Style
from esper.shell.host.blueprints import NormSeed, PositionAttention, SqueezeExcite, Zero
from esper.shell.host.hosts import CNN1dHost, CNNHost, Host
from esper.shell.host.slots import BLEND, BLEND_KINDS, Gate, SeedSlot, blend

#: Host classes whose envs can run as one batch.
BATCHED_HOSTS = (CNNHost, CNN1dHost)


def supports(host: Host) -> bool:
    """Whether envs of ``host``'s kind can run as one batch (the CNN families; the transformer host
    runs env by env)."""
    return isinstance(host, BATCHED_HOSTS)


# ----------------------------------------------------------------------------------- the interpreter
# Layout: ``[G, C, *spatial, N]``: env ``g``'s activation in row ``g``, the samples last and contiguous, so
# that every operation runs on contiguous runs of ``N`` values. Each operation is the CPU kernel that
# measured fastest at these sizes: a pointwise convolution is a batched matmul, a wider one a grouped
# convolution over ``[1, G·C, *spatial, N]`` (a view) with a ``(*k, 1)`` kernel, a batch norm a layer norm
# over each (env, channel) row, a group norm the native one on ``[G·N, C, *spatial]``; max-pooling and
# the attention softmax are written out (the pooling kernels' scatter and the softmax kernel over a
# short last dim are several times slower here).
#: Stacked host parameters, keyed by ``id`` of env 0's copy (:meth:`StackedHosts.bind_parameters`).
Leaves = dict[int, torch.Tensor]


def _stack(
    params: Sequence[torch.Tensor], train: Sequence[bool] | bool, leaves: Leaves | None = None
) -> torch.Tensor:
    """``[G, *shape]``: the group's copies of one parameter; where ``train`` is False, detached. With
    ``leaves`` (every env's hosts, in order), a host parameter is its stacked leaf itself, no copy."""
    if leaves is not None and (leaf := leaves.get(id(params[0]))) is not None:
        if len(params) != leaf.shape[0] or not isinstance(train, bool):
            raise ValueError("_stack: a stacked host parameter is read for every env at once")
        return leaf if train else leaf.detach()
    if isinstance(train, bool):
        return torch.stack(list(params) if train else [p.detach() for p in params])
    return torch.stack([p if t else p.detach() for p, t in zip(params, train)])


def _bcast(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``v [G, C]`` (or ``[G]``) shaped to broadcast against ``x [G, C, *spatial, N]``."""
    return v.view(*v.shape, *(1,) * (x.dim() - v.dim()))


def _per_sample(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``v [G, C, N]`` shaped to broadcast against ``x [G, C, *spatial, N]``."""
    return v.view(*v.shape[:2], *(1,) * (x.dim() - 3), v.shape[2])


def _conv(mods: Sequence[nn.Module], x: torch.Tensor, train, leaves: Leaves | None = None) -> torch.Tensor:
    """Stride-1 "same" convolutions (``padding = k // 2``, odd ``k``; dense, depthwise or grouped),
    each env its own weights: ``x [G, I, *spatial, N] -> [G, O, *spatial, N]``."""
    m, G = mods[0], len(mods)
    w = _stack([c.weight for c in mods], train, leaves)  # [G, O, I/groups, *k]
    out = w.shape[1]
    if m.groups == 1 and all(k == 1 for k in m.kernel_size):
        y = torch.bmm(w.reshape(G, out, -1), x.reshape(G, x.shape[1], -1)).view(G, out, *x.shape[2:])
    else:  # the envs' (and the module's) groups as the groups of one convolution over a batch of 1
        conv = F.conv2d if x.dim() == 4 else F.conv3d
        weight = w.reshape(G * out, *w.shape[2:], 1)
        padding = (*(k // 2 for k in m.kernel_size), 0)
        y = conv(x.reshape(1, -1, *x.shape[2:]), weight, None, 1, padding, 1, G * m.groups)
        y = y.view(G, out, *x.shape[2:])
    if m.bias is not None:
        y = y + _bcast(_stack([c.bias for c in mods], train, leaves), y)
    return y


def _linear(mods: Sequence[nn.Linear], x: torch.Tensor, train, leaves: Leaves | None = None) -> torch.Tensor:
    """``x [G, in, N] -> [G, out, N]``, env g through its own layer."""
    y = torch.bmm(_stack([m.weight for m in mods], train, leaves), x)
    if mods[0].bias is not None:
        y = y + _stack([m.bias for m in mods], train, leaves).unsqueeze(-1)
    return y


def _samples_first(x: torch.Tensor) -> torch.Tensor:
    """``[G, C, *spatial, N] -> [G·N, C, *spatial]`` (a copy): the layout of the per-sample kernels."""
    G, C, N = x.shape[0], x.shape[1], x.shape[-1]
    return x.movedim(-1, 1).reshape(G * N, C, *x.shape[2:-1])


def _group_norm(mods: Sequence[nn.GroupNorm], x: torch.Tensor, train) -> torch.Tensor:
    m = mods[0]
    G, C, N = x.shape[0], x.shape[1], x.shape[-1]
    y = F.group_norm(_samples_first(x), m.num_groups, None, None, m.eps)
    y = y.view(G, N, C, *x.shape[2:-1]).movedim(1, -1)
    if m.affine:
        weight, bias = (_stack([getattr(g, k) for g in mods], train) for k in ("weight", "bias"))
        y = y * _bcast(weight, y) + _bcast(bias, y)
    return y


def _spatial_mean(x: torch.Tensor) -> torch.Tensor:
    """``[G, C, *spatial, N] -> [G, C, N]``."""
    return x.mean(dim=tuple(range(2, x.dim() - 1)))


def run_group(
    mods: Sequence[nn.Module], x: torch.Tensor, train: Sequence[bool] | bool = True
) -> torch.Tensor:
    """The group's modules (one structure: one blueprint at one width) on ``x [G, C, *spatial, N]``, env
    ``g``'s input in row ``g``; ``train`` says per module whether its parameters get gradients. Returns
    the modules' outputs in the same layout."""
    m = mods[0]
    if isinstance(m, nn.Sequential):
        for i in range(len(m)):
            x = run_group([s[i] for s in mods], x, train)
        return x
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return _conv(mods, x, train)
    if isinstance(m, nn.GroupNorm):
        return _group_norm(mods, x, train)
    if isinstance(m, nn.ReLU):
        return F.relu(x)
    if isinstance(m, Zero):
        return torch.zeros_like(x)
    if isinstance(m, NormSeed):
        scale = torch.tanh(_stack([s.scale for s in mods], train))  # [G]
        return _bcast(scale, x) * (run_group([s.norm for s in mods], x, train) - x)
    if isinstance(m, SqueezeExcite):
        hidden = F.relu(_linear([s.fc1 for s in mods], _spatial_mean(x), train))
        z = _linear([s.fc2 for s in mods], hidden, train)  # [G, C, N]
        return x * _per_sample(torch.tanh(z), x)
    if isinstance(m, PositionAttention):
        q, k, v = run_group([a.qkv for a in mods], x, train).chunk(3, dim=1)  # each [G, C, L, N]
        # Contiguous ``[G, N, L, C]`` copies: with one env in the group, the permuted views would fold
        # into a batched matmul with a batch stride of 1, which the CPU kernel runs matrix by matrix
        # (3-5x slower); with more envs, matmul makes the same copies itself.
        y = _attention(*(t.permute(0, 3, 2, 1).contiguous() for t in (q, k, v)))  # [G, N, L, C]
        # The gradient that comes back through the projection is laid out [G, C, L, N]; the attention's
        # backward matmuls want it contiguous as [G, N, L, C] (the same matrix-by-matrix fallback).
        return run_group([a.proj for a in mods], _ContiguousGrad.apply(y).permute(0, 3, 2, 1), train)
    raise NotImplementedError(f"no batched form of {type(m).__name__}")


def _gate(gates: Sequence[Gate], x: torch.Tensor, train) -> torch.Tensor:
    """``g(x)`` of GATED_GATE seeds, shaped to broadcast against ``x``."""
    h = F.relu(_linear([g.fc1 for g in gates], _spatial_mean(x), train))
    return _per_sample(torch.sigmoid(_linear([g.fc2 for g in gates], h, train)), x)  # [G, 1, N]


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward hands on a contiguous gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class _MaxPool(torch.autograd.Function):
    """Max over non-overlapping windows of ``k`` along dim ``dim`` (``nn.MaxPool1d(k)``; a trailing
    remainder dropped): a running maximum over the window's elements, the earlier element winning a tie
    as in the pooling kernel, and a backward that multiplies by the saved choice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, k: int, dim: int) -> torch.Tensor:
        L = x.shape[dim] // k * k
        windows = x.narrow(dim, 0, L).unflatten(dim, (L // k, k))
        taps = windows.unbind(dim + 1)
        out, better = taps[0], []
        for tap in taps[1:]:  # arithmetic, not where/scatter: both are slow on the CPU at these sizes
            b = (tap > out).to(x.dtype)
            out = out + b * (tap - out)
            better.append(b)
        chosen, left = [], torch.ones_like(out)
        for b in reversed(better):  # element j is chosen if it beat the running max and no later one did
            chosen.append(b * left)
            left = left * (1.0 - b)
        ctx.save_for_backward(left, *reversed(chosen))
        ctx.shape, ctx.dim = x.shape, dim
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dim, shape = ctx.dim, ctx.shape
        g = torch.stack([grad * c for c in ctx.saved_tensors], dim=dim + 1).flatten(dim, dim + 1)
        if g.shape[dim] < shape[dim]:
            pad = [0, 0] * (len(shape) - 1 - dim) + [0, shape[dim] - g.shape[dim]]
            g = F.pad(g, pad)
        return g, None, None


def _max_pool(x: torch.Tensor, k: int) -> torch.Tensor:
    """``nn.MaxPool1d(k)`` / ``nn.MaxPool2d(k)`` over the spatial dims of ``[G, C, *spatial, N]``."""
    for dim in range(2, x.dim() - 1):
        x = _MaxPool.apply(x, k, dim)
    return x


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the last-but-one dim (``[B..., L, C]``, scale ``1/sqrt(C)``), the softmax
    written out: the CPU softmax kernel is several times slower over a short last dim."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    weights = (scores - scores.amax(-1, keepdim=True).detach()).exp()
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v)


# ------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class SeedGroup:
    """Envs (positions in the batch) whose seeds in one slot share a blueprint, so they run as one module;
    each keeps its own blend. ``alpha`` and ``style`` per env; ``attached`` per env (a FOSSILIZED seed
    reads the live activation); ``train`` per env (the seed's parameters get gradients). The tensors the
    step needs (rows, per-style alphas) are made once, with the plan."""

    envs: tuple[int, ...]
    styles: tuple[Style, ...]
    alpha: tuple[float, ...]
    attached: tuple[bool, ...]
    train: tuple[bool, ...]
    device: torch.device

    def __post_init__(self) -> None:
        t = lambda v, **kw: torch.tensor(v, device=self.device, **kw)
        object.__setattr__(self, "rows", t(self.envs, dtype=torch.long))
        object.__setattr__(self, "attached_mask", t(self.attached, dtype=torch.bool))
        per_style = {}
        for kind in BLEND_KINDS:
            coef = [a if BLEND[s] == kind else 0.0 for a, s in zip(self.alpha, self.styles)]
            per_style[kind] = t(coef, dtype=torch.float32) if any(coef) else None
        object.__setattr__(self, "coef", per_style)
        gated = [i for i, s in enumerate(self.styles) if s == Style.GATED_GATE]
        object.__setattr__(self, "gated", t(gated, dtype=torch.long) if gated else None)
        object.__setattr__(self, "gated_pos", tuple(gated))  # the same positions, read without a sync


#: Per slot, the groups that act there.
SlotPlan = tuple[tuple[SeedGroup, ...], ...]


def plan(
    hosts: Sequence[Host], *, forced: dict[tuple[int, int], float] | None = None, trainable: bool = True,
    incubating_only: bool = False,
) -> SlotPlan:  # fmt: skip
    """The seed groups of ``hosts`` as they stand (stage, alpha, blueprint, style).

    ``forced``: (env, slot) -> the alpha forced there (the what-if pass forces incubating seeds to 1, a
    counterfactual forces a seed to 0, which leaves it out). Envs are positions in ``hosts``. A seed
    acts where it is blended (not incubating) with alpha > 0, or where its alpha is forced above 0.
    ``trainable``: the acting seeds get gradients; with ``incubating_only`` only the incubating ones do
    (the what-if pass)."""
    if not hosts:
        return ()
    device = next(hosts[0].parameters()).device
    slots = []
    for s in range(hosts[0].n_slots):
        groups: dict[str, list[tuple[int, SeedSlot, float]]] = {}
        for e, host in enumerate(hosts):
            slot = host.slot(s)
            if slot.seed is None:
                continue
            alpha = (forced or {}).get((e, s), None)
            if alpha is None:
                if slot.incubating:
                    continue
                alpha = slot.alpha
            if alpha == 0.0:
                continue
            groups.setdefault(slot.blueprint, []).append((e, slot, alpha))
        slots.append(tuple(
            SeedGroup(
                envs=tuple(e for e, _, _ in members),
                styles=tuple(sl.style for _, sl, _ in members),
                alpha=tuple(a for _, _, a in members),
                attached=tuple(sl.reads_live for _, sl, _ in members),
                train=tuple(trainable and (sl.incubating or not incubating_only) for _, sl, _ in members),
                device=device,
            )
            for members in groups.values()
        ))  # fmt: skip
    return tuple(slots)


def _compose(group: SeedGroup, h: torch.Tensor, d: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """:func:`esper.shell.host.slots.blend` for every env of the group, each with its style and alpha."""
    return blend(h, d, {k: None if v is None else _bcast(v.to(h.dtype), h) for k, v in group.coef.items()}, g)


def apply_slot(hosts: Sequence[Host], s: int, groups: Sequence[SeedGroup], h: torch.Tensor) -> torch.Tensor:
    """The slot's output for every env of the batch: ``h [E, C, *spatial, N]`` with each group's seeds
    composed in (the other envs pass ``h`` through)."""
    out = h
    for group in groups:
        whole = len(group.envs) == len(hosts)
        hs = h if whole else h.index_select(0, group.rows)
        if all(group.attached):
            x = hs
        elif not any(group.attached):
            x = hs.detach()
        else:
            x = torch.where(_bcast(group.attached_mask, hs), hs, hs.detach())
        slots = [hosts[e].slot(s) for e in group.envs]
        d = run_group([sl.seed for sl in slots], x, group.train)
        g = None
        if group.gated is not None:  # the gate of the GATED_GATE seeds only (the others have none)
            pick = group.gated_pos
            sub = x if len(pick) == len(slots) else x.index_select(0, group.gated)
            g = _gate([slots[i].gate for i in pick], sub, [group.train[i] for i in pick])
            if len(pick) < len(slots):
                g = torch.zeros((len(slots), *g.shape[1:]), dtype=g.dtype, device=g.device).index_copy(
                    0, group.gated, g
                )
        y = _compose(group, hs, d, g)
        out = y if whole else out.index_copy(0, group.rows, y)
    return out


# --------------------------------------------------------------------------------------- the hosts
class StackedHosts:
    """``E`` CNN hosts of one shape, run as one batch (the module docstring)."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        if not hosts or not all(supports(h) for h in hosts):
            raise ValueError("StackedHosts: needs CNN hosts (cnn, cnn1d)")
        if len({type(h) for h in hosts}) != 1:
            raise ValueError("StackedHosts: the hosts must be of one kind")
        self.hosts = list(hosts)
        self.norms: list[list[nn.modules.batchnorm._BatchNorm]] = [
            [blk[1] for blk in h.blocks] for h in self.hosts
        ]
        self.bind_buffers()
        self.leaves: Leaves = {}
        self._rows: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}

    def rows(self, envs: Sequence[int], device: torch.device) -> torch.Tensor:
        """``envs`` as an int64 index tensor on ``device``, made once per subset and kept: a step then
        copies nothing from the host (on a GPU each such copy blocked, and a CUDA graph cannot capture
        one). Made outside inference mode, so evaluation's tensors can index a training step's."""
        key = (tuple(int(e) for e in envs), str(device))
        index = self._rows.get(key)
        if index is None:
            with torch.inference_mode(False):
                index = torch.tensor(key[0], dtype=torch.long, device=device)
            self._rows[key] = index
        return index

    def bind_parameters(self) -> list[torch.Tensor]:
        """Make each host parameter (every one outside the slots) a row of one leaf tensor ``[E, *shape]``
        and return those leaves, for the optimizer to step: the forward over every env reads a leaf
        itself, so its gradient arrives whole (no stacking, and no gradient split back per env), and one
        foreach update touches a dozen tensors, not a dozen per env. Each host's own parameter keeps
        its place in its module and shares the leaf's row (``.data``): what reads or loads a host
        (snapshots, rollback, counts, the per-env path) sees and writes the same numbers. Its ``.grad``
        stays None; :meth:`host_grads` gives each env's rows of the leaves' gradients."""
        per_host = [h.host_parameters() for h in self.hosts]
        if len({tuple(p.shape for p in ps) for ps in per_host}) != 1:
            raise ValueError("StackedHosts.bind_parameters: the hosts' parameters differ in shape")
        self.leaves = {}
        for j, first in enumerate(per_host[0]):
            leaf = torch.stack([ps[j].detach() for ps in per_host]).requires_grad_(first.requires_grad)
            for e, ps in enumerate(per_host):
                ps[j].data = leaf.data[e]
            self.leaves[id(first)] = leaf
        return list(self.leaves.values())

    def host_grads(self, e: int) -> list[torch.Tensor | None]:
        """Env ``e``'s host gradients (rows of the bound leaves' ``.grad``; None where a leaf has none), in
        :meth:`~esper.shell.host.hosts.Host.host_parameters`' order."""
        return [None if leaf.grad is None else leaf.grad[e] for leaf in self.leaves.values()]

    @property
    def n(self) -> int:
        return len(self.hosts)

    def bind_buffers(self) -> None:
        """Make each block's batch-norm running statistics (and step counts) rows of one tensor per block
        ``[E, C]`` (views), so the stacked batch norm updates every env's in place. Call again after a
        host's buffers were replaced (``load_state_dict`` copies into them: no need then)."""
        self.running: list[tuple[torch.Tensor, torch.Tensor]] = []
        for b in range(len(self.norms[0])):
            mean = torch.stack([norms[b].running_mean for norms in self.norms])
            var = torch.stack([norms[b].running_var for norms in self.norms])
            for e, norms in enumerate(self.norms):
                norms[b].running_mean, norms[b].running_var = mean[e], var[e]
            self.running.append((mean, var))
        self.steps = torch.stack([torch.stack([n.num_batches_tracked for n in ns]) for ns in self.norms])
        for e, norms in enumerate(self.norms):
            for b, n in enumerate(norms):
                n.num_batches_tracked = self.steps[e, b]

    # ------------------------------------------------------------------------------------- forward
    def forward(
        self, envs: Sequence[int], x: torch.Tensor, slot_plan: SlotPlan, *, train: bool,
        host_grad: bool = True, statistics: str = "update", after: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """Logits ``[G, classes, N]`` of the hosts ``envs`` (``G`` of them; ``x [G, C_in, *spatial, N]``),
        and every block's output before its slot composes (what :meth:`resume` starts from). ``train``:
        training mode (batch statistics); ``host_grad``: the hosts' own parameters get gradients;
        ``statistics``: ``"update"`` the running statistics (a training pass), ``"none"`` leave them (the
        what-if pass), ``"use"`` normalize with them (evaluation); ``after``: each slot's output is
        appended to it."""
        hosts = [self.hosts[e] for e in envs]
        before = []
        for b in range(len(hosts[0].blocks)):
            x = self._block(hosts, envs, b, x, train=train, host_grad=host_grad, statistics=statistics)
            before.append(x)
            x = apply_slot(hosts, b, slot_plan[b], x)
            if after is not None:
                after.append(x)
        return self.head(hosts, x, host_grad, self._leaves(envs)), before

    def resume(
        self, envs: Sequence[int], x: torch.Tensor, slot: int, slot_plan: SlotPlan, *, train: bool = False
    ) -> torch.Tensor:
        """Logits from the activation entering slot ``slot``'s composition onwards, the hosts' own
        parameters detached: the counterfactual passes (evaluation) and the what-if pass (``train``: batch
        statistics, left unrecorded) share the host pass's earlier blocks, whose output is theirs."""
        hosts = [self.hosts[e] for e in envs]
        statistics = "none" if train else "use"
        x = apply_slot(hosts, slot, slot_plan[slot], x)
        for b in range(slot + 1, len(hosts[0].blocks)):
            x = self._block(hosts, envs, b, x, train=train, host_grad=False, statistics=statistics)
            x = apply_slot(hosts, b, slot_plan[b], x)
        return self.head(hosts, x, False, self._leaves(envs))

    def _leaves(self, envs: Sequence[int]) -> Leaves | None:
        """The bound leaves where ``envs`` is every env in order (a subset stacks its rows anew)."""
        return self.leaves if self.leaves and list(envs) == list(range(self.n)) else None

    def _block(self, hosts, envs, b, x, *, train: bool, host_grad: bool, statistics: str) -> torch.Tensor:
        """conv -> batch norm -> ReLU -> max-pool of block ``b`` of every host."""
        blocks = [h.blocks[b] for h in hosts]
        leaves = self._leaves(envs)
        x = _conv([blk[0] for blk in blocks], x, host_grad, leaves)
        norm = blocks[0][1]
        weight = _stack([blk[1].weight for blk in blocks], host_grad, leaves)  # [G, C]
        bias = _stack([blk[1].bias for blk in blocks], host_grad, leaves)
        G, C = x.shape[:2]
        if train:  # batch statistics over (N, *spatial), one row per env and channel
            flat = x.reshape(G, C, -1)
            normed, mean, rstd = torch.native_layer_norm(flat, (flat.shape[-1],), None, None, norm.eps)
            x = normed.view_as(x) * _bcast(weight, x) + _bcast(bias, x)
            if statistics == "update":  # always every env: the host pass
                with torch.no_grad():
                    n, m = flat.shape[-1], norm.momentum
                    var = (rstd.reciprocal().square() - norm.eps).squeeze(-1)
                    running_mean, running_var = self.running[b]
                    running_mean.mul_(1 - m).add_(mean.squeeze(-1), alpha=m)
                    running_var.mul_(1 - m).add_(var * (n / max(n - 1, 1)), alpha=m)
        else:
            running_mean, running_var = self.running[b]
            if len(envs) != self.n:
                rows = self.rows(envs, x.device)
                running_mean, running_var = running_mean[rows], running_var[rows]
            scale = weight * torch.rsqrt(running_var + norm.eps)  # [G, C]
            x = x * _bcast(scale, x) + _bcast(bias - running_mean * scale, x)
        pool = blocks[0][3]
        if not isinstance(pool, nn.Identity):  # a max-pool commutes with the ReLU: pool first, on less
            x = _max_pool(x, pool.kernel_size if isinstance(pool.kernel_size, int) else pool.kernel_size[0])
        return F.relu(x)

    @staticmethod
    def head(hosts, x: torch.Tensor, host_grad: bool, leaves: Leaves | None = None) -> torch.Tensor:
        """The global average pool and the linear classifier: ``[G, classes, N]``."""
        return _linear([h.head for h in hosts], _spatial_mean(x), host_grad, leaves)

    # ---------------------------------------------------------------------------------------- steps
    def loss(
        self, x: torch.Tensor, y: torch.Tensor, slot_plan: SlotPlan,
        whatif: tuple[Sequence[int], SlotPlan, int] | None,
        record: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """One training step's forward: ``x [E, C_in, ..., N]``, ``y [E, N]``. Returns the loss to
        back-propagate (the sum of every env's mean cross-entropy, plus the what-if pass's over the envs
        ``whatif[0]`` with their plan ``whatif[1]``, from slot ``whatif[2]`` (their first incubating
        slot): gradients only for their incubating seeds), and per env the host pass's loss ``[E]`` and
        correct count ``[E]``. ``record(slot, h, y)`` is called with each slot's input and output in the
        host pass (the slot statistics of ``lifecycle.grad_init``; the envs' losses are summed, so the
        gradient reaching env ``e``'s row of ``y`` is that of env ``e``'s own mean loss)."""
        envs = range(self.n)
        after: list[torch.Tensor] | None = [] if record is not None else None
        logits, before = self.forward(envs, x, slot_plan, train=True, after=after)
        if record is not None:
            for s, (h, out) in enumerate(zip(before, after, strict=True)):
                record(s, h, out)
        per_env, correct = _cross_entropy(logits, y)
        total = per_env.sum()
        self.steps.add_(1)  # the batch norms count their steps, as nn.BatchNorm does
        if whatif is not None and len(whatif[0]):
            rows = self.rows(whatif[0], x.device)
            # the what-if pass starts at the first incubating slot: up to there it is the host pass (same
            # parameters, same batch statistics, the seeds before it composed alike), and an incubating
            # seed reads the detached activation, so nothing before it needs a gradient
            start = whatif[2]
            entering = before[start].detach().index_select(0, rows)
            logits_w = self.resume(whatif[0], entering, start, whatif[1], train=True)
            total = total + _cross_entropy(logits_w, y.index_select(0, rows))[0].sum()
            counted = torch.zeros(self.n, 1, dtype=self.steps.dtype, device=self.steps.device)
            counted[rows] = 1
            self.steps.add_(counted)  # the per-env path's what-if pass counts a batch-norm step too
        return total, per_env.detach(), correct

    @torch.inference_mode()
    def evaluate(
        self, x: torch.Tensor, y: torch.Tensor, slot_plan: SlotPlan, live: Sequence[Sequence[int]],
        incubating: Sequence[Sequence[int]] = (), *, batch_statistics: bool = False,
    ) -> tuple[torch.Tensor, ...]:  # fmt: skip
        """Evaluation mode: per env the loss ``[E]``, correct count ``[E]``, for every slot the correct
        count with that slot's seed left out ``[E, S]`` (only the envs in ``live[s]``; the others keep
        the real count), the correct count with that slot's incubating seed blended in at alpha 1
        ``[E, S]`` (only the envs in ``incubating[s]``; the others keep the real count), and the count
        that one is read against ``[E]``. With ``batch_statistics`` the what-if counts and the count
        they are read against normalize with the batch's own statistics, recording nothing (each env
        with an incubating seed runs its host once more); else both are the running statistics' and
        that count is the real one. Last, the mean loss with that slot's seed left out ``[E, S]`` (as
        the left-out counts: the envs in ``live[s]``, the real loss elsewhere)."""
        envs = list(range(self.n))
        logits, before = self.forward(envs, x, slot_plan, train=False, host_grad=False, statistics="use")
        loss, correct = _cross_entropy(logits, y)
        S = len(slot_plan)

        def with_slot(
            envs_by_slot: Sequence[Sequence[int]], alpha: float, base: torch.Tensor,
            starts: list[torch.Tensor], position: dict[int, int] | None, train: bool,
            losses: torch.Tensor | None = None,
        ) -> torch.Tensor:  # fmt: skip
            """``[E, S]`` correct counts with slot ``s``'s seed at ``alpha`` in the envs of
            ``envs_by_slot[s]`` (0: left out; 1: an incubating seed blended in), ``base`` elsewhere;
            ``starts[s]`` holds the activations entering slot ``s``, for every env (``position``
            None) or for the envs ``position`` maps to their row. ``losses`` ``[E, S]``, where given,
            takes those passes' mean losses in the same places."""
            out = base.unsqueeze(1).repeat(1, S)
            for s, envs_s in enumerate(envs_by_slot):
                if not envs_s:
                    continue
                sub = list(envs_s)
                rows = self.rows(sub, x.device)
                local = rows if position is None else self.rows([position[e] for e in sub], x.device)
                forced = {(k, s): alpha for k in range(len(sub))}  # a seed forced to 0 is left out
                changed = plan([self.hosts[e] for e in sub], forced=forced, trainable=False)
                logits_s = self.resume(sub, starts[s].index_select(0, local), s, changed, train=train)
                loss_s, out[rows, s] = _cross_entropy(logits_s, y.index_select(0, rows))
                if losses is not None:
                    losses[rows, s] = loss_s.detach().to(losses.dtype)
            return out

        left_out_loss = loss.detach().unsqueeze(1).repeat(1, S)
        left_out = with_slot(live, 0.0, correct, before, None, False, left_out_loss)
        asked = sorted({e for envs_s in incubating for e in envs_s})
        if not (batch_statistics and asked):
            what_if = with_slot(incubating, 1.0, correct, before, None, False)
            return loss, correct, left_out, what_if, correct, left_out_loss
        # the hosts with an incubating seed once more, every batch norm on this batch's statistics
        rows = self.rows(asked, x.device)
        own = plan([self.hosts[e] for e in asked], trainable=False)
        logits_b, before_b = self.forward(asked, x.index_select(0, rows), own, train=True, host_grad=False,
                                          statistics="none")  # fmt: skip
        base = correct.clone()
        base[rows] = _cross_entropy(logits_b, y.index_select(0, rows))[1]
        position = {e: k for k, e in enumerate(asked)}
        what_if = with_slot(incubating, 1.0, base, before_b, position, True)
        return loss, correct, left_out, what_if, base, left_out_loss


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [G, K, N]``, ``y [G, N]`` -> per env the mean cross-entropy ``[G]`` and the correct
    count ``[G]`` (int64)."""
    ce = F.cross_entropy(logits, y, reduction="none")  # [G, N]: K is the class dim
    correct = (logits.detach().argmax(1) == y).sum(1)
    return ce.mean(1), correct


def stack_inputs(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every env's batch ``(x [N, C, *spatial], y [N])`` in the batched layout: ``x [E, C, *spatial, N]``
    and ``y [E, N]``."""
    x = torch.stack([b[0] for b in batches]).movedim(1, -1)  # [E, C, *spatial, N]
    return x.contiguous(), torch.stack([b[1] for b in batches])


__all__ = [
    "BATCHED_HOSTS",
    "SeedGroup",
    "SlotPlan",
    "StackedHosts",
    "apply_slot",
    "plan",
    "run_group",
    "stack_inputs",
    "supports",
]
