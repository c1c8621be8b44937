"""The vectorized env's per-env CUDA streams (finding S1) and AMP (finding H12), checked on a CPU.

There is no GPU here, so ``torch.cuda``'s stream API is replaced by fakes that keep the ordering
bookkeeping a GPU would: every stream counts the ops enqueued on it, ``wait_stream`` / ``wait_event``
remember up to which op of the other stream the waiter is ordered after, and an event remembers the
op count of its stream when it was recorded. A :class:`~torch.overrides.TorchFunctionMode` sees every
torch op the env runs, tags each tensor it writes with (current stream, op count), and flags any op
that touches, on stream C, a tensor last written on stream P != C without C having waited on P at or
after that write: exactly the race of finding S1 (an accumulator read or reduced on the default
stream before the env's stream finished writing it). The hosts stay on the CPU; only
:class:`~esper.shell.host.streams.EnvStreams` is told its devices are CUDA devices.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest
import torch
from tensordict import TensorDict
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from esper.core.lifecycle import WHATIF_STATISTICS, LifecycleConfig
from esper.core.spec import HEADS, Op, Stage
from esper.shell.baselines.simple import FixedController
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.model import EnvModel
from esper.shell.host.streams import EnvStreams

CUDA0 = torch.device("cuda", 0)


def _env(n_envs: int = 2, *, amp: bool = False, **governor) -> VecEnv:
    cfg = EnvConfig(
        task="digits", n_envs=n_envs, image_size=8, channels=(4, 8, 8), batch_size=32, train_batches=1,
        val_batches=1, amp=amp, host_step="per_env",  # the streams and scalers are the per-env path's
    )  # fmt: skip
    return VecEnv(cfg, LifecycleConfig(max_epochs=3), GovernorConfig(**governor), seed=0)


# ------------------------------------------------------------------------------------- fake CUDA
class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ops = 0  # ops enqueued so far
        self.after: dict[FakeStream, int] = {}  # stream -> last of its ops this one is ordered after

    def _order_after(self, other: FakeStream, op: int) -> None:
        self.after[other] = max(self.after.get(other, 0), op)
        for s, n in other.after.items():  # ordering is transitive
            if s is not self:
                self.after[s] = max(self.after.get(s, 0), n)

    def wait_stream(self, other: FakeStream) -> None:
        FakeCuda.active.log.append(("wait_stream", self.name, other.name))
        self._order_after(other, other.ops)

    def wait_event(self, event: FakeEvent) -> None:
        FakeCuda.active.log.append(("wait_event", self.name, event.stream.name))
        self._order_after(event.stream, event.ops)

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, *args, **kwargs) -> None:
        self.stream: FakeStream | None = None
        self.ops = 0

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream if stream is not None else FakeCuda.active.current
        self.ops = self.stream.ops
        FakeCuda.active.log.append(("record", self.stream.name))


class FakeCuda:
    """Installs fake ``torch.cuda.Stream / Event / current_stream / stream`` for one test."""

    active: FakeCuda

    def __init__(self, monkeypatch) -> None:
        self.default = FakeStream("default")
        self.current = self.default
        self.streams: list[FakeStream] = []
        self.log: list[tuple] = []
        FakeCuda.active = self
        monkeypatch.setattr(torch.cuda, "Stream", self._new_stream)
        monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(torch.cuda, "stream", self._use)
        monkeypatch.setattr(
            torch.Tensor, "record_stream", lambda t, s: self.log.append(("record_stream", s.name))
        )

    def _new_stream(self, device=None, **kwargs) -> FakeStream:
        s = FakeStream(f"s{len(self.streams)}")
        self.streams.append(s)
        return s

    @contextmanager
    def _use(self, stream: FakeStream):
        outer, self.current = self.current, stream
        self.log.append(("enter", stream.name))
        try:
            yield
        finally:
            self.current = outer
            self.log.append(("exit", stream.name))


#: Ops that read no tensor data (metadata, allocator hints).
_NO_DATA = {
    "__get__", "__set__", "numel", "dim", "size", "stride", "is_floating_point", "is_complex",
    "is_contiguous", "element_size", "data_ptr", "record_stream", "__len__", "__hash__", "requires_grad_",
    "is_inference",
}  # fmt: skip


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _writes_in_place(name: str, kwargs: dict) -> bool:
    if "out" in kwargs:
        return True
    if name == "__setitem__" or (name.startswith("__i") and name.endswith("__")):
        return True
    return name.endswith("_") and not name.endswith("__")


class StreamRaceChecker(TorchFunctionMode):
    """Flags every op that touches a tensor written on another stream without ordering (see module)."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda
        self.writer = WeakIdKeyDictionary()  # tensor -> (stream, op index of the last write)
        self.races: list[str] = []
        self.cross_stream_reads = 0  # ordered ones: proves the check ran on real cross-stream traffic

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        cur = self.cuda.current
        if name not in _NO_DATA:
            for t in _tensors((args, kwargs)):
                tag = self.writer.get(t)
                if tag is None or tag[0] is cur:
                    continue
                writer, op = tag
                if cur.after.get(writer, 0) >= op:
                    self.cross_stream_reads += 1
                else:
                    self.races.append(f"{name} on {cur.name} touches a tensor written on {writer.name}")
        out = func(*args, **kwargs)
        if name in _NO_DATA:
            return out
        cur.ops += 1
        written = list(_tensors(out))
        if _writes_in_place(name, kwargs) and args:
            written += list(_tensors(args[0])) + list(_tensors(kwargs.get("out")))
        for t in written:
            self.writer[t] = (cur, cur.ops)
        return out


def _fake_cuda_streams(env: VecEnv, monkeypatch) -> FakeCuda:
    cuda = FakeCuda(monkeypatch)
    env.hosts.streams = EnvStreams([CUDA0] * env.n)  # the hosts stay on the CPU; the streams are "CUDA"
    assert cuda.streams == env.hosts.streams.streams and len(set(map(id, cuda.streams))) == env.n
    return cuda


def _record_calls(monkeypatch, cuda: FakeCuda, env: VecEnv) -> list[tuple[int, str, str, dict]]:
    """Spy on the EnvModel methods that do an env's device work: (env, method, stream, kwargs)."""
    calls: list[tuple[int, str, str, dict]] = []
    for method in ("train_epoch", "measure_validation", "counterfactual_validation", "germinate"):
        real = getattr(EnvModel, method)

        def spy(self, *a, _real=real, _method=method, **k):
            i = next(j for j, m in enumerate(env.hosts.models) if m is self)
            calls.append((i, _method, cuda.current.name, dict(k)))
            return _real(self, *a, **k)

        monkeypatch.setattr(EnvModel, method, spy)
    return calls


class _Scripted(FixedController):
    """GERMINATE slot 0 at the first step (so ``apply`` builds seeds on the env streams), then WAIT;
    the other heads random."""

    def __init__(self, spec) -> None:
        self.spec, self.t = spec, 0
        self.g = torch.Generator().manual_seed(0)

    def begin(self, n_envs: int) -> None:
        self.t = 0

    def act(self, step) -> TensorDict:
        E = step.raw_obs.shape[0]
        sizes = self.spec.sizes
        out = TensorDict({h: TensorDict({"action": torch.randint(0, sizes[h], (E,), generator=self.g)}, [E])
                          for h in HEADS}, [E])  # fmt: skip
        out["op", "action"] = torch.full((E,), int(Op.GERMINATE if self.t == 0 else Op.WAIT))
        out["slot", "action"] = torch.zeros(E, dtype=torch.int64)
        self.t += 1
        return out


# ------------------------------------------------------------------------------------------------ S1
def test_S1_every_cross_stream_read_waits_on_the_env_event(monkeypatch):
    """A whole episode (train, validate with counterfactuals, governor rollback, germinate): each env's
    work runs on its own stream, an event is recorded after it, and no tensor an env stream wrote is
    read or reduced on the consumer stream before that stream waited on the event."""
    env = _env(2)
    cuda = _fake_cuda_streams(env, monkeypatch)
    calls = _record_calls(monkeypatch, cuda, env)
    real_check = env.governor.check
    monkeypatch.setattr(
        env.governor,
        "check",
        lambda i, loss: "nonfinite" if (i, env.epoch) == (1, 2) else real_check(i, loss),
    )  # a rollback at epoch 2 re-validates env 1 on its stream and joins again
    runner = EpisodeRunner(env, _Scripted(env.spec))
    checker = StreamRaceChecker(cuda)
    with checker:
        result = runner.run(0)

    assert [g["env"] for g in result.governor] == [1]
    assert not checker.races, "\n".join(checker.races[:20])
    assert checker.cross_stream_reads > 0, "the check saw no cross-stream traffic: it proved nothing"
    # every env's device work ran on that env's own stream, and only there
    streams = {i: {s for j, _, s, _ in calls if j == i} for i in range(env.n)}
    assert streams == {0: {"s0"}, 1: {"s1"}}
    kinds = {(i, m) for i, m, _, _ in calls}
    assert {(0, "train_epoch"), (1, "measure_validation"), (0, "germinate"), (1, "germinate")} <= kinds
    # the rollback re-validated env 1 (with its counterfactuals) after its epoch's measurement
    assert sum(1 for i, m, _, _ in calls if (i, m) == (1, "measure_validation")) > env.lifecycle.max_epochs
    # the protocol: enter stream i (after waiting on the default), leave it, record an event on it;
    # the consumer waits on that event before anything else of env i is read
    log = cuda.log
    for k, entry in enumerate(log):
        if entry[0] == "enter":
            s = entry[1]
            assert log[k - 1] == ("wait_stream", s, "default")
            close = next(j for j in range(k, len(log)) if log[j] == ("exit", s))
            assert log[close + 1] == ("record", s)
    waits = [e for e in log if e[0] == "wait_event"]
    assert waits and all(e[1] == "default" for e in waits)
    T = env.lifecycle.max_epochs
    assert len(waits) == T * env.n + 1 + env.n, (
        "one join per env per step, the rolled-back env's re-validation, and the final evaluation's"
    )


def test_S1_checker_catches_a_join_without_the_wait(monkeypatch):
    """A join that skips ``wait_event`` is reported as a race: the check is not vacuous."""
    env = _env(2)
    cuda = _fake_cuda_streams(env, monkeypatch)

    def join_without_wait(i, tensors, device):
        return [t.to(device, non_blocking=True) for t in tensors]

    monkeypatch.setattr(env.hosts.streams, "join", join_without_wait)
    checker = StreamRaceChecker(cuda)
    with checker:
        env.reset(0)  # builds the hosts and measures the first epoch
    assert checker.races and all("default touches a tensor written on s" in r for r in checker.races)


def test_S1_stream_per_env_and_cpu_runs_without_streams():
    streams = EnvStreams([torch.device("cpu")] * 3)
    assert streams.streams == [None] * 3
    with streams.run(1):
        x = torch.ones(2)
    assert streams.events == [None] * 3
    (y,) = streams.join(1, [x], torch.device("cpu"))
    assert y is x


# ----------------------------------------------------------------------------------------------- H12
@pytest.mark.filterwarnings("ignore:.*GradScaler.*:UserWarning")  # no CUDA: the scalers are disabled
def test_H12_one_grad_scaler_per_env_used_only_on_its_own_stream(monkeypatch):
    """On CUDA every env gets its own GradScaler (never shared), and env i's scaler is only ever used
    by env i's training, on env i's stream."""
    env = _env(3, amp=True)
    env.hosts.env_devices = [CUDA0] * env.n  # what reset() sees; the hosts and data stay on the CPU
    task = env.task

    def make_host():
        host = task.make_host()
        host.to = lambda *a, **k: host
        return host

    env.hosts.task = dataclasses.replace(
        task,
        make_host=make_host,
        make_loaders=lambda seed, device=None: task.make_loaders(seed, device="cpu"),
    )
    cuda = _fake_cuda_streams(env, monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the scalers disabled on any machine
    real_train = EnvModel.train_epoch

    def train_without_fp16(self, batches, *, autocast_dtype=None, scaler=None):
        assert autocast_dtype == torch.float16  # CUDA AMP: fp16 autocast and a scaler
        return real_train(self, batches, scaler=scaler)  # the CPU lacks fp16 kernels; the scaler is real

    monkeypatch.setattr(EnvModel, "train_epoch", train_without_fp16)
    calls = _record_calls(monkeypatch, cuda, env)
    episodes = []
    for episode in range(2):
        start = len(calls)
        env.reset(episode)  # fresh hosts and scalers, then the first epoch
        scalers = list(env.hosts.scalers)
        assert all(isinstance(s, torch.amp.GradScaler) for s in scalers)
        assert len({id(s) for s in scalers}) == env.n, "one scaler per env, never shared"
        trains = [(i, s, k["scaler"]) for i, m, s, k in calls[start:] if m == "train_epoch"]
        episodes.append(scalers)
        assert sorted(i for i, _, _ in trains) == list(range(env.n))
        for i, stream, scaler in trains:
            assert scaler is scalers[i], f"env {i} trained with another env's scaler"
            assert stream == f"s{i}", f"env {i}'s scaler was used off its stream"
    assert not {id(s) for s in episodes[0]} & {id(s) for s in episodes[1]}, "each episode gets fresh scalers"


def test_H12_cpu_amp_trains_in_bf16_without_a_scaler():
    """On a CPU, AMP is bf16 autocast and needs no scaler: one epoch runs in bf16, gives finite
    signals and moves the parameters."""
    env = _env(2, amp=True)
    env.reset(0)
    assert env.hosts.scalers == [None, None]
    assert env.hosts._amp(0) == {"autocast_dtype": torch.bfloat16, "scaler": None}
    dtypes = []
    conv = next(m for m in env.hosts.models[0].host.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype) if m.training else None)
    before = [p.detach().clone() for p in env.hosts.models[0].host.host_parameters()]
    signals = env.hosts.measure(1.0)
    assert dtypes and set(dtypes) == {torch.bfloat16}, "the training forward ran under bf16 autocast"
    for key in ("train_loss", "val_loss", "train_acc", "val_acc"):
        assert signals[key].dtype == torch.float32 and torch.isfinite(signals[key]).all(), key
    after = env.hosts.models[0].host.host_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the parameters were updated"
    assert all(torch.isfinite(p).all() for p in after)


def test_H12_env_model_bf16_epochs_learn():
    """EnvModel's AMP path on a CPU: bf16 autocast, no scaler, float32 statistics, and it learns."""
    from esper.shell.host.hosts import CNNHost

    torch.manual_seed(0)
    model = EnvModel(CNNHost(1, 8, (4, 8, 8), 10), host_lr=0.05)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))]
    first = model.train_epoch(data, autocast_dtype=torch.bfloat16)
    for _ in range(5):
        last = model.train_epoch(data, autocast_dtype=torch.bfloat16)
    assert first["loss"].dtype == torch.float32 and torch.isfinite(first["loss"])
    assert float(last["loss"]) < float(first["loss"])


@pytest.mark.parametrize("host_step", ["per_env", "batched"])
@pytest.mark.parametrize("evidence", ["host", "what_if", "either"])
def test_g2_what_if_measures_the_incubating_seeds_and_records_their_gain(monkeypatch, evidence, host_step):
    """Under ``lifecycle.g2_evidence what_if`` the env asks its hosts for every incubating seed's what-if
    gain each epoch (and only then: it costs a validation pass per seed), and the slot state records it
    for the incubating seed alone, where G2 reads it."""
    cfg = EnvConfig(task="digits", n_envs=2, image_size=8, channels=(4, 8, 8), batch_size=32, train_batches=1,
                    val_batches=1, host_step=host_step)  # fmt: skip
    env = VecEnv(cfg, LifecycleConfig(max_epochs=3, g2_evidence=evidence), GovernorConfig(), seed=0)
    asked, real = [], env.hosts.measure

    def measure(scale, **kw):
        asked.append(kw.get("whatif"))
        out = real(scale, **kw)
        return {**out, "whatif_gain": torch.full_like(out["whatif_gain"], 7.0)}

    monkeypatch.setattr(env.hosts, "measure", measure)
    EpisodeRunner(env, _Scripted(env.spec)).run(0)
    assert asked == [evidence != "host"] * 3
    assert (env.slots["stage"][:, 0] == int(Stage.TRAINING)).all()
    assert env.slots["whatif_gain"].tolist() == [[7.0, 0.0, 0.0]] * 2


@pytest.mark.parametrize("host_step", ["per_env", "batched"])
@pytest.mark.parametrize("statistics", WHATIF_STATISTICS)
def test_vecenv_passes_the_configured_whatif_statistics_to_the_bank(monkeypatch, statistics, host_step):
    """The env asks its host bank for what-if gains with the batch-norm statistics the config names
    (``lifecycle.whatif_statistics``), every epoch and on both bank paths: the bank's own tests call
    ``measure`` directly, so an env that passed ``"running"`` whatever the config said went unseen."""
    cfg = EnvConfig(task="digits", n_envs=2, image_size=8, channels=(4, 8, 8), batch_size=32, train_batches=1,
                    val_batches=1, host_step=host_step)  # fmt: skip
    lc = LifecycleConfig(max_epochs=3, g2_evidence="what_if", whatif_statistics=statistics)
    env = VecEnv(cfg, lc, GovernorConfig(), seed=0)
    asked, real = [], env.hosts.measure

    def measure(scale, **kw):
        asked.append((kw.get("whatif"), kw.get("whatif_statistics", "running")))
        return real(scale, **kw)

    monkeypatch.setattr(env.hosts, "measure", measure)
    EpisodeRunner(env, _Scripted(env.spec)).run(0)
    assert asked == [(True, statistics)] * 3
