"""Env-level minibatches for recurrent PPO (finding C3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.minibatch import env_minibatches


def test_C3_minibatches_shuffle_whole_env_sequences():
    n_envs, T, M = 12, 7, 3
    td = TensorDict(
        {
            "env": torch.arange(n_envs).unsqueeze(-1).expand(n_envs, T).clone(),
            "t": torch.arange(T).expand(n_envs, T).clone(),
            "obs": torch.randn(n_envs, T, 5),
        },
        batch_size=[n_envs, T],
    )
    g = torch.Generator().manual_seed(0)
    epochs = [env_minibatches(n_envs, M, generator=g) for _ in range(4)]
    for idx in epochs:
        assert idx.shape == (M, n_envs // M) and idx.dtype == torch.int64
        # every env exactly once per epoch
        assert sorted(idx.reshape(-1).tolist()) == list(range(n_envs))
        for row in idx:
            mb = td[row]
            assert mb.batch_size == (n_envs // M, T)
            # whole, in-order sequences of the selected envs
            assert (mb["t"] == torch.arange(T)).all()
            assert (mb["env"] == row.unsqueeze(-1)).all()
            torch.testing.assert_close(mb["obs"], td["obs"][row])
    # the order differs across epochs, and a reseeded generator replays it
    assert len({tuple(i.reshape(-1).tolist()) for i in epochs}) > 1
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(env_minibatches(n_envs, M, generator=g2), epochs[0])


@given(n_per=st.integers(1, 6), m=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_env_minibatches_partition_hypothesis(n_per, m, seed):
    idx = env_minibatches(n_per * m, m, generator=torch.Generator().manual_seed(seed))
    assert idx.shape == (m, n_per)
    assert torch.equal(idx.reshape(-1).sort().values, torch.arange(n_per * m))


@pytest.mark.parametrize(
    ("n_envs", "m", "pattern"), [(8, 0, "n_minibatches"), (8, 3, "divide"), (0, 1, "n_envs")]
)
def test_env_minibatches_bad_sizes(n_envs, m, pattern):
    with pytest.raises(ValueError, match=pattern):
        env_minibatches(n_envs, m)
