"""What every process of a run must agree on, and how the learner gets there: a rollout refused
everywhere if one process's is not finite, running statistics merged over every process's part, the
update's metrics, the LSTM's health and the advantage statistics reduced to the whole batch's, a kept
rollout gathered whole. With one process each is the plain single-process operation."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.normalize import batch_stats, merge_running_stats, update_running_stats
from esper.shell.common.distributed import Dist


def check_finite(td: TensorDictBase) -> None:
    """Raise naming every non-finite floating key (one host sync for the whole batch)."""
    keys = [k for k in td.keys(True, True) if td[k].is_floating_point()]
    if not keys:
        return
    flags = torch.stack([torch.isfinite(td[k]).all() for k in keys])
    if not bool(flags.all()):  # sync point
        bad = [k for k, ok in zip(keys, flags.tolist()) if not ok]
        raise FloatingPointError(f"non-finite values in the rollout under {bad}; refusing to update")


def check_finite_everywhere(batch: TensorDictBase, dist: Dist) -> None:
    """:func:`check_finite`, and with several processes every one raises if one's rollout is bad."""
    try:
        check_finite(batch)
    except FloatingPointError:
        if dist.active:
            dist.all_reduce_sum(torch.ones(1, device=batch.device))
        raise
    if dist.active and dist.all_reduce_sum(torch.zeros(1, device=batch.device)).item():
        raise FloatingPointError("non-finite values in another process's rollout; refusing to update")


def update_stats(
    stats: TensorDict, x: torch.Tensor, dist: Dist, momentum: float | None = None,
    valid: torch.Tensor | None = None,
) -> TensorDict:  # fmt: skip
    """``stats`` updated with the batch ``x`` (``valid``: bool over its leading dims, False samples
    ignored); with several processes, with the whole batch (every process's part, merged exactly in rank
    order), so every process holds the same statistics."""
    if not dist.active:
        return update_running_stats(stats, x, valid=valid, momentum=momentum)
    part = batch_stats(x, stats["mean"].dim(), valid=valid)
    flat = torch.cat([part["count"].reshape(1), part["mean"].reshape(-1), part["var"].reshape(-1)])
    whole = None
    for row in dist.gather_tensors(flat):
        n, rest = row[0], row[1:]
        mean, var = rest.chunk(2)
        p = TensorDict({"mean": mean.view_as(part["mean"]), "var": var.view_as(part["var"]), "count": n})
        whole = p if whole is None else merge_running_stats(whole, p)
    return merge_running_stats(stats, whole, momentum=momentum)


def reduce_report(report: TensorDict, dist: Dist) -> TensorDict:
    """The mean step metrics of the whole batch from every process's: sums of the shares (loss
    terms, KL, entropy, clip fractions, ``mean_ratio``), max / min of the ratio extremes, the mean
    over processes of ``ESS`` (an average of the parts', not the whole's); gradient statistics,
    head weights, the explained variance and the adaptive value coefficient are already the whole
    minibatch's everywhere."""
    if not dist.active:
        return report
    for key in report.keys(True, True):
        path = key if isinstance(key, tuple) else (key,)
        if path[0] == "grad" or path[-1] in ("weight", "explained_variance", "value_coef"):
            continue
        op = {"max_ratio": "max", "min_ratio": "min"}.get(path[-1], "sum")
        value = dist.all_reduce(report[key].clone(), op)
        if path[-1] == "ESS":
            value = value / dist.world
        report[key] = value
    return report


def reduce_health(report: TensorDict, dist: Dist) -> TensorDict:
    """A health report (:func:`esper.core.health.lstm_health`) of the whole batch from every process's
    part (each holds as many envs): maxima (``*_max``) the largest, counts (integer leaves) summed, means
    and shares averaged over processes."""
    if not dist.active:
        return report
    for key in report.keys():
        value = report[key].clone()
        if key.endswith("_max"):
            report[key] = dist.all_reduce(value, "max")
        elif not value.is_floating_point():
            report[key] = dist.all_reduce_sum(value)
        else:
            report[key] = dist.all_reduce_sum(value) / dist.world
    return report


def advantage_stats(adv: torch.Tensor, valid: torch.Tensor | None, dist: Dist) -> TensorDict:
    """The statistics of the advantages ``adv [*B, T]`` over the valid steps of the whole batch (every
    process's part): ``mean``, ``std``, ``max_abs`` and ``pos_frac`` (share of steps above 0), float32
    0-dim tensors; zeros for no valid step. No host sync (finding M12: each update reports them)."""
    a = adv.detach().double().reshape(-1)
    w = (torch.ones_like(a) if valid is None else valid.reshape(-1).to(a.device)).double()
    sums = torch.stack([w.sum(), (w * a).sum(), (w * a.square()).sum(), (w * (a > 0).double()).sum()])
    peak = torch.where(w > 0, a.abs(), 0.0).amax() if a.numel() else a.new_zeros(())
    if dist.active:
        sums = dist.all_reduce_sum(sums)
        peak = dist.all_reduce(peak, "max")
    n = sums[0].clamp(min=1.0)
    mean = sums[1] / n
    var = (sums[2] / n - mean.square()).clamp(min=0.0)
    return TensorDict(
        {"mean": mean, "std": var.sqrt(), "max_abs": peak, "pos_frac": sums[3] / n}, batch_size=[]
    ).float()


def whole_rollout(part: TensorDictBase, dist: Dist) -> TensorDictBase:
    """A kept rollout with every process's envs, in rank order (this process's part alone)."""
    if not dist.active:
        return part
    parts = dist.gather_objects(part.cpu().to_dict())
    return torch.cat([TensorDict(d, batch_size=part.batch_size) for d in parts], 0)


def shape_key(td: TensorDictBase) -> tuple:
    """What must match for two rollouts to share a minibatch: every entry's shape past the env dim (the
    episode's length and the host's slots and blueprints)."""
    return tuple(sorted((str(k), tuple(v.shape[1:])) for k, v in td.items(True, True)))


def keep_replay(rollouts: list[TensorDictBase], k: int) -> list[TensorDictBase]:
    """The rollouts ``ppo.replay`` keeps, newest first: the ``k`` newest of each shape (:func:`shape_key`),
    so training on several tasks keeps ``k`` of each task's host shape (one task: the ``k`` newest)."""
    seen: dict[tuple, int] = {}
    out = []
    for td in rollouts:
        key = shape_key(td)
        if seen.get(key, 0) < k:
            seen[key] = seen.get(key, 0) + 1
            out.append(td)
    return out


__all__ = [
    "advantage_stats",
    "check_finite",
    "check_finite_everywhere",
    "keep_replay",
    "reduce_health",
    "reduce_report",
    "shape_key",
    "update_stats",
    "whole_rollout",
]
