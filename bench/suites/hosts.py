"""Would training the envs' hosts as one model buy more episodes an update? One SGD step of E hosts
as E separate modules (what ``EnvModel.train_epoch`` does, env by env) against one module whose
convolutions are grouped over the E envs (each env its own input channel, its own weights and its
own batch of signals), at the default's host shape.

The model is a stand-in, not esper's host: the default :class:`~esper.shell.host.hosts.CNN1dHost`
(1 -> 8 -> 8 -> 8 pointwise convolutions, batch norm, ReLU, max-pools 2, 2, 1, a linear head on the
mean over positions) with a ``conv_heavy``-shaped seed after the first block (k3 conv -> group norm ->
ReLU -> k3 conv, added), fully blended. Grouping it is exact (:func:`grouped_from`; a test checks the
logits). Seeds differ from env to env in the real loop (blueprint, slot, stage), so this is what
grouping could give at best, before any of that bookkeeping.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.harness import Context, Row, SuiteResult, round_ratio, suite

BATCH, LENGTH, WIDTH, CLASSES = 128, 40, 8, 10


class GroupedHost(nn.Module):
    """``envs`` hosts of the default's shape in one module (``envs=1``: one ordinary host).
    ``forward``: signals ``[N, envs, L]`` (env e's batch in channel e) -> logits ``[N, envs, classes]``."""

    def __init__(self, envs: int = 1):
        super().__init__()
        c, g = WIDTH * envs, envs
        self.envs = envs
        self.conv0 = nn.Conv1d(g, c, 1, bias=False, groups=g)
        self.norm0 = nn.BatchNorm1d(c)
        self.seed_in = nn.Conv1d(c, c, 3, padding=1, bias=False, groups=g)
        self.seed_norm = nn.GroupNorm(2 * g, c)  # two groups per env, as the seed's own GN(2, 8)
        self.seed_out = nn.Conv1d(c, c, 3, padding=1, bias=False, groups=g)
        self.conv1 = nn.Conv1d(c, c, 1, bias=False, groups=g)
        self.norm1 = nn.BatchNorm1d(c)
        self.conv2 = nn.Conv1d(c, c, 1, bias=False, groups=g)
        self.norm2 = nn.BatchNorm1d(c)
        self.head = nn.Conv1d(c, CLASSES * g, 1, groups=g)  # a linear head per env

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool1d(F.relu(self.norm0(self.conv0(x))), 2)
        x = x + self.seed_out(F.relu(self.seed_norm(self.seed_in(x))))
        x = F.max_pool1d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.relu(self.norm2(self.conv2(x)))
        return self.head(x.mean(-1, keepdim=True)).view(x.shape[0], self.envs, CLASSES)


def grouped_from(hosts: list[GroupedHost]) -> GroupedHost:
    """One grouped module holding ``hosts``' parameters (every tensor's env-e block is host e's)."""
    grouped = GroupedHost(len(hosts))
    with torch.no_grad():
        for name, p in grouped.named_parameters():
            p.copy_(torch.cat([dict(h.named_parameters())[name] for h in hosts]))
    return grouped


def host_sgd(params) -> torch.optim.Optimizer:
    """The hosts' optimizer in this suite and its test (both sides of the comparison use it)."""
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def grouped_loss(grouped: GroupedHost, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum over envs of each env's mean cross-entropy (``x [N, E, L]``, ``y [N, E]``): its gradient
    in env e's parameters is env e's own."""
    return F.cross_entropy(grouped(x).reshape(-1, CLASSES), y.reshape(-1), reduction="sum") / x.shape[0]


@suite("grouped_hosts", help="E hosts' SGD step: E modules vs one module grouped over the envs", order=60)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="x vs separate")
    for envs in (8,) if ctx.quick else (8, 16):
        _case(ctx, res, envs)
    res.notes.append(
        "A stand-in at the default host's shape with one conv_heavy-shaped seed (bench/suites/hosts.py); "
        "one SGD step of every env's host per call. What grouping the envs could buy at best: real envs "
        "differ in their seeds."
    )
    return res


def _case(ctx: Context, res: SuiteResult, envs: int) -> None:
    hosts = [GroupedHost().to(ctx.device) for _ in range(envs)]
    grouped = grouped_from(hosts).to(ctx.device)
    xs = [torch.randn(BATCH, 1, LENGTH, device=ctx.device) for _ in range(envs)]
    ys = [torch.randint(0, CLASSES, (BATCH,), device=ctx.device) for _ in range(envs)]
    x, y = torch.cat(xs, 1), torch.stack(ys, 1)
    opts = [host_sgd(h.parameters()) for h in hosts]
    opt = host_sgd(grouped.parameters())

    def separate():
        for host, o, xe, ye in zip(hosts, opts, xs, ys):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(host(xe)[:, 0], ye).backward()
            o.step()

    def one_module():
        opt.zero_grad(set_to_none=True)
        grouped_loss(grouped, x, y).backward()
        opt.step()

    stats = ctx.compare({"separate": separate, "grouped": one_module})
    case = f"{envs} envs x batch {BATCH}"
    res.rows.append(Row(case, f"{envs} separate modules", stats["separate"], ratio=1.0))
    res.rows.append(Row(case, "one module, convs grouped over envs", stats["grouped"],
                        ratio=round_ratio(stats["separate"], stats["grouped"])))  # fmt: skip
