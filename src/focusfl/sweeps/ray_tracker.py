"""What a sweep's Ray tasks say while they run (executors.RayExecutor): each attempt of a task,
as it starts, tells this actor its runs and its node, so the driver knows which runs are running
where, and which Ray ran again after a lost node or worker. A task that runs where the sweep
folder is not (its runs shipped back) also hands it each checkpoint as it is written, so that
Ray's next attempt, on another node, resumes from the latest one; the actor lives on the
driver's node, which outlives any worker node lost.

Its own module, importing nothing heavy: the actor's worker process imports it (not torch)."""
from __future__ import annotations


class Tracker:
    """A Ray actor: run key -> (the node of its latest attempt, how many attempts started), and
    run key -> the latest checkpoint of a shipped run (executors.folder_snapshot's dict)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[str, int]] = {}
        self.checkpoints: dict[str, dict] = {}

    def start(self, keys: list[str], node: str) -> None:
        for key in keys:
            self.started[key] = (node, self.started.get(key, ("", 0))[1] + 1)

    def snapshot(self) -> dict[str, tuple[str, int]]:
        return dict(self.started)

    def keep(self, key: str, checkpoint: dict) -> None:
        """Hold ``checkpoint`` unless one of a later round is held (an attempt thought lost may
        still be writing older ones)."""
        held = self.checkpoints.get(key)
        if held is None or checkpoint["round"] >= held["round"]:
            self.checkpoints[key] = checkpoint

    def latest(self, keys: list[str]) -> dict[str, dict]:
        return {key: self.checkpoints[key] for key in keys if key in self.checkpoints}

    def forget(self, keys: list[str]) -> None:
        for key in keys:
            self.checkpoints.pop(key, None)
