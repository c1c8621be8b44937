"""PPO loss forward + backward, eager vs compiled, and Esper vs TorchRL ``ClipPPOLoss`` on one head.

Both losses get their logits from a real policy network (an MLP trunk, ``obs -> 64 -> 64``, with a
linear head per action head and a value head), so the backward pass runs through the network, not
just into leaf logits. Each timed call is ``zero_grad -> network forward -> loss -> backward`` and
covers the actor forward on both sides (TorchRL's loss runs the actor and critic itself).

- factored: Esper's eight heads (``esper.core.spec.HEADS``, 3 slots, 6 blueprints) on a ``[envs, T]``
  batch (the recurrent layout: whole env sequences) with legality masks, ``ppo_loss(td,
  factored=True)``; eager vs ``torch.compile(fullgraph=True)`` (inductor) of the same step function;
  on a GPU with Triton, also the same step with the fused kernel as each head's log-prob / entropy / KL
  (``categorical=esper.kernels.masked_categorical``), eager and compiled.
- single head: 8 choices, TorchRL's flat keys; ``esper.core.ppo_loss`` vs ``ClipPPOLoss`` with the
  same actor/critic networks, the same settings (clip 0.2, entropy 0.01, critic 0.5 x squared error,
  no value clipping, no advantage normalization; ``ppo_loss`` gets the arguments that reproduce
  ``ClipPPOLoss`` exactly), eager and compiled. ``ClipPPOLoss`` is compiled as TorchRL users do,
  ``torch.compile(step)``; fullgraph is tried first and the outcome recorded. Measured twice: with the
  MLPs (network forward + loss + backward) and with pass-through "networks" that return a parameter
  (the loss's forward and backward alone).
- single head, whole step: the MLPs' forward, the loss, backward, ``clip_grad_norm_`` and Adam, with
  the CartPole example's step functions (``examples.cartpole_ppo``). Esper eager (``optimizer.step()``)
  and compiled as one graph (:mod:`esper.shell.agent.wholestep`); TorchRL eager, and with its loss compiled
  (``torch.compile(loss_module)``, backward and Adam eager: what TorchRL offers for a step).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

import esper.core as core
import esper.kernels as kernels
from bench.harness import Context, Row, SuiteResult, Target, round_ratio, suite
from esper.core import distributions as D
from esper.core.spec import HEADS, ActionSpec, Op

OBS, HIDDEN = 32, 64
KERNEL_ROW = "esper eager, fused kernel (Triton esper::masked_categorical)"
SPEC = ActionSpec(n_slots=3, n_blueprints=6)
#: ppo_loss arguments that reproduce the ClipPPOLoss below (clip 0.2, entropy 0.01, critic 0.5, l2)
PARITY = dict(
    clip_epsilon=0.2,
    entropy_coef=0.01,
    value_coef=0.5,
    critic_loss="l2",
    value_clip=None,
    normalize_entropy=False,
)


class Policy(nn.Module):
    """Shared trunk, one linear layer over all heads' logits (split per head), a value head."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        self.sizes = dict(sizes)
        self.trunk = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.logits = nn.Linear(HIDDEN, sum(self.sizes.values()))
        self.value = nn.Linear(HIDDEN, 1)

    def forward(self, obs: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        h = self.trunk(obs)
        logits = dict(zip(self.sizes, self.logits(h).split(list(self.sizes.values()), -1)))
        return logits, self.value(h)


def factored_rollout(policy: Policy, E: int, T: int, device: torch.device, seed: int = 0) -> TensorDict:
    """A rollout the policy could have collected: masks with >= 1 legal choice (WAIT always legal),
    actions sampled from perturbed logits, their log-probs stored."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(E, T, OBS, generator=g)
    with torch.no_grad():
        logits = {k: x.cpu() for k, x in policy(obs.to(device))[0].items()}
    td = TensorDict({"observation": obs}, [E, T])
    for head, n in SPEC.sizes.items():
        mask = torch.rand(E, T, n, generator=g) > 0.35
        mask[..., 0] |= ~mask.any(-1)
        if head == "op":
            mask[..., Op.WAIT] = True
        behaviour = logits[head] + 0.3 * torch.randn(E, T, n, generator=g)
        action = D.sample(behaviour, mask, generator=g)
        td[head] = TensorDict(
            {"action": action, "action_log_prob": D.log_prob(behaviour, action, mask), "action_mask": mask},
            [E, T],
        )
    for key in ("advantage", "state_value", "value_target"):
        td[key] = torch.randn(E, T, 1, generator=g)
    return td.to(device)


def factored_step(policy: Policy, batch: TensorDict, categorical=D.masked_categorical) -> torch.Tensor:
    """Network forward on the batch, Esper's factored PPO loss, the summed loss (the function a
    trainer compiles); ``categorical`` is the per-head function (the core's, or the fused kernel)."""
    logits, value = policy(batch["observation"])
    bs = batch.batch_size
    current = TensorDict({h: TensorDict({"logits": logits[h]}, bs) for h in HEADS}, bs)
    current["state_value"] = value
    td = batch.copy()
    td["current"] = current
    return core.total_loss(core.ppo_loss(td, factored=True, categorical=categorical))


class PassThrough(nn.Module):
    """A "network" that ignores its input and returns its own ``[E, T, width]`` parameter: with it the
    timed step is the loss's forward and backward alone (plus one multiply), on both sides."""

    def __init__(self, E: int, T: int, width: int) -> None:
        super().__init__()
        self.out = nn.Parameter(torch.randn(E, T, width))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.out * 1.0


def single_head_setup(
    E: int, T: int, device: torch.device, n: int = 8, seed: int = 0, *, networks: str = "mlp"
):
    """Batch, step functions and parameters; ``networks`` is ``"mlp"`` (real actor and critic MLPs)
    or ``"pass"`` (:class:`PassThrough`: the loss alone)."""
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss

    torch.manual_seed(seed)
    if networks == "pass":
        net, critic = PassThrough(E, T, n), PassThrough(E, T, 1)
    else:
        net = nn.Sequential(
            nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, n)
        )
        critic = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    net, critic = net.to(device), critic.to(device)
    actor = ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    value_op = ValueOperator(critic, in_keys=["observation"])
    loss_mod = ClipPPOLoss(
        actor, value_op, clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2"
    )
    obs = torch.randn(E, T, OBS, device=device)
    with torch.no_grad():
        behaviour = torch.distributions.Categorical(
            logits=net(obs) + 0.3 * torch.randn(E, T, n, device=device)
        )
        action = behaviour.sample()
    batch = TensorDict(
        {
            "observation": obs,
            "action": action,
            "action_log_prob": behaviour.log_prob(action),
            "advantage": torch.randn(E, T, 1, device=device),
            "state_value": torch.randn(E, T, 1, device=device),
            "value_target": torch.randn(E, T, 1, device=device),
        },
        [E, T],
        device=device,
    )

    def esper_step(b: TensorDict) -> torch.Tensor:
        td = b.copy()
        td["current"] = TensorDict(
            {"logits": net(b["observation"]), "state_value": critic(b["observation"])}, b.batch_size
        )
        return core.total_loss(core.ppo_loss(td, **PARITY))

    def torchrl_step(b: TensorDict) -> torch.Tensor:
        out = loss_mod(b)
        return out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]

    def network_step(b: TensorDict) -> torch.Tensor:
        """The networks' share of a step: both forwards and their backward, no loss."""
        return net(b["observation"]).sum() + critic(b["observation"]).sum()

    params = [*net.parameters(), *critic.parameters()]
    steps = {"torchrl ClipPPOLoss": torchrl_step, "esper ppo_loss": esper_step, "networks only": network_step}
    return batch, steps, params, (net, critic, actor, value_op)


def _train_call(step, batch, params):
    def call():
        for p in params:
            p.grad = None
        step(batch).backward()

    return call


def _compile(ctx: Context, step, batch, params, *, fullgraph: bool = True):
    """Compile ``step``; returns (call, note). Tries fullgraph first when asked, records failures."""
    modes = [True, False] if fullgraph else [False]
    errors = []
    for fg in modes:
        compiled = torch.compile(step, fullgraph=fg)
        call = _train_call(compiled, batch, params)
        try:
            seconds = ctx.time_once(call)
        except Exception as exc:
            errors.append(f"fullgraph={fg} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        return call, "; ".join([*errors, f"fullgraph={fg}, first fwd+bwd {seconds:.1f} s"])
    return None, "; ".join(errors)


@suite(
    "loss",
    help="PPO loss fwd+bwd: factored eager vs compiled; single head esper vs TorchRL ClipPPOLoss",
    order=20,
)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="speed-up")
    for E, T in [(4, 25)] if ctx.quick else [(4, 25), (64, 25)]:
        torch._dynamo.reset()
        _factored_case(ctx, res, E, T)
    for networks in ("mlp", "pass"):
        torch._dynamo.reset()
        _single_head_case(ctx, res, *((16, 25) if ctx.quick else (64, 25)), networks=networks)
    torch._dynamo.reset()
    _whole_step_case(ctx, res, *((16, 25) if ctx.quick else (64, 25)))
    res.notes.append(
        "speed-up column: the median over rounds of the per-round ratio; factored rows vs esper eager of "
        "the same case, single-head rows vs ClipPPOLoss eager. Single-head targets compare like with like "
        "(eager with eager, compiled with compiled)."
    )
    return res


def _factored_case(ctx: Context, res: SuiteResult, E: int, T: int) -> None:
    case = f"8 heads {E}x{T}"
    policy = Policy(SPEC.sizes).to(ctx.device)
    batch = factored_rollout(policy, E, T, ctx.device)
    params = list(policy.parameters())
    step = lambda b: factored_step(policy, b)
    fns = {"esper eager": _train_call(step, batch, params)}
    compiled, note = _compile(ctx, step, batch, params)
    if compiled is None:
        res.rows.append(Row(case, "esper compiled (inductor)", note=note))
    else:
        fns["esper compiled (inductor)"] = compiled
    notes = {"esper compiled (inductor)": note}
    if ctx.device.type == "cuda" and kernels.HAS_TRITON:  # the fused Triton masked-categorical kernel
        kstep = lambda b: factored_step(policy, b, categorical=kernels.masked_categorical)
        fns[KERNEL_ROW] = _train_call(kstep, batch, params)
        kcompiled, knote = _compile(ctx, kstep, batch, params)
        if kcompiled is None:
            res.rows.append(Row(case, KERNEL_ROW + ", compiled", note=knote))
        else:
            fns[KERNEL_ROW + ", compiled"], notes[KERNEL_ROW + ", compiled"] = kcompiled, knote
    stats = ctx.compare(fns)
    eager = stats["esper eager"]
    for name, s in stats.items():
        res.rows.append(Row(case, name, s, round_ratio(eager, s), notes.get(name, "")))
    if KERNEL_ROW not in stats:
        res.rows.append(Row(case, KERNEL_ROW, note="no GPU"))
    if "esper compiled (inductor)" in stats:
        ratio = round_ratio(eager, stats["esper compiled (inductor)"])
        res.targets.append(Target(f"{case}: compiled / eager speed-up", ratio, ">= 1.5", ratio >= 1.5))


def _single_head_case(ctx: Context, res: SuiteResult, E: int, T: int, *, networks: str) -> None:
    case = f"1 head {E}x{T}" + (", loss alone" if networks == "pass" else ", MLP networks")
    batch, steps, params, _ = single_head_setup(E, T, ctx.device, networks=networks)
    fns, notes = {}, {}
    for name, step in steps.items():
        fns[f"{name} eager"] = _train_call(step, batch, params)
    for name, step in steps.items():
        call, notes[f"{name} compiled"] = _compile(ctx, step, batch, params)
        if call is None:
            res.rows.append(Row(case, f"{name} compiled", note=notes[f"{name} compiled"]))
        else:
            fns[f"{name} compiled"] = call
    stats = ctx.compare(fns)
    base = stats["torchrl ClipPPOLoss eager"]
    for name, s in stats.items():
        note = notes.get(name, "")
        if name.startswith("networks only"):
            note = "reference: actor + critic forward and backward, no loss (included in every row above)"
            if networks == "pass":
                note = "reference: the pass-through outputs and their backward, no loss"
        res.rows.append(Row(case, name, s, round_ratio(base, s), note))
    for mode in ("eager", "compiled"):
        theirs, ours = stats.get(f"torchrl ClipPPOLoss {mode}"), stats.get(f"esper ppo_loss {mode}")
        if theirs is None or ours is None:
            res.targets.append(Target(f"{case}: ClipPPOLoss / esper ppo_loss, {mode}", None, ">= 2", None))
            continue
        ratio = round_ratio(theirs, ours)
        res.targets.append(Target(f"{case}: ClipPPOLoss / esper ppo_loss, {mode}", ratio, ">= 2", ratio >= 2))
        net = stats.get(f"networks only {mode}")
        if networks == "mlp" and net is not None and ours.median_ms > net.median_ms:
            loss_only = (theirs.median_ms - net.median_ms) / (ours.median_ms - net.median_ms)
            res.notes.append(
                f"{case} {mode}: without the networks' share ({net.median_ms:.3f} ms), the losses alone "
                f"compare {loss_only:.2f}x (ClipPPOLoss / esper)"
            )


def _whole_step_case(ctx: Context, res: SuiteResult, E: int, T: int) -> None:
    """Forward + loss + backward + clip + Adam, per implementation on its own copy of the networks (the
    same seed), each stepping its own Adam."""
    from examples.cartpole_ppo import Args, make_esper_step, make_torchrl_step

    case = f"1 head {E}x{T}, whole step"
    args = Args(clip_epsilon=0.2, entropy_coef=0.01, critic_coef=0.5)

    def fresh():
        batch, _, params, (net, critic, actor, value_op) = single_head_setup(E, T, ctx.device)
        return batch, net, critic, actor, value_op, torch.optim.Adam(params, lr=1e-4, eps=1e-5)

    builders = {
        "torchrl ClipPPOLoss eager": lambda b, n, c, a, v, o: make_torchrl_step(a, v, o, args),
        "torchrl ClipPPOLoss compiled loss": lambda b, n, c, a, v, o: make_torchrl_step(
            a, v, o, args, compile_loss=True
        ),
        "esper ppo_loss eager": lambda b, n, c, a, v, o: make_esper_step(n, c, o, args),
        "esper whole step compiled (one graph)": lambda b, n, c, a, v, o: make_esper_step(
            n, c, o, args, compiled=True
        ),
    }
    fns, notes = {}, {}
    for name, build in builders.items():
        batch, *nets, opt = fresh()
        step = build(batch, *nets, opt)
        call = lambda step=step, batch=batch: step(batch)
        try:
            seconds = ctx.time_once(call)
        except Exception as exc:  # record, never hide
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
            res.rows.append(Row(case, name, note=f"failed: {reason}"))
            continue
        notes[name] = f"first call {seconds:.1f} s" + (" (compile)" if "compiled" in name else "")
        fns[name] = call
    stats = ctx.compare(fns)
    base = stats.get("torchrl ClipPPOLoss eager")
    for name, s in stats.items():
        res.rows.append(Row(case, name, s, base and round_ratio(base, s), notes[name]))
    ours_compiled = "esper whole step compiled (one graph)"
    pairs = (
        ("eager", "torchrl ClipPPOLoss eager", "esper ppo_loss eager"),
        ("compiled", "torchrl ClipPPOLoss compiled loss", ours_compiled),
        ("esper compiled vs torchrl eager", "torchrl ClipPPOLoss eager", ours_compiled),
    )
    for label, theirs, ours in pairs:
        value = round_ratio(stats[theirs], stats[ours]) if theirs in stats and ours in stats else None
        met = None if value is None else value >= 2
        res.targets.append(Target(f"whole step {E}x{T}: ClipPPOLoss / esper, {label}", value, ">= 2", met))
