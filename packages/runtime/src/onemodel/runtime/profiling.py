"""Per-node timing of a Session's runs: a Chrome-trace JSON file (chrome://tracing and Perfetto
read it, as they read onnxruntime's profiles) and a per-op summary table.

Only a session created with ``profile=True`` pays for it: its plans run through
``Plan.execute_profiled``, which times each step; other sessions run the plain loop."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from onemodel.tensors.fileio import atomic_write


@dataclass
class Profiler:
    """Events recorded so far: one per executed node and one per run."""

    events: list[dict] = field(default_factory=list)
    _origin: float = field(default_factory=time.perf_counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now_us(self) -> float:
        return (time.perf_counter() - self._origin) * 1e6

    def record(self, name: str, category: str, start_us: float, duration_us: float,
               args: dict) -> None:
        event = {"name": name, "cat": category, "ph": "X", "ts": round(start_us, 3),
                 "dur": round(duration_us, 3), "pid": os.getpid(), "tid": threading.get_ident(),
                 "args": args}
        with self._lock:
            self.events.append(event)

    def write(self, path: str | os.PathLike) -> str:
        """Write the Chrome trace (atomically) and return its path."""
        with self._lock:
            data = json.dumps({"traceEvents": list(self.events), "displayTimeUnit": "ms"})
        atomic_write(path, [data.encode()])
        return os.fspath(path)

    def summary(self) -> str:
        """Time per op type over every recorded run, largest first."""
        total: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        with self._lock:
            nodes = [e for e in self.events if e["cat"] == "Node"]
        for e in nodes:
            total[e["args"]["op"]] += e["dur"]
            calls[e["args"]["op"]] += 1
        whole = sum(total.values()) or 1.0
        lines = [f"{'op':<24}{'calls':>8}{'total ms':>12}{'mean us':>12}{'share':>8}"]
        for op, us in sorted(total.items(), key=lambda kv: -kv[1]):
            lines.append(f"{op:<24}{calls[op]:>8}{us / 1e3:>12.3f}{us / calls[op]:>12.1f}"
                         f"{us / whole:>8.1%}")
        return "\n".join(lines)
