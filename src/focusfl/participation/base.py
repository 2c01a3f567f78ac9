"""The participation-process protocol, its row cache, and the parameter checks shared by processes.

A process answers "which clients take part in round r" (the set S_r) deterministically from a seed.
Runs are resumed and replayed by round index, so ``mask(R)[:R0]`` must equal ``mask(R0)``: every
process here draws round r from its own random stream (or, for the Markov chain, computes forward
from round 0), never from a generator whose state depends on how many rounds were asked before.
Rounds are drawn in chunks as a run goes (``rows(start, stop)``), so memory does not grow with the
number of rounds.

A run asks for the active sets themselves (``active_sets(start, stop)``: each round's sorted client
indices). A process that can draw them without a row of N bools (``direct``: uniform, full, cyclic,
reshuffled cyclic, bernoulli with ``draw=sparse``) does so in time O(|S_r|) per round (full: O(N),
everyone is active; reshuffled cyclic: one permutation of N per epoch of E rounds, O(N / E) a round);
the others draw their rows in chunks of at most ``ROW_CELLS`` bools (a length-N draw per round:
about 10 ms at N = 10^6 for the independent coins, more for weighted's N exponential keys and
Markov's N chains) and read the sets off them, the same sets either way.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from ..spec import check_magnitude

# Stream of the per-client parameters (p_i, q_i, rho_i). Shared by every process on purpose:
# bernoulli, sine and markov built with the same seed get the same default p_i, so they differ
# only in how the coins are correlated over time, not in their marginals.
PARAM_STREAM = 7_000

# Rounds drawn at once: the window ``active(r)`` keeps, and the step a sequential process skips
# ahead by.
_CHUNK = 256
# Bools of the mask drawn at once when active sets are read off rows (16 MiB): memory stays
# bounded whatever N is.
ROW_CELLS = 1 << 24


def round_rng(seed: int, stream: int, r: int, *extra: int) -> np.random.Generator:
    """Generator of round ``r``: independent of every other round, so rounds can be drawn in any order."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream, r, *extra]))


def param_rng(seed: int, *sub: int) -> np.random.Generator:
    """Generator of the per-client parameters; separate from the round streams.

    ``sub`` picks an independent sub-stream, for parameters that must not be tied to the rate
    preset drawn from the main one (weighted's q).
    """
    return np.random.default_rng(np.random.SeedSequence([seed, PARAM_STREAM, *sub]))


class ParticipationProcess(abc.ABC):
    """A random (or fixed) sequence of active client sets S_0, S_1, ...

    Subclasses implement :meth:`_rows` (rows ``start..stop-1`` of the mask), :meth:`nominal_p` and
    :meth:`_params`. Memory never depends on how many rounds are asked for over a process's life:
    rows are drawn in chunks as a run goes (:meth:`rows`), and only a window of ``_CHUNK`` rows is
    kept for :meth:`active`. A *sequential* process (Markov: round r depends on round r - 1) is
    continued from the last row it computed, which :meth:`stream_state` exposes to checkpoints.
    """

    name: ClassVar[str]
    # True when round r can only be computed from round r - 1: _rows is then always asked for the
    # rows right after the last computed one, which _last_row() returns.
    sequential: ClassVar[bool] = False
    # True when _active_sets draws a round's set in time O(|S_r|), without a row of N bools.
    direct: ClassVar[bool] = False

    def __init__(self, num_clients: int, seed: int = 0) -> None:
        self.num_clients = check_num_clients(num_clients)
        self.seed = check_seed(seed)
        self._next = 0  # sequential processes: rounds computed so far
        self._last: np.ndarray | None = None  # ... and the last of them
        self._window_start = 0
        self._window = np.zeros((0, self.num_clients), dtype=bool)

    # -- protocol ---------------------------------------------------------------------------
    def mask(self, rounds: int) -> np.ndarray:
        """Bool array ``[rounds, num_clients]``; row r is the indicator of S_r (a fresh copy)."""
        return self.rows(0, _check_rounds(rounds))

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Bool rows ``start..stop-1`` of the mask (a fresh array), in memory O(stop - start)."""
        start, stop = _check_round(start), _check_rounds(stop)
        if stop <= start:
            return np.zeros((0, self.num_clients), dtype=bool)
        if not self.sequential:
            return self._checked_rows(start, stop)
        if start < self._next:
            self._next, self._last = 0, None  # behind the stream: recompute from round 0
        while self._next < start:  # skip ahead in bounded chunks, keeping only the last row
            self._advance(min(start, self._next + _CHUNK))
        return self._advance(stop)

    def active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        """The sorted int64 client indices of S_r for rounds ``start..stop-1``: drawn directly by a
        ``direct`` process, else read off rows drawn ``ROW_CELLS`` bools at a time; the same sets
        as :meth:`rows` either way."""
        start, stop = _check_round(start), _check_rounds(stop)
        if stop <= start:
            return []
        if self.direct and not self.sequential:
            return [np.asarray(s, dtype=np.int64) for s in self._active_sets(start, stop)]
        step = max(1, ROW_CELLS // self.num_clients)
        sets = []
        for lo in range(start, stop, step):
            sets.extend(np.flatnonzero(row).astype(np.int64) for row in self.rows(lo, min(stop, lo + step)))
        return sets

    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        """Direct processes: the sorted active sets of rounds ``start..stop-1`` (see ``direct``)."""
        raise NotImplementedError(f"{self.name} draws rows, not active sets")

    def active(self, r: int) -> np.ndarray:
        """Sorted int64 indices of the clients in S_r."""
        r = _check_round(r)
        offset = r - self._window_start
        if not 0 <= offset < len(self._window):
            self._window_start, self._window, offset = r, self.rows(r, r + _CHUNK), 0
        return np.flatnonzero(self._window[offset]).astype(np.int64)

    def stream_state(self) -> dict[str, Any]:
        """Where a sequential process's stream stands (for checkpoints); empty for the others."""
        if not self.sequential or self._last is None:
            return {}
        return {"next": self._next, "last": self._last.copy()}

    def restore_stream(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`stream_state`'s output instead of recomputing from round 0."""
        if not self.sequential or not state:
            return
        last = np.asarray(state["last"], dtype=bool)
        if last.shape != (self.num_clients,):
            raise ConfigError(f"{self.name}: saved participation row has shape {last.shape}")
        self._next, self._last = _check_rounds(int(state["next"])), last.copy()

    @abc.abstractmethod
    def nominal_p(self) -> np.ndarray | None:
        """Long-run marginal P(i in S) per client (float64 ``[N]``), or None when unknown."""

    def cycle(self) -> int | None:
        """Rounds after which the process's law repeats (cyclic: its E groups), None when it has no
        period; periodic-participation algorithms (Amplified SCAFFOLD) take their window from it."""
        return None

    def describe(self) -> dict[str, Any]:
        """``{"name": ..., **resolved params}``; feeding it to ``make_participation`` rebuilds the process."""
        return {"name": self.name, **self._params()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_clients={self.num_clients}, seed={self.seed})"

    # -- for subclasses ---------------------------------------------------------------------
    @abc.abstractmethod
    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Bool rows ``start..stop-1`` of the mask. For a sequential process ``start`` is the
        round after the last one computed (``_last_row()``); others are asked for any range."""

    @abc.abstractmethod
    def _params(self) -> dict[str, Any]:
        """Resolved, JSON-serialisable parameters (lists, not arrays)."""

    def _last_row(self) -> np.ndarray | None:
        """Row of the round before the one being computed (None before round 0)."""
        return self._last

    # -- streaming --------------------------------------------------------------------------
    def _checked_rows(self, start: int, stop: int) -> np.ndarray:
        rows = np.asarray(self._rows(start, stop), dtype=bool)
        if rows.shape != (stop - start, self.num_clients):
            raise AssertionError(f"{self.name}: _rows returned shape {rows.shape}")
        return rows

    def _advance(self, stop: int) -> np.ndarray:
        """Compute the rows from the stream's position up to ``stop`` and move the stream there."""
        rows = self._checked_rows(self._next, stop)
        self._next, self._last = stop, rows[-1].copy()
        return rows


class MemorylessProcess(ParticipationProcess):
    """A process whose round r depends only on (seed, r): each round has its own random stream."""

    STREAM: ClassVar[int]

    def _rows(self, start: int, stop: int) -> np.ndarray:
        out = np.zeros((stop - start, self.num_clients), dtype=bool)
        for k, r in enumerate(range(start, stop)):
            out[k] = self._draw_round(r)
        return out

    @abc.abstractmethod
    def _draw_round(self, r: int) -> np.ndarray:
        """Bool row of round ``r``, drawn from ``round_rng(seed, STREAM, r)``."""


# -- parameter checks (one-line ConfigErrors) -------------------------------------------------
def check_num_clients(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"number of clients must be a positive integer, got {n!r}")
    return int(n)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_rounds(rounds: Any) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ConfigError(f"rounds must be a non-negative integer, got {rounds!r}")
    return int(rounds)


def _check_round(r: Any) -> int:
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ConfigError(f"round index must be a non-negative integer, got {r!r}")
    return int(r)


def check_int(where: str, key: str, value: Any, lo: int, hi: int | None = None) -> int:
    """An integer in ``[lo, hi]`` (floats that are whole numbers are accepted, as from a CLI)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{where}: {key}={value!r} is not an integer")
    check_magnitude(where, key, int(value))
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"{where}: {key}={value} must be {bound}")
    return int(value)


def check_real(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{where}: {key}={value!r} is not a number")
    value = float(check_magnitude(where, key, value))
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {key}={value} is not finite")
    return value


def check_rate(where: str, key: str, value: Any) -> float:
    """One probability in (0, 1] (a rate every client's p is built from)."""
    value = check_real(where, key, value)
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{where}: {key}={value:g} is outside (0, 1]")
    return value


def per_client(where: str, key: str, value: Any, n: int) -> np.ndarray:
    """A scalar broadcast to all clients, or a list of exactly ``n`` numbers, as float64 ``[n]``."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values = [check_real(where, key, v) for v in np.asarray(value, dtype=object).ravel()]
        if len(values) != n:
            raise ConfigError(f"{where}: {key} has {len(values)} values, expected 1 or {n} (one per client)")
        return np.array(values, dtype=np.float64)
    return np.full(n, check_real(where, key, value), dtype=np.float64)


def check_probabilities(where: str, key: str, p: np.ndarray) -> np.ndarray:
    """Every p_i in (0, 1]: a client with p_i = 0 would never be seen, which no method can handle."""
    bad = np.flatnonzero(~((p > 0) & (p <= 1)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{where}: {key}[{i}]={p[i]:g} is outside (0, 1]")
    return p


def to_list(a: np.ndarray) -> list:
    """Python floats for JSON (``ndarray.tolist`` already gives Python scalars)."""
    return np.asarray(a, dtype=np.float64).tolist()


def default_rate_preset(seed: int, n: int) -> np.ndarray:
    """FOCUS reference p_i: U(0.1, 0.3) for 90% of clients, U(0.1, 0.9) for the other 10%.

    The 10% (``round(0.1 * n)``, half rounding up) are chosen at random. All draws are made every
    time, in a fixed order, so that later parameters from the same stream (Markov's rho) do not
    depend on whether p was given by the user.
    """
    rng = param_rng(seed)
    return rate_preset(rng, n)


def rate_preset(rng: np.random.Generator, n: int) -> np.ndarray:
    low = rng.uniform(0.1, 0.3, size=n)
    high = rng.uniform(0.1, 0.9, size=n)
    chosen = rng.permutation(n)[: int(math.floor(0.1 * n + 0.5))]
    p = low.copy()
    p[chosen] = high[chosen]
    return p


def resolve_rates(where: str, seed: int, n: int, p: Any) -> np.ndarray:
    """p from the user (scalar or list, checked in (0, 1]) or, when unset, the FOCUS preset."""
    if p is None:
        return default_rate_preset(seed, n)
    return check_probabilities(where, "p", per_client(where, "p", p, n))
