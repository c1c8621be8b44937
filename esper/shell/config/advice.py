"""Warnings for settings that are legal but suspicious (issue 92): a config that passes validation can
still ask for something a run rarely wants, a discount that sees a few steps ahead or a clip that lets
the policy jump. :func:`suspicious_settings` says so in one line per setting; ``python -m
esper.shell.run`` prints them on stderr once, when the config is resolved (before anything is built),
as ``esper: warning: ...`` lines, and ``--warnings false`` silences them. No preset raises one.

The thresholds are where the PPO literature and this project's runs stop having examples, not
hard limits: a run outside them may be right, which is why it is a warning and not a refusal.
"""

from __future__ import annotations

import sys
from typing import TextIO

from esper.shell.config.presets import RunConfig

#: ``ppo.gamma`` below this: the discount sees about ``1 / (1 - gamma)`` steps ahead, 10 at 0.9.
GAMMA_MIN = 0.9
#: ``ppo.gae_lambda`` below this: the advantage leans on the critic's guesses, biased early in a run.
GAE_LAMBDA_MIN = 0.8
#: ``ppo.clip_epsilon`` above this: the surrogate barely restrains a step (0.1-0.3 is PPO's range).
CLIP_MAX = 0.3
#: ``ppo.entropy_coef`` above this: the entropy bonus can outweigh the advantage of every head.
ENTROPY_COEF_MAX = 0.1
#: ``ppo.lr`` above this: AdamW steps of 1e-2 and more are rarely stable for an LSTM policy.
LR_MAX = 1e-2
#: ``ppo.n_epochs`` above this with no ``ppo.target_kl``: nothing stops the policy drifting off its data.
N_EPOCHS_MAX = 10
#: ``ppo.max_grad_norm`` above this: the clip is effectively off.
MAX_GRAD_NORM_MAX = 10.0


def suspicious_settings(cfg: RunConfig) -> list[str]:
    """One line per legal but suspicious setting of ``cfg`` (empty: none), each naming the field, its
    value and why it is suspicious."""
    p = cfg.ppo
    found = []
    if cfg.policy != "ppo":  # the heuristic learns nothing: the PPO section is not used
        return found
    if p.gamma < GAMMA_MIN:
        found.append(
            f"ppo.gamma {p.gamma:g} is below {GAMMA_MIN:g}: the discount sees about {1 / (1 - p.gamma):.1f} "
            f"steps ahead of a {cfg.lifecycle.max_epochs}-step episode, and a seed pays epochs after it grows"
        )
    if p.gae_lambda < GAE_LAMBDA_MIN:
        found.append(
            f"ppo.gae_lambda {p.gae_lambda:g} is below {GAE_LAMBDA_MIN:g}: the advantages lean on the "
            "critic's guesses, which are poor early in a run"
        )
    if p.clip_epsilon > CLIP_MAX:
        found.append(
            f"ppo.clip_epsilon {p.clip_epsilon:g} is above {CLIP_MAX:g}: the surrogate barely restrains a "
            "step (PPO's usual range is 0.1-0.3)"
        )
    for name, coef in (("entropy_coef", p.entropy_coef), ("entropy_coef_end", p.entropy_coef_end)):
        if coef is not None and coef > ENTROPY_COEF_MAX:
            found.append(
                f"ppo.{name} {coef:g} is above {ENTROPY_COEF_MAX:g}: the entropy bonus can outweigh "
                "the advantages and keep the policy uniform"
            )
    for name, lr in (("lr", p.lr), ("lr_end", p.lr_end)):
        if lr is not None and lr > LR_MAX:
            found.append(f"ppo.{name} {lr:g} is above {LR_MAX:g}: AdamW steps this large rarely stay stable")
    if p.n_epochs > N_EPOCHS_MAX and p.target_kl is None:
        found.append(
            f"ppo.n_epochs {p.n_epochs} with no ppo.target_kl: nothing stops {p.n_epochs} passes from "
            "taking the policy far from the one that collected the batch (set --ppo.target_kl)"
        )
    if p.max_grad_norm > MAX_GRAD_NORM_MAX:
        found.append(
            f"ppo.max_grad_norm {p.max_grad_norm:g} is above {MAX_GRAD_NORM_MAX:g}: the gradient clip is "
            "effectively off"
        )
    return found


def print_warnings(cfg: RunConfig, file: TextIO | None = None) -> list[str]:
    """Print :func:`suspicious_settings` of ``cfg`` on ``file`` (stderr), one ``esper: warning:`` line
    each, unless ``cfg.warnings`` is off; returns the lines printed."""
    if not cfg.warnings:
        return []
    lines = [f"esper: warning: {w} (--warnings false silences these)" for w in suspicious_settings(cfg)]
    for line in lines:
        print(line, file=file or sys.stderr)
    return lines


__all__ = ["print_warnings", "suspicious_settings"]
