"""The examples run.

- The CartPole example learns: TorchRL's GymEnv and collector, ``esper.core.gae`` and ``ppo_loss``, a
  short budget in a subprocess, and a mean return far above a random policy's (~20).
- The grow-your-model example grows a network it defines on data it generates, with the heuristic and
  with a run's trained controller (zero-shot), on tiny sizes in a subprocess.
- The grow-in-your-loop example grows that network in an ordinary training loop with a run's controller,
  saves it and reloads it into a fresh network.
- The grow-transformer example grows a byte-level transformer LM of its own in an ordinary loop on the
  source of a few standard-library modules, and exports it as a torch.export program.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

#: The CartPole example needs the 'examples' extra (gymnasium); the others run without it.
needs_gym = pytest.mark.skipif(
    importlib.util.find_spec("gymnasium") is None, reason="the example needs the 'examples' extra (gymnasium)"
)


@needs_gym
@pytest.mark.e2e
def test_cartpole_example_learns(tmp_path):
    """12,288 frames (24 batches, ~5 s of training): the mean of the last 20 episodes' returns ends
    above 100 (seeds 0-4 end between 155 and 236 on this budget; a random policy scores ~20)."""
    out = tmp_path / "curve.json"
    cmd = [sys.executable, "-m", "examples.cartpole_ppo", "--seed", "0", "--frames", "12288"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    curve = result["curve"]
    assert result["variant"] == "esper" and len(curve) == 24
    first, last = curve[0][1], curve[-1][1]
    assert first < 40, f"a fresh policy should play like a random one, got {first}"
    assert last > 100, f"the return should climb well above random's ~20, got {[round(r) for _, r in curve]}"


@needs_gym
def test_esper_loss_arguments_are_clip_ppo_loss_settings():
    """The example's two variants compute the same loss (the parity the README documents)."""
    import torch
    from tensordict import TensorDict

    from examples.cartpole_ppo import Args, make_agent, make_esper_step, make_torchrl_step

    args = Args(minibatch=64)
    torch.manual_seed(0)
    actor_net, critic_net, actor, critic = make_agent(4, 2, 16)
    obs = torch.randn(64, 4)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=actor_net(obs) + 0.3 * torch.randn(64, 2))
        action = dist.sample()
    mb = TensorDict(
        {
            "observation": obs,
            "action": torch.nn.functional.one_hot(action, 2),
            "action_log_prob": dist.log_prob(action),
            "advantage": torch.randn(64, 1),
            "value_target": torch.randn(64, 1),
            "state_value": torch.randn(64, 1),
        },
        [64],
    )
    params = [*actor_net.parameters(), *critic_net.parameters()]
    sgd = torch.optim.SGD(params, lr=0.0)  # a step that changes nothing: both see the same networks
    ours = make_esper_step(actor_net, critic_net, sgd, args)(mb)
    theirs = make_torchrl_step(actor, critic, sgd, args)(mb)
    for key in ("loss_objective", "loss_critic", "entropy"):
        torch.testing.assert_close(ours[key], theirs[key].reshape(()), msg=key)


def _step_setup(minibatch: int = 64, seed: int = 0):
    import torch
    from tensordict import TensorDict

    from examples.cartpole_ppo import Args, make_agent

    torch.manual_seed(seed)
    actor_net, critic_net, *_ = make_agent(4, 2, 16)
    opt = torch.optim.Adam([*actor_net.parameters(), *critic_net.parameters()], lr=1e-2, eps=1e-5)

    def batch(i: int) -> TensorDict:
        g = torch.Generator().manual_seed(100 + i)
        obs = torch.randn(minibatch, 4, generator=g)
        with torch.no_grad():
            logits = actor_net(obs) + 0.3 * torch.randn(minibatch, 2, generator=g)
        action = torch.distributions.Categorical(logits=logits).sample()
        lp = torch.distributions.Categorical(logits=logits).log_prob(action)
        scalar = lambda: torch.randn(minibatch, 1, generator=g)
        return TensorDict(
            {"observation": obs, "action": torch.nn.functional.one_hot(action, 2), "action_log_prob": lp,
             "advantage": scalar(), "value_target": scalar(), "state_value": scalar()},
            [minibatch],
        )  # fmt: skip

    return Args(minibatch=minibatch), actor_net, critic_net, opt, batch


def _compiled_equals_eager(monkeypatch, backend) -> list:
    """Six minibatches (two "batches" of three) through the eager and the compiled example step;
    returns the graphs the compiled one built."""
    import torch

    import examples.cartpole_ppo as ex
    from esper.shell.agent.wholestep import compile_step

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        if backend == "aot_eager":
            from torch._dynamo.backends.debugging import aot_eager

            return aot_eager(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    monkeypatch.setattr(ex, "compile_step", lambda fn: compile_step(fn, backend=counting))
    torch._dynamo.reset()
    args, a1, c1, o1, batch = _step_setup()
    _, a2, c2, o2, _ = _step_setup()
    eager = ex.make_esper_step(a1, c1, o1, args)
    compiled = ex.make_esper_step(a2, c2, o2, args, compiled=True)
    for i in range(6):
        mb = batch(i)
        m1, m2 = eager(mb.clone()), compiled(mb.clone())
        for key in m1.keys():
            torch.testing.assert_close(m2[key], m1[key], rtol=1e-4, atol=1e-5)
    for p, q in zip([*a1.parameters(), *c1.parameters()], [*a2.parameters(), *c2.parameters()]):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    return graphs


@needs_gym
def test_example_compiled_step_is_one_graph_without_recompiles(monkeypatch):
    """Forward of both MLPs, ppo_loss, backward, clip and Adam: one fullgraph (aot_eager) reused by
    every minibatch, with the eager step's losses and parameters."""
    assert len(_compiled_equals_eager(monkeypatch, "aot_eager")) == 1


@needs_gym
@pytest.mark.inductor
def test_example_compiled_step_inductor_equals_eager(monkeypatch):
    assert len(_compiled_equals_eager(monkeypatch, "inductor")) == 1


# ----------------------------------------------------------------------------------- grow your model
def _grow_example(tmp_path: Path, *args: str) -> tuple[str, dict]:
    """The example on tiny sizes (2 hosts, 3 epochs, 128 training signals); its output and its JSON."""
    out = tmp_path / "grown.json"
    cmd = [sys.executable, "-m", "examples.grow_your_model", "--episodes", "2", "--epochs", "3",
           "--train", "128", "--out", str(out), *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _check_grow_report(stdout: str, report: dict, grower: str) -> None:
    assert "your model: SignalNet, 3 slots (grow1, grow2, grow3), family cnn1d, 220 parameters" in stdout
    results = report["results"]
    assert list(results) == ["static", grower] and report["controller"] == grower
    for name, r in results.items():
        assert len(r["test_acc"]) == 2 and r["host_params"] == 220, name
        assert 0 <= r["test_acc_mean"] <= 100 and f"{r['test_acc_mean']:.1f} %" in stdout
    assert results["static"]["params_added_mean"] == 0 and results["static"]["grown"] == {"nothing": 2}


@pytest.mark.e2e
def test_grow_your_model_example_with_the_heuristic(tmp_path):
    stdout, report = _grow_example(tmp_path)
    _check_grow_report(stdout, report, "heuristic")
    assert report["run"] is None and "with the heuristic" in stdout


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """A smoke run's directory: a controller trained on a three-slot cnn1d host (the longrange task's: its
    data are drawn in a blink, where MNIST-1D's take seconds)."""
    where = tmp_path_factory.mktemp("runs")
    run = [sys.executable, "-m", "esper.shell.run", "--preset", "smoke", "--env.task", "longrange",
           "--run_dir", str(where), "--name", "r", "--lifecycle.max_epochs", "3",
           "--env.train_batches", "1"]  # fmt: skip
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where / "r"


@pytest.mark.e2e
def test_grow_your_model_example_zero_shot_from_a_run(tmp_path, smoke_run):
    """The example's network has three cnn1d slots, as the smoke run's host, so the run's controller grows
    it without training there."""
    stdout, report = _grow_example(tmp_path, "--run", str(smoke_run))
    _check_grow_report(stdout, report, "ppo")
    assert report["run"] == str(smoke_run) and "zero-shot" in stdout


@pytest.mark.e2e
def test_grow_in_your_loop_example_with_a_runs_controller(tmp_path, smoke_run):
    """The user's loop (AdamW, cosine, DataLoader) grown by the smoke run's controller (eager to germinate
    with its untrained-looking policy): the grown network saved, reloaded into a fresh ``SignalNet`` (here
    too, in this process) and tested again gives the same accuracy."""
    out, save = tmp_path / "loop.json", tmp_path / "grown.pt"
    cmd = [sys.executable, "-m", "examples.grow_in_your_loop", "--run", str(smoke_run), "--train", "256",
           "--epochs", "6", "--save", str(save), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["epochs"] == 6 and report["controller"] == str(smoke_run)
    assert report["reloaded_test_acc"] == report["grown_test_acc"] and "reloaded" in proc.stdout
    assert report["params_grown"] >= 0 and 0 <= report["static_test_acc"] <= 100
    from examples.grow_in_your_loop import accuracy
    from examples.grow_your_model import SignalNet, make_signals

    net = SignalNet()
    net.load_state_dict(torch.load(save, weights_only=True))
    assert accuracy(net, *make_signals(128, seed=2)) == report["grown_test_acc"]
    grown = {name: m.blueprint for name, m in net.named_modules() if getattr(m, "occupied", False)}
    assert grown == report["grown"]


@pytest.mark.e2e
def test_grow_transformer_example_learns_grows_and_exports(tmp_path):
    """The byte-level LM on the standard library's source, 6 epochs of 8 batches with the gates open: the
    loss falls, the plan's two seeds are grown into the residual stream, and the exported program (loaded
    here with torch alone) gives the grown LM's validation loss."""
    out, program = tmp_path / "lm.json", tmp_path / "lm.pt2"
    gates = ["lifecycle.g2_min_gain=-100", "lifecycle.g2_min_grad_ratio=0", "lifecycle.g2_min_epochs=1",
             "lifecycle.g3_min_epochs=1", "lifecycle.g5_min_contribution=-100"]  # fmt: skip
    sets = [a for gate in gates for a in ("--set", gate)]
    cmd = [sys.executable, "-m", "examples.grow_transformer", "--epochs", "6", "--batches", "8",
           "--export", str(program), "--out", str(out), *sets]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    before, after = report["loss_before"], report["loss_after"]
    assert before["val"] > 5.0 and after["val"] < before["val"] - 2.0 and after["test"] < before["test"] - 2.0
    assert report["controller"] == "grow:grow1=attention+grow2=mlp" and report["epochs"] == 6
    assert report["grown"] == {"grow1": "attention", "grow2": "mlp"} and report["params_grown"] > 0
    germinated = [(e["slot"], e["blueprint"]) for e in report["events"] if e["kind"] == "germinated"]
    assert germinated == [("grow1", "attention"), ("grow2", "mlp")]
    assert "grown: grow1=attention+grow2=mlp" in proc.stdout and "before" in proc.stdout
    from examples.grow_transformer import stdlib_text, windows

    tokens = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    cut = int(len(tokens) * 0.9)
    x, y = windows(tokens[cut : cut + (len(tokens) - cut) // 2], 64)  # the example's validation windows
    lm = torch.export.load(program).module()
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(lm(x).flatten(0, 1), y.flatten())
    assert loss.item() == pytest.approx(after["val"], rel=1e-4)
