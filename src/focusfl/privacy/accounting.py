"""Per-client (epsilon, delta) by Google's dp-accounting (its RDP accountant), from the rounds each
client actually took part in (docs/privacy.md, "Accounting").

The default bound holds when the participation schedule is public, as focusfl's outputs make it
(metrics.csv's ``active``, config.json's seed, a stop message naming the client): client i's
epsilon is the composition of the k_i Gaussian mechanisms it took part in, under the
add-or-remove relation (``PUBLIC``). Sampling hides nothing from an adversary who knows the sample.

Amplified bounds exist only where the user declares the schedule secret (``--dp
...,secret_schedule=true``, central mode) and the process is the sampling a theorem is about:

- ``bernoulli`` (its own coins, no redraw) and ``banded``: Poisson sampling at the known p_i,
  add-or-remove, composed over every round run (``POISSON``);
- ``uniform`` (m of N without replacement): the library's theorem holds for the replace-one
  relation, under which one client's change moves the round's sum by up to 2C (its clipped
  message out, another in), so the Gaussian's multiplier is sigma / (2 sqrt(k)) (``UNIFORM``).

Under either the client's epsilon is the smaller of that and the public bound (both hold), the
public bound taken under the same relation as the amplified one: for ``uniform`` the composition
over the rounds the client joined at sensitivity 2C (a replace-one neighbour swaps its clipped
message for another's), else its minimum would mix two relations and understate epsilon (the
audit flagged it: m = 25 of 26, audited 3.71 against 2.79 accounted). Any
other process cannot keep a secret schedule (memory, recorded traces, rates read from the data)
and check_secret refuses it.

Each vector an algorithm sends is clipped to C on its own, so a message of k vectors has L2
sensitivity C sqrt(k) and the mechanism's noise multiplier is sigma / sqrt(k).

Speed: RDP composes by addition, so the library's RDP of ONE round is computed once per distinct
event (and cached for the process), and a client's epsilon is the library's conversion of
count x that curve; an evaluation converts one curve per distinct (count, rate), never N.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError

# Integer RDP orders: the library's fractional orders cost 6x more for a Poisson-sampled
# Gaussian (its series fails to converge below order 2 and is dropped anyway) and change
# epsilon in the third digit at most at the budgets focusfl runs.
ORDERS = tuple(range(2, 65)) + (80, 96, 128, 256, 512, 1024)
INSTALL = "pip install 'focusfl[privacy]' (Google's dp-accounting)"
POISSON_PROCESSES = ("bernoulli", "banded")
SECRET_PROCESSES = (*POISSON_PROCESSES, "uniform")
# config.json's "epsilon_bound": which bound every epsilon of the run is.
PUBLIC = "public schedule: composition over the rounds each client joined (add-or-remove)"
POISSON = ("secret schedule: min(public bound; Poisson sampling at p_i composed over the rounds run, "
           "add-or-remove)")
UNIFORM = ("secret schedule: min(composition over the rounds each client joined; sampling m of N without "
           "replacement composed over the rounds run), both replace-one, sensitivity 2C")
BOUNDS = {"none": PUBLIC, "poisson": POISSON, "uniform": UNIFORM}


def library() -> Any:
    """dp_accounting, imported only when a run accounts for its privacy."""
    try:
        import dp_accounting
    except ImportError:
        raise ConfigError(f"--dp with delta needs the privacy extra: {INSTALL}") from None
    # Its RDP series logs a warning per order it drops; the epsilon it returns is still correct.
    logging.getLogger("absl").setLevel(logging.ERROR)
    return dp_accounting


class Amplification(NamedTuple):
    """How a process's sampling enters the accounting: ``kind`` none, poisson (``rates`` p_i) or
    uniform (``sample`` m of N)."""

    kind: str
    rates: np.ndarray | None = None
    sample: int | None = None

    @property
    def bound(self) -> str:
        """Which bound the run's epsilons are (config.json's ``epsilon_bound``)."""
        return BOUNDS[self.kind]


def keeps_secret(participation: Any) -> bool:
    """Whether the process is sampling an amplification theorem is about: independent coins at
    known rates (bernoulli without redraw, banded) or m of N without replacement (uniform)."""
    name = getattr(participation, "name", None)
    return name in SECRET_PROCESSES and not getattr(participation, "redraw", False)


def amplification(participation: Any, dp: Any) -> Amplification:
    """The amplification the run's ``dp`` record (a DPConfig) allows under ``participation``
    (module docstring): none unless the schedule is declared secret."""
    if not dp.secret_schedule or dp.mode != "central" or not keeps_secret(participation):
        return Amplification("none")
    if participation.name in POISSON_PROCESSES:  # known independent coins
        return Amplification("poisson", rates=np.asarray(participation.nominal_p(), dtype=np.float64))
    return Amplification("uniform", sample=int(participation.m))  # m of N without replacement


def noise_multiplier(sigma: float, vectors: int) -> float:
    """The mechanism's noise multiplier when each of ``vectors`` vectors is clipped to C on its own."""
    return sigma / math.sqrt(max(1, vectors))


@functools.lru_cache(maxsize=4096)
def one_round_rdp(kind: str, multiplier: float, rate: float = 1.0, population: int = 0, sample: int = 0) -> tuple:
    """The library's RDP curve (at ORDERS) of one round: a Gaussian mechanism, Poisson-sampled at
    ``rate``, or sampled ``sample`` of ``population`` without replacement."""
    dp = library()
    from dp_accounting.rdp import RdpAccountant

    event = dp.GaussianDpEvent(multiplier)
    relation = dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    if kind == "poisson":
        event = dp.PoissonSampledDpEvent(rate, event)
    elif kind == "uniform":  # replace-one: the sum moves by up to 2C, so half the multiplier
        event = dp.SampledWithoutReplacementDpEvent(population, sample, dp.GaussianDpEvent(multiplier / 2))
        relation = dp.NeighboringRelation.REPLACE_ONE
    accountant = RdpAccountant(list(ORDERS), relation).compose(event)
    return tuple(float(v) for v in accountant._rdp)  # the curve it composes by addition


def epsilon_of(rdp: tuple, count: int, delta: float) -> float:
    """The library's epsilon at ``delta`` of ``count`` rounds of the curve ``rdp`` (0 for none)."""
    if count <= 0:
        return 0.0
    library()
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    return float(compute_epsilon(ORDERS, count * np.asarray(rdp), delta)[0])


class Accountant:
    """Per-client epsilon of a run: ``epsilons(counts, rounds)`` from each client's participation
    count and the rounds run; ``limits(target, rounds)``: the counts and rounds a client may reach
    without exceeding the target."""

    def __init__(self, multiplier: float, delta: float, amp: Amplification, num_clients: int) -> None:
        self.multiplier, self.delta, self.amp, self.num_clients = multiplier, delta, amp, num_clients
        self._composed = functools.lru_cache(maxsize=None)(self._composed_epsilon)

    def _composed_epsilon(self, count: int) -> float:
        # the public term under the amplified term's relation (module docstring): replace-one for
        # uniform, where a neighbour moves the sum by 2C, so half the multiplier
        multiplier = self.multiplier / 2 if self.amp.kind == "uniform" else self.multiplier
        return epsilon_of(one_round_rdp("none", multiplier), count, self.delta)

    def amplified(self, rounds: int) -> np.ndarray | None:
        """Epsilon [N] by amplification after ``rounds`` rounds (None where none applies)."""
        amp = self.amp
        if amp.kind == "poisson":
            values, inverse = np.unique(amp.rates, return_inverse=True)
            per_rate = np.array([epsilon_of(one_round_rdp("poisson", self.multiplier, float(p)), rounds, self.delta)
                                 for p in values])
            return per_rate[inverse]
        if amp.kind == "uniform":
            curve = one_round_rdp("uniform", self.multiplier, population=self.num_clients, sample=amp.sample)
            return np.full(self.num_clients, epsilon_of(curve, rounds, self.delta))
        return None

    def epsilons(self, counts: np.ndarray, rounds: int) -> np.ndarray:
        """Each client's epsilon after ``rounds`` rounds, client i having taken part in counts[i]."""
        values, inverse = np.unique(np.asarray(counts, dtype=np.int64), return_inverse=True)
        composed = np.array([self._composed(int(k)) for k in values])[inverse]
        amplified = self.amplified(rounds)
        return composed if amplified is None else np.minimum(composed, amplified)

    def limits(self, target: float, rounds: int) -> tuple[int, np.ndarray]:
        """(k_max, r_max [N]): a client stays within ``target`` while it has taken part in at most
        k_max rounds, or (amplified processes) while at most r_max[i] rounds have run; both by
        bisection over the library's epsilon (monotone in either), up to ``rounds``."""
        k_max = _largest(lambda k: self._composed(k) <= target, rounds)
        if self.amp.kind == "none":
            return k_max, np.zeros(self.num_clients, dtype=np.int64)
        if self.amp.kind == "uniform":
            curve = one_round_rdp("uniform", self.multiplier, population=self.num_clients, sample=self.amp.sample)
            r_max = _largest(lambda r: epsilon_of(curve, r, self.delta) <= target, rounds)
            return k_max, np.full(self.num_clients, r_max, dtype=np.int64)
        values, inverse = np.unique(self.amp.rates, return_inverse=True)
        per_rate = [_largest(lambda r, p=float(p): epsilon_of(one_round_rdp("poisson", self.multiplier, p), r,
                                                             self.delta) <= target, rounds) for p in values]
        return k_max, np.asarray(per_rate, dtype=np.int64)[inverse]


def _largest(ok, upper: int) -> int:
    """The largest n in 0..upper with ok(n) (ok monotone decreasing, ok(0) true)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
