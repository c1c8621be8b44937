"""Shared test helpers.

``compile_check(fn, *args, **kwargs)`` traces ``fn`` with ``torch.compile(fullgraph=True)`` on a cheap
backend (a graph break raises), runs it, and asserts the compiled result equals the eager one.
Inductor-compiled numerical checks are marked ``@pytest.mark.inductor``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Under pytest-xdist (the README's test command runs two workers) each worker gets its share of the
# cores: torch processes with a thread per core each slow each other down by an order of magnitude.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

# The CLI tests run ``python -m esper.shell...`` in subprocesses from temporary directories: they must
# import this checkout's esper, not the one an editable install elsewhere points at.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])


def _assert_tree_close(a, b, *, rtol: float, atol: float, path: str = "out") -> None:
    from tensordict import TensorDictBase

    if isinstance(a, TensorDictBase):
        assert isinstance(b, TensorDictBase), f"{path}: eager gave a TensorDict, compiled gave {type(b)}"
        assert set(a.keys(True, True)) == set(b.keys(True, True)), f"{path}: different keys"
        for k in a.keys(True, True):
            _assert_tree_close(a[k], b[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), f"{path}: different lengths"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_tree_close(x, y, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: different keys"
        for k in a:
            _assert_tree_close(a[k], b[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _fresh(args):
    """Clone tensor/TensorDict arguments so a function that writes into its input cannot make the
    eager and compiled results the same object."""
    from tensordict import TensorDictBase

    return tuple(a.clone() if isinstance(a, (torch.Tensor, TensorDictBase)) else a for a in args)


@pytest.fixture
def compile_check():
    def check(fn, *args, backend: str = "aot_eager", rtol: float = 1e-5, atol: float = 1e-6, **kwargs):
        torch._dynamo.reset()
        eager = fn(*_fresh(args), **kwargs)
        compiled = torch.compile(fn, fullgraph=True, backend=backend)(*_fresh(args), **kwargs)
        _assert_tree_close(eager, compiled, rtol=rtol, atol=atol)
        return compiled

    return check
