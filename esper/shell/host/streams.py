"""One CUDA stream per env (finding S1: every cross-stream read waits on the writer's event)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class EnvStreams:
    """One CUDA stream per env (none on CPU), with an event per env marking the end of its queued
    work. Results produced inside :meth:`run` are only read after :meth:`join` made the consumer's
    current stream wait on that env's event (finding S1)."""

    def __init__(self, devices: list[torch.device]) -> None:
        self.devices = devices
        self.streams = [torch.cuda.Stream(device=d) if d.type == "cuda" else None for d in devices]
        self.events: list = [None] * len(devices)

    @contextmanager
    def run(self, i: int) -> Iterator[None]:
        stream = self.streams[i]
        if stream is None:
            yield
            return
        stream.wait_stream(torch.cuda.current_stream(self.devices[i]))  # inputs queued on the default
        with torch.cuda.stream(stream):
            yield
        event = torch.cuda.Event()
        event.record(stream)
        self.events[i] = event

    def join(self, i: int, tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Env ``i``'s ``tensors`` made safe to use on ``device``'s current stream."""
        if self.events[i] is not None:
            consumer = torch.cuda.current_stream(self.devices[i])
            consumer.wait_event(self.events[i])
            for t in tensors:
                t.record_stream(consumer)  # the allocator must not reuse them while the consumer reads
        return [t.to(device, non_blocking=True) for t in tensors]


__all__ = ["EnvStreams"]
