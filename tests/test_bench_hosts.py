"""bench/suites/hosts.py: the module grouped over envs is exactly the envs' separate hosts, forward and
one SGD step, so its timing compares like with like."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.suites.hosts import BATCH, CLASSES, LENGTH, GroupedHost, grouped_from, grouped_loss, host_sgd


def test_grouped_hosts_are_the_separate_hosts_forward_and_after_a_step():
    torch.manual_seed(0)
    hosts = [GroupedHost() for _ in range(3)]
    grouped = grouped_from(hosts)
    xs = [torch.randn(BATCH, 1, LENGTH) for _ in hosts]
    ys = [torch.randint(0, CLASSES, (BATCH,)) for _ in hosts]
    x, y = torch.cat(xs, 1), torch.stack(ys, 1)
    separate = torch.stack([h(xe)[:, 0] for h, xe in zip(hosts, xs)], 1)
    torch.testing.assert_close(grouped(x), separate, rtol=1e-5, atol=1e-5)

    for h, xe, ye in zip(hosts, xs, ys):
        opt = host_sgd(h.parameters())
        F.cross_entropy(h(xe)[:, 0], ye).backward()
        opt.step()
    opt = host_sgd(grouped.parameters())
    grouped_loss(grouped, x, y).backward()
    opt.step()
    for name, p in grouped.named_parameters():
        expected = torch.cat([dict(h.named_parameters())[name] for h in hosts])
        torch.testing.assert_close(p, expected, rtol=1e-4, atol=1e-6, msg=name)
