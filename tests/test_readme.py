"""The README's promises: its core-API snippet runs as written on a TorchRL-shaped batch (and is the one
docs/core-api.md shows), its two quick-start commands are there, its test command is the one CI runs, and
its preset list is the real one. The core-API page's list of ``ppo_loss`` outputs and its TorchRL-parity
lines name real outputs and real arguments. Its suite table quotes the committed results file it links."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tests.test_figures import check_suite_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CORE_API = (ROOT / "docs" / "core-api.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def blocks(lang: str, text: str | None = None) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README if text is None else text, flags=re.S | re.M)


def section(title: str, text: str = README, where: str = "README") -> str:
    """The text from the ``## title`` heading to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{where} has no '## {title}' section"
    return match.group(1)


def core_snippet(text: str = README, where: str = "README") -> str:
    found = [b for b in blocks("python", text) if "ec.gae(" in b and "ec.ppo_loss(" in b]
    assert len(found) == 1, f"{where} must hold exactly one python block calling ec.gae and ec.ppo_loss"
    return found[0]


def torchrl_batch(n_envs: int, T: int, obs_dim: int, n_actions: int, *, trailing_one: bool, one_hot=False):
    """What a TorchRL collector hands over (TorchRL keys, ``[n_envs, T]``, per-step scalars with the
    trailing 1 TorchRL uses, no values), and an actor and a critic sharing one linear layer."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = torch.nn.Linear(obs_dim, n_actions + 1)
    actor = lambda obs: net(obs)[..., :n_actions]
    critic = lambda obs: net(obs)[..., n_actions:] if trailing_one else net(obs)[..., n_actions]

    obs = torch.randn(n_envs, T + 1, obs_dim, generator=g)  # T steps and the observation after the last
    with torch.no_grad():
        shift = 0.3 * torch.randn(n_actions, generator=g)  # behaviour != current policy: ratios != 1
        dist = torch.distributions.Categorical(logits=actor(obs[:, :T]) + shift)
        action = dist.sample()
        log_prob = dist.log_prob(action)
    scalar = (n_envs, T, 1) if trailing_one else (n_envs, T)
    done = torch.zeros(scalar, dtype=torch.bool)
    done[:, -1] = True  # the last step of each env's segment ends its episode (truncated)
    terminated = torch.zeros(scalar, dtype=torch.bool)
    terminated[0, 2] = done[0, 2] = True  # one env terminates mid-way
    batch = TensorDict(
        {
            "observation": obs[:, :T],
            "action": torch.nn.functional.one_hot(action, n_actions) if one_hot else action,
            "action_log_prob": log_prob,
            "next": {
                "observation": obs[:, 1:],
                "reward": torch.randn(scalar, generator=g),
                "done": done,
                "terminated": terminated,
                "truncated": done & ~terminated,
            },
        },
        batch_size=[n_envs, T],
    )
    return batch, {"collector_batch": batch, "actor": actor, "critic": critic}, net


@pytest.mark.parametrize(("trailing_one", "one_hot"), [(True, False), (False, False), (True, True)])
def test_core_api_snippet_runs_on_a_torchrl_batch(trailing_one, one_hot):
    code = core_snippet()
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 15, "the core-API snippet should stay short (~10 lines)"
    batch, ns, net = torchrl_batch(4, 6, 5, 3, trailing_one=trailing_one, one_hot=one_hot)
    exec(compile(code, "README.md (core API)", "exec"), ns)

    td, losses = ns["td"], ns["losses"]
    assert td is batch  # gae writes into the user's TensorDict
    for key in ("advantage", "value_target"):
        assert td[key].shape == batch["next", "reward"].shape, key
        assert bool(torch.isfinite(td[key]).all()), key
    torch.testing.assert_close(td["advantage"].mean(), torch.tensor(0.0), atol=1e-5, rtol=0)  # normalized
    scalars = ("loss_objective", "loss_critic", "loss_entropy", "entropy", "kl_approx", "explained_variance")
    for name in scalars:
        assert losses[name].shape == () and bool(torch.isfinite(losses[name])), name
    assert losses["loss_critic"] > 0
    assert ns["stop"].dtype == torch.bool and ns["stop"].shape == ()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(bool(g.abs().sum() > 0) for g in grads)  # backward reached the user's network


def test_core_api_page_shows_the_readme_snippet():
    """docs/core-api.md repeats the README's snippet; the two must not drift apart."""
    assert core_snippet(CORE_API, "docs/core-api.md") == core_snippet()


def test_ppo_loss_returns_the_names_the_core_api_page_lists():
    _, ns, _ = torchrl_batch(2, 4, 3, 3, trailing_one=True)
    exec(compile(core_snippet(), "README.md (core API)", "exec"), ns)
    text = section("A PPO step on a TorchRL batch", CORE_API, "docs/core-api.md")
    listed = text.split("`ppo_loss` returns", 1)[1].split("per-head", 1)[0]
    names = set(re.findall(r"`(\w+)`", listed))
    assert {"loss_objective", "loss_critic", "early_stop", "ESS"} <= names  # the parse found the list
    assert names <= set(ns["losses"].keys()), names - set(ns["losses"].keys())


def test_core_api_parity_call_names_real_arguments():
    """The TorchRL-parity lines of docs/core-api.md name ppo_loss's and ClipPPOLoss's real keyword
    arguments."""
    import inspect

    from torchrl.objectives import ClipPPOLoss

    from esper.core import ppo_loss

    text = section("TorchRL compatibility", CORE_API, "docs/core-api.md")
    theirs = re.search(r"ClipPPOLoss\(actor, critic, (.*?)\)\n", text).group(1)
    ours = re.search(r"ec\.ppo_loss\(td, (.*?)\)\n", text).group(1)
    for call, fn in ((theirs, ClipPPOLoss.__init__), (ours, ppo_loss)):
        names = re.findall(r"(\w+)=", call)
        assert names and set(names) <= set(inspect.signature(fn).parameters), names


def ci_commands() -> list[str]:
    return [ln.strip() for ln in CI.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_has_the_two_setup_commands_ci_uses():
    setup = blocks("bash", section("Quick start"))
    assert len(setup) == 2, "Quick start holds two commands: install-and-run, and the tests"
    install, tests = (b.strip() for b in setup)
    assert "\n" not in install and "\n" not in tests  # one command each
    steps = [s.strip() for s in install.split("&&")]
    torch_pin = re.search(r"torch==[\w.]+", CI)
    assert torch_pin, ".ci/run pins torch"
    assert steps[0] == f"pip install {torch_pin.group(0)}"  # same pin as CI, installed first
    assert steps[1] == 'pip install -e ".[dev]"'
    assert any(shlex.split(c)[-2:] == ["-e", ".[dev]"] for c in ci_commands() if "pip install" in c)
    assert steps[2] == "python -m esper.shell.run"


def test_readme_test_command_is_the_one_ci_runs():
    tests = blocks("bash", section("Quick start"))[1].strip()
    ci_pytest = [c for c in ci_commands() if "pytest" in c]
    assert ci_pytest == [tests], (ci_pytest, tests)
    assert ci_commands()[-1] == tests  # and it is what CI ends with


def test_readme_lists_the_real_presets():
    from esper.shell.config.presets import PRESETS

    match = re.search(r"# presets: ([\w, ]+)", README)
    assert match, "the CLI section lists the presets"
    assert [p.strip() for p in match.group(1).split(",")] == list(PRESETS)


def suite_table() -> tuple[Path, list[str], list[list[str]]]:
    """The suite table of the current result (docs/results.md since issue 102 moved it out of the README):
    the results file its paragraph links, its header and its rows."""
    page = (ROOT / "docs" / "results.md").read_text()
    start = page.index("**The task suite's latest run**")
    link = re.search(r"\]\((?:\.\./)?(bench/results/suite/[\w.-]+)\.md\)", page[start:])
    assert link, "the suite paragraph links the table it quotes"
    lines = page[start:].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("| task |"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[first:end]]
    return ROOT / f"{link.group(1)}.json", cells[0], cells[2:]


def test_current_result_suite_table_quotes_the_committed_results_it_links():
    """Every number in the current result's suite table is the committed results file's, rounded as shown: the
    front door cannot drift from the run it cites (tests/test_figures.py holds every page's figures to
    their files; this is its reading by task and controller, for the table the README leads with)."""
    path, header, rows = suite_table()
    assert path.exists(), path
    tasks = json.loads(path.read_text())["tasks"]
    assert all(row[0].replace("`", "") in tasks for row in rows), (sorted(tasks), [row[0] for row in rows])
    checked = check_suite_table(path, header, rows)
    assert rows and checked >= 2 * len(rows), "the table quotes at least two controllers per task"
