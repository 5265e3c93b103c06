"""The Session's plan cache: plans by key, bounded by count and by bytes, least recently used
out first, safe to use from several threads.

A hit takes one short lock (dict lookup, move to the end). A miss builds the plan under a second
lock, so concurrent misses on one key build it once and hits never wait for a build.

A plan's bytes can grow after it is kept (its pool keeps another set of planned buffers when
runs overlap, see buffers.py): each hit re-reads ``Plan.nbytes`` and evicts if the bound is
passed."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from .planner import Plan


@dataclass(frozen=True)
class CacheInfo:
    """What the plan cache holds and has done (like ``functools.lru_cache``'s cache_info)."""

    hits: int
    builds: int
    evictions: int
    plans: int
    nbytes: int
    max_plans: int
    max_bytes: int


class PlanCache:
    """An LRU map from plan keys to plans; ``max_plans`` and ``max_bytes`` bound it."""

    def __init__(self, max_plans: int = 32, max_bytes: int = 256 << 20):
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        # key -> (plan, bytes counted for it, bytes of the key itself)
        self._plans: OrderedDict[Hashable, tuple[Plan, int, int]] = OrderedDict()
        self._nbytes = 0
        self._hits = self._builds = self._evictions = 0
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()

    def _hit(self, key: Hashable) -> Plan | None:
        """The plan under ``key`` (now the most recently used), or None."""
        entry = self._plans.get(key)
        if entry is None:
            return None
        plan, counted, extra = entry
        if plan.nbytes + extra == counted:  # the common hit: nothing to recount, no lock
            try:  # noqa: SIM105 (contextlib.suppress costs more than this whole hit)
                self._plans.move_to_end(key)  # one C call: atomic under the GIL
            except KeyError:
                pass  # evicted by another thread just now: the plan itself still runs
            self._hits += 1
            return plan
        with self._lock:
            entry = self._plans.get(key)
            if entry is None:
                return None
            self._plans.move_to_end(key)
            self._hits += 1
            plan, counted, extra = entry
            now = plan.nbytes + extra
            if now != counted:  # its buffer pool grew since
                self._plans[key] = (plan, now, extra)
                self._nbytes += now - counted
                self._evict()
            return plan

    def get_or_build(self, key: Hashable, build: Callable[..., Plan], *args) -> Plan:
        """The plan under ``key``; on a miss, ``build(*args)`` makes it (once, even when several
        threads miss together) and it is kept if it fits."""
        plan = self._hit(key)
        if plan is not None:
            return plan
        with self._build_lock:
            plan = self._hit(key)  # another thread may have built it while this one waited
            if plan is not None:
                return plan
            plan = build(*args)
            with self._lock:
                self._builds += 1
                self._insert(key, plan)
            return plan

    def _insert(self, key: Hashable, plan: Plan) -> None:
        extra = key_bytes(key)
        size = plan.nbytes + extra
        self._plans[key] = (plan, size, extra)
        self._nbytes += size
        self._evict()

    def trim(self) -> None:
        """Evict until the bounds hold (after they were lowered)."""
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        while self._plans and (len(self._plans) > self.max_plans
                               or self._nbytes > self.max_bytes):
            _, (_, dropped, _) = self._plans.popitem(last=False)
            self._nbytes -= dropped
            self._evictions += 1

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._builds, self._evictions, len(self._plans),
                             self._nbytes, self.max_plans, self.max_bytes)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._nbytes = 0

    def values(self) -> Iterator[Plan]:
        with self._lock:
            plans = [p for p, _, _ in self._plans.values()]
        return iter(plans)

    def __len__(self) -> int:
        return len(self._plans)


def key_bytes(key) -> int:
    """Bytes a key holds beyond its shapes: the values of inputs that set shapes."""
    if isinstance(key, bytes):
        return len(key)
    if isinstance(key, tuple):
        return sum(key_bytes(k) for k in key)
    return 0
