"""Reading a metrics TensorDict costs one host transfer (finding M14)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from esper.core.health import GradHealthConfig, grad_health, lstm_health
from esper.shell.telemetry.readout import read_scalars


@pytest.fixture
def host_calls(monkeypatch):
    """Counts every Tensor.item/.tolist/.cpu/.numpy call while the test runs."""
    calls = {name: 0 for name in ("item", "tolist", "cpu", "numpy")}
    for name in calls:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, __name=name, __orig=original, **kwargs):
            calls[__name] += 1
            return __orig(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def test_M14_lstm_health_report_is_one_host_sync(host_calls):
    h, c = torch.randn(2, 8, 16), torch.randn(2, 8, 16) * 30
    report = lstm_health(h, c)
    assert sum(host_calls.values()) == 0  # computing the report never syncs
    values = read_scalars(report)
    assert host_calls == {"item": 0, "tolist": 1, "cpu": 0, "numpy": 0}
    assert set(values) == set(report.keys())
    for k, v in values.items():
        assert isinstance(v, float)
        assert v == pytest.approx(float(report[k]), rel=1e-6)


def test_grad_health_report_is_one_host_sync(host_calls):
    grads = [torch.randn(3, 4), torch.randn(5)]
    report = grad_health(grads, groups=[0, 1], n_groups=2, cfg=GradHealthConfig())
    values = read_scalars(report)
    assert host_calls["tolist"] == 1 and host_calls["item"] == host_calls["cpu"] == host_calls["numpy"] == 0
    assert isinstance(values["param_norms"], list) and len(values["param_norms"]) == 2
    assert values["finite"] == 1.0 and values["nan_count"] == 0.0


def test_read_scalars_layout():
    td = TensorDict(
        {
            "a": torch.tensor(1.5),
            "flag": torch.tensor(True),
            "n": torch.tensor(7, dtype=torch.int64),
            "half": torch.tensor([0.5, 0.25], dtype=torch.bfloat16),
            "head": {"kl": torch.tensor(0.125), "grid": torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)},
        },
        batch_size=[],
    )
    assert read_scalars(td) == {
        "a": 1.5,
        "flag": 1.0,
        "n": 7.0,
        "half": [0.5, 0.25],
        "head/kl": 0.125,
        "head/grid": [1.0, 2.0, 3.0, 4.0],
    }
    assert read_scalars(TensorDict({}, batch_size=[])) == {}
