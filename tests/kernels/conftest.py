"""Kernel tests run the Triton code itself: on the GPU when there is one, else on the CPU under
Triton's interpreter.

``triton.jit`` picks interpreter or compiler when a kernel is *decorated*, i.e. when
``esper.kernels._triton`` is imported (``esper.kernels`` imports it lazily, at the first launch). So
this file, which pytest imports before any test module in this directory, sets ``TRITON_INTERPRET=1``
when CUDA is absent, imports ``_triton`` under it (reloading it if something earlier in the session
imported it compiled; if Triton itself was imported earlier, its own ``@jit`` library is re-decorated
too), then restores the environment, so the rest of the session (inductor tests) sees no change. The
interpreter also reads the variable at launch, so the ``triton_path`` fixture sets it again for the
duration of each kernel test. (The alternative, a subprocess per run with the variable set from the
start, costs a second torch import and reports failures less precisely.)

``triton_path`` sends CPU tensors through the kernels (``TRITON_ON_CPU``) and skips, with the reason,
only where Triton is not installed; tests without it exercise the core fallback of the ops.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _interpret_triton_in_this_process() -> None:
    """Decorate the kernels (and Triton's own ``@jit`` library) for the interpreter. CPU-only machines
    only: nothing can run compiled Triton there, so nothing else in the process is affected."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    standard = sys.modules["triton.language.standard"]
    if not isinstance(standard.max, InterpretedFunction):
        # Triton was imported before this file could set the variable (torchrl imports it while other
        # test directories are collected), so its own @jit library (tl.max, tl.sum, tl.cdiv, ...) was
        # decorated for the compiler and cannot be called by the interpreter: re-decorate it.
        importlib.reload(standard)
        for name, obj in vars(standard).items():
            if isinstance(getattr(tl, name, None), JITFunction):
                setattr(tl, name, obj)
    assert isinstance(tl.max, InterpretedFunction), "could not switch triton.language to the interpreter"
    if "esper.kernels._triton" in sys.modules:
        importlib.reload(sys.modules["esper.kernels._triton"])
    else:
        importlib.import_module("esper.kernels._triton")


if HAS_TRITON and DEVICE == "cpu":
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        _interpret_triton_in_this_process()
    finally:
        if _saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture
def triton_path(monkeypatch):
    """Run the Triton kernels (GPU, or interpreter on CPU) through the public wrappers and the ops."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed: the Triton kernels cannot run (core-fallback tests still run)")
    # by module path: the package attribute ``esper.kernels.gae`` is the function, not the module
    gae = importlib.import_module("esper.kernels.gae")
    categorical = importlib.import_module("esper.kernels.categorical")
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(gae, "TRITON_ON_CPU", True)
        monkeypatch.setattr(categorical, "TRITON_ON_CPU", True)
    return DEVICE
