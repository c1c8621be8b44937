"""PPO on CartPole-v1 as a TorchRL user writes it, with Esper's core doing the RL math:
``esper.core.gae`` for the advantages and ``esper.core.ppo_loss`` for the loss.

    python -m examples.cartpole_ppo --seed 0 --frames 32768                  # esper's GAE and loss
    python -m examples.cartpole_ppo --seed 0 --frames 32768 --torchrl-loss   # TorchRL's GAE + ClipPPOLoss
    python -m examples.cartpole_ppo --compile                                # the minibatch step as one graph

Needs gymnasium (``pip install -e ".[examples]"``; the ``dev`` extra has it too). Everything but the
advantage and the loss is shared by the two variants: TorchRL's ``GymEnv`` (``n_envs`` of them in a
``SerialEnv``) and ``Collector``, the same actor and critic MLPs and initialization, the seed, Adam, the
clip of the gradient norm, advantage normalization over the batch, the minibatch shuffling. The esper
variant calls ``ppo_loss`` with the arguments that reproduce ``ClipPPOLoss`` exactly (README: "TorchRL
parity"), so the two differ only by which library computed the numbers.

Each batch is ``[n_envs, T]`` (time last), so ``gae`` reads it as is; the critic's values for
``state_value`` and ``("next", "state_value")`` are computed here (a collector batch does not hold them).
Minibatches have a fixed size that divides the batch: a ragged last one would recompile a compiled step.
Prints one line per batch and, with ``--out``, writes the curve as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

import esper.core as ec
from esper.shell.agent.wholestep import adam_step, compile_step, init_adam_state

#: the curve's return is the mean over this many last finished episodes
RETURN_WINDOW = 20
#: what a minibatch step reads from the batch
MB_KEYS = ("observation", "action", "action_log_prob", "advantage", "value_target", "state_value")


@dataclass(frozen=True, slots=True)
class Args:
    seed: int = 0  # torch and env seed
    frames: int = 32768  # environment steps in total
    n_envs: int = 8  # CartPole copies stepped together (a SerialEnv)
    steps: int = 64  # T: steps per env per batch
    epochs: int = 8  # passes over each batch
    minibatch: int = 256  # transitions per minibatch (must divide n_envs * steps)
    lr: float = 1e-3  # Adam learning rate
    gamma: float = 0.99
    lmbda: float = 0.95
    clip_epsilon: float = 0.2
    entropy_coef: float = 0.01
    critic_coef: float = 0.5  # on (V - target)^2: ClipPPOLoss(critic_coeff=0.5, loss_critic_type="l2")
    max_grad_norm: float = 0.5
    hidden: int = 64
    torchrl_loss: bool = False  # TorchRL's GAE + ClipPPOLoss instead of esper's gae + ppo_loss
    compile: bool = False  # the minibatch step as one compiled graph (esper variant)

    def __post_init__(self) -> None:
        batch = self.n_envs * self.steps
        if batch % self.minibatch:
            raise ValueError(f"minibatch={self.minibatch} must divide n_envs * steps = {batch}")
        if self.compile and self.torchrl_loss:
            raise ValueError("--compile applies to the esper variant")

    @property
    def frames_per_batch(self) -> int:
        return self.n_envs * self.steps


def esper_loss_args(args: Args) -> dict:
    """``ppo_loss`` arguments equal to ``ClipPPOLoss(clip_epsilon, entropy_coeff, critic_coeff,
    loss_critic_type="l2")``: no value clipping, entropy in nats."""
    return dict(
        clip_epsilon=args.clip_epsilon,
        entropy_coef=args.entropy_coef,
        value_coef=args.critic_coef,
        critic_loss="l2",
        value_clip=None,
        normalize_entropy=False,
    )


# ---------------------------------------------------------------------------------------- networks
def mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
    net.append(nn.Linear(hidden, n_out))
    for layer, gain in zip(net[::2], (math.sqrt(2), math.sqrt(2), out_gain)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return net


def make_agent(obs_dim: int, n_actions: int, hidden: int, action_spec=None):
    """Actor and critic MLPs, and their TorchRL wrappers (the collector's policy samples one-hot
    actions and stores ``action_log_prob``)."""
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator

    actor_net, critic_net = mlp(obs_dim, hidden, n_actions, 0.01), mlp(obs_dim, hidden, 1, 1.0)
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
        spec=action_spec,
    )
    return actor_net, critic_net, actor, ValueOperator(critic_net, in_keys=["observation"])


# ---------------------------------------------------------------------------------- minibatch steps
def make_esper_step(actor_net, critic_net, optimizer, args: Args, *, compiled: bool = False):
    """``step(mb) -> metrics``: forward of both MLPs, ``ppo_loss``, backward, clip, Adam. Compiled, it
    is one graph (:mod:`esper.shell.agent.wholestep`)."""
    params = [*actor_net.parameters(), *critic_net.parameters()]
    loss_args = esper_loss_args(args)

    def step(mb: TensorDictBase) -> TensorDict:
        td = mb.copy()
        obs = mb["observation"]
        td["current"] = TensorDict({"logits": actor_net(obs), "state_value": critic_net(obs)}, mb.batch_size)
        losses = ec.ppo_loss(td, **loss_args)
        ec.total_loss(losses).backward()
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        if compiled:
            adam_step(optimizer)
        else:
            optimizer.step()
        for p in params:
            p.grad = None
        return losses.select("loss_objective", "loss_critic", "entropy", "kl_approx").detach()

    if not compiled:
        return step
    init_adam_state(optimizer)
    return compile_step(step)


def make_torchrl_step(actor, critic, optimizer, args: Args, *, compile_loss: bool = False):
    """The same step with TorchRL's ``ClipPPOLoss`` (which runs the actor and critic itself);
    ``compile_loss``: the loss module under ``torch.compile`` (backward and Adam stay eager)."""
    from torchrl.objectives import ClipPPOLoss

    loss_module = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=args.clip_epsilon,
        entropy_coeff=args.entropy_coef,
        critic_coeff=args.critic_coef,
        loss_critic_type="l2",
    )
    params = list(loss_module.parameters())
    loss_fn = torch.compile(loss_module) if compile_loss else loss_module

    def step(mb: TensorDictBase) -> TensorDict:
        out = loss_fn(mb)
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.select("loss_objective", "loss_critic", "entropy", "kl_approx").detach()

    return step


# ------------------------------------------------------------------------------------------ training
def make_env(args: Args):
    from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv

    env = TransformedEnv(SerialEnv(args.n_envs, lambda: GymEnv("CartPole-v1")), RewardSum())
    env.set_seed(args.seed)
    return env


def train(args: Args, log=print) -> dict:
    """Runs one training; returns ``{"args", "curve": [[frames, mean return], ...], "wall_s"}`` where the
    mean return after each batch is over the last ``RETURN_WINDOW`` episodes that ended (NaN before the
    first one ends)."""
    from torchrl.collectors import Collector
    from torchrl.objectives.value import GAE

    torch.manual_seed(args.seed)
    env = make_env(args)
    obs_dim = env.observation_spec["observation"].shape[-1]
    n_actions = env.action_spec.shape[-1]
    actor_net, critic_net, actor, critic = make_agent(obs_dim, n_actions, args.hidden, env.action_spec)
    optimizer = torch.optim.Adam([*actor_net.parameters(), *critic_net.parameters()], lr=args.lr, eps=1e-5)
    if args.torchrl_loss:
        step = make_torchrl_step(actor, critic, optimizer, args)
        advantage = GAE(gamma=args.gamma, lmbda=args.lmbda, value_network=critic)
    else:
        step = make_esper_step(actor_net, critic_net, optimizer, args, compiled=args.compile)
        advantage = lambda batch: esper_gae(batch, critic_net, args)
    collector = Collector(
        env,
        actor,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.frames,
        split_trajs=False,
        auto_register_policy_transforms=False,  # a feed-forward policy: no InitTracker needed
    )
    curve, returns, frames, start = [], [], 0, time.perf_counter()
    for batch in collector:  # [n_envs, T]
        frames += batch.numel()
        with torch.no_grad():
            advantage(batch)
        batch["advantage"] = ec.normalize_advantage(batch["advantage"])
        data = batch.select(*MB_KEYS).reshape(-1)
        for _ in range(args.epochs):
            for idx in torch.randperm(data.shape[0]).split(args.minibatch):
                metrics = step(data[idx])
        collector.update_policy_weights_()
        ended = batch["next", "done"].squeeze(-1)
        returns += batch["next", "episode_reward"].squeeze(-1)[ended].tolist()  # sync point: logging
        recent = returns[-RETURN_WINDOW:]
        mean_return = sum(recent) / len(recent) if recent else float("nan")
        curve.append([frames, mean_return])
        log(
            f"frames {frames:6d}  return {mean_return:6.1f} (last {len(recent)} of {len(returns)} episodes)  "
            f"entropy {metrics['entropy'].item():.3f}  kl {metrics['kl_approx'].item():+.4f}  "
            f"{time.perf_counter() - start:5.1f} s"
        )
    collector.shutdown()  # closes the env too
    return {"args": dataclasses.asdict(args), "curve": curve, "wall_s": time.perf_counter() - start}


def esper_gae(batch: TensorDictBase, critic_net: nn.Module, args: Args) -> TensorDictBase:
    """The critic's values for both ends of every step, then ``esper.core.gae`` on ``[n_envs, T]``."""
    batch["state_value"] = critic_net(batch["observation"])
    batch["next", "state_value"] = critic_net(batch["next", "observation"])
    return ec.gae(batch, gamma=args.gamma, lmbda=args.lmbda)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.cartpole_ppo", description="PPO on CartPole-v1")
    for f in dataclasses.fields(Args):
        if f.type == "bool":
            parser.add_argument(f"--{f.name.replace('_', '-')}", action="store_true")
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    parser.add_argument("--out", type=Path, default=None, help="write the curve as JSON here")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared CPU)")
    ns = vars(parser.parse_args(argv))
    out, threads = ns.pop("out"), ns.pop("threads")
    torch.set_num_threads(threads)
    try:
        args = Args(**ns)
    except ValueError as exc:
        parser.error(str(exc))
    result = train(args)
    result["variant"] = "torchrl" if args.torchrl_loss else "esper" + (" compiled" if args.compile else "")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
