"""Host training on a GPU with its step captured as a CUDA graph (issue 44): what would it buy?

On a GPU the batched host step is bound by kernel launches and the Python between them (about 30 ms a
step on an H200 at 8-128 envs, 2026-11-30), not by arithmetic. A CUDA graph replays a recorded step's
kernels with one launch. Within an epoch the seed groups, learning rates and batch shapes are fixed, so
one capture per epoch can serve the epoch's other batches. This probe measures that before the library
grows a path for it: one epoch of the batched hosts (:class:`~esper.shell.host.batched.BatchedHosts`,
the ``hosts`` suite's populations), eager against the same epoch with its training step captured and
replayed (:class:`StepGraph`), interleaved, capture included. First, one epoch of each from the same
hosts: their host parameters and measurements must agree, or the timing compares different work.

    python -m bench.run --suite hosts_cuda_graph --device cuda

On a CPU device the suite runs nothing and says so.
"""

from __future__ import annotations

import torch

from bench.harness import Context, Row, SuiteResult, round_ratio, suite
from bench.perf.hosts import twin_banks
from esper.shell.host.batched import BatchedHosts


class StepGraph:
    """Wraps a bank's ``stack.loss`` and optimizer so that its unchanged epoch loop (zero_grad, loss,
    backward, step per batch) runs the first ``warmup`` steps eagerly, captures the next one (from
    ``loss`` to ``step``: forward, backward and the SGD update) and replays it for the rest, each batch
    copied into the graph's static inputs. While it replays, the loop's ``zero_grad``, ``backward`` (on
    a stand-in scalar) and ``step`` do nothing. :meth:`begin_epoch` drops the graph: the next epoch
    captures again (its groups and learning rates may differ)."""

    def __init__(self, bank: BatchedHosts, warmup: int = 3) -> None:
        self.warmup = warmup
        self._loss = bank.stack.loss
        self._zero_grad, self._step = bank.optimizer.zero_grad, bank.optimizer.step
        bank.stack.loss = self.loss
        bank.optimizer.zero_grad = self.zero_grad
        bank.optimizer.step = self.step
        self.captures = 0
        self.begin_epoch()

    def begin_epoch(self) -> None:
        self.calls, self.graph, self._capture, self._eager = 0, None, None, False

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.graph is None:
            self._zero_grad(set_to_none=set_to_none)

    def loss(self, x: torch.Tensor, y: torch.Tensor, plan, whatif):
        self.calls += 1
        if self.graph is not None and x.shape == self.x.shape and y.shape == self.y.shape:
            self.x.copy_(x)
            self.y.copy_(y)
            self.graph.replay()
            self._eager = False
            return self.stand_in, self.out_loss, self.out_correct
        if self.graph is not None:  # a batch of another shape: eager, on gradients zeroed in place
            self._zero_grad(set_to_none=False)
            self._eager = True
            return self._loss(x, y, plan, whatif)
        if self.calls <= self.warmup:
            return self._loss(x, y, plan, whatif)
        torch.cuda.synchronize()
        self.x, self.y = x.clone(), y.clone()
        self.stand_in = torch.zeros((), device=x.device, requires_grad=True)
        self.graph = torch.cuda.CUDAGraph()
        self._capture = torch.cuda.graph(self.graph)
        self._capture.__enter__()
        total, loss, n_correct = self._loss(self.x, self.y, plan, whatif)
        self.out_loss, self.out_correct = loss, n_correct
        return total, loss, n_correct

    def step(self) -> None:
        if self._capture is not None:  # the end of the captured step: close it, then run it once
            self._step()
            self._capture.__exit__(None, None, None)
            self._capture = None
            self.captures += 1
            self.graph.replay()  # capturing records the kernels without running them
        elif self.graph is None or self._eager:
            self._step()


@suite(
    "hosts_cuda_graph",
    help="one epoch of the batched hosts on a GPU: eager against its training step as a CUDA graph",
    order=62,
)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="x vs eager")
    if ctx.device.type != "cuda":
        res.notes.append("hosts_cuda_graph needs a CUDA device (--device cuda): nothing run")
        return res
    populations = ("converged", "diverse")
    cases = [(8, "converged")] if ctx.quick else [(e, p) for e in (8, 32, 128) for p in populations]
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # compare exactly
    try:
        for envs, population in cases:
            _case(ctx, res, envs, population)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    res.notes.append(
        "One epoch = 31 training steps of batch 128 per env and the validation with counterfactuals (eager "
        "on both sides), all envs in one batch; the graph row captures once an epoch, after 3 eager steps, "
        "and replays for the other 27. TF32 off. 'same work': one epoch of each from the same hosts, the "
        "largest difference of any host parameter and of the measured train loss and validation accuracy."
    )
    return res


def _case(ctx: Context, res: SuiteResult, envs: int, population: str) -> None:
    eager, graphed = twin_banks(envs, population, ctx.device)
    graph = StepGraph(graphed)

    def graphed_epoch():
        graph.begin_epoch()
        return graphed.measure(1.0)

    case = f"{envs} envs, {population}"
    try:
        a, b = eager.measure(1.0), graphed_epoch()
    except Exception as e:  # the probe reports why a capture failed
        if graph._capture is not None:  # leave no capture open for the next case
            try:
                graph._capture.__exit__(type(e), e, e.__traceback__)
            except Exception:  # the first error is the one reported
                pass
        res.notes.append(f"{case}: the captured epoch failed: {type(e).__name__}: {str(e)[:300]}")
        return
    pairs = zip(eager.stack.leaves.values(), graphed.stack.leaves.values(), strict=True)
    param_diff = max((p - q).abs().max().item() for p, q in pairs)
    meas_diff = max((a[k] - b[k]).abs().max().item() for k in ("train_loss", "val_acc"))
    epochs = {"eager": lambda: eager.measure(1.0), "graph": graphed_epoch}
    stats = ctx.compare(epochs, rounds=3 if ctx.quick else 5)
    res.rows.append(Row(case, "batched, eager", stats["eager"], ratio=1.0))
    res.rows.append(Row(
        case, "batched, step as a CUDA graph", stats["graph"],
        ratio=round_ratio(stats["eager"], stats["graph"]),
        note=f"same work: parameters within {param_diff:.1e}, measurements within {meas_diff:.1e}; "
             f"{graph.captures} captures",
    ))  # fmt: skip
