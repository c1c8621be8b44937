"""The environment's configuration (:class:`EnvConfig`: task, data, host optimizers, devices) and the
checks of a device against this machine."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from esper.shell.common.fields import check_fields, doc
from esper.shell.env.tasks import DEEP_BLOCKS, TASK_FACTORIES, Task, make_task

#: The task names (``env.task``), in the order of :data:`esper.shell.env.tasks.TASK_FACTORIES`.
TASKS = tuple(TASK_FACTORIES)
#: Tasks whose data is generated from a seed (``env.data_seed``: another seed, a fresh draw of every
#: split). The others are fixed datasets: their test split is the only held-out draw.
GENERATED_TASKS = (
    "mnist1d",
    "mnist1d_deep",
    "longrange",
    "retrieval",
    "recall",
    "mnist1d_where",
    "mnist1d_when",
)
#: Families of hosts (issue 89): tasks whose hosts (and, for some, data) differ by host seed
#: (:attr:`esper.shell.env.tasks.Task.make_host_for`); each host's widths are the family's draw.
FAMILY_TASKS = ("mnist1d_where", "mnist1d_when")


#: Tasks whose data is read from --env.data_path (nothing is ever downloaded).
LOCAL_TASKS = ("cifar10", "tinystories")


LR_SCHEDULES = ("constant", "cosine")
#: How the envs' hosts train (``env.host_step``).
HOST_STEPS = ("auto", "batched", "per_env")


#: Tasks whose host is a CNN (``env.channels`` sets its blocks' widths).
CNN_TASKS = (
    "mnist1d",
    "mnist1d_deep",
    "longrange",
    "retrieval",
    "digits",
    "digits_shallow",
    "cifar10",
    *FAMILY_TASKS,
)
#: The 1-D CNN tasks' block counts: their hosts take a kernel and a pool per block, so ``env.channels``
#: gives exactly this many widths. A 2-D host takes one width per block, as many blocks as its 2×2
#: pools leave pixels for (``2 ** blocks <= image side``).
SIGNAL_BLOCKS = {"mnist1d": 3, "mnist1d_deep": DEEP_BLOCKS, "longrange": 3, "retrieval": 3}
#: Tasks that read scikit-learn's digits (``env.image_size`` resizes them).
DIGITS_TASKS = ("digits", "digits_shallow")
#: The image side of each 2-D task's host (digits tasks: ``env.image_size``, 0 for the task's own).
IMAGE_SIDES = {"digits": 16, "digits_shallow": 32, "cifar10": 32}


@dataclass(frozen=True, slots=True)
class EnvConfig:
    task: str = doc("mnist1d", f"task: {' | '.join(TASKS)}")
    data_seed: int | None = doc(
        None, f"generated data ({', '.join(GENERATED_TASKS)}): the seed of its draw (none: the task's own, "
        "mnist1d 42, longrange 7, retrieval 11); fixed datasets refuse it", ge=0,
    )  # fmt: skip
    data_path: str | None = doc(
        None, "local data path (cifar10: the binary batches' folder; tinystories: a .txt)"
    )
    n_envs: int = doc(4, "hosts trained side by side; one PPO batch is one episode of each", ge=1)
    batch_size: int = doc(0, "host training batch size (0: the task's default)", ge=0)
    train_batches: int = doc(0, "training batches per epoch per env (0: the task's default)", ge=0)
    val_batches: int = doc(0, "validation batches per epoch (0: the task's default)", ge=0)
    image_size: int = doc(
        0, "digits tasks: side the 8x8 images are resized to (0: the task's own, digits 16, "
        "digits_shallow 32)", ge=0,
    )  # fmt: skip
    channels: tuple[int, ...] = doc(
        (), "CNN hosts: one width per block (empty: the task's default; the 1-D tasks' hosts have a fixed "
        "block count: mnist1d 3, mnist1d_deep 5, longrange 3)"
    )  # fmt: skip
    host_lr: float = doc(0.01, "host SGD learning rate", gt=0)
    seed_lr: float = doc(0.01, "seed SGD learning rate", gt=0)
    momentum: float = doc(0.9, "SGD momentum (host and seeds)", ge=0, lt=1)
    weight_decay: float = doc(5e-4, "host weight decay", ge=0)
    slots: tuple[int, ...] = doc((), "enabled slot indices (empty: all of the host's slots)", ge=0)
    device: str = doc("cpu", "device of the policy (and of the hosts unless devices is set)")
    devices: tuple[str, ...] = doc((), "devices for the hosts, assigned round-robin (empty: device)")
    amp: bool = doc(
        False, "mixed precision for host training: fp16 + a GradScaler per env on CUDA, bf16 on CPU"
    )
    workers: int = doc(
        1,
        "CPU: envs trained concurrently by this many threads (1: one after the other; on the batched "
        "path, the envs split into this many batches, a thread each)",
        ge=1,
    )
    lr_schedule: str = doc(
        "constant", "host and seed learning rates over an episode: constant | cosine (1 -> 0 over the epochs)"
    )
    host_step: str = doc(
        "auto",
        "how the envs' hosts train: batched (every env's host and seeds as one batch; CNN tasks on one "
        "device) | per_env (env by env, a CUDA stream each, a GradScaler each with amp: the reference) | "
        "auto (batched where it applies)",
    )
    budget_shares: tuple[float, ...] = doc(
        (),
        "a budget the controller reads (issue 89): each episode draws its parameter budget from these "
        "shares of what grow_all adds (one a batch, by the run seed and the episode; evaluate "
        "--budget-share fixes one); it is the learned controller's hard cap and the reward's budget "
        "(in place of ppo.param_cap_share and reward.param_budget_share), and the set policy reads it "
        "(the descriptors' params_vs_budget). Empty: off",
        gt=0,
    )

    def __post_init__(self) -> None:
        if self.task not in TASKS:  # first: the checks below depend on the task
            raise ValueError(f"env.task must be one of {TASKS}, got {self.task!r}")
        check_fields(self, "env")
        for name, value in (("env.device", self.device), *(("env.devices", d) for d in self.devices)):
            parse_device(value, name)
        if 0 < self.image_size < 8:
            raise ValueError(f"env.image_size: 0 (the task's own) or a side >= 8, got {self.image_size}")
        if self.channels and (why := self._bad_channels()):
            raise ValueError(f"env.channels: {why}; got {self.channels}")
        if self.data_seed is not None and self.task not in GENERATED_TASKS:
            raise ValueError(
                f"env.data_seed: task {self.task!r} is a fixed dataset (its test split is the only held-out "
                f"draw); data seeds draw generated data: {', '.join(GENERATED_TASKS)}"
            )
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"env.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.task in LOCAL_TASKS and not self.data_path:
            raise ValueError(f"task {self.task!r} reads local files: pass --env.data_path PATH")
        if self.task not in LOCAL_TASKS and self.data_path:
            raise ValueError(f"task {self.task!r} ships with the code; --env.data_path is not used by it")
        if self.host_step not in HOST_STEPS:
            raise ValueError(f"env.host_step must be one of {HOST_STEPS}, got {self.host_step!r}")
        if self.host_step == "batched" and (why := self._not_batched()):
            raise ValueError(f"env.host_step batched: {why}; use --env.host_step per_env (or auto)")

    def _bad_channels(self) -> str | None:
        """What is wrong with ``channels`` for the task's host (None: nothing)."""
        if self.task in FAMILY_TASKS:
            return f"task {self.task!r} is a family: it draws each host's widths"
        if self.task not in CNN_TASKS:
            return f"for the CNN tasks only ({', '.join(CNN_TASKS)}), not {self.task!r}"
        if min(self.channels) < 1:
            return "widths must be >= 1"
        if self.task in SIGNAL_BLOCKS and len(self.channels) != (n := SIGNAL_BLOCKS[self.task]):
            return f"{n} widths for task {self.task!r} (its host has {n} blocks)"
        side = (self.image_size if self.task in DIGITS_TASKS else 0) or IMAGE_SIDES.get(self.task, 0)
        if self.task in IMAGE_SIDES and 2 ** len(self.channels) > side:
            return f"at most {side.bit_length() - 1} widths for {side}x{side} images (a 2x2 pool per block)"
        return None

    def _not_batched(self) -> str | None:
        """Why the hosts cannot train as one batch (None: they can)."""
        if self.task not in CNN_TASKS:
            return f"task {self.task!r} has a transformer host, which trains env by env"
        if len(set(self.devices)) > 1:
            return f"the hosts are spread over devices {self.devices}"
        device = self.devices[0] if self.devices else self.device
        if self.amp and parse_device(device).type == "cuda":
            return "CUDA amp needs a GradScaler per env"
        return None

    @property
    def batched(self) -> bool:
        """Whether the hosts train as one batch (:class:`~esper.shell.host.batched.BatchedHosts`)."""
        return self.host_step != "per_env" and self._not_batched() is None

    def build_task(self) -> Task:
        kwargs: dict = {}
        if self.batch_size:
            kwargs["batch_size"] = self.batch_size
        if self.train_batches:
            kwargs["max_batches"] = self.train_batches
        if self.val_batches:
            kwargs["val_max_batches"] = self.val_batches
        if self.image_size and self.task in DIGITS_TASKS:
            kwargs["image_size"] = self.image_size
        if self.channels:
            kwargs["channels"] = self.channels
        if self.data_seed is not None:
            kwargs["data_seed"] = self.data_seed
        if self.task in LOCAL_TASKS:
            kwargs["path"] = self.data_path
        return make_task(self.task, **kwargs)


def parse_device(value: str, name: str = "device") -> torch.device:
    """``value`` as a :class:`torch.device`, or a one-line ``ValueError`` naming the option."""
    try:
        return torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name}: {value!r} is not a device (e.g. cpu, cuda, cuda:1, mps)") from None


def check_devices(cfg: EnvConfig) -> None:
    """Refuse, in one line, a device this machine does not have (``cuda`` on a CPU-only machine or
    build, ``cuda:3`` with two GPUs, ``mps`` off Apple silicon). Config parsing cannot do this: a
    config is valid on the GPU machine it was written for."""
    for name, value in (("env.device", cfg.device), *(("env.devices", d) for d in cfg.devices)):
        dev = parse_device(value, name)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(
                    f"{name} {value!r}: CUDA is not available on this machine (no GPU, or a CPU-only torch "
                    "build); use --env.device cpu"
                )
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                n = torch.cuda.device_count()
                raise ValueError(f"{name} {value!r}: this machine has {n} CUDA device(s)")
        elif dev.type == "mps" and not torch.backends.mps.is_available():
            raise ValueError(f"{name} {value!r}: MPS is not available on this machine; use --env.device cpu")
        elif dev.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"{name} {value!r}: esper runs on cpu, cuda or mps devices")


def lr_scale(schedule: str, epoch: int, max_epochs: int) -> float:
    """Learning-rate multiplier for training epoch ``epoch`` (1-based) of ``max_epochs``: 1 for
    ``constant``; for ``cosine`` a half cosine from 1 at the first epoch to 0 after the last."""
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / max(max_epochs, 1)))


__all__ = [
    "CNN_TASKS",
    "DIGITS_TASKS",
    "FAMILY_TASKS",
    "GENERATED_TASKS",
    "HOST_STEPS",
    "IMAGE_SIDES",
    "LOCAL_TASKS",
    "LR_SCHEDULES",
    "SIGNAL_BLOCKS",
    "TASKS",
    "EnvConfig",
    "check_devices",
    "lr_scale",
    "parse_device",
]
