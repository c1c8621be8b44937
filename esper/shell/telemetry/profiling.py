"""``--profile N``: a ``torch.profiler`` trace of a run's first N updates (issue 92).

:class:`UpdateProfiler` records every operator of those updates, the episodes (``esper.rollout``) and the
PPO update (``esper.ppo_update``) marked as ranges, on the CPU and, where the run's device is CUDA, on the
GPU. When the N-th update ends (or the run ends first) it writes into ``RUN_DIR/profile/``:

- ``trace.json.gz``: the whole trace, for Perfetto (ui.perfetto.dev) or ``chrome://tracing``;
- ``top_ops.txt``: torch's table of the operators that took the most time by themselves (self time,
  the GPU's where there is one);

and returns what the ``profile`` event logs, the table's top :data:`TOP` rows among them, which the
report shows (:mod:`esper.shell.telemetry.report`). A run that stops early stops the profiler without
writing. Profiling costs time (every operator is recorded): the profiled updates' ``seconds`` are not
the run's speed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

#: The run directory's folder for the profile.
PROFILE_DIR = "profile"
TRACE = "trace.json.gz"
TABLE = "top_ops.txt"
#: Rows of the top operators kept in the ``profile`` event (and the report).
TOP = 15


class UpdateProfiler:
    """The profiler of a run's first ``updates`` updates; :meth:`start` before the first,
    :meth:`update_done` after each (the result once the last is done), :meth:`finish` if the run ends
    earlier, :meth:`stop` if it stops on an error."""

    def __init__(self, run_dir: Path, updates: int, device: str | torch.device) -> None:
        if updates < 1:
            raise ValueError(f"UpdateProfiler: updates must be >= 1, got {updates}")
        self.dir = Path(run_dir) / PROFILE_DIR
        self.updates, self.done = updates, 0
        self.cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self.running = False

    def start(self) -> None:
        self._prof.start()
        self.running = True

    def update_done(self) -> dict | None:
        """Count an update; after the last profiled one, :meth:`finish` (its result), else None."""
        self.done += 1
        return self.finish() if self.running and self.done >= self.updates else None

    def stop(self) -> None:
        """Stop recording, writing nothing (a run that stops on an error or a signal)."""
        if self.running:
            self.running = False
            self._prof.stop()

    def finish(self) -> dict:
        """Stop, write the trace and the table, and return the ``profile`` event's fields: ``updates``
        (profiled), ``trace`` and ``table`` (paths relative to the run directory), ``sort_by`` and ``top``
        (the first :data:`TOP` rows: ``name``, ``calls``, ``self_ms``, ``total_ms``, each operator's self
        and total time summed over its calls, on the GPU where ``sort_by`` says device, else the CPU)."""
        self.stop()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(self.dir / TRACE))
        sort_by = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        averages = self._prof.key_averages()
        (self.dir / TABLE).write_text(averages.table(sort_by=sort_by, row_limit=40) + "\n")
        total = "device_time_total" if self.cuda else "cpu_time_total"
        rows = sorted(averages, key=lambda e: getattr(e, sort_by), reverse=True)[:TOP]
        top = [
            {"name": e.key, "calls": int(e.count), "self_ms": getattr(e, sort_by) / 1e3,
             "total_ms": getattr(e, total) / 1e3}
            for e in rows
        ]  # fmt: skip
        where = lambda name: f"{PROFILE_DIR}/{name}"
        return {
            "updates": self.done,
            "trace": where(TRACE),
            "table": where(TABLE),
            "sort_by": sort_by,
            "top": top,
        }


__all__ = ["PROFILE_DIR", "TABLE", "TOP", "TRACE", "UpdateProfiler"]
