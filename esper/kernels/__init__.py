"""Fused kernels behind ``torch.library`` custom ops, each a drop-in for a core function.

``esper.kernels.gae_tensors`` / ``gae`` mirror :mod:`esper.core.advantage`; ``masked_categorical``
mirrors :func:`esper.core.distributions.masked_categorical`. On CUDA with Triton installed they run one
Triton kernel each (``esper::gae``, ``esper::masked_categorical`` and its backward); everywhere else they
run the core function, which is also each op's CPU kernel and the reference the tests hold them to.
Importing this package registers the ops; it needs Triton only when a kernel actually launches.
"""

from esper.kernels.categorical import masked_categorical
from esper.kernels.gae import HAS_TRITON, gae, gae_tensors

__all__ = ["HAS_TRITON", "gae", "gae_tensors", "masked_categorical"]
