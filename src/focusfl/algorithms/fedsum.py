"""FedSUM: the standard member of the FedSUM family (local updates with a correction).

Paper: "FedSUM family" (seed 004), section 3.2, Algorithm 2 and its equation (9) for the
correction direction. The formulas were lost in extraction; the update below is OUR
RECONSTRUCTION (ALGORITHMS.md section 3.2), with the scalings chosen so that the equivalences
of section 3.4 hold:

Client i keeps c_i (0 before any participation). Round r, every active client i receives
(x_r, v_r) (2 vectors down):
    z = x_r, acc = 0
    for k = 1..K:  g = grad f_i(z);  acc += g;  z = z - eta * (g - c_i + v_r / N)
    c_i_new = acc / K;  push Delta_i = c_i_new - c_i (1 vector up);  c_i = c_i_new
Server:  v_{r+1} = v_r + sum_{i in S_r} Delta_i            (v = sum_j c_j at all times)
         x_{r+1} = x_r - gamma * eta * K * v_{r+1} / N     (also when S_r is empty)

The local model z is never sent: local steps only decide where the gradients are taken, and
the correction v_r/N - c_i (the others' latest gradients minus one's own) removes client drift.
Under full participation this is SCAFFOLD (option II) with global step gamma.

A short client (K_i < K steps, RoundContext.steps) takes its K_i corrected steps and divides
by its own count, c_i_new = acc / K_i, so that c_i stays its mean local gradient (as
SCAFFOLD's option II does with tau_i; the paper has no step counts). The server is unchanged:
its step gamma * eta * K uses the nominal K, and v = sum_j c_j still holds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Communication, RoundContext, Step, broadcast, live_mask, max_steps, per_row, step_size
from .fedsum_b import FedSumB, SumClients, SumMessage, SumServer


def corrected_local_steps(
    x: torch.Tensor, correction: torch.Tensor, oracle, lr: Step, steps: int, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """K local steps z -= lr * (g + correction) from x; returns the mean gradient [n, d].

    ``correction`` [n, d] is each client's (global direction estimate - c_i). ``counts`` (int64
    [n], each in 1..K): client j stops after counts[j] steps and returns the mean of its own
    counts[j] gradients; one batched loop of max(counts) steps keeps finished rows as they are."""
    z = broadcast(x, correction.shape[0])
    total = torch.zeros_like(correction)
    if counts is not None:
        for step in range(max_steps(counts)):
            grad = oracle(z, step)
            live = live_mask(counts, step, grad)
            total = torch.where(live, total + grad, total)
            z = torch.where(live, z - lr * (grad + correction), z)
        return total / per_row(counts, total)
    for step in range(steps):
        grad = oracle(z, step)
        total = total + grad
        if step < steps - 1:  # the last move of z is never used
            z = z - lr * (grad + correction)
    return total / steps


@dataclass(frozen=True)
class FedSum(FedSumB):
    """FedSUM (reconstruction): local steps corrected by v_r/N - c_i; 2 down, 1 up.
    ``lr`` is eta, ``server_lr`` is gamma, ``local_steps`` is K."""

    name = "fedsum"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "FedSUM [reconstructed]: corrected local steps (v/N - c_i), sum-tracking server, = SCAFFOLD at full"

    def client_round(self, server: SumServer, clients: SumClients, oracle, ctx: RoundContext):
        direction = server.v / ctx.num_clients  # v_r / N, sent down with x_r
        correction = direction - clients.c
        c_new = corrected_local_steps(server.x, correction, oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return SumClients(c=c_new), SumMessage(delta=c_new - clients.c)

    def communication(self) -> Communication:
        return Communication(down=2, up=1, server_memory=2, client_memory=1)
