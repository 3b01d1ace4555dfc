"""How many times each operation ran, and how long it took on average: the simulator's phases."""

from __future__ import annotations


class OpTimes:
    """Count and total seconds per operation (the worker's requests, a host's handling)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._seconds: dict[str, float] = {}

    def add(self, op: str, seconds: float, times: int = 1) -> None:
        """``times`` runs of ``op`` that took ``seconds`` each."""
        self._count[op] = self._count.get(op, 0) + times
        self._seconds[op] = self._seconds.get(op, 0.0) + seconds * times

    def status(self) -> dict[str, dict[str, float]]:
        return {
            op: {"n": n, "mean_ms": round(1e3 * float(self._seconds[op]) / n, 1)}
            for op, n in sorted(self._count.items())
            if n
        }
