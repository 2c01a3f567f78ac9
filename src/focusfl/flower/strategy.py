"""AlgorithmStrategy: any focusfl algorithm as one Flower strategy, exact under faults.

The strategy is a thin engine in the sense of engine/reference.py: it moves state and
messages, it never re-implements an update rule. Round r:

1. Who is asked: the participation process's S_r (a replayable experiment) or, with
   ``participation=None`` ("available"), every known node that is online. Clients without a
   live node, and clients whose state was lost, are rejected before anything is sent.
2. ``train`` to each: the server fields ``client_round`` reads, the client's index, the round,
   ``ack`` = the server's record of the client's last accepted round (the commit protocol,
   node.py), and ``steps`` = tau_i,r drawn by the run's work process (none: local_steps). Each
   node runs ``client_round`` on its own row, exactly as the reference loop does, and says how
   many steps it took: a node whose deadline passed stops early (deadline.py), and its reply is
   accepted as partial work, 1 <= tau_i,r <= asked (a count outside is malformed).
3. Replies are matched to requests by ``reply_to_message_id``. Rejected, and counted as
   non-participation: timeouts (no reply), error replies (from the node or from the SuperLink
   for a lost node), lost state, NaN/inf, wrong fields, dtype or shape, duplicates, replies
   for another round or request (stale, late), replies from an unexpected node.
4. The accepted messages are stacked in client order and ``server_round`` runs on them with
   RoundContext(active = accepted). Accepted clients' ``ack`` becomes r.
5. Algorithms with ``client_finish`` (FedAWE, ProxSkip) send ``train.finish`` with the new
   server state. A finish that does not arrive leaves the node unable to commit round r; it
   says so (lost state) at its next contact and is excluded from then on.

The realized participation (accepted per round) and the realized step counts are the run's
traces: the reference engine replaying them computes the same model bit for bit. Nothing here waits forever: every exchange
has a timeout, and a round with nobody in it still takes the server step, as in Algorithm 1.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..algorithms.base import Algorithm, RoundContext, State
from ..engine.divergence import BlowUpDetector
from ..engine.rows import diverged, evaluation_row
from ..engine.simulate import SCHEDULES
from ..engine.tree import concat_rows, gather_rows
from .client_app import ERROR_CODE, has_finish
from .codec import (CTX, MESSAGE, ROWS, RUN, SERVER, STATUS, Malformed, RunSpec, WireContext, decode_tree,
                    encode_ctx, encode_run, encode_tree)
from .node import data_fingerprint, has_memory

# Reasons a client's round is not accepted (metrics.csv has a cumulative column for each).
REASONS = ("timeout", "error", "lost_state", "non_finite", "malformed", "duplicate", "stale",
           "unknown_node", "no_node", "client_failure")


class _Available:
    """The participation of ``participation=available``: whoever answers (no nominal rates)."""

    name = "available"

    def __init__(self, num_clients: int, seed: int) -> None:
        self.num_clients, self.seed = num_clients, seed

    def nominal_p(self) -> None:
        return None


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


class AlgorithmStrategy(Strategy):
    """Runs ``algorithm`` on ``problem`` over a Flower Grid; see the module docstring.

    ``participation``: a focusfl participation process (S_r requested), or None: every online
    node takes part. ``work``: a focusfl work process (tau_i,r asked of each client), or None
    (or fixed): every client is asked for local_steps. ``timeout``: seconds an exchange waits
    for replies."""

    def __init__(self, algorithm: Algorithm, problem: Any, *, rounds: int, participation: Any = None,
                 work: Any = None,
                 seed: int = 0, dtype: str = "float64", schedule: str = "constant", eval_every: int = 1,
                 timeout: float = 30.0, token: str | None = None, on_row: Callable[[dict], None] | None = None,
                 on_round: Callable[["AlgorithmStrategy", RoundLog], None] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        n = problem.num_clients
        if participation is not None and participation.num_clients != n:
            raise ValueError(f"participation has {participation.num_clients} clients, problem has {n}")
        self.problem, self.rounds, self.seed, self.timeout = problem, rounds, seed, float(timeout)
        self.participation, self.eval_every = participation, eval_every
        self.schedule = SCHEDULES[schedule]
        self.algorithm = algorithm.prepare(problem, participation if participation is not None else _Available(n, seed))
        self.tau = self.algorithm.local_steps
        self.work = None if work is None or work.fixed else work
        if self.work is not None:
            if self.work.num_clients != n or self.work.local_steps != self.tau:
                raise ValueError(f"work is for {self.work.num_clients} clients and {self.work.local_steps} steps, "
                                 f"the run has {n} and {self.tau}")
            self.algorithm.check_work(RoundContext(round=0, active=torch.zeros(0, dtype=torch.int64),
                                                   num_clients=n, steps=torch.zeros(0, dtype=torch.int64)))
        self.partial = 0
        self.deadlines: dict[int, float] = {}
        self.initial: State = self.algorithm.init(problem.initial_point(), n)
        self.server = self.initial.server
        self.run = RunSpec(self.algorithm.describe(), problem.describe(), seed, dtype, token or uuid.uuid4().hex)
        self.tracked = has_memory(self.initial.clients)
        self.finishes = has_finish(self.algorithm)
        self.train_fields, self.finish_fields, self.message_template = self._probe()
        self.node_client: dict[int, int] = {}  # node id -> client index
        self.client_node: dict[int, int] = {}
        self.committed = [-1] * n  # the server's record of each client's last accepted round
        self.lost: set[int] = set()
        self.counts: Counter = Counter()
        self.on_row, self.on_round, self.log = on_row, on_round, log or (lambda text: None)
        self.comm = self.algorithm.communication()
        self.floats = [0.0, 0.0]
        self.requested_total = 0
        self.refused: set[int] = set()  # nodes whose handshake was malformed: never asked again
        self.refusals: dict[int, str] = {}  # refused node -> why (the audit reports them)
        self.told: set[tuple[int, str]] = set()  # (node, reason) of handshake failures logged
        self.data = data_fingerprint(problem)  # nn: every node must hold the same client data
        # A sustained blow-up stops a federation as it stops a simulation (engine/rows.py).
        self.blow_up = BlowUpDetector()

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

    # -- Flower's Strategy interface --------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Train messages of Flower round ``server_round`` (focusfl round server_round - 1)."""
        entry = self._requested(server_round - 1, grid)
        self._pending_entry = entry
        return self._messages(entry, "train", self.train_fields)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        entry = self._pending_entry
        self._accept(entry, replies)
        self._server_step(entry)
        return (ArrayRecord([self.algorithm.model(State(self.server, None)).detach().cpu().numpy()]),
                MetricRecord({"accepted": len(entry.accepted), "requested": len(entry.requested)}))

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
        """Run the federation; ``initial_arrays`` is ignored (x_0 comes from the problem)."""
        if timeout is not None:
            self.timeout = float(timeout)
        rounds = self.rounds if num_rounds is None else num_rounds
        self.summary()
        rows: list[dict] = []
        mask = np.zeros((rounds, self.problem.num_clients), dtype=bool)
        work = np.zeros((rounds, self.problem.num_clients), dtype=np.int64)
        log: list[RoundLog] = []
        diverged_at = None
        interrupted = None
        completed = self.server  # the server state of the last round done
        try:
            if not self._evaluate(0, 0, rows):
                diverged_at = 0
            for r in range(rounds if diverged_at is None else 0):
                self._discover(grid)
                entry = self._requested(r, grid)
                replies = send_and_receive(grid, list(self._messages(entry, "train", self.train_fields)),
                                           timeout=self.timeout)
                self._accept(entry, replies)
                self._server_step(entry)
                if self.finishes and entry.accepted:
                    self._finish(entry, grid)
                mask[r, entry.accepted] = True
                work[r, entry.accepted] = [entry.steps[c] for c in entry.accepted]
                log.append(entry)
                completed = self.server
                if self.on_round is not None:
                    self.on_round(self, entry)
                if (r + 1) % self.eval_every == 0 or r + 1 == rounds:
                    if not self._evaluate(r + 1, len(entry.accepted), rows):
                        diverged_at = r + 1
                        mask, work = mask[: r + 1], work[: r + 1]
                        break
        except StopRounds as stop:  # keep the rounds done: the round in progress is not one of them
            interrupted, self.server = stop.signum, completed
            mask, work, rows = self._rounds_done(log, mask, work, rows)
        if diverged_at is not None:
            self.log(f"diverged at round {diverged_at} ({self.blow_up.reason(rows[-1])})")
        return FederationResult(rows, self.server, mask, log, self.counts, sorted(self.lost), dict(self.node_client),
                                diverged_at=diverged_at, blow_up=self.blow_up, work=work, partial=self.partial,
                                deadlines=dict(sorted(self.deadlines.items())), interrupted=interrupted)

    def _rounds_done(self, log: list[RoundLog], mask: np.ndarray, work: np.ndarray, rows: list[dict]):
        """The traces and rows of the rounds in ``log``, the last of them evaluated (a stop
        between a round and its row, or between two evaluations, leaves the run readable)."""
        done = len(log)
        rows = [row for row in rows if row["round"] <= done]
        if done and rows[-1]["round"] != done:
            self._evaluate(done, len(log[-1].accepted), rows)
        return mask[:done], work[:done], rows

    # -- the round ---------------------------------------------------------------------------
    def _discover(self, grid: Grid) -> None:
        """Handshake with nodes not seen yet: which client does each run?"""
        live = set(grid.get_node_ids())
        new = sorted(live - set(self.node_client) - self.refused)
        if not new:
            return
        messages = {}
        for node in new:
            message = Message(RecordDict({RUN: encode_run(self.run)}), dst_node_id=node, message_type="query",
                              group_id="hello", ttl=_ttl(self.timeout))
            messages[node] = message
        replies = send_and_receive(grid, list(messages.values()), timeout=self.timeout)
        by_id = {m.metadata.message_id: node for node, m in messages.items()}
        for reply in replies:
            node = by_id.pop(reply.metadata.reply_to_message_id, None)
            if node is None or reply.metadata.src_node_id != node:
                self._count("unknown_node")
                continue
            if reply.has_error() or STATUS not in reply.content:
                reason = _reason(reply) if reply.has_error() else "malformed"
                self._count(reason)
                detail = reply.error.reason if reply.has_error() else "no status"
                if reason == "malformed":  # e.g. no usable partition-id: asking again will not help
                    self._refuse_node(node, str(detail))
                elif (node, reason) not in self.told:  # e.g. a node that cannot read its data: asked again
                    self.told.add((node, reason))
                    self.log(f"node {node}: handshake failed, asked again next round ({detail})")
                continue
            status = reply.content[STATUS]
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

    def _requested(self, r: int, grid: Grid) -> RoundLog:
        n = self.problem.num_clients
        if self.participation is not None:
            wanted = [int(c) for c in np.flatnonzero(self.participation.rows(r, r + 1)[0])]
        else:
            wanted = sorted(self.client_node)
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
        assert all(0 <= c < n for c in wanted)
        if self.work is not None and entry._send:
            counts = self.work.steps(r, torch.tensor(entry._send, dtype=torch.int64))
            entry.asked = dict(zip(entry._send, (int(v) for v in counts)))
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
            message = Message(RecordDict({RUN: run, CTX: encode_ctx(ctx), SERVER: server}),
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
            ctx = reply.content.get(CTX) if reply.has_content() else None
            if not isinstance(ctx, ConfigRecord) or ctx.get("round") != entry.round or ctx.get("client") != client:
                self._reject(entry, client, "stale", "reply names another round or client", kind)
                continue
            yield client, reply
        for client in sorted(set(by_id.values()) - seen):
            self._reject(entry, client, "timeout", f"no reply within {self.timeout:g} s", kind)

    def _accept(self, entry: RoundLog, replies: Iterable[Message]) -> None:
        accepted = {}
        for client, reply in self._matched(entry, replies, "train"):
            try:
                done = self._steps_done(entry, client, reply.content[CTX])
                accepted[client] = decode_tree(reply.content.get(MESSAGE), self.message_template,
                                               device=self.problem.device)
            except Malformed as exc:
                self._reject(entry, client, exc.reason, str(exc))
                continue
            entry.steps[client] = done
        entry.accepted = sorted(accepted)
        entry._messages = [accepted[c] for c in entry.accepted]
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

    def _server_step(self, entry: RoundLog) -> None:
        device = self.problem.device
        active = torch.tensor(entry.accepted, dtype=torch.int64, device=device)
        done = [entry.steps[c] for c in entry.accepted]
        # As the reference engine replaying the recorded counts: per-client steps whenever the
        # run has a work process or a client of this round stopped short; else none (tau).
        counted = self.work is not None or any(d != self.tau for d in done)
        ctx = RoundContext(round=entry.round, active=active, num_clients=self.problem.num_clients,
                           lr_scale=float(self.schedule(entry.round)),
                           steps=torch.tensor(done, dtype=torch.int64, device=device) if counted else None)
        if entry.accepted:
            message = concat_rows(entry._messages)
        else:  # as the reference engine: the empty message of a client round over no clients
            _, message = self.algorithm.client_round(
                self.server, gather_rows(self.initial.clients, active),
                self.problem.oracle(active, seed=self.seed, round=entry.round), ctx)
        self.server = self.algorithm.server_round(self.server, message, ctx)
        for client in entry.accepted:
            self.committed[client] = entry.round
        self.floats[0] += len(entry.accepted) * self.comm.down * self.problem.dim
        self.floats[1] += len(entry.accepted) * self.comm.up * self.problem.dim
        del entry._messages

    def _finish(self, entry: RoundLog, grid: Grid) -> None:
        messages = list(self._messages(entry, "train.finish", self.finish_fields))
        replies = send_and_receive(grid, messages, timeout=self.timeout)
        # A failed finish changes nothing here: the round stays accepted, and the node, unable
        # to commit it, reports lost state at its next contact. The replies are only read through
        # _matched, which counts the stale, duplicate and malformed ones in metrics.csv.
        for _client, _reply in self._matched(entry, replies, "finish"):
            continue

    def _reject(self, entry: RoundLog, client: int, reason: str, detail: str, kind: str = "train") -> None:
        name = reason if kind == "train" else f"{kind}_{reason}"
        entry.rejected.append((client, name, detail))
        self._count(name)

    def _count(self, reason: str) -> None:
        self.counts[reason] += 1

    def _evaluate(self, done: int, active: int, rows: list[dict]) -> bool:
        """The simulator's row (engine/rows.py) with this federation's counters; False: diverged."""
        counters = {"requested_total": self.requested_total,
                    **{f"rejected_{reason}": self.counts.get(reason, 0) for reason in REASONS},
                    "rejected_finish": sum(v for k, v in self.counts.items() if k.startswith("finish_")),
                    "lost_clients": len(self.lost)}
        row = evaluation_row(self.algorithm.model(State(self.server, None)), self.problem, self.blow_up, done=done,
                             active=active, comm=(self.floats[0], self.floats[1]), extra=counters)
        rows.append(row)
        if self.on_row is not None:
            self.on_row(row)
        return not diverged(row)

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
                messages[c] = Message(RecordDict({RUN: encode_run(self.run), CTX: encode_ctx(ctx)}), dst_node_id=node,
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
                status = reply.content[STATUS]
                if status.get("committed_round") != self.committed[client]:
                    mismatched.append(client)
                    continue
                rows[client] = decode_tree(reply.content.get(ROWS), template, device=self.problem.device)
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


POLL = 0.05  # seconds between pulls of replies from a SuperLink (Flower's HttpGrid sleeps 3 s)


def send_and_receive(grid: Grid, messages: list[Message], *, timeout: float | None = None) -> list[Message]:
    """``grid.send_and_receive``, polling a SuperLink every POLL seconds instead of Flower's 3 s.

    Flower 1.42's ``HttpGrid.send_and_receive`` (a deployment's grid) sleeps 3 s between pulls
    (flwr/superlink/grid/http_grid.py), which puts a floor of 3 s under every exchange; this is
    the same loop with a shorter sleep. Other grids (simulation, FakeGrid) are called as they are.
    """
    from flwr.superlink.grid.http_grid import HttpGrid

    if not isinstance(grid, HttpGrid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    end = time.time() + (timeout if timeout is not None else 0.0)
    replies: list[Message] = []
    while timeout is None or time.time() < end:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting:
            break
        time.sleep(POLL)
    return replies
