"""GAE and advantage normalization against slow references, TorchRL, and the R1 allocation finding."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.profiler import profile
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

from esper.core.advantage import gae, gae_tensors, group_relative, normalize_advantage
from esper.core.spec import Keys


# ------------------------------------------------------------------------------------------ references
def ref_gae(reward, value, next_value, done, terminated, gamma, lmbda):
    """Per env, per step, in Python floats (float64): the textbook recurrence."""
    shape = reward.shape
    T = shape[-1]
    flat = [x.reshape(-1, T).tolist() for x in (reward, value, next_value, done, terminated)]
    adv_rows, tgt_rows = [], []
    for r, v, nv, d, term in zip(*flat):
        adv = [0.0] * T
        nxt = 0.0
        for t in reversed(range(T)):
            delta = r[t] + gamma * (0.0 if term[t] else 1.0) * nv[t] - v[t]
            nxt = delta + gamma * lmbda * (0.0 if d[t] else 1.0) * nxt
            adv[t] = nxt
        adv_rows.append(adv)
        tgt_rows.append([a + b for a, b in zip(adv, v)])
    to = lambda rows: torch.tensor(rows, dtype=torch.float64).reshape(shape)
    return to(adv_rows), to(tgt_rows)


def ref_normalize(adv, valid, eps=1e-8):
    a = adv.double().reshape(-1).tolist()
    m = valid.expand_as(adv).reshape(-1).tolist()
    xs = [x for x, k in zip(a, m) if k]
    n = len(xs)
    mean = sum(xs) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    out = [(x - mean) / (math.sqrt(var) + eps) if k else 0.0 for x, k in zip(a, m)]
    return torch.tensor(out, dtype=torch.float64).reshape(adv.shape)


def rollout(batch, T, *, p_term=0.15, p_trunc=0.15, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, T)
    r, v, nv = (torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    term = torch.rand(shape, generator=g) < p_term
    trunc = (torch.rand(shape, generator=g) < p_trunc) & ~term
    return r, v, nv, term, trunc


def make_td(batch, T, *, trailing=True, seed=0, **kw):
    r, v, nv, term, trunc = rollout(batch, T, seed=seed, **kw)
    f = (lambda x: x.unsqueeze(-1)) if trailing else (lambda x: x)
    nxt = {"reward": f(r), "terminated": f(term), "truncated": f(trunc), "done": f(term | trunc)}
    nxt["state_value"] = f(nv)
    return TensorDict({"state_value": f(v), "next": nxt}, batch_size=[*batch, T])


# -------------------------------------------------------------------------------------- gae_tensors
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_tensors_matches_reference(batch, dtype):
    r, v, nv, term, trunc = rollout(batch, 17, seed=3, dtype=dtype)
    adv, tgt = gae_tensors(r, v, nv, term | trunc, term, gamma=0.97, lmbda=0.9)
    ref_adv, ref_tgt = ref_gae(r, v, nv, term | trunc, term, 0.97, 0.9)
    assert adv.dtype == tgt.dtype == dtype
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv.double(), ref_adv, **tol)
    torch.testing.assert_close(tgt.double(), ref_tgt, **tol)


@st.composite
def gae_cases(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    T = draw(st.integers(1, 12))
    p_term = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    p_trunc = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    gamma = draw(st.floats(0.0, 1.0))
    lmbda = draw(st.floats(0.0, 1.0))
    seed = draw(st.integers(0, 2**16))
    # done need not contain terminated in the functional form: draw it freely sometimes.
    free_done = draw(st.booleans())
    return batch, T, p_term, p_trunc, gamma, lmbda, seed, free_done


@given(gae_cases())
def test_gae_tensors_matches_reference_hypothesis(case):
    batch, T, p_term, p_trunc, gamma, lmbda, seed, free_done = case
    r, v, nv, term, trunc = rollout(batch, T, p_term=p_term, p_trunc=p_trunc, seed=seed, dtype=torch.float64)
    done = trunc if free_done else term | trunc
    adv, tgt = gae_tensors(r, v, nv, done, term, gamma=gamma, lmbda=lmbda)
    ref_adv, ref_tgt = ref_gae(r, v, nv, done, term, gamma, lmbda)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tgt, ref_tgt, rtol=1e-10, atol=1e-10)


def test_gae_semantics_by_hand():
    """One env, 4 steps: a truncation at t=1 bootstraps from V(next) and cuts the trace; a
    termination at t=3 does not bootstrap."""
    r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    v = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    nv = torch.tensor([0.5, 10.0, 0.5, 100.0], dtype=torch.float64)
    term = torch.tensor([False, False, False, True])
    trunc = torch.tensor([False, True, False, False])
    g, lam = 0.9, 0.8
    adv, _ = gae_tensors(r, v, nv, term | trunc, term, gamma=g, lmbda=lam)
    a3 = 4.0 - 0.5  # terminated: no bootstrap
    a2 = 3.0 + g * 0.5 - 0.5 + g * lam * a3
    a1 = 2.0 + g * 10.0 - 0.5  # truncated: bootstrap from V(next), trace cut
    a0 = 1.0 + g * 0.5 - 0.5 + g * lam * a1
    torch.testing.assert_close(adv, torch.tensor([a0, a1, a2, a3], dtype=torch.float64))


def test_gae_envs_never_mix():
    r, v, nv, term, trunc = rollout((4,), 9, seed=1)
    adv, _ = gae_tensors(r, v, nv, term | trunc, term, gamma=0.99, lmbda=0.95)
    r2, v2 = r.clone(), v.clone()
    r2[1] += 100.0
    v2[3] -= 50.0
    adv2, _ = gae_tensors(r2, v2, nv, term | trunc, term, gamma=0.99, lmbda=0.95)
    torch.testing.assert_close(adv2[[0, 2]], adv[[0, 2]], rtol=0, atol=0)
    assert not torch.allclose(adv2[1], adv[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gae_tensors_half_precision_computes_in_float32(dtype):
    r, v, nv, term, trunc = rollout((3,), 11, seed=2, dtype=dtype)
    adv, tgt = gae_tensors(r, v, nv, term | trunc, term, gamma=0.99, lmbda=0.95)
    assert adv.dtype == tgt.dtype == dtype
    ref, _ = gae_tensors(r.float(), v.float(), nv.float(), term | trunc, term, gamma=0.99, lmbda=0.95)
    torch.testing.assert_close(adv, ref.to(dtype))


def test_gae_tensors_bad_inputs():
    r, v, nv, term, trunc = rollout((2,), 5)
    done = term | trunc
    with pytest.raises(ValueError, match="next_value"):
        gae_tensors(r, v, nv[:, :4], done, term, gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match="done"):
        gae_tensors(r, v, nv, done.float(), term, gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match="reward"):
        gae_tensors(r.long(), v, nv, done, term, gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae_tensors(r, v, nv, done, term, gamma=1.5, lmbda=0.9)
    with pytest.raises(ValueError, match="reward"):
        z = torch.zeros(())
        gae_tensors(z, z, z, z.bool(), z.bool(), gamma=0.9, lmbda=0.9)


# ---------------------------------------------------------------------------------------------- gae
@pytest.mark.parametrize("batch", [(4,), (2, 3)])
def test_gae_equals_torchrl(batch):
    td = make_td(batch, 20, seed=7)
    out = gae(td.clone(), gamma=0.99, lmbda=0.95)
    args = (0.99, 0.95, td["state_value"], td["next", "state_value"], td["next", "reward"])
    done, term = td["next", "terminated"] | td["next", "truncated"], td["next", "terminated"]
    assert done.any() and term.any() and td["next", "truncated"].any()
    adv, tgt = generalized_advantage_estimate(*args, done, term, time_dim=-2)
    torch.testing.assert_close(out["advantage"], adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["value_target"], tgt, rtol=1e-5, atol=1e-5)
    vadv, vtgt = vec_generalized_advantage_estimate(*args, done, term, time_dim=-2)
    torch.testing.assert_close(out["advantage"], vadv, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["value_target"], vtgt, rtol=1e-4, atol=1e-4)


def test_gae_td_writes_reward_shape_and_returns_td():
    for trailing in (True, False):
        td = make_td((3,), 6, trailing=trailing)
        out = gae(td, gamma=0.9, lmbda=0.9)
        assert out is td
        assert td["advantage"].shape == td["value_target"].shape == td["next", "reward"].shape
    # mixed: [*B, T, 1] reward with [*B, T] values
    td = make_td((3,), 6, trailing=True)
    td["state_value"] = td["state_value"].squeeze(-1)
    ref = gae(make_td((3,), 6, trailing=True), gamma=0.9, lmbda=0.9)
    torch.testing.assert_close(gae(td, gamma=0.9, lmbda=0.9)["advantage"], ref["advantage"])


def test_gae_done_absent_uses_terminated_or_truncated():
    td = make_td((3,), 10, seed=5)
    ref = gae(td.clone(), gamma=0.95, lmbda=0.9)["advantage"]
    del td["next", "done"]
    torch.testing.assert_close(gae(td, gamma=0.95, lmbda=0.9)["advantage"], ref)


def test_gae_without_done_or_truncated_names_both():
    td = make_td((3,), 4)
    del td["next", "done"]
    del td["next", "truncated"]
    with pytest.raises(KeyError, match=r"'next', 'done'.*'next', 'truncated'"):
        gae(td, gamma=0.9, lmbda=0.9)


def test_gae_custom_keys():
    td = make_td((2,), 5)
    keys = Keys(state_value="v", advantage="adv", reward=("next", "r"))
    td2 = td.clone()
    td2.rename_key_("state_value", "v")
    td2.rename_key_(("next", "reward"), ("next", "r"))
    out = gae(td2, gamma=0.9, lmbda=0.8, keys=keys)
    torch.testing.assert_close(out["adv"], gae(td, gamma=0.9, lmbda=0.8)["advantage"])


def _drop(key):
    def f(td):
        del td[key]

    return f


def _set(key, value):
    def f(td):
        td[key] = value(td[key])

    return f


@pytest.mark.parametrize(
    ("mutate", "exc", "pattern"),
    [
        (_drop("state_value"), KeyError, r"missing key 'state_value'.*has .*'next', 'reward'"),
        (_drop(("next", "reward")), KeyError, r"missing key \('next', 'reward'\)"),
        (_drop(("next", "state_value")), KeyError, r"\('next', 'state_value'\)"),
        (_drop(("next", "terminated")), KeyError, r"\('next', 'terminated'\)"),
        (_set(("next", "done"), lambda x: x.float()), TypeError, r"'done'.*torch.bool.*float32"),
        (_set(("next", "terminated"), lambda x: x.long()), TypeError, r"'terminated'.*int64"),
        (_set(("next", "reward"), lambda x: x.long()), TypeError, r"'reward'.*floating.*int64"),
        (_set("state_value", lambda x: x.int()), TypeError, r"'state_value'.*floating"),
        (
            _set("state_value", lambda x: x.expand(4, 6, 2)),
            ValueError,
            r"'state_value'.*\[4, 6\].*\[4, 6, 2\]",
        ),
    ],
)
def test_gae_bad_td_raises_naming_the_key(mutate, exc, pattern):
    td = make_td((4,), 6)
    mutate(td)
    with pytest.raises(exc, match=pattern):
        gae(td, gamma=0.9, lmbda=0.9)


def test_gae_truncated_must_be_bool_when_used():
    td = make_td((2,), 3)
    del td["next", "done"]
    td["next", "truncated"] = td["next", "truncated"].float()
    with pytest.raises(TypeError, match="truncated"):
        gae(td, gamma=0.9, lmbda=0.9)


def test_gae_needs_a_batch_dim_and_unit_coefficients():
    with pytest.raises(ValueError, match="batch size"):
        gae(TensorDict({}, batch_size=[]), gamma=0.9, lmbda=0.9)
    td = make_td((2,), 3)
    for gamma, lmbda, name in ((-0.1, 0.9, "gamma"), (0.9, 1.01, "lmbda")):
        with pytest.raises(ValueError, match=name):
            gae(td, gamma=gamma, lmbda=lmbda)
    with pytest.raises(TypeError, match="gamma must be a Python float, got Tensor"):
        gae(td, gamma=torch.tensor(0.9), lmbda=0.9)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- R1
def _n_allocations(fn) -> int:
    fn()  # warm-up
    with profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(1 for e in prof.events() if e.self_cpu_memory_usage > 0)


def _allocations_at(T: int) -> tuple[int, int]:
    r, v, nv, term, trunc = rollout((16,), T)
    done = term | trunc
    mine = _n_allocations(lambda: gae_tensors(r, v, nv, done, term, gamma=0.99, lmbda=0.95))
    u = lambda x: x.unsqueeze(-1)
    theirs = _n_allocations(
        lambda: generalized_advantage_estimate(0.99, 0.95, u(v), u(nv), u(r), u(done), u(term))
    )
    return mine, theirs


def test_R1_gae_no_per_step_allocation():
    (mine_8, theirs_8), (mine_64, theirs_64) = _allocations_at(8), _allocations_at(64)
    assert mine_8 == mine_64 > 0, (mine_8, mine_64)
    # the measurement does see per-step allocations where they exist: TorchRL's loop allocates per step
    assert theirs_64 >= theirs_8 + 56, (theirs_8, theirs_64)


# ------------------------------------------------------------------------------ normalize_advantage
def test_normalize_advantage_matches_reference():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, 9, generator=g, dtype=torch.float64) * 3 + 2
    valid = torch.rand(6, 9, generator=g) < 0.7
    torch.testing.assert_close(normalize_advantage(adv, valid), ref_normalize(adv, valid))
    torch.testing.assert_close(normalize_advantage(adv), ref_normalize(adv, torch.ones_like(valid)))
    full = normalize_advantage(adv)
    torch.testing.assert_close(full, (adv - adv.mean()) / (adv.std() + 1e-8))


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
    trailing=st.booleans(),
)
def test_normalize_advantage_hypothesis(shape, p, seed, trailing):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    valid = torch.rand(shape, generator=g) < p
    out = normalize_advantage(adv.unsqueeze(-1), valid) if trailing else normalize_advantage(adv, valid)
    out = out.squeeze(-1) if trailing else out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref_normalize(adv, valid))
    assert (out[~valid] == 0).all()


def test_normalize_advantage_few_valid_is_finite():
    adv = torch.randn(3, 4)
    for n_valid in (0, 1):
        valid = torch.zeros(3, 4, dtype=torch.bool)
        valid.view(-1)[:n_valid] = True
        out = normalize_advantage(adv, valid)
        assert torch.isfinite(out).all() and (out == 0).all()
    half = normalize_advantage(adv.half(), torch.ones(4, dtype=torch.bool))
    assert half.dtype == torch.float16 and torch.isfinite(half).all()


def test_normalize_advantage_bad_inputs():
    adv = torch.randn(3, 4)
    with pytest.raises(TypeError, match="valid"):
        normalize_advantage(adv, torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"valid.*\[3, 4\].*\[4, 3\]"):
        normalize_advantage(adv, torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid"):
        normalize_advantage(adv, torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="advantage"):
        normalize_advantage(adv.long())


@pytest.mark.parametrize(
    ("dtypes", "expected"),
    [
        ((torch.float32, torch.float32, torch.float32), torch.float32),
        ((torch.float16, torch.float32, torch.float16), torch.float32),
        ((torch.bfloat16, torch.bfloat16, torch.bfloat16), torch.bfloat16),
        ((torch.float32, torch.float64, torch.float32), torch.float64),
    ],
)
def test_gae_out_dtype_is_the_dtype_gae_tensors_returns(dtypes, expected):
    from esper.core.advantage import gae_out_dtype

    r, v, nv = (torch.randn(2, 5).to(dt) for dt in dtypes)
    done = torch.zeros(2, 5, dtype=torch.bool)
    assert gae_out_dtype(r, v, nv) == expected
    adv, target = gae_tensors(r, v, nv, done, done, gamma=0.9, lmbda=0.8)
    assert adv.dtype == target.dtype == expected


@given(st.integers(1, 70), st.integers(0, 2**31 - 1))
def test_R1_blocked_scan_matches_a_python_loop(T, seed):
    """The traced path's blocked scan (run eagerly here) is the plain reverse recurrence, for every T
    (divisible into blocks or padded)."""
    from esper.core.advantage import _reverse_scan_blocked

    g = torch.Generator().manual_seed(seed)
    delta = torch.randn(3, T, generator=g, dtype=torch.float64)
    coef = torch.rand(3, T, generator=g, dtype=torch.float64) * (torch.rand(3, T, generator=g) > 0.2)
    expected = torch.zeros_like(delta)
    for e in range(3):
        a = 0.0
        for t in range(T - 1, -1, -1):
            a = float(delta[e, t]) + float(coef[e, t]) * a
            expected[e, t] = a
    torch.testing.assert_close(_reverse_scan_blocked(delta, coef), expected)


def test_normalize_advantage_keeps_one_nan_to_itself():
    """Issue 10, item 9: one NaN used to make every step NaN. It stays NaN; the others are normalized
    over the finite steps; an invalid step comes back as 0 whatever it holds."""
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(3, 8, generator=g)
    valid = torch.rand(3, 8, generator=g) > 0.2
    bad = adv.clone()
    bad[0, 1] = math.nan
    valid[0, 1] = True
    bad[2, 5] = math.inf
    valid[2, 5] = False  # non-finite but invalid: 0
    out = normalize_advantage(bad, valid)
    assert math.isnan(out[0, 1]) and out[2, 5] == 0
    keep = valid.clone()
    keep[0, 1] = False
    expected = normalize_advantage(adv, keep)
    mask = torch.ones_like(valid)
    mask[0, 1] = False
    torch.testing.assert_close(out[mask], expected[mask])


# ------------------------------------------------------------------------------------- group_relative
def test_group_relative_subtracts_the_other_envs_of_the_group_at_each_step():
    adv = torch.tensor([[1.0, 2.0], [3.0, 6.0], [0.0, 0.0], [4.0, 4.0]])
    pairs = torch.tensor([[-2.0, -4.0], [2.0, 4.0], [-4.0, -4.0], [4.0, 4.0]])
    torch.testing.assert_close(group_relative(adv, 2), pairs)
    # groups of four: each env against the mean of the three others
    want = adv - (adv.sum(0, keepdim=True) - adv) / 3
    torch.testing.assert_close(group_relative(adv.unsqueeze(-1), 4), want.unsqueeze(-1))
    assert group_relative(adv, 1) is adv  # one env a group: no baseline
    # an invalid step comes back as it was and is nobody's baseline; alone in its group, no baseline
    valid = torch.tensor([[True, True], [False, True], [True, True], [True, True]])
    got = group_relative(adv, 2, valid)
    torch.testing.assert_close(got, torch.tensor([[1.0, -4.0], [3.0, 4.0], [-4.0, -4.0], [4.0, 4.0]]))
    half = group_relative(adv.half(), 2)
    assert half.dtype == torch.float16


def ref_group_relative(adv, group, valid):
    """Per env and step, in Python floats: the env's advantage less the mean of the group's other valid
    envs there; an invalid step, or one with no other valid env in its group, as it was."""
    a, v = adv.reshape(adv.shape[0], -1).tolist(), valid.reshape(adv.shape[0], -1).tolist()
    out = [row[:] for row in a]
    for e, row in enumerate(a):
        first = e - e % group
        for t, x in enumerate(row):
            others = [a[j][t] for j in range(first, first + group) if j != e and v[j][t]]
            if v[e][t] and others:
                out[e][t] = x - sum(others) / len(others)
    return torch.tensor(out, dtype=torch.float64).reshape(adv.shape)


@pytest.mark.parametrize(("E", "group", "trailing"), [(6, 3, False), (8, 2, True), (4, 4, False)])
def test_group_relative_matches_the_reference(E, group, trailing):
    g = torch.Generator().manual_seed(E + group)
    adv = torch.randn(E, 7, generator=g, dtype=torch.float64)
    valid = torch.rand(E, 7, generator=g) < 0.7
    if trailing:
        adv = adv.unsqueeze(-1)
    torch.testing.assert_close(group_relative(adv, group, valid), ref_group_relative(adv, group, valid))
    every = torch.ones(E, 7, dtype=torch.bool)
    torch.testing.assert_close(group_relative(adv, group), ref_group_relative(adv, group, every))


def test_group_relative_is_unbiased_and_takes_out_the_hosts_luck():
    """A bandit on shared hosts: return = host luck (sd 3) + 0.5 if action 1 + noise (sd 1). The group
    baseline must keep the action's effect whole (a mean that counted the env itself would halve it in
    pairs) and shrink the spread, since the luck is what a group shares."""
    g = torch.Generator().manual_seed(0)
    n_groups, group, effect = 20000, 2, 0.5
    luck = (3.0 * torch.randn(n_groups, 1, generator=g)).expand(n_groups, group).reshape(-1, 1)
    action = torch.rand(n_groups * group, 1, generator=g) < 0.5
    ret = luck + effect * action.float() + torch.randn(n_groups * group, 1, generator=g)
    adv = group_relative(ret, group)
    gap = adv[action].mean() - adv[~action].mean()
    assert abs(float(gap) - effect) < 0.05
    assert float(adv.std()) < 0.6 * float(ret.std())


@pytest.mark.parametrize(
    ("adv", "group", "match"),
    [
        (torch.zeros(4, 3), 3, "must divide the 4 envs"),
        (torch.zeros(4, 3), 0, "Python int >= 1"),
        (torch.zeros(4, 3), True, "Python int >= 1"),
        (torch.zeros(4), 2, r"\[E, T\] or \[E, T, 1\]"),
        (torch.zeros(4, 3, 2), 2, r"\[E, T\] or \[E, T, 1\]"),
    ],
)
def test_group_relative_refuses_bad_input(adv, group, match):
    with pytest.raises(ValueError, match=match):
        group_relative(adv, group)
    with pytest.raises((TypeError, ValueError), match="float"):
        group_relative(torch.zeros(4, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="shaped like advantage"):
        group_relative(torch.zeros(4, 3), 2, torch.ones(4, 2, dtype=torch.bool))
