"""The ServerApp: builds the run from its configuration, runs AlgorithmStrategy, writes the run
folder (the same metrics.csv / config.json / curve.png / model.pt as ``focusfl run``, plus the realized
trace).

The federation's configuration travels as one run-config value, ``focusfl``: a JSON object with
the keys of :class:`FederationConfig`. ``flwr run APP --run-config 'focusfl="{...}"'`` or
``focusfl federation local`` sets it.

Outputs (``out``):
- ``metrics.csv``: evaluated rows as in ``focusfl run`` plus cumulative rejection counts
  (``rejected_<reason>``), clients requested so far and clients whose state was lost;
- ``trace.csv``: the accepted clients per round (0/1, rounds x clients), and ``config.json``,
  which replays the federation with the reference engine on that trace:
  ``focusfl run --config OUT/config.json --out OUT-replay`` gives the same model bits;
- ``work.csv``: the local steps each accepted client took in each round (``round,client,steps``,
  the format of the ``trace`` work process): fewer than asked where a node's deadline cut its
  round short. config.json replays it (``work: trace:path=OUT/work.csv`` with its SHA-256)
  when the run had a work process or a client stopped short; else every count is tau and
  config.json keeps ``work: fixed``;
- ``participation.csv``: every requested client and every rejection, with the reason;
- ``federation.json``: the settings, nodes, rejection totals, lost clients and the audit;
- ``model.pt``: the final model, as ``focusfl run`` writes it (``{"x": [d]}``).
"""
from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .. import __version__
from ..algorithms import algorithm_record
from ..algorithms.base import State
from ..algorithms.importing import algorithm_imports
from ..device import policy_applied
from ..errors import ConfigError
from ..io.atomic import write_csv, write_json
from ..io.folders import open_output
from ..runs.checkpoint import MODEL, save_model
from ..runs.config import RunConfig, WithRun, record
from ..privacy import parse_dp, run_privacy
from ..runs.driver import build, policy_of
from ..runs.folder import BUDGET_EXHAUSTED, COMPLETE, DIVERGED, INTERRUPTED, write_finished
from ..signals import handled
from ..threads import fixed_threads
from ..work.trace import trace_record, trace_text
from .defaults import FEDERATION_DEFAULTS
from .strategy import AlgorithmStrategy, FederationResult, StopRounds

RUN_CONFIG_KEY = "focusfl"


# Its own knobs, with their defaults.
# allow_algorithm_import: the user's permission, given to `federation local` or `federation app` with
# --allow-algorithm-import, for the ServerApp to import the algorithm class the run names (their code).
KNOBS = {"timeout": 30.0, "out": None, "token": None, "audit": True, "allow_algorithm_import": False, "min_nodes": 0}


@dataclass(frozen=True, init=False)
class FederationConfig(WithRun):
    """A federation: a run (runs.config.RunConfig, its fields read through: ``config.rounds``)
    and its own knobs: ``timeout`` (seconds an exchange waits for replies), ``out`` (the run
    folder; None: results are only logged), ``token`` and ``audit`` (ask nodes for their
    committed state at the end and check it), ``min_nodes`` (nodes to wait for, up to
    ``timeout`` seconds, before the first round; 0: start with those connected).
    ``participation`` may also be "available": every node that answers. Built as ``FederationConfig(run, timeout=...)`` or from the run's fields
    themselves, ``FederationConfig(algorithm="focus", rounds=8, timeout=5.0)``, with
    FEDERATION_DEFAULTS over the record's own."""

    run: RunConfig
    timeout: float
    out: str | None
    token: str | None
    audit: bool
    allow_algorithm_import: bool
    min_nodes: int

    def __init__(self, run: RunConfig | None = None, *, timeout: float = KNOBS["timeout"], out: str | None = None,
                 token: str | None = None, audit: bool = True, allow_algorithm_import: bool = False,
                 min_nodes: int = 0, **run_fields: Any) -> None:
        if run is None:
            run = RunConfig(**{**FEDERATION_DEFAULTS, **run_fields})
        elif run_fields:
            raise ConfigError(f"a federation takes its run or its run's fields, not both ({sorted(run_fields)[0]!r})")
        if not isinstance(allow_algorithm_import, bool):
            raise ConfigError(f"allow_algorithm_import must be true or false, got {allow_algorithm_import!r}")
        if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < 0:
            raise ConfigError(f"min_nodes must be a whole number >= 0, got {min_nodes!r}")
        for name, value in (("run", run), ("timeout", timeout), ("out", out), ("token", token), ("audit", audit),
                            ("allow_algorithm_import", allow_algorithm_import), ("min_nodes", min_nodes)):
            object.__setattr__(self, name, value)

    @classmethod
    def from_json(cls, text: str) -> "FederationConfig":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"run config {RUN_CONFIG_KEY!r} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"run config {RUN_CONFIG_KEY!r}: unknown key '(not an object)'")
        knobs = {k: data[k] for k in KNOBS if k in data}
        run = {**FEDERATION_DEFAULTS, **{k: v for k, v in data.items() if k not in KNOBS}}
        return cls(RunConfig.from_dict(run, where=f"run config {RUN_CONFIG_KEY!r}"), **knobs)

    def to_json(self) -> str:
        return json.dumps({**self.run.to_dict(), "timeout": self.timeout, "out": self.out, "token": self.token,
                           "audit": self.audit, "allow_algorithm_import": self.allow_algorithm_import,
                           "min_nodes": self.min_nodes}, sort_keys=True)

    def resolved(self) -> "FederationConfig":
        """With the problem's defaults for the fields left None (dtype, eval_every)."""
        return FederationConfig(self.run.with_problem_defaults(), timeout=self.timeout, out=self.out,
                                token=self.token, audit=self.audit, allow_algorithm_import=self.allow_algorithm_import,
                                min_nodes=self.min_nodes)


def available(participation: str | dict) -> bool:
    """Whether a federation's participation is "available" (whoever answers) rather than a process."""
    return participation in ("available", {"name": "available"})


def check_timeout(timeout: Any) -> None:
    """A round's wait: a positive, finite number of seconds (0, nan or -5 would end every round
    with no client at once; inf would never end one)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")


def build_strategy(config: FederationConfig, log=print) -> tuple[AlgorithmStrategy, Any]:
    """The run built by the one builder (runs.driver.build), as the reference engine computes
    it, and the strategy that runs it over a Grid."""
    check_timeout(config.timeout)
    run = config.resolved().run
    anyone = available(run.participation)
    problems: dict = {}
    built = build(run.replace(participation="full" if anyone else run.participation, engine="reference"),
                  problems=problems)
    # The noise's nonce is the one `focusfl run` with these options draws (its run key's), so a
    # local-mode federation computes what the run does; under "available" (no process to run
    # alone) the run as built here. config.json records it in its dp (write_results).
    nonce = built.dp_nonce if anyone or parse_dp(run.dp) is None else build(run, problems=problems).dp_nonce
    participation = None if anyone else built.participation
    # No amplification by sampling in a federation: who arrives depends on the nodes' failures too,
    # not on the process's coins alone (and the replay on the realized trace accounts alike).
    # Local mode: the nodes clip and noise before sending (client_app.py); central: the server.
    # The nodes read the nonce from the dp record they are sent.
    privacy = run_privacy(run.dp, built.algorithm, built.problem, None, seed=run.seed, end_round=run.rounds,
                          federated=True, nonce=nonce)
    strategy = AlgorithmStrategy(built.algorithm, built.problem, rounds=run.rounds,
                                 participation=participation, work=built.work,
                                 seed=run.seed, dtype=built.config.dtype, schedule=run.schedule,
                                 eval_every=built.config.eval_every, timeout=config.timeout, token=config.token, log=log,
                                 privacy=privacy, min_nodes=config.min_nodes)
    return strategy, built


def run_federation(grid: Grid, config: FederationConfig, log=print) -> FederationResult:
    config = config.resolved()
    strategy, built = build_strategy(config, log=log)
    started = time.monotonic()
    # threads and the device policy (deterministic kernels): as the reference replay computes
    with fixed_threads(), policy_applied(policy_of(built.config)), _stop_rounds_on_signals():
        result = strategy.start(grid)
    if config.audit and result.interrupted is None:
        result.audit = strategy.audit(grid)
        gap = result.audit.get("tracking")
        if gap:
            log(f"audit: {gap} holds to {result.audit['tracking_gap']:.3e} (relative)")
        if result.audit["unverified_clients"]:
            log(f"audit: clients {result.audit['unverified_clients']} could not be verified")
    for node, why in sorted(strategy.refusals.items()):
        log(f"audit: node {node} was refused at the handshake ({why})")
    if result.interrupted is not None:
        _keep_interrupted(config, strategy, built, result, time.monotonic() - started, log)
        signal.raise_signal(result.interrupted)  # then as the signal asks (Flower's graceful exit)
        return result
    seconds = time.monotonic() - started
    last = result.rows[-1] if result.rows else {}
    log(f"done: {len(result.mask)} rounds in {seconds:.1f} s; "
        + ", ".join(f"{k}={last[k]:.3e}" for k in ("loss", "rel_error") if k in last))
    if result.partial:
        log(f"work: {result.partial} client rounds stopped short by their node's deadline (accepted as partial "
            "work; the steps taken are in work.csv)")
    if config.out:
        write_results(Path(config.out), strategy, built, config, result, seconds)
    return result


def _stop_rounds_on_signals():
    """SIGTERM and SIGINT (``federation local`` stopped by Ctrl-C, ``flwr stop``) stop the round
    loop (StopRounds) so that the rounds done are written; main thread only, as Python allows."""
    def handler(signum, frame) -> None:
        raise StopRounds(signum)

    return handled((signal.SIGTERM, signal.SIGINT), handler)


def _keep_interrupted(config: FederationConfig, strategy: AlgorithmStrategy, built, result: FederationResult,
                      seconds: float, log) -> None:
    """A stopped federation's rounds done, as a run folder whose config.json says ``interrupted``
    (and replays them); nothing when no round was done."""
    done = int(result.mask.shape[0])
    name = signal.Signals(result.interrupted).name
    if not config.out or done == 0:
        log(f"focusfl: {name}: stopped after {done} rounds; nothing written")
        return
    write_results(Path(config.out), strategy, built, config, result, seconds)
    log(f"focusfl: {name}: stopped after {done} rounds; the rounds done are in {config.out}")


def write_results(out: Path, strategy: AlgorithmStrategy, built, config: FederationConfig,
                  result: FederationResult, seconds: float) -> None:
    """The federation's run folder: what ``focusfl run`` writes (through runs.folder's writer:
    metrics.csv, config.json with the same keys, model.pt, curve.png), with config.json replaying
    the realized trace on the reference engine, and the federation's own files beside them."""
    out = out.expanduser().resolve()
    mask = result.mask.astype(np.int8)
    every_client = bool(mask.any(axis=0).all()) and mask.shape[0] > 0
    rounds = int(mask.shape[0])
    # The reference engine on the realized trace replays it (its participation and work below).
    replay = built.config.replace(rounds=rounds, device="cpu", engine="reference", work="fixed")
    if strategy.privacy is not None:  # with its nonce: the replay draws the federation's noise
        replay = replay.replace(dp=strategy.privacy.dp.describe())
    work_text = trace_text([(r, c, int(result.work[r, c])) for r, c in zip(*np.nonzero(result.work))])
    # The counts replay as a work trace when they are not all tau under a fixed work process.
    counted = strategy.work is not None or bool((result.work[mask.astype(bool)] != strategy.tau).any())
    with open_output(out, kind="federation", keep_partial=False) as output:
        work = output.work
        save_model(work / MODEL, strategy.algorithm.model(State(result.server, None)))
        (work / "trace.csv").write_text(_trace_text(mask))
        (work / "work.csv").write_text(work_text)
        write_csv(work / "participation.csv", _participation_events(result),
                  ["round", "client", "outcome", "reason", "detail"])
        title = f"{strategy.algorithm.name} on {built.problem.name}, federated ({len(result.nodes)} nodes)"
        recorded = record(replay, algorithm=algorithm_record(strategy.algorithm), problem=built.problem.describe(),
                          participation={"name": "trace", "path": str(out / "trace.csv"),
                                         **({} if every_client else {"absent": True})},
                          work=trace_record(out / "work.csv", work_text) if counted else None)
        status = DIVERGED if result.diverged_at is not None else COMPLETE if result.stopped is None else BUDGET_EXHAUSTED
        if result.stopped is not None:
            recorded["stopped"] = result.stopped
        if result.interrupted is not None:
            status, recorded["interrupted_after_round"] = INTERRUPTED, rounds
        write_finished(work, recorded, result.rows, status=status, rounds_done=rounds, title=title)
        audit = dict(result.audit or {})
        audit.pop("clients", None)
        audit.pop("rows", None)
        write_json(work / "federation.json", {
            "focusfl_version": __version__, "federation": json.loads(config.to_json()),
            "participation": built.participation.describe() if strategy.participation is not None else "available",
            "nodes": {str(node): client for node, client in sorted(result.nodes.items())},
            "rejections": dict(sorted(result.counts.items())), "lost_clients": result.lost,
            "work": built.work.describe(), "partial_work": result.partial,
            "deadlines": {str(client): seconds for client, seconds in result.deadlines.items()},
            "audit": audit, "seconds": round(seconds, 3),
            "interrupted": None if result.interrupted is None else signal.Signals(result.interrupted).name,
            # The trace replays with --participation trace:path=... only if every client took part
            # (else trace:path=...,absent=true, as config.json does).
            "replayable": every_client,
        })
        output.publish()


def _trace_text(mask: np.ndarray) -> str:
    """trace.csv: the accepted clients per round, 0/1, one column per client."""
    header = ",".join(f"client{i}" for i in range(mask.shape[1]))
    return "\n".join([header] + [",".join(str(int(v)) for v in row) for row in mask]) + "\n"


def _participation_events(result: FederationResult) -> list[dict]:
    """participation.csv: every requested client and every rejected reply, with the reason."""
    events = []
    for entry in result.log:
        why = {}
        for client, reason, detail in entry.rejected:
            if client in entry.requested and client not in why:
                why[client] = (reason, detail)
            else:  # replies that belong to no request of this round's client (stale, duplicate)
                events.append({"round": entry.round, "client": client, "outcome": "reply_rejected",
                               "reason": reason, "detail": detail[:200]})
        for client in entry.requested:
            reason, detail = why.get(client, ("", ""))
            outcome = "accepted" if client in entry.accepted else "rejected"
            events.append({"round": entry.round, "client": client, "outcome": outcome, "reason": reason,
                           "detail": detail[:200]})
    return events


def make_server_app(config: FederationConfig, sink: dict | None = None, log=print) -> ServerApp:
    """A ServerApp for ``config`` given in code (Flower simulation, tests); the result goes into
    ``sink["result"]`` when the ServerApp runs in this process."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        result = run_federation(grid, config, log=log)
        if sink is not None:
            sink["result"] = result

    return server_app


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    text = context.run_config.get(RUN_CONFIG_KEY)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"the run config needs {RUN_CONFIG_KEY}=<JSON of the federation>")
    config = FederationConfig.from_json(text)
    with algorithm_imports(config.allow_algorithm_import):
        run_federation(grid, config)
