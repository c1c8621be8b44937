"""Seeds of everything an env draws at random, derived from names (a purpose, the run seed, the episode,
the global env index) so that an env's episode does not depend on which process or batch runs it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (a purpose string first: ``"train"``, ``"eval"``): distinct parts
    give unrelated seeds, and seeds of different purposes never coincide in practice (a hash, not
    arithmetic that two (run, episode, env) triples could share)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def train_host_seeds(run_seed: int, episode: int, env_indices: Sequence[int], *, group: int = 1) -> list[int]:
    """Host seeds of a training episode (host init, seed modules and data order), per global env index.
    With ``group`` > 1 the envs ``group * k .. group * k + group - 1`` share the seed of env ``k``'s
    group (``ppo.host_group``); ``group`` 1 gives every env its own, the seeds of a run without groups."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"train_host_seeds: group must be an int >= 1, got {group!r}")
    return [derive_seed("train", run_seed, episode, i // group) for i in env_indices]


def member_train_host_seeds(run_seed: int, episode: int, env_indices: Sequence[int], member, *,
                            group: int = 1) -> list[int]:  # fmt: skip
    """Host seeds of a training episode on a family of hosts (issue 89), one member for the whole batch:
    the episode's member is ``member(s)`` of its first candidate seed ``s`` (:func:`train_host_seeds` of
    env 0), and global env ``i`` (group ``i // group``) takes the ``i // group``-th candidate of that
    member, candidates ``train_host_seeds(run_seed, episode, [0, 1, 2, ...])`` in order, so every process
    of a run draws the same member and each env its own seed. ``member``: the task's ``describe_member``
    (cheap: it draws the member, not the host)."""
    want = None
    need = max(env_indices, default=-1) // group + 1
    found: list[int] = []
    j = 0
    while len(found) < need:
        s = derive_seed("train", run_seed, episode, j)
        kind = member(s)
        if want is None:
            want = kind
        if kind == want:
            found.append(s)
        j += 1
        if j > 1000 * (need + 1):
            raise RuntimeError("member_train_host_seeds: the family hardly ever draws this member")
    return [found[i // group] for i in env_indices]


def eval_host_seeds(eval_seed: int, episodes: Sequence[int]) -> list[int]:
    """Host seeds of evaluation episodes (by index): another purpose than training's, so no evaluation
    host is a training host."""
    return [derive_seed("eval", eval_seed, e) for e in episodes]


__all__ = ["derive_seed", "eval_host_seeds", "member_train_host_seeds", "train_host_seeds"]
