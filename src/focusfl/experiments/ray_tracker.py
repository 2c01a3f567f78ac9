"""What a sweep's Ray tasks say while they run (executors.RayExecutor): each attempt of a task,
as it starts, tells this actor its runs and its node, so the driver knows which runs are running
where, and which Ray ran again after a lost node or worker.

Its own module, importing nothing heavy: the actor's worker process imports it (not torch)."""
from __future__ import annotations


class Tracker:
    """A Ray actor: run key -> (the node of its latest attempt, how many attempts started)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[str, int]] = {}

    def start(self, keys: list[str], node: str) -> None:
        for key in keys:
            self.started[key] = (node, self.started.get(key, ("", 0))[1] + 1)

    def snapshot(self) -> dict[str, tuple[str, int]]:
        return dict(self.started)
