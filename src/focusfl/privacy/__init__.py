"""Client-level differential privacy around any algorithm's messages (docs/privacy.md).

:class:`RunPrivacy` is what the round loop (engine/loop.py) holds for a run with ``--dp``: it
clips and noises each round's stacked messages before the server step (mechanism.py), counts the
rounds each client took part in, turns the counts into per-client epsilons at evaluations
(accounting.py, by Google's dp-accounting) and, with a target epsilon, refuses the round that
would take a client beyond it. The algorithm never knows: privacy is a wrapper around messages.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..engine.loop import ROUND_CELLS, ROUND_CHUNK
from ..errors import ConfigError
from .accounting import SECRET_PROCESSES, Accountant, Amplification, amplification, keeps_secret, library, \
    noise_multiplier
from .config import NONCE_LIMIT, NONE, DPConfig, parse_dp
from .mechanism import privatize

__all__ = ["NONE", "DPConfig", "RunPrivacy", "central_covers", "check_privacy", "dp_nonce", "epsilon_bound",
           "parse_dp", "run_privacy"]



class RunPrivacy:
    """One run's DP: the mechanism's record ``dp``, the run's ``seed`` (the noise's key), each
    client's participation count (int64 [N] on the run's device) and the accountant.
    ``noised_by_clients``: the messages arrive clipped and noised already (a federation's nodes
    under local mode, flower/client_app.py), so the server only counts and accounts.
    ``legacy_key``: the noise keyed by the seed alone (mechanism.noise_key), a run recorded before
    the nonce and resumed."""

    def __init__(self, dp: DPConfig, *, seed: int, num_clients: int, vectors: int, participation: Any,
                 end_round: int, device: torch.device | str = "cpu", noised_by_clients: bool = False,
                 legacy_key: bool = False) -> None:
        if noised_by_clients and dp.mode != "local":
            raise ValueError("only local-mode messages are noised by the clients")
        self.dp, self.seed, self.vectors, self.noised_by_clients = dp, seed, vectors, noised_by_clients
        self.legacy_key = legacy_key
        self.counts = torch.zeros(num_clients, dtype=torch.int64, device=device)
        self.rounds = 0
        self.amp: Amplification = amplification(participation, dp)
        self.accountant = None
        self.k_max = self.r_max = None
        if dp.accounted:
            self.accountant = Accountant(noise_multiplier(dp.noise, vectors), dp.delta, self.amp, num_clients)
            if dp.target_epsilon is not None:
                k_max, r_max = self.accountant.limits(dp.target_epsilon, end_round)
                self.k_max, self.r_max = k_max, torch.as_tensor(r_max, device=device)

    def resume(self, participation: Any, start_round: int) -> None:
        """The counts of rounds 0..start_round-1, recounted from the participation process a chunk
        of rounds at a time, as the round loop draws them (a simulation's clients all arrive)."""
        counts = np.zeros(self.counts.numel(), dtype=np.int64)
        step = max(1, min(ROUND_CHUNK, ROUND_CELLS // max(1, counts.size)))
        for lo in range(0, start_round, step):
            joined = participation.active_sets(lo, min(start_round, lo + step))
            if joined:
                np.add.at(counts, np.concatenate(joined), 1)
        self.counts = torch.as_tensor(counts, device=self.counts.device)
        self.rounds = start_round

    def exhausted(self, round_: int, active: torch.Tensor) -> str | None:
        """Why round ``round_`` with clients ``active`` would exceed the target (None: it would not).
        One host synchronisation a round on a GPU, only with a target.

        Under the public bound only the clients that join spend. Under an amplified bound every
        client spends every round run (its epsilon is min(composition over k_i, amplified over
        the rounds)), so every client is checked, and the message names none: the schedule is
        the secret."""
        if self.k_max is None:
            return None
        if self.amp.kind == "none":
            if active.numel() == 0:
                return None
            over = self.counts.index_select(0, active) + 1 > self.k_max
            if not bool(over.any()):
                return None
            client = int(active[over.nonzero()[0, 0]])
            return (f"privacy budget exhausted: round {round_ + 1} would take client {client} beyond "
                    f"epsilon {self.dp.target_epsilon:g} (delta {self.dp.delta:g})")
        after = self.counts.index_add(0, active, torch.ones_like(active))
        if not bool(((after > self.k_max) & (self.r_max < round_ + 1)).any()):
            return None
        return (f"privacy budget exhausted: round {round_ + 1} would take a client beyond "
                f"epsilon {self.dp.target_epsilon:g} (delta {self.dp.delta:g})")

    def messages(self, message: Any, round_: int, active: torch.Tensor) -> Any:
        """The round's messages clipped and noised; the clients ``active`` counted as taking part."""
        self.rounds = round_ + 1
        if active.numel():
            self.counts.index_add_(0, active, torch.ones_like(active))
        if message is None or self.noised_by_clients:
            return message
        return privatize(self.dp, message, active, round_, self.seed, legacy_key=self.legacy_key)

    def epsilons(self) -> np.ndarray | None:
        """Each client's epsilon now (None without accounting)."""
        if self.accountant is None:
            return None
        return self.accountant.epsilons(self.counts.cpu().numpy(), self.rounds)

    def columns(self) -> dict[str, float]:
        """metrics.csv's privacy columns: the largest and median per-client epsilon and the client
        with the largest (the lowest index among ties)."""
        eps = self.epsilons()
        if eps is None:
            return {}
        return {"epsilon_max": float(eps.max()), "epsilon_median": float(np.median(eps)),
                "epsilon_client": int(eps.argmax())}


def message_vectors(algorithm: Any) -> int:
    """The vectors a client sends per round (each clipped on its own): the algorithm's declared
    upload (tests/test_privacy.py holds it equal to the vector fields of every message)."""
    return max(1, math.ceil(algorithm.communication().up))


def dp_nonce(spec: Any, key: str) -> int | None:
    """The nonce a run's noise is keyed by beside its seed (None without DP): the one ``--dp``
    gives, else the run's identity ``key`` (runs.config.horizon_free_key: its run key, the rounds
    aside, 16 hex digits) read as an integer below 2**63. Two runs that differ in any keyed setting
    (sigma, mode, lr, algorithm, seed...) draw independent noise; a replay, a resume or an extension
    of one run draws the same (docs/privacy.md)."""
    dp = parse_dp(spec)
    if dp is None:
        return None
    return dp.nonce if dp.nonce is not None else int(key, 16) % NONCE_LIMIT


def run_privacy(spec: Any, algorithm: Any, problem: Any, participation: Any, *, seed: int, end_round: int,
                start_round: int = 0, federated: bool = False, nonce: int | None = 0) -> RunPrivacy | None:
    """The run's :class:`RunPrivacy` from its ``dp`` record (None without DP); ``federated``: the
    messages come from a federation's nodes, which noise their own under local mode. ``nonce``:
    the run's (dp_nonce), unless the record gives one; its record carries it (a federation's
    nodes noise by the record they are sent). ``nonce`` None: a run recorded before the nonce,
    resumed with the noise its first rounds drew (keyed by the seed alone, mechanism.noise_key)."""
    dp = parse_dp(spec)
    if dp is None:
        return None
    legacy_key = dp.nonce is None and nonce is None
    if dp.nonce is None and nonce is not None:
        dp = replace(dp, nonce=nonce)
    if federated and dp.secret_schedule:
        raise ConfigError("--dp: secret_schedule cannot hold in a federation: who arrives is the server's to see and "
                          "depends on the nodes' failures, not on the process's coins alone")
    privacy = RunPrivacy(dp, seed=seed, num_clients=problem.num_clients, vectors=message_vectors(algorithm),
                         participation=participation, end_round=end_round, device=problem.device,
                         noised_by_clients=federated and dp.mode == "local", legacy_key=legacy_key)
    if start_round and participation is not None:
        privacy.resume(participation, start_round)
    return privacy


# Algorithms whose server step reads the messages other than through their (per-field) sum: a
# weight per client (FedAU's omega_i, known-p FedAvg's 1/(N p_i), debiasing FedAvg's) or a table
# of each client's last message (MIFA, FedVARP, FedStale). Central noise on the sum does not
# cover what they release; local mode does. tests/test_privacy.py derives this set by moving
# mass between two clients' messages and seeing the server's step change.
READS_EACH_MESSAGE = frozenset({"fedau", "fedavg_known_p", "debiasing_fedavg", "mifa", "fedvarp", "fedstale"})


def central_covers(algorithm: Any) -> bool:
    """Whether central DP (noise on the round's sum) covers what ``algorithm``'s server releases."""
    return algorithm.name not in READS_EACH_MESSAGE and getattr(algorithm, "weighting", None) != "known_p"


def check_privacy(spec: Any, algorithm: Any, participation: Any = None) -> None:
    """A one-line ConfigError for a ``dp`` record this algorithm (and ``participation``, when
    given) cannot run under, or a missing accounting library; nothing without DP."""
    dp = parse_dp(spec)
    if dp is None:
        return
    if dp.mode == "central" and not central_covers(algorithm):
        raise ConfigError(f"--dp mode=central: {algorithm.name}'s server reads each client's message, not only "
                          "their sum, so noise on the sum does not cover it; use mode=local (docs/privacy.md)")
    if participation is not None:
        check_participation(dp, participation)
    if dp.accounted:
        library()


def reads_data(participation: Any) -> bool:
    """Whether the process's rates are computed from the clients' data (``label``: their label
    histograms), the processes the registry builds from the problem."""
    return bool(getattr(participation, "NEEDS_PROBLEM", False))


def check_participation(dp: DPConfig, participation: Any) -> None:
    """A one-line ConfigError where ``participation`` cannot run under ``dp``: rates read from
    the data (published by every schedule, outside any epsilon) unless declared public, and a
    secret schedule the process cannot keep."""
    name = getattr(participation, "name", "?")
    if reads_data(participation) and not dp.public_rates:
        raise ConfigError(f"--dp: participation {name} sets each client's rate from its data, and the schedule "
                          "publishes those rates outside any epsilon; add public_rates=true if they are public "
                          "knowledge (docs/privacy.md)")
    if dp.secret_schedule and not keeps_secret(participation):
        raise ConfigError(f"--dp: secret_schedule needs a process whose sampling an amplification theorem covers "
                          f"({', '.join(SECRET_PROCESSES)} without redraw), not {name}")


def epsilon_bound(spec: Any, participation: Any) -> dict[str, str]:
    """config.json's ``epsilon_bound``: which bound the run's epsilons are (nothing without them)."""
    dp = parse_dp(spec)
    if dp is None or not dp.accounted:
        return {}
    return {"epsilon_bound": amplification(participation, dp).bound}
