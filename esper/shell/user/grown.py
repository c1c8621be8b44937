"""The grown network, as an ``nn.Module`` of the user's own class whose slots hold the grown seeds
(:func:`grown_model`). Its slots are esper's ``Slot``: loading it needs esper importable (and a custom
blueprint registered); :func:`esper.shell.user.export.plain_module` and
:func:`~esper.shell.user.export.export_program` give artefacts that load with torch alone.

A host (:class:`~esper.shell.user.host.UserHost`) keeps the user's slots in ``host.slots`` and the
network calls them through references. :func:`grown_model` hands back a copy of the network with each
slot in its place again, holding what the host's forward used at that moment and nothing else:

- a seed that changes the forward (blended, holding, fossilized, or pruned but not yet at alpha 0: any
  stage but an incubating one, at alpha > 0) is composed permanently, by its style and gate at the alpha
  it had (stage FOSSILIZED: its input is no longer detached, so it trains with the network if the user
  trains it further; the forward value is the same);
- every other seed (incubating: the host's forward skipped it; alpha 0; pruned and removed) is dropped,
  and its slot is empty: the identity.

So the grown network's outputs are the host's, number for number (``tests/shell/host/test_user.py``). It
is saved as any network, ``torch.save(net.state_dict(), path)``, and loads back into a fresh network of
the user's class: each slot's state-dict entry ``<path>._extra_state`` describes its seed (blueprint,
family, style, stage, alpha), and the slot builds that seed before its weights load
(:meth:`esper.shell.user.host.Slot.set_extra_state`). Load on the CPU, then move the network.
"""

from __future__ import annotations

import copy

from torch import nn

from esper.core.spec import Stage
from esper.shell.host.hosts import Host
from esper.shell.host.slots import SeedSlot


def describe_seed(slot: SeedSlot) -> dict:
    """What builds ``slot``'s seed again (``{}``: it holds none): blueprint, family, style, stage, alpha
    (plain numbers and strings: a state dict loads them with ``weights_only=True``)."""
    if slot.seed is None:
        return {}
    return {"blueprint": slot.blueprint, "family": slot.family, "style": int(slot.style),
            "stage": int(slot.stage), "alpha": float(slot.alpha)}  # fmt: skip


def freeze_slot(slot: SeedSlot) -> None:
    """Make ``slot`` hold what its forward uses now, permanently: a seed that changes the forward becomes
    FOSSILIZED at the alpha it has; any other is removed."""
    if slot.contributes:
        slot.set(alpha=slot.alpha, stage=Stage.FOSSILIZED)
    elif slot.occupied:
        slot.remove()


def grown_model(host: Host) -> nn.Module:
    """A copy of the user's network in ``host`` (a :class:`~esper.shell.user.host.UserHost`) with its
    slots back in place, each holding the seed the host's forward composes now, at its alpha, or none
    (module docstring). The host is left as it was; the copy is on the host's device, in its mode."""
    paths = getattr(host, "slot_paths", None)
    if paths is None or not hasattr(host, "model"):
        raise ValueError(
            f"grown_model: a {type(host).__name__} is not the user's network in a host (UserHost); the "
            "built-in hosts are networks already"
        )
    twin = copy.deepcopy(host)
    model = twin.model
    for slot in twin.slots:
        freeze_slot(slot)
        parent, _, leaf = paths[slot.name].rpartition(".")
        model.get_submodule(parent)._modules[leaf] = slot
    return model


__all__ = ["describe_seed", "freeze_slot", "grown_model"]
