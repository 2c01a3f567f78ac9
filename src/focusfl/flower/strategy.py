"""AlgorithmStrategy: any focusfl algorithm as one Flower strategy, exact under faults.

The strategy is the exchange of the round loop every focusfl run has (engine/loop.py): it
moves state and messages, it never re-implements an update rule, and the loop (not the
strategy) steps the server, counts traffic, evaluates and applies the blow-up rule, as it does
for a simulation. Round r:

1. Who is asked: the participation process's S_r (a replayable experiment) or, with
   ``participation=None`` ("available"), every known node that is online. Clients without a
   live node, and clients whose state was lost, are rejected before anything is sent.
2. ``train`` to each: the server fields ``client_round`` reads, the client's index, the round,
   ``ack`` = the server's record of the client's last accepted round (the commit protocol,
   node.py), and ``steps`` = tau_i,r drawn by the run's work process (none: local_steps). Each
   node runs ``client_round`` on its own row, exactly as the reference loop does, and says how
   many steps it took: a node whose deadline passed stops early (deadline.py), and its reply is
   accepted as partial work, 1 <= tau_i,r <= asked (a count outside is malformed). It also
   sends the minibatch losses of those steps (nn problems), which the rows report as
   ``train_loss``, as the reference engine's rounds return them.
3. Replies are matched to requests by ``reply_to_message_id``. Rejected, and counted as
   non-participation: timeouts (no reply), error replies (from the node or from the SuperLink
   for a lost node), lost state, NaN/inf, wrong fields, dtype or shape, duplicates, replies
   for another round or request (stale, late), replies from an unexpected node.
4. The accepted messages are stacked in client order (``aggregate_train``) and the loop's
   server step runs ``server_round`` on them with RoundContext(active = accepted). Accepted
   clients' ``ack`` becomes r.
5. Algorithms with ``client_finish`` (FedAWE, ProxSkip) send ``train.finish`` with the new
   server state. A finish that does not arrive leaves the node unable to commit round r; it
   says so (lost state) at its next contact and is excluded from then on.

The realized participation (accepted per round) and the realized step counts are the run's
traces: the reference engine replaying them computes the same model bit for bit. Nothing here waits forever: every exchange
has a timeout, and a round with nobody in it still takes the server step, as in Algorithm 1.
"""
from __future__ import annotations

import contextlib
import functools
import math
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.superlink.grid import http_grid
from flwr.superlink.grid.http_grid import HttpGrid

from ..algorithms import algorithm_record
from ..algorithms.base import Algorithm, RoundContext, State, check_work_process
from ..engine.divergence import BlowUpDetector
from ..engine.loop import Resume, run_rounds
from ..engine.round import Collected
from ..engine.rows import evaluation_row
from ..engine.simulate import schedule_of
from ..engine.tree import concat_rows, gather_rows
from ..errors import ConfigError, FederationError
from .client_app import ERROR_CODE, has_finish
from .codec import (CTX, MESSAGE, ROWS, RUN, SERVER, STATUS, Malformed, RunSpec, WireContext, decode_tree,
                    encode_ctx, encode_run, encode_tree, pack, unpack)
from .node import data_fingerprint, has_memory

# Reasons a client's round is not accepted (metrics.csv has a cumulative column for each).
REASONS = ("timeout", "error", "lost_state", "non_finite", "malformed", "duplicate", "stale",
           "unknown_node", "no_node", "client_failure")


class _Recorder:
    """Notes which server fields a client-side call reads (only those are sent to nodes)."""

    def __init__(self, server: Any) -> None:
        self.read: set[str] = set()
        recorder, fields = self, server._fields

        class Recording(type(server)):
            __slots__ = ()

            def __getattribute__(self, name: str) -> Any:
                if name in fields:
                    recorder.read.add(name)
                return super().__getattribute__(name)

        self.server = Recording(*server)

    def fields(self, order: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name for name in order if name in self.read)


@dataclass
class RoundLog:
    """What happened to each client in one round."""

    round: int
    requested: list[int]
    accepted: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)  # (client or -1, reason, detail)
    asked: dict[int, int] = field(default_factory=dict)  # client -> tau_i,r of the work process (none: tau)
    steps: dict[int, int] = field(default_factory=dict)  # accepted client -> local steps it took


class StopRounds(KeyboardInterrupt):
    """A stop signal in the round loop (server_app's handler raises it): the rounds done are kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class FederationResult:
    rows: list[dict]
    server: Any
    mask: np.ndarray  # [rounds, N] accepted clients: the realized trace
    log: list[RoundLog]
    counts: Counter
    lost: list[int]
    nodes: dict[int, int]  # node id -> client
    audit: dict | None = None
    diverged_at: int | None = None
    blow_up: BlowUpDetector | None = None  # the run's detector (its reason() says why a run stopped)
    work: np.ndarray | None = None  # [rounds, N] int64: local steps of each accepted client (0: not accepted)
    partial: int = 0  # accepted client rounds with fewer steps than asked (deadlines)
    deadlines: dict[int, float] = field(default_factory=dict)  # client -> its node's deadline, seconds
    interrupted: int | None = None  # the signal that stopped the rounds (mask: the rounds done before it)
    stopped: str | None = None  # why the rounds stopped early otherwise (a DP budget: engine/loop.py)


class AlgorithmStrategy(Strategy):
    """Runs ``algorithm`` on ``problem`` over a Flower Grid; see the module docstring.

    ``participation``: a focusfl participation process (S_r requested), or None: every online
    node takes part. ``work``: a focusfl work process (tau_i,r asked of each client), or None
    (or fixed): every client is asked for local_steps. ``timeout``: seconds an exchange waits
    for replies. ``min_nodes``: nodes connected before the first round, waited for up to
    ``timeout`` seconds (Flower's simulation registers its nodes while the ServerApp starts:
    without the wait, a round may find half of them missing)."""

    def __init__(self, algorithm: Algorithm, problem: Any, *, rounds: int, participation: Any = None,
                 work: Any = None,
                 seed: int = 0, dtype: str = "float64", schedule: str = "constant", eval_every: int = 1,
                 timeout: float = 30.0, token: str | None = None, on_row: Callable[[dict], None] | None = None,
                 on_round: Callable[["AlgorithmStrategy", RoundLog], None] | None = None,
                 log: Callable[[str], None] | None = None, privacy: Any = None, min_nodes: int = 0) -> None:
        n = problem.num_clients
        if min_nodes > n:
            raise ConfigError(f"min_nodes is {min_nodes}, but the problem has {n} clients (one node runs one client)")
        self.min_nodes = min_nodes
        if participation is not None and participation.num_clients != n:
            raise ValueError(f"participation has {participation.num_clients} clients, problem has {n}")
        self.problem, self.rounds, self.seed, self.timeout = problem, rounds, seed, float(timeout)
        self.participation, self.eval_every = participation, eval_every
        self.schedule = schedule_of(schedule)
        self.algorithm = algorithm.prepare(problem, participation, seed=seed)
        self.tau = self.algorithm.local_steps
        self.work = None if work is None or work.fixed else work
        if self.work is not None:
            if self.work.num_clients != n or self.work.local_steps != self.tau:
                raise ValueError(f"work is for {self.work.num_clients} clients and {self.work.local_steps} steps, "
                                 f"the run has {n} and {self.tau}")
            check_work_process(self.algorithm, self.work)
        self.partial = 0
        self.deadlines: dict[int, float] = {}
        self.initial: State = self.algorithm.init(problem.initial_point(), n)
        self.server = self.initial.server
        # Local DP travels to the nodes, which noise before sending; central DP stays here.
        noised_by_nodes = privacy is not None and privacy.noised_by_clients
        self.run = RunSpec(algorithm_record(self.algorithm), problem.describe(), seed, dtype, token or uuid.uuid4().hex,
                           dp=privacy.dp.describe() if noised_by_nodes else None)
        self.tracked = has_memory(self.initial.clients)
        self.finishes = has_finish(self.algorithm)
        self.train_fields, self.finish_fields, self.message_template = self._probe()
        self.node_client: dict[int, int] = {}  # node id -> client index
        self.client_node: dict[int, int] = {}
        self.committed = [-1] * n  # the server's record of each client's last accepted round
        self.lost: set[int] = set()
        self.counts: Counter = Counter()
        self.on_row, self.on_round, self.log = on_row, on_round, log or (lambda text: None)
        self.requested_total = 0
        self.refused: set[int] = set()  # nodes whose handshake was malformed: never asked again
        self.refusals: dict[int, str] = {}  # refused node -> why (the audit reports them)
        self.told: set[tuple[int, str]] = set()  # (node, reason) of handshake failures logged
        self.data = data_fingerprint(problem)  # nn: every node must hold the same client data
        # Client-level DP (focusfl.privacy.RunPrivacy): central mode, the round loop clips and
        # noises the accepted messages before the server step, exactly where a simulation does;
        # local mode (noised_by_clients), they arrive noised by the nodes and are only counted.
        self.privacy = privacy

    # -- set-up ----------------------------------------------------------------------------
    def _probe(self) -> tuple[tuple[str, ...], tuple[str, ...], Any]:
        """Server fields read by client_round / client_finish, and one client's message shape."""
        order = self.initial.server._fields
        one = torch.tensor([0], device=self.problem.device)
        ctx = RoundContext(round=0, active=one, num_clients=self.problem.num_clients)
        train = _Recorder(self.initial.server)
        rows, message = self.algorithm.client_round(
            train.server, gather_rows(self.initial.clients, one), self.problem.oracle(one, seed=self.seed, round=0), ctx)
        finish = _Recorder(self.initial.server)
        if self.finishes:
            self.algorithm.client_finish(finish.server, rows, ctx)
        return train.fields(order), finish.fields(order), message

    # -- Flower's Strategy interface: the exchange of a round ------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Train messages of Flower round ``server_round`` (focusfl round server_round - 1) to the
        clients the round loop asks (:meth:`_requested`)."""
        entry = self._entry
        assert entry.round == server_round - 1
        return self._messages(entry, "train", self.train_fields)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Accept or reject each reply (the module docstring's rules). The server step itself is
        the round loop's (engine/loop.py), so no arrays are aggregated here."""
        entry = self._entry
        self._accept(entry, replies)
        return None, MetricRecord({"accepted": len(entry.accepted), "requested": len(entry.requested)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []  # the server evaluates the model on its copy of the problem

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        self.log(f"focusfl {self.algorithm.name} on {self.problem.name}: {self.problem.num_clients} clients, "
                 f"{self.rounds} rounds, participation "
                 f"{'available' if self.participation is None else self.participation.name}")

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, **unused: Any) -> FederationResult:
        """Run the federation: the round loop every focusfl run has (engine/loop.py), with this
        strategy as its exchange (:class:`_Exchange`). ``initial_arrays`` is ignored (x_0 comes
        from the problem)."""
        if timeout is not None:
            self.timeout = float(timeout)
        rounds = self.rounds if num_rounds is None else num_rounds
        self.summary()
        self._await_nodes(grid)
        exchange = _Exchange(self, grid, rounds)
        rows: list[dict] = []  # as they come: a stop keeps those of the rounds done

        def keep(row: dict) -> None:
            rows.append(row)
            if self.on_row is not None:
                self.on_row(row)

        try:
            result = run_rounds(self.algorithm, self.problem, self.participation, rounds, exchange, seed=self.seed,
                                eval_every=self.eval_every, schedule=self.schedule, work=self.work,
                                resume=Resume(self.initial, 0), on_row=keep, privacy=self.privacy)
        except StopRounds as stop:  # server_app's signal handler: keep the rounds done
            return self._stopped(exchange, rows, stop.signum)
        if result.diverged_at is not None:
            self.log(f"diverged at round {result.diverged_at} ({result.blow_up.reason(result.rows[-1])})")
        done = result.rounds_done
        return FederationResult(result.rows, result.state.server, exchange.mask[:done], exchange.log, self.counts,
                                sorted(self.lost), dict(self.node_client), diverged_at=result.diverged_at,
                                blow_up=result.blow_up, work=exchange.work[:done], partial=self.partial,
                                deadlines=dict(sorted(self.deadlines.items())), stopped=result.stopped)

    def _stopped(self, exchange: "_Exchange", rows: list[dict], signum: int) -> FederationResult:
        """The result of the rounds a stop signal left done (the round in progress is not one of
        them), its last row that of the last round done: a closing row (engine/loop.py) where the
        cadence had none there (the minibatch losses since the previous row are not in it)."""
        done, server = len(exchange.log), exchange.done_server
        rows = [row for row in rows if row["round"] <= done]
        if rows and rows[-1]["round"] != done:
            comm = self.algorithm.communication()
            vectors = sum(len(entry.accepted) for entry in exchange.log) * self.problem.dim
            rows.append(evaluation_row(self.algorithm.model(State(server, None)), self.problem, BlowUpDetector(),
                                       done=done, active=len(exchange.log[-1].accepted),
                                       comm=(vectors * comm.down, vectors * comm.up), extra=self.counters()))
        return FederationResult(rows, server, exchange.mask[:done], exchange.log, self.counts, sorted(self.lost),
                                dict(self.node_client), work=exchange.work[:done], partial=self.partial,
                                deadlines=dict(sorted(self.deadlines.items())), interrupted=signum)

    def _await_nodes(self, grid: Grid) -> None:
        """Until ``min_nodes`` nodes are connected, or FederationError after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        while (connected := len(grid.get_node_ids())) < self.min_nodes:
            if time.monotonic() >= deadline:
                raise FederationError(f"{connected} of the {self.min_nodes} nodes min_nodes asks for connected "
                                      f"within {self.timeout:g} s (the timeout); start more nodes, or lower min_nodes")
            time.sleep(min(NODE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        if self.min_nodes:
            self.log(f"{connected} nodes connected (min_nodes {self.min_nodes})")

    # -- the round ---------------------------------------------------------------------------
    def _discover(self, grid: Grid) -> None:
        """Handshake with nodes not seen yet: which client does each run?"""
        live = set(grid.get_node_ids())
        new = sorted(live - set(self.node_client) - self.refused)
        if not new:
            return
        messages = {}
        for node in new:
            message = Message(pack({RUN: encode_run(self.run)}), dst_node_id=node, message_type="query",
                              group_id="hello", ttl=_ttl(self.timeout))
            messages[node] = message
        replies = send_and_receive(grid, list(messages.values()), timeout=self.timeout)
        by_id = {m.metadata.message_id: node for node, m in messages.items()}
        for reply in replies:
            node = by_id.pop(reply.metadata.reply_to_message_id, None)
            if node is None or reply.metadata.src_node_id != node:
                self._count("unknown_node")
                continue
            records = {} if reply.has_error() else _records(reply)  # malformed: no STATUS
            if reply.has_error() or STATUS not in records:
                reason = _reason(reply) if reply.has_error() else "malformed"
                self._count(reason)
                detail = reply.error.reason if reply.has_error() else "no status"
                if reason == "malformed":  # e.g. no usable partition-id: asking again will not help
                    self._refuse_node(node, str(detail))
                elif (node, reason) not in self.told:  # e.g. a node that cannot read its data: asked again
                    self.told.add((node, reason))
                    self.log(f"node {node}: handshake failed, asked again next round ({detail})")
                continue
            status = records[STATUS]
            client = status.get("client")
            if (isinstance(client, bool) or not isinstance(client, int) or not 0 <= client < self.problem.num_clients
                    or status.get("num_clients") != self.problem.num_clients or status.get("token") != self.run.token):
                self._count("malformed")
                self._refuse_node(node, f"client {client!r}")
                continue
            if status.get("data") != self.data:  # nn: the node's copy of the data set is another
                self._count("malformed")
                self._refuse_node(node, f"client {client}: its data differs from the server's, "
                                        f"digest {status.get('data')!r} != {self.data!r}; check its data-path")
                continue
            holder = self.client_node.get(client)
            if holder is not None and holder in live:
                # Asked again next round: the holder may be a dead node not yet expired.
                self._count("duplicate")
                self.log(f"node {node}: client {client} is already served by node {holder}; refused for now")
                continue
            if holder is not None:
                del self.node_client[holder]
                self.log(f"client {client}: node {holder} replaced by node {node}")
            self.node_client[node] = client
            self.client_node[client] = node

    def _refuse_node(self, node: int, why: str) -> None:
        self.refused.add(node)
        self.refusals[node] = why
        self.log(f"node {node}: handshake refused ({why})")

    def _requested(self, r: int, drawn: torch.Tensor | None, grid: Grid) -> RoundLog:
        """Round r's log: the clients the participation process drew (None: every client with a
        node), of which those without a live node, or whose state was lost, are rejected now."""
        wanted = sorted(self.client_node) if drawn is None else [int(c) for c in drawn.tolist()]
        entry = RoundLog(r, wanted)
        self.requested_total += len(wanted)
        live = set(grid.get_node_ids())
        entry._send = []
        for client in wanted:
            if client in self.lost:
                self._reject(entry, client, "lost_state", "excluded: its state was lost earlier")
            elif self.client_node.get(client) not in live:
                self._reject(entry, client, "no_node", "no live node runs this client")
            else:
                entry._send.append(client)
        return entry

    def _messages(self, entry: RoundLog, kind: str, fields: tuple[str, ...]) -> Iterable[Message]:
        r = entry.round
        server = encode_tree(self.server, fields)
        run = encode_run(self.run)
        entry._out = {}
        clients = entry._send if kind == "train" else entry.accepted
        for client in clients:
            ctx = WireContext(round=r, client=client, num_clients=self.problem.num_clients,
                              lr_scale=float(self.schedule(r)), ack=self.committed[client],
                              phase=kind, steps=entry.asked.get(client, 0) if kind == "train" else 0)
            message = Message(pack({RUN: run, CTX: encode_ctx(ctx), SERVER: server}),
                              dst_node_id=self.client_node[client], message_type=kind, group_id=str(r),
                              ttl=_ttl(self.timeout))
            entry._out[client] = message
            yield message

    def _matched(self, entry: RoundLog, replies: Iterable[Message], kind: str):
        """(client, reply) for each first, well-addressed reply; every other reply is counted."""
        by_id = {m.metadata.message_id: client for client, m in entry._out.items()}
        seen: set[int] = set()
        for reply in replies:
            client = by_id.get(reply.metadata.reply_to_message_id)
            if client is None:
                self._reject(entry, -1, "stale", "a reply to no request of this exchange", kind)
                continue
            if client in seen:
                self._reject(entry, client, "duplicate", "second reply to one request", kind)
                continue
            seen.add(client)
            if reply.has_error():
                reason = _reason(reply)
                if reason == "lost_state" and self.tracked:
                    self.lost.add(client)
                    self.log(f"client {client} (node {self.client_node.get(client)}): state lost, "
                             f"excluded from now on ({reply.error.reason})")
                self._reject(entry, client, reason, str(reply.error.reason), kind)
                continue
            if reply.metadata.src_node_id != self.client_node[client]:
                self._reject(entry, client, "unknown_node", f"reply from node {reply.metadata.src_node_id}", kind)
                continue
            try:
                records = unpack(reply.content) if reply.has_content() else {}
            except Malformed as exc:
                self._reject(entry, client, exc.reason, str(exc), kind)
                continue
            ctx = records.get(CTX)
            if not isinstance(ctx, ConfigRecord) or ctx.get("round") != entry.round or ctx.get("client") != client:
                self._reject(entry, client, "stale", "reply names another round or client", kind)
                continue
            yield client, records
        for client in sorted(set(by_id.values()) - seen):
            self._reject(entry, client, "timeout", f"no reply within {self.timeout:g} s", kind)

    def _accept(self, entry: RoundLog, replies: Iterable[Message]) -> None:
        accepted, losses = {}, {}
        for client, records in self._matched(entry, replies, "train"):
            try:
                done = self._steps_done(entry, client, records[CTX])
                losses[client] = _losses(records[CTX], done)
                accepted[client] = decode_tree(records.get(MESSAGE), self.message_template,
                                               device=self.problem.device)
            except Malformed as exc:
                self._reject(entry, client, exc.reason, str(exc))
                continue
            entry.steps[client] = done
        entry.accepted = sorted(accepted)
        entry._messages = [accepted[c] for c in entry.accepted]
        entry._losses = [value for c in entry.accepted for value in losses[c]]
        self.partial += sum(entry.steps[c] < entry.asked.get(c, self.tau) for c in entry.accepted)

    def _steps_done(self, entry: RoundLog, client: int, ctx: ConfigRecord) -> int:
        """The local steps a reply says its client took: 1..asked (fewer: its deadline passed)."""
        asked = entry.asked.get(client, self.tau)
        done = ctx.get("steps")
        if isinstance(done, bool) or not isinstance(done, int) or not 1 <= done <= asked:
            raise Malformed("malformed", f"the reply says {done!r} local steps, asked for 1..{asked}")
        deadline = ctx.get("deadline")
        if isinstance(deadline, float):
            self.deadlines[client] = deadline
        if done < self.tau and not self.algorithm.partial_work:
            raise Malformed("malformed", f"{self.algorithm.name} cannot take partial work ({done} of {self.tau} steps)")
        return done

    def _collected(self, entry: RoundLog) -> Collected:
        """The accepted clients' work, as the reference engine replaying the recorded counts
        would collect it: per-client steps whenever the run has a work process or a client of
        this round stopped short, else none (tau each)."""
        device = self.problem.device
        active = torch.tensor(entry.accepted, dtype=torch.int64, device=device)
        done = [entry.steps[c] for c in entry.accepted]
        counted = self.work is not None or any(d != self.tau for d in done)
        steps = torch.tensor(done, dtype=torch.int64, device=device) if counted else None
        message = concat_rows(entry._messages) if entry.accepted else None
        del entry._messages
        return Collected(active, None, message, steps, entry._losses)

    def _finish(self, entry: RoundLog, grid: Grid) -> None:
        messages = list(self._messages(entry, "train.finish", self.finish_fields))
        replies = send_and_receive(grid, messages, timeout=self.timeout)
        # A failed finish changes nothing here: the round stays accepted, and the node, unable
        # to commit it, reports lost state at its next contact. The replies are only read through
        # _matched, which counts the stale, duplicate and malformed ones in metrics.csv.
        for _client, _records in self._matched(entry, replies, "finish"):
            continue

    def _reject(self, entry: RoundLog, client: int, reason: str, detail: str, kind: str = "train") -> None:
        name = reason if kind == "train" else f"{kind}_{reason}"
        entry.rejected.append((client, name, detail))
        self._count(name)

    def _count(self, reason: str) -> None:
        self.counts[reason] += 1

    def counters(self) -> dict[str, Any]:
        """This federation's columns of metrics.csv: clients requested and rejected so far (by
        reason) and clients whose state was lost."""
        return {"requested_total": self.requested_total,
                **{f"rejected_{reason}": self.counts.get(reason, 0) for reason in REASONS},
                "rejected_finish": sum(v for k, v in self.counts.items() if k.startswith("finish_")),
                "lost_clients": len(self.lost)}

    # -- after the run ----------------------------------------------------------------------
    def audit(self, grid: Grid) -> dict:
        """Ask every node for its committed rows; check they match the server's record and,
        for gradient-tracking algorithms, the invariant (FOCUS: y = sum_i g_prev_i)."""
        n = self.problem.num_clients
        table = self.initial.clients
        rows: dict[int, Any] = {}
        live = set(grid.get_node_ids())
        messages = {}
        for c, node in sorted(self.client_node.items()):
            if node in live and c not in self.lost:
                ctx = WireContext(round=-1, client=c, num_clients=n, lr_scale=1.0, ack=self.committed[c], phase="audit")
                messages[c] = Message(pack({RUN: encode_run(self.run), CTX: encode_ctx(ctx)}), dst_node_id=node,
                                      message_type="query.state", group_id="audit", ttl=_ttl(self.timeout))
        replies = send_and_receive(grid, list(messages.values()), timeout=self.timeout)
        by_id = {m.metadata.message_id: c for c, m in messages.items()}
        template = gather_rows(table, torch.tensor([0], device=self.problem.device))
        mismatched = []
        for reply in replies:
            client = by_id.pop(reply.metadata.reply_to_message_id, None)
            if client is None or reply.has_error() or reply.metadata.src_node_id != self.client_node[client]:
                continue
            try:
                records = unpack(reply.content)
                status = records[STATUS]
                if status.get("committed_round") != self.committed[client]:
                    mismatched.append(client)
                    continue
                rows[client] = decode_tree(records.get(ROWS), template, device=self.problem.device)
            except (Malformed, KeyError):
                continue
        for client in range(n):  # never accepted: the initial row is the committed one
            if client not in rows and self.committed[client] == -1:
                rows[client] = gather_rows(table, torch.tensor([client], device=self.problem.device))
        missing = sorted(set(range(n)) - set(rows))
        result: dict[str, Any] = {"verified_clients": len(rows), "unverified_clients": missing,
                                  "mismatched_clients": sorted(mismatched), "rows": rows,
                                  "refused_nodes": {str(node): why for node, why in sorted(self.refusals.items())},
                                  "clients_without_node": sorted(set(range(n)) - set(self.client_node))}
        if not missing:
            result["clients"] = concat_rows([rows[c] for c in range(n)])
        invariant = self.algorithm.tracking
        if invariant is not None and not missing:
            server_field, client_field = invariant
            tracked = getattr(self.server, server_field)
            terms = getattr(result["clients"], client_field)
            total = terms.sum(0)
            # Relative to the terms' size: at the optimum y -> 0 while each g_prev_i does not.
            size = float(torch.linalg.vector_norm(terms.flatten(1), dim=1).sum())
            scale = max(size, float(torch.linalg.vector_norm(tracked)), float(torch.finfo(tracked.dtype).tiny))
            result["tracking_gap"] = float(torch.linalg.vector_norm(tracked - total)) / scale
            result["tracking"] = f"{server_field} = sum_i {client_field}_i"
        return result


class _Exchange:
    """A federation as the round loop's exchange (engine/loop.py): handshakes and whom to ask,
    the train messages and replies through the strategy's configure_train / aggregate_train, the
    finish messages and acknowledgements; it records the realized trace (accepted clients and
    their steps per round) and the round logs."""

    def __init__(self, strategy: AlgorithmStrategy, grid: Grid, rounds: int) -> None:
        self.strategy, self.grid = strategy, grid
        self.mask = np.zeros((rounds, strategy.problem.num_clients), dtype=bool)
        self.work = np.zeros((rounds, strategy.problem.num_clients), dtype=np.int64)
        self.log: list[RoundLog] = []
        self.done_server = strategy.initial.server  # the server state after the rounds in ``log``

    def requested(self, r: int, drawn: torch.Tensor | None) -> torch.Tensor:
        strategy = self.strategy
        strategy._discover(self.grid)
        strategy._entry = strategy._requested(r, drawn, self.grid)
        return torch.tensor(strategy._entry._send, dtype=torch.int64, device=strategy.problem.device)

    def collect(self, state: State, ctx: RoundContext) -> Collected:
        strategy, entry = self.strategy, self.strategy._entry
        if ctx.steps is not None:
            entry.asked = dict(zip(entry._send, (int(v) for v in ctx.steps.tolist())))
        messages = list(strategy.configure_train(ctx.round + 1, ArrayRecord(), ConfigRecord(), self.grid))
        replies = send_and_receive(self.grid, messages, timeout=strategy.timeout)
        strategy.aggregate_train(ctx.round + 1, replies)
        return strategy._collected(entry)

    def commit(self, state: State, server: Any, collected: Collected, ctx: RoundContext) -> State:
        strategy, entry = self.strategy, self.strategy._entry
        strategy.server = server
        for client in entry.accepted:
            strategy.committed[client] = entry.round
        if strategy.finishes and entry.accepted:
            strategy._finish(entry, self.grid)
        with _signals_deferred():  # a stop signal sees the round recorded whole, or not at all
            self.mask[entry.round, entry.accepted] = True
            self.work[entry.round, entry.accepted] = [entry.steps[c] for c in entry.accepted]
            self.log.append(entry)
            self.done_server = server
        if strategy.on_round is not None:
            strategy.on_round(strategy, entry)
        return State(server, state.clients)

    def counters(self) -> dict[str, Any]:
        return self.strategy.counters()


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM held back inside (delivered, and their handler run, on leaving): the
    main thread only, where the platform can block signals; elsewhere nothing is held."""
    blockable = (signal.SIGINT, signal.SIGTERM)
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blockable)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


MAX_LOSSES_PER_STEP = 16  # a bound on the losses a reply may report per local step (untrusted input)


def _records(reply: Message) -> dict:
    """A reply's records (codec.unpack); none where it has no content or its packing is malformed."""
    try:
        return unpack(reply.content) if reply.has_content() else {}
    except Malformed:
        return {}


def _losses(ctx: ConfigRecord, done: int) -> list[float]:
    """The minibatch losses a reply reports for its ``done`` steps (none for problems that
    measure none): finite numbers, at most MAX_LOSSES_PER_STEP a step."""
    values = ctx.get("losses", [])
    if not isinstance(values, list) or len(values) > MAX_LOSSES_PER_STEP * done or not all(
            isinstance(v, float) and math.isfinite(v) for v in values):
        raise Malformed("malformed", "the reply's losses are not a short list of finite numbers")
    return values


def _reason(reply: Message) -> str:
    """The rejection reason of an error reply: focusfl's own, or "error" (SuperLink, node crash)."""
    error = reply.error
    text = str(error.reason or "")
    if error.code == ERROR_CODE and text.startswith("focusfl:"):
        reason = text[len("focusfl:"):].split(" ", 1)[0]
        if reason in REASONS:
            return reason
    return "error"


def _ttl(timeout: float) -> float:
    """Message lifetime: a little longer than the exchange waits, so late replies expire."""
    return max(10.0, 2.0 * timeout)


# The ServerApp's pulls of replies from a SuperLink (Flower's HttpGrid sleeps 3 s between pulls,
# and 1 s, doubling, before pulling a reply's objects again): FIRST_POLL seconds after a push or a
# reply, doubling while nothing comes, up to POLL. Replies of a small model come within tens of
# milliseconds; polling at the short pause all along would spend CPU the nodes need.
NODE_POLL_SECONDS = 0.2  # how often the wait for min_nodes asks the SuperLink again
FIRST_POLL = 0.005
POLL = 0.1


def send_and_receive(grid: Grid, messages: list[Message], *, timeout: float | None = None) -> list[Message]:
    """``grid.send_and_receive`` with short polls (FIRST_POLL, doubling up to POLL) instead of Flower's 3 s.

    Flower 1.42's ``HttpGrid.send_and_receive`` (a deployment's grid) sleeps 3 s between pulls
    (flwr/superlink/grid/http_grid.py), which puts a floor of 3 s under every exchange, and its
    ``pull_messages`` waits 1 s before it asks again for a reply's objects that the SuperLink does
    not hold yet; this is the same loop with shorter sleeps. Other grids (simulation, FakeGrid)
    are called as they are.
    """
    if not isinstance(grid, HttpGrid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    _short_object_pulls()
    waiting = set(grid.push_messages(messages))
    end = time.time() + (timeout if timeout is not None else 0.0)
    replies: list[Message] = []
    pause = FIRST_POLL
    while timeout is None or time.time() < end:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting:
            break
        if got:
            pause = FIRST_POLL
        time.sleep(pause)
        pause = min(2 * pause, POLL)
    return replies


def _short_object_pulls() -> None:
    """HttpGrid's pulls of a reply's objects back off from FIRST_POLL up to POLL (Flower: 1 s up to 10 s)."""
    if not isinstance(http_grid.pull_objects, functools.partial):
        http_grid.pull_objects = functools.partial(http_grid.pull_objects, initial_backoff=FIRST_POLL,
                                                   backoff_cap=POLL)
