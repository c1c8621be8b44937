"""Growing the user's own model: seed slots declared in any ``nn.Module`` (:class:`Slot`), grown inside
the user's own training loop (:class:`Grower`: their optimizer, schedule, data and precision), or on
fresh hosts by :func:`grow` from a task of the user's tensors (:func:`user_task`, the model wrapped as a
host, :class:`UserHost`), by a run's trained controller or a baseline; the grown network is a plain
module of the user's class (:func:`grown_model`), and out of Esper a copy whose slots are torch's own
modules (:func:`plain_module`) or a ``torch.export`` program (:func:`export_program`), which load without
esper. docs/grow-your-model.md walks through it."""

from esper.shell.user.export import export_program, plain_module
from esper.shell.user.grow import check_controller_fits, grow
from esper.shell.user.grower import Grower
from esper.shell.user.grown import grown_model
from esper.shell.user.host import Slot, UserHost
from esper.shell.user.task import user_task

__all__ = [
    "Grower",
    "Slot",
    "UserHost",
    "check_controller_fits",
    "export_program",
    "grow",
    "grown_model",
    "plain_module",
    "user_task",
]
