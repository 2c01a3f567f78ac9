"""Runs as a batch dimension: R runs of one problem in lockstep, a federation of federations.

Runs of one problem that differ in their seed, step size, hyperparameters, participation or
work process, or evaluation cadence are the same computation with more rows. A
:class:`RunBatch` steps each run's own round loop (engine/loop.py's :class:`RunLoop`: its draws
from its own seed, its server round, its rows, its blow-up rule, its checkpoints through
``on_round``) one round at a time, all runs together, and collects their clients' work together:

- the runs whose client round is the same function this round up to its step size (one
  algorithm with equal hyperparameters but ``lr``; the same round and kind of step counts) run
  ONE client round on their stacked active rows: every run's rows gathered from its own table,
  each row given its own run's server state (a [rows, ...] stack of the runs' server fields,
  which ``algorithms.base.broadcast`` passes through) and its own run's step size lr * lr_scale
  (``RoundContext.row_lr``, read through ``algorithms.base.step_size``: a column where the runs'
  steps differ, the float itself where they agree), and one oracle for all rows
  (``Problem.runs_oracle``: exact gradients in one call, minibatches per run from its seed);
- a run alone in its group (a hyperparameter no other run has) collects on its own, as it
  would alone; so do algorithms not known to take per-row server state and step sizes
  (``STACKED``).

The server round, the commit and the evaluation stay per run (a loop over R: the server step is
a few vector operations, and every run writes its own rows). Every row of a stacked client round
is computed by the same operations as the run alone computes it (client rounds are row by row:
the engines' chunking relies on the same fact), so on a CPU in float64 a batched run's
metrics.csv equals the run alone byte for byte; tests/test_batched.py holds every stacked
algorithm to it. A run that diverges or ends leaves the batch; the others go on.

What a batch cannot hold: runs of different problems (the problem's data seed, size, dtype or
device: the problem object is shared), or of different algorithms (different client rounds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..algorithms.base import Algorithm, RoundContext, RowSteps
from ..device import host_values, mirrored
from ..problems.base import Problem
from .loop import EngineExchange, Resume, RunLoop, RunResult
from .round import Collected
from .simulate import ENGINES, schedule_of
from .tree import concat_rows, gather_rows
from .vectorized import ChunkRows

# Algorithms whose client round reads the server state only through ``broadcast`` and
# elementwise operations, and its step size only through ``step_size``, so that a stack of
# per-row server states and step sizes runs several runs' clients at once (tests/test_batched.py
# checks each against its runs alone). Others are collected run by run: a batch of them is still
# correct, only less stacked.
STACKED = frozenset({
    "focus", "sg_focus", "fedavg", "fedavg_all", "fedavg_known_p", "fednova", "fedsum_b", "fedsum", "scaffold",
    "amplified_scaffold", "mifa", "fedvarp", "fedstale", "fedau", "fedawe", "fedpbc", "debiasing_fedavg",
    "proxskip", "pushsum", "pushsum_tracking",
})  # not fedsum_cr: its client round copies x_r into each row with expand(n, d)


@dataclass
class BatchMember:
    """One run of a batch: simulate()'s arguments for it (the problem is the batch's)."""

    algorithm: Algorithm
    participation: Any
    rounds: int
    seed: int = 0
    eval_every: int | None = 1
    schedule: str | Callable[[int], float] = "constant"
    work: Any = None
    resume: Resume | None = None
    on_row: Callable[[dict], None] | None = None
    on_round: Callable[[RunResult], None] | None = None
    keep_rows: bool = True
    privacy: Any = None  # the run's focusfl.privacy.RunPrivacy (None: none); see run_rounds


class RunBatch:
    """R runs of ``problem`` stepped together (see the module docstring); ``loops[k].result`` is
    run k's result so far (consistent whenever an ``on_round`` raises)."""

    def __init__(self, problem: Problem, members: Sequence[BatchMember], *, engine: str = "vectorized") -> None:
        self.problem, self.engine = problem, ENGINES[engine]
        self.stacks = engine == "vectorized"
        self.loops = [self._loop(member) for member in members]
        self.kinds = {id(loop): self._kind(loop) for loop in self.loops}

    def _loop(self, member: BatchMember) -> RunLoop:
        start = 0 if member.resume is None else member.resume.start_round
        prepared = member.algorithm.prepare(self.problem, member.participation, seed=member.seed)
        exchange = EngineExchange(self.engine, prepared, self.problem, member.seed, start)
        return RunLoop(member.algorithm, self.problem, member.participation, member.rounds, exchange,
                       seed=member.seed, eval_every=member.eval_every, schedule=schedule_of(member.schedule),
                       work=member.work, resume=member.resume, on_row=member.on_row, on_round=member.on_round,
                       keep_rows=member.keep_rows, privacy=member.privacy)

    def run(self) -> list[RunResult]:
        """Every run to its end (its rounds done, or diverged); their results in order."""
        live = [loop for loop in self.loops if loop.start()]
        while live:
            opened = [(loop, ctx) for loop in live if (ctx := loop.open()) is not None]
            collected = self.collect(opened)
            live = [loop for (loop, ctx), work in zip(opened, collected) if loop.close(work, ctx)]
        return [loop.result for loop in self.loops]

    def collect(self, opened: list[tuple[RunLoop, RoundContext]]) -> list[Collected]:
        """Each opened run's clients' work this round, runs of one client round stacked."""
        groups: dict[tuple, list[int]] = {}
        for k, (loop, ctx) in enumerate(opened):
            kind = self.kinds[id(loop)]
            key = (k,) if kind is None else (kind, ctx.round, ctx.steps is None)
            groups.setdefault(key, []).append(k)
        collected: list[Collected | None] = [None] * len(opened)
        for group in groups.values():
            if len(group) == 1:
                loop, ctx = opened[group[0]]
                collected[group[0]] = loop.exchange.collect(loop.result.state, ctx)
                continue
            for k, work in zip(group, stacked_collect(self.problem, [opened[k] for k in group])):
                collected[k] = work
        return collected

    def _kind(self, loop: RunLoop) -> str | None:
        """What runs whose client rounds may be stacked share: the algorithm (its class and its
        hyperparameters but ``lr``, as prepared for the run); None for a run collected alone."""
        algorithm = loop.algorithm
        if not (self.stacks and algorithm.name in STACKED):
            return None
        others = {key: value for key, value in algorithm.hyperparameters().items() if key != "lr"}
        return repr((type(algorithm).__module__, type(algorithm).__qualname__, algorithm.name, sorted(others.items())))


def run_batch(problem: Problem, members: Sequence[BatchMember], *, engine: str = "vectorized") -> list[RunResult]:
    """Run every member to its end as one batch (:class:`RunBatch`); their results in order."""
    return RunBatch(problem, members, engine=engine).run()


def stacked_collect(problem: Problem, opened: Sequence[tuple[RunLoop, RoundContext]]) -> list[Collected]:
    """One client round over the stacked active rows of runs that share it; each run's share."""
    algorithm = opened[0][0].algorithm
    contexts = [ctx for _, ctx in opened]
    sizes = [int(ctx.active.numel()) for ctx in contexts]
    steps = None if contexts[0].steps is None else concat_counts([ctx.steps for ctx in contexts])
    ctx = contexts[0]._replace(active=torch.cat([c.active for c in contexts]), steps=steps,
                               row_lr=row_steps(opened, sizes, problem))
    server = per_row_server([loop.result.state.server for loop, _ in opened], sizes)
    rows = concat_rows([gather_rows(loop.result.state.clients, c.active) for loop, c in opened])
    oracle = problem.runs_oracle([(c.active, loop.seed) for loop, c in opened], round=ctx.round,
                                 steps=algorithm.round_steps(ctx))
    new_rows, message = algorithm.client_round(server, rows, oracle, ctx)
    losses = oracle.losses([c.steps for c in contexts])
    return [Collected(c.active, [ChunkRows(c.active, c.steps, part_rows)], part_message, c.steps, part_losses)
            for c, part_rows, part_message, part_losses
            in zip(contexts, split_rows(new_rows, sizes), split_rows(message, sizes), losses)]


def concat_counts(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The runs' step counts as one tensor, its host copy kept where every part has one: the
    algorithms read the largest count on the host (algorithms.base.max_steps)."""
    stacked = torch.cat(list(parts))
    hosts = [host_values(part) for part in parts]
    return stacked if any(h is None for h in hosts) else mirrored(stacked, np.concatenate(hosts))


def row_steps(opened: Sequence[tuple[RunLoop, RoundContext]], sizes: Sequence[int], problem: Problem
              ) -> RowSteps | None:
    """The runs' step sizes this round, each lr * lr_scale as the run alone computes it, one per
    row (None when they all agree: the first run's lr and schedule factor then serve every row)."""
    values = [loop.algorithm.lr * ctx.lr_scale for loop, ctx in opened]
    if all(value == values[0] for value in values):
        return None
    return RowSteps(values, sizes, problem.dtype, problem.device)


def per_row_server(servers: Sequence[Any], sizes: Sequence[int]) -> Any:
    """The runs' server states as one NamedTuple of [rows, ...] stacks: each run's fields
    repeated for each of its ``sizes[k]`` rows."""
    fields = zip(*servers)
    return type(servers[0])(*(torch.cat([value.expand(n, *value.shape) for value, n in zip(values, sizes)])
                              for values in fields))


def split_rows(tree: Any, sizes: Sequence[int]) -> list[Any]:
    """A NamedTuple of [rows, ...] stacks cut into the runs' consecutive shares."""
    parts = [field.split(list(sizes)) for field in tree]
    return [type(tree)(*(part[k] for part in parts)) for k in range(len(sizes))]
