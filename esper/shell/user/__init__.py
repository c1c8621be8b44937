"""Growing the user's own model: seed slots declared in any ``nn.Module`` (:class:`Slot`), the model wrapped
as a host (:class:`UserHost`), a task from the user's tensors (:func:`user_task`), and a controller that
grows it on fresh hosts, a run's trained one or a baseline (:func:`grow`), and the grown network
as a plain module (:func:`grown_model`). docs/grow-your-model.md walks
through it."""

from esper.shell.user.grow import check_controller_fits, grow
from esper.shell.user.grown import grown_model
from esper.shell.user.host import Slot, UserHost
from esper.shell.user.task import user_task

__all__ = ["Slot", "UserHost", "check_controller_fits", "grow", "grown_model", "user_task"]
