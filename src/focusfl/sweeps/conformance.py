"""The conformance kit: what makes an algorithm trustworthy, checked on any Algorithm class,
registered or the user's own (``focusfl check ALGORITHM``; docs/your-algorithm.md).

Each check is one function that runs the algorithm on small problems and returns a
:class:`Check`: passed or not (None: the check does not apply to this algorithm) and the figure
it measured. The registry's own suite (tests/test_algorithm_suite.py, tests/test_engines.py)
calls these same functions, so a check means the same for focusfl's algorithms and a user's.

An algorithm is given as a ``maker``: ``maker(lr=..., local_steps=...)`` builds it (None: the
SPEC's own value), e.g. ``lambda **kw: make_algorithm("fedavg:server_lr=0.5", **kw)``
(:func:`maker_of`). Exceptions the algorithm's code raises are a failed check, with their one
line, never a traceback.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..algorithms import Algorithm, RoundContext, StateSize, algorithm_record, make_algorithm
from ..algorithms.importing import user_code_error
from ..engine import Resume, simulate
from ..engine.tree import gather_rows
from ..engine.vectorized import vectorized_round
from ..errors import FocusflError
from ..participation import make_participation
from ..problems import make_problem
from ..runs.driver import shape_fault
from ..runs.checkpoint import load_checkpoint, resume_from, save_checkpoint, take_checkpoint
from ..runs.store import reference_state
from ..work import make_work

Maker = Callable[..., Algorithm]

# The problems the checks run on: small enough for a laptop, with heterogeneous clients.
RIDGE = "ridge:dim=10,clients=8,samples=20"
LOGISTIC = "logistic:dim=5,clients=8,samples=20,reg=0.1"
SMALL_RIDGE = "ridge:clients=6,samples=12,dim=5,hetero=0.5"
SMALL_RIDGE_SGD = SMALL_RIDGE + ",batch=4"
# Participation processes of the engine check: every client, a fixed count, independent coins
# with empty rounds (p = 0.2 on 6 clients), clients that stay away (markov), a rotation.
PROCESSES = ("full", "uniform:m=2", "bernoulli:p=0.2", "markov", "cyclic:groups=3")
# Work processes of the engine check, for algorithms that take per-client step counts.
WORKS = ("uniform", "rates:r=0.34;1;0.67;1;0.34;1", "markov:p=0.3,rho=0.8,slow=0.34")
STATE_SIZES = ((1, 1), (3, 5), (7, 2), (16, 33))
# Tolerances of float64 agreement between two computations of the same rounds.
RTOL = ATOL = 1e-12
# Full participation: an algorithm that claims exact convergence reaches this relative error;
# the others must at least cut the error tenfold (client drift leaves FedAvg-like ones a plateau).
EXACT_ERROR, INEXACT_ERROR = 1e-8, 0.1


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``passed`` (None: not applicable) and the figure it measured."""

    name: str
    passed: bool | None
    figure: str

    def line(self) -> str:
        status = {True: "ok  ", False: "FAIL", None: "n/a "}[self.passed]
        return f"{status} {self.name:<16} {self.figure}"


def maker_of(spec: str | dict) -> Maker:
    """The maker of the algorithm ``spec`` names (a registered name or an import target)."""
    return lambda **overrides: make_algorithm(spec, **overrides)


def _guarded(name: str, run: Callable[[], Check]) -> Check:
    """``run()``, an exception of the algorithm's code turned into a failed check."""
    try:
        return run()
    except (Exception, SystemExit) as exc:  # the algorithm under test may raise anything
        error = user_code_error(exc)  # a user's class: the line of their file it came from
        if error is not None:
            return Check(name, False, f"raised in {error.place}")
        text = str(exc).splitlines()[0] if str(exc) else ""
        where = "" if isinstance(exc, FocusflError) else f"{type(exc).__name__}: "
        return Check(name, False, f"raised {where}{text}")


def _fields(state: Any) -> list[torch.Tensor]:
    return [*state.server, *state.clients]


def state_gap(a: Any, b: Any, rtol: float = RTOL, atol: float = ATOL) -> tuple[float, bool]:
    """(largest |a - b| over every field of two states, whether every element is within
    atol + rtol |b|: torch.testing.assert_close's criterion). NaN when either state holds a value
    that is not finite (a NaN would drop out of the maximum and read as no difference)."""
    return fields_gap(_fields(a), _fields(b), rtol, atol)


def fields_gap(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], rtol: float = RTOL,
               atol: float = ATOL) -> tuple[float, bool]:
    """state_gap of two sequences of tensors, field by field."""
    largest, close = 0.0, len(a) == len(b)
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf"), False
        if x.numel() == 0:
            continue
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
            return float("nan"), False
        diff = (x.double() - y.double()).abs()
        largest = max(largest, float(diff.max()))
        close = close and bool((diff <= atol + rtol * y.double().abs()).all())
    return largest, close


def difference_text(gap: float) -> str:
    """A measured difference as a check's figure prints it: ``not finite`` where a value was NaN
    or infinite."""
    return f"{gap:.2e}" if math.isfinite(gap) else "not finite"


# -- construction --------------------------------------------------------------------------------
def check_construction(spec: str | dict) -> Check:
    """The SPEC builds at its defaults, has a name, and its record (config.json's algorithm)
    rebuilds an equal object of the same class."""
    def run() -> Check:
        algorithm = make_algorithm(spec)
        if not isinstance(algorithm.name, str) or not algorithm.name:
            return Check("construction", False, "the class has no name")
        record = algorithm_record(algorithm)
        rebuilt = make_algorithm(record)
        same = rebuilt == algorithm and type(rebuilt) is type(algorithm)
        figure = f"{algorithm.name}: the record of {len(algorithm.hyperparameters())} hyperparameters rebuilds " \
                 + ("an equal object" if same else f"a different one ({rebuilt!r})")
        return Check("construction", same, figure)

    return _guarded("construction", run)


def check_prepare(make: Maker) -> Check:
    """prepare() may fill in run-dependent values; it keeps the class and the name."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        algorithm = make(lr=1e-3)
        prepared = algorithm.prepare(problem, make_participation("bernoulli", problem.num_clients, seed=0), seed=0)
        kept = type(prepared) is type(algorithm) and prepared.name == algorithm.name
        return Check("prepare", kept, f"prepare() gives {type(prepared).__name__} {prepared.name!r}")

    return _guarded("prepare", run)


# -- the state's size ----------------------------------------------------------------------------
def allocated(state: Any) -> StateSize:
    """The elements init allocated: distinct storages, by dtype kind (float, int64)."""
    seen, floats, integers = set(), 0, 0
    for tensor in _fields(state):
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        if tensor.is_floating_point():
            floats += storage.nbytes() // tensor.element_size()
        elif tensor.dtype == torch.int64:
            integers += storage.nbytes() // 8
        else:
            return StateSize(-1, -1)  # a dtype StateSize cannot count: never equal to a declared size
    return StateSize(floats, integers)


def shapes(state: Any) -> StateSize:
    """The elements of every field (a meta tensor has shapes, no memory)."""
    fields = _fields(state)
    return StateSize(sum(t.numel() for t in fields if t.is_floating_point()),
                     sum(t.numel() for t in fields if not t.is_floating_point()))


def check_state_size(make: Maker, sizes: Sequence[tuple[int, int]] = STATE_SIZES) -> Check:
    """state_size(N, d) is what init allocates (distinct storages and field shapes alike), in
    float32 and float64, and its bytes are the state's."""
    def run() -> Check:
        algorithm = make()
        for n, d in sizes:
            for dtype in (torch.float32, torch.float64):
                state = algorithm.init(torch.randn(d, dtype=dtype), n)
                declared = algorithm.state_size(n, d)
                found, fields = allocated(state), shapes(state)
                nbytes = sum(t.numel() * t.element_size() for t in _fields(state))
                if not (found == declared == fields) or declared.nbytes(torch.finfo(dtype).bits // 8) != nbytes:
                    return Check("state_size", False, f"N={n}, d={d}, {str(dtype)[6:]}: declared {tuple(declared)}, "
                                 f"init allocates {tuple(found)} (fields {tuple(fields)})")
        n, d = sizes[-1]
        return Check("state_size", True, f"declared = allocated for {len(sizes)} sizes x 2 dtypes "
                     f"(N={n}, d={d}: {algorithm.state_size(n, d).floats:,} floats)")

    return _guarded("state_size", run)


def check_state_size_at_scale(make: Maker, num_clients: int = 100_000, dim: int = 1_000_000) -> Check:
    """N = 10^5 clients of a 10^6-parameter model (10^11 floats per table): the formula against
    init's shapes on the meta device, which allocates nothing; its N x d tables counted once each."""
    def run() -> Check:
        algorithm = make()
        declared = algorithm.state_size(num_clients, dim)
        found = shapes(algorithm.init(torch.empty(dim, device="meta"), num_clients))
        comm = algorithm.communication()
        keeps_tables = bool(comm.client_memory or comm.server_memory_per_client)
        ok = (declared == found and isinstance(declared.floats, int) and declared.floats >= dim
              and (declared.floats >= num_clients * dim) == keeps_tables)
        figure = f"N={num_clients:,}, d={dim:,}: declared {declared.floats:,} floats, init's shapes {found.floats:,}"
        if declared == found and not ok:
            figure += f"; N x d tables {'declared in communication() but not counted' if keeps_tables else 'counted but not declared in communication()'}"
        return Check("state_size_1e5", ok, figure)

    return _guarded("state_size_1e5", run)


# -- engines ---------------------------------------------------------------------------------------
def engine_runs(make: Maker, problem_spec: str, participation: str, *, work: str | None = None, rounds: int = 8,
                seed: int = 3, lr: float = 2e-3, local_steps: int = 3):
    """The same rounds on the vectorized engine and on the per-client reference loop (float64)."""
    problem = make_problem(problem_spec)
    process = make_participation(participation, problem.num_clients, seed=seed)
    algorithm = make(lr=lr, local_steps=local_steps)
    steps = None if work is None else make_work(work, problem.num_clients, local_steps, seed=seed)
    return tuple(simulate(algorithm, problem, process, rounds, seed=seed, engine=engine, work=steps)
                 for engine in ("vectorized", "reference"))


def check_engines(make: Maker, problem_spec: str = SMALL_RIDGE, participation: str = "bernoulli:p=0.2", *,
                  work: str | None = None, rounds: int = 8, local_steps: int = 3) -> Check:
    """The vectorized engine equals the per-client reference loop in float64: every state field
    within RTOL/ATOL, every evaluated rel_error within 1e-10 relative."""
    where = f"{participation}" + (f", work {work}" if work else "")

    def run() -> Check:
        fast, slow = engine_runs(make, problem_spec, participation, work=work, rounds=rounds, local_steps=local_steps)
        gap, close = state_gap(fast.state, slow.state)
        errors_a = [r.get("rel_error") for r in fast.rows]
        errors_b = [r.get("rel_error") for r in slow.rows]
        rows_close = len(errors_a) == len(errors_b) and all(
            a == b or abs(a - b) <= 1e-10 * abs(b) for a, b in zip(errors_a, errors_b))
        return Check("engines", close and rows_close, f"{where}: largest difference {difference_text(gap)}"
                     + ("" if rows_close else "; rel_error rows differ"))

    return _guarded("engines", run)


def check_engine_suite(make: Maker, processes: Sequence[str] = PROCESSES, works: Sequence[str] = WORKS) -> Check:
    """:func:`check_engines` under every participation process, with minibatches, and (for an
    algorithm that takes per-client step counts) under every work process: one line."""
    checks = [check_engines(make, SMALL_RIDGE, p) for p in processes]
    checks.append(check_engines(make, SMALL_RIDGE_SGD, "bernoulli:p=0.2", rounds=6))
    partial = _guarded("engines", lambda: Check("engines", make().partial_work, "")).passed
    if partial:
        checks += [check_engines(make, SMALL_RIDGE_SGD, "bernoulli:p=0.5", work=w, rounds=6) for w in works]
    failed = [c for c in checks if not c.passed]
    if failed:
        return Check("engines", False, failed[0].figure + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    largest = max(float(c.figure.rsplit(" ", 1)[1]) for c in checks)
    kinds = f"{len(processes)} participation processes, minibatches" + (f", {len(works)} work processes" if partial
                                                                       else "")
    return Check("engines", True, f"vectorized = reference in float64 under {kinds}; largest difference {largest:.2e}")


# -- round mechanics -------------------------------------------------------------------------------
def steps_asked(algorithm: Algorithm, problem: Any, ctx: RoundContext) -> list[int]:
    """The steps a client round asks its oracle for, in order."""
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    inner, steps = problem.oracle(ctx.active, seed=0, round=ctx.round), []

    def recording_oracle(z, step):
        steps.append(step)
        return inner(z, step)

    algorithm.client_round(state.server, gather_rows(state.clients, ctx.active), recording_oracle, ctx)
    return steps


def check_round_steps(make: Maker, local_steps: int = 3) -> Check:
    """round_steps (the hint by which a problem draws a round's minibatches together) is what the
    client round asks for: steps 0..k-1, each once; with per-client counts, the largest."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        algorithm = make(lr=1e-3, local_steps=local_steps)
        ctx = RoundContext(round=0, active=torch.tensor([1, 4, 6]), num_clients=problem.num_clients)
        cases = [ctx]
        if algorithm.partial_work:
            cases.append(ctx._replace(steps=torch.tensor([1, 2, 1])))
        for case in cases:
            hinted, asked = algorithm.round_steps(case), steps_asked(algorithm, problem, case)
            expected = local_steps if case.steps is None else int(case.steps.max())
            if hinted != expected or asked != list(range(hinted)):
                counts = "" if case.steps is None else f" with counts {case.steps.tolist()}"
                return Check("round_steps", False, f"round_steps says {hinted} (expected {expected}), the round "
                             f"asked for steps {asked}{counts}")
        return Check("round_steps", True, f"{local_steps} steps asked = round_steps"
                     + ("; counts [1, 2, 1]: 2" if algorithm.partial_work else ""))

    return _guarded("round_steps", run)


def check_empty_round(make: Maker) -> Check:
    """A round without participants: empty messages, the clients' rows unchanged, a finite model."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        algorithm = make(lr=1e-3, local_steps=2).prepare(problem, make_participation("full", problem.num_clients))
        state = algorithm.init(problem.initial_point(), problem.num_clients)
        nobody = torch.zeros(0, dtype=torch.int64)
        ctx = RoundContext(round=0, active=nobody, num_clients=problem.num_clients)
        _, message = algorithm.client_round(state.server, gather_rows(state.clients, nobody),
                                            problem.oracle(nobody, seed=0, round=0), ctx)
        if not all(field.shape[0] == 0 for field in message):
            return Check("empty_round", False, "an empty round's message has rows")
        after = vectorized_round(algorithm, state, problem, nobody, 0, seed=0)
        if not all(torch.equal(a, b) for a, b in zip(state.clients, after.clients)):
            return Check("empty_round", False, "an empty round changed the clients' state")
        finite = bool(torch.isfinite(algorithm.model(after)).all())
        return Check("empty_round", finite, "no message, clients unchanged, model " + ("finite" if finite else
                                                                                      "not finite"))

    return _guarded("empty_round", run)


def check_lr_scale(make: Maker, rounds: int = 6) -> Check:
    """A round at (lr, lr_scale = 0.5) is a round at (lr / 2, 1): schedules reach every step size."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        scaled = make(lr=2e-3, local_steps=2).prepare(problem, process)
        halved = make(lr=1e-3, local_steps=2).prepare(problem, process)
        a = scaled.init(problem.initial_point(), problem.num_clients)
        b = halved.init(problem.initial_point(), problem.num_clients)
        for r in range(rounds):
            active = torch.as_tensor(process.active(r))
            a = vectorized_round(scaled, a, problem, active, r, seed=0, lr_scale=0.5)
            b = vectorized_round(halved, b, problem, active, r, seed=0, lr_scale=1.0)
        x, y = scaled.model(a), halved.model(b)
        gap, _ = fields_gap([x], [y])
        close = bool(((x - y).abs() <= 1e-14 + 1e-12 * y.abs()).all())
        return Check("lr_scale", close, f"(lr, scale 1/2) vs (lr/2, 1) after {rounds} rounds: "
                     f"difference {difference_text(gap)}")

    return _guarded("lr_scale", run)


def check_server_order(make: Maker) -> Check:
    """The server step does not depend on the order of the messages: the same messages and
    clients in another order give the same server state (to rounding)."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        full = make_participation("full", problem.num_clients)
        algorithm = make(lr=1e-3, local_steps=2).prepare(problem, full, seed=0)
        state = algorithm.init(problem.initial_point(), problem.num_clients)
        everyone = torch.arange(problem.num_clients)
        for r in range(2):  # a state that is not the initial one
            state = vectorized_round(algorithm, state, problem, everyone, r, seed=0)
        active = torch.tensor([1, 3, 4, 6])
        ctx = RoundContext(round=2, active=active, num_clients=problem.num_clients)
        oracle = problem.oracle(active, seed=0, round=2, steps=algorithm.round_steps(ctx))
        _, message = algorithm.client_round(state.server, gather_rows(state.clients, active), oracle, ctx)
        order = torch.tensor([2, 0, 3, 1])
        straight = algorithm.server_round(state.server, message, ctx)
        shuffled = algorithm.server_round(state.server, gather_rows(message, order), ctx._replace(active=active[order]))
        gap, close = fields_gap(list(straight), list(shuffled), rtol=1e-12, atol=1e-14)
        return Check("server_order", close, f"messages of clients {active.tolist()} in the order "
                     f"{active[order].tolist()}: largest difference {difference_text(gap)}")

    return _guarded("server_order", run)


def check_tracking(make: Maker, participation: str = "bernoulli", rounds: int = 40) -> Check:
    """An algorithm that declares a tracking invariant (``tracking``) keeps it after every round:
    its server field equals the sum of every client's field (every client row written back)."""
    def run() -> Check:
        algorithm = make(lr=2e-4, local_steps=3)
        invariant = algorithm.tracking
        if invariant is None:
            return Check("tracking", None, "declares no tracking invariant")
        problem = make_problem("ridge")
        process = make_participation(participation, problem.num_clients, seed=0)
        state = algorithm.init(problem.initial_point(), problem.num_clients)
        worst = 0.0
        for r in range(rounds):
            state = vectorized_round(algorithm, state, problem, torch.as_tensor(process.active(r)), r, seed=0)
            tracked = getattr(state.clients, invariant.clients).sum(0)
            gap = float((getattr(state.server, invariant.server) - tracked).norm()) / max(1.0, float(tracked.norm()))
            worst = max(worst, gap)
            if not gap <= 1e-12:  # NaN included
                return Check("tracking", False, f"{invariant.server} != sum_i {invariant.clients}_i after round {r} "
                             f"under {participation} (relative gap {difference_text(gap)})")
        return Check("tracking", True, f"{invariant.server} = sum_i {invariant.clients}_i after each of {rounds} rounds "
                     f"under {participation} (largest relative gap {worst:.2e})")

    return _guarded("tracking", run)


# -- whole runs ------------------------------------------------------------------------------------
def not_finite_fields(state: Any) -> list[str]:
    """The fields of a state that hold a value that is not finite, as ``server.u (NaN)``."""
    found = []
    for side in ("server", "clients"):
        part = getattr(state, side)
        names = getattr(part, "_fields", None) or [str(i) for i in range(len(part))]
        for name, tensor in zip(names, part):
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                found.append(f"{side}.{name} ({'NaN' if bool(torch.isnan(tensor).any()) else 'inf'})")
    return found


class FirstNotFinite:
    """A whole run's ``on_round``: the first round after which its state held a value that is not
    finite, and in which fields. A run evaluated only at its end stops there, rounds after the
    NaN appeared; this says where it appeared (a check's runs are small: one test per round)."""

    def __init__(self) -> None:
        self.round: int | None = None
        self.fields: list[str] = []

    def __call__(self, result: Any) -> None:
        if self.round is None and (fields := not_finite_fields(result.state)):
            self.round, self.fields = result.rounds_done, fields

    def divergence(self, result: Any) -> str:
        """Why ``result`` (which diverged) stopped, in a check's words: where a NaN appeared, else
        the metric that was not finite, else the blow-up (engine/divergence.py)."""
        if self.round is None and (fields := not_finite_fields(result.state)):
            self.round, self.fields = result.diverged_at, fields
        if self.round is not None:
            return f"not finite after round {self.round}: {', '.join(self.fields)}"
        row = result.rows[-1] if result.rows else {}
        metrics = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        if metrics:
            return f"{', '.join(metrics)} not finite after round {result.diverged_at}"
        return f"the loss blew up (diverged at round {result.diverged_at})"


def check_float32(make: Maker, lr: float, rounds: int = 30) -> Check:
    """float32 with stochastic gradients runs, stays float32 and lowers the error."""
    def run() -> Check:
        problem = make_problem(RIDGE + ",batch=5", dtype=torch.float32)
        process = make_participation("uniform:m=3", problem.num_clients, seed=0)
        algorithm = make(lr=lr, local_steps=2)
        watch = FirstNotFinite()
        result = simulate(algorithm, problem, process, rounds, eval_every=rounds, on_round=watch)
        dtype = algorithm.model(result.state).dtype
        if result.diverged_at is not None:
            return Check("float32", False, f"{watch.divergence(result)}; model {str(dtype)[6:]}")
        first, last = result.rows[0]["rel_error"], result.rows[-1]["rel_error"]
        ok = dtype == torch.float32 and last < first
        return Check("float32", ok, f"rel_error {first:.3g} -> {last:.3g} in {rounds} rounds, model {str(dtype)[6:]}")

    return _guarded("float32", run)


def check_convergence(make: Maker, lr: float, problem_spec: str = RIDGE, *, exact: bool | None = None,
                      rounds: int = 150) -> Check:
    """Under full participation: exact convergence (rel_error <= EXACT_ERROR) for an algorithm
    that claims it (``exact_at_full``), a tenfold cut (INEXACT_ERROR) for the others."""
    def run() -> Check:
        problem = make_problem(problem_spec)
        algorithm = make(lr=lr, local_steps=2)
        claims = algorithm.exact_at_full if exact is None else exact
        watch = FirstNotFinite()
        result = simulate(algorithm, problem, make_participation("full", problem.num_clients), rounds,
                          eval_every=rounds, on_round=watch)
        name, bound = problem_spec.split(":")[0], EXACT_ERROR if claims else INEXACT_ERROR
        if result.diverged_at is not None:
            return Check("convergence", False, f"{name}, full participation, lr {lr:.3g}: {watch.divergence(result)}")
        final = result.rows[-1]["rel_error"]
        return Check("convergence", final <= bound, f"{name}, full participation, lr {lr:.3g}: rel_error {final:.2e} "
                     f"after {rounds} rounds (bound {bound:g}: {'exact' if claims else 'inexact'})")

    return _guarded("convergence", run)


def check_resume(make: Maker, rounds: int = 10, stop: int = 4, participation: str = "markov") -> Check:
    """A run stopped after ``stop`` rounds, its checkpoint written and read back (runs/checkpoint.py)
    and resumed, equals the uninterrupted run bit for bit (a Markov chain's stream restored too)."""
    def run() -> Check:
        problem = make_problem(SMALL_RIDGE_SGD)
        algorithm = make(lr=2e-3, local_steps=2)

        def process():
            return make_participation(participation, problem.num_clients, seed=4)

        straight = simulate(algorithm, problem, process(), rounds, seed=5)
        first_process = process()
        first = simulate(algorithm, problem, first_process, stop, seed=5)
        prepared = algorithm.prepare(problem, first_process, seed=5)
        with tempfile.TemporaryDirectory(prefix="focusfl-check-") as folder:
            path = Path(folder) / "checkpoint.pt"
            save_checkpoint(path, take_checkpoint(first, first_process, 0))
            reference = reference_state(prepared, problem.initial_point(), problem.num_clients)
            checkpoint = load_checkpoint(path, reference, problem.num_clients)
        later = process()
        rest = simulate(algorithm, problem, later, rounds - stop, seed=5, resume=resume_from(checkpoint, later))
        same = all(torch.equal(a, b) for a, b in zip(_fields(straight.state), _fields(rest.state)))
        same_row = straight.rows[-1] == rest.rows[-1]
        gap, _ = state_gap(straight.state, rest.state)
        return Check("resume", same and same_row, f"{stop} rounds, checkpoint, {rounds - stop} more = {rounds} rounds: "
                     + ("bit for bit" if same and same_row else f"differs (largest difference {difference_text(gap)})"))

    return _guarded("resume", run)


def check_communication(make: Maker, rounds: int = 4, active: int = 3) -> Check:
    """communication()'s figures are sane, and a run's comm_down / comm_up count them: rounds x
    active clients x vectors x d floats."""
    def run() -> Check:
        problem = make_problem(RIDGE)
        algorithm = make(lr=1e-4)
        comm = algorithm.communication()
        if not (comm.down >= 1 and comm.up >= 1 and comm.server_memory >= 1 and comm.client_memory >= 0
                and comm.server_memory_per_client >= 0):
            return Check("communication", False, f"figures out of range: {tuple(comm)}")
        watch = FirstNotFinite()
        result = simulate(algorithm, problem, make_participation(f"uniform:m={active}", problem.num_clients, seed=0),
                          rounds, on_round=watch)
        if result.diverged_at is not None:  # a run cut short counts fewer floats than it would have sent
            return Check("communication", False, f"down {comm.down:g}, up {comm.up:g} vectors per client; "
                         f"{rounds} rounds of {active}: {watch.divergence(result)}")
        last = result.rows[-1]
        expected = (rounds * active * comm.down * problem.dim, rounds * active * comm.up * problem.dim)
        ok = (last["comm_down"], last["comm_up"]) == expected
        return Check("communication", ok, f"down {comm.down:g}, up {comm.up:g} vectors per client; {rounds} rounds "
                     f"of {active}: {last['comm_down']:g} / {last['comm_up']:g} floats"
                     + ("" if ok else f" (expected {expected[0]:g} / {expected[1]:g})"))

    return _guarded("communication", run)


# -- the kit ---------------------------------------------------------------------------------------
def stable_lr(make: Maker, problem_spec: str = RIDGE, local_steps: int = 2) -> float:
    """The algorithm's own stable step on ``problem_spec`` (Algorithm.auto_lr at its smoothness)."""
    problem = make_problem(problem_spec)
    return make(local_steps=local_steps).auto_lr(problem.smoothness(), problem.num_clients)


def run_checks(spec: str | dict) -> list[Check]:
    """Every check of the kit on the algorithm ``spec``, in order (``focusfl check``)."""
    make = maker_of(spec)
    construction = check_construction(spec)
    if not construction.passed:
        return [construction]  # nothing else can be built
    lr_ridge = stable_lr(make, RIDGE)
    lr_float32 = stable_lr(make, RIDGE + ",batch=5")
    return _shapes_said(make, [
        construction,
        check_prepare(make),
        check_state_size(make),
        check_state_size_at_scale(make),
        check_engine_suite(make),
        check_round_steps(make),
        check_empty_round(make),
        check_server_order(make),
        check_tracking(make),
        check_lr_scale(make),
        check_float32(make, lr_float32 / 2),
        check_resume(make),
        check_communication(make),
        check_convergence(make, lr_ridge / 2),
    ])


def _shapes_said(make: Maker, checks: list[Check]) -> list[Check]:
    """Checks that failed on torch's words for a state of the wrong shape (``size mismatch``,
    ``index_copy_()``), said as the field of the user's class that has it (runs/driver.py)."""
    torch_errors = [i for i, c in enumerate(checks) if c.passed is False and c.figure.startswith("raised RuntimeError")]
    if not torch_errors:
        return checks
    problem = make_problem(SMALL_RIDGE)
    fault = _guarded("shapes", lambda: Check("shapes", None, shape_fault(
        make(), problem, make_participation("full", problem.num_clients), 0) or "")).figure
    if not fault or fault.startswith("raised"):
        return checks
    return [dataclasses.replace(c, figure=f"raised: {fault}") if i in torch_errors else c
            for i, c in enumerate(checks)]
