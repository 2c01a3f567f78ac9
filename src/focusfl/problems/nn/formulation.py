"""How a neural-network problem computes its clients' gradients on a device (FedJAX's model,
init and apply, with the grouping of clients): the flat-parameter view of the module, the
grouped gradient call, and the formulation (clients per batched call, convolution layout).

``oracle(clients)`` returns minibatch gradients for a stack of points ``[n, d]``, one row per
active client, computed for all of them in ONE batched call: the grouped-weights path
(problems/client_batched.py) for ``nn.Sequential`` models, else ``torch.func.vmap`` over
clients of ``grad_and_value`` of a ``functional_call`` of the module. No Python loop runs over
clients.

The formulation is chosen by a deterministic rule from the device type, the model's activation
sizes and the batch, so a run's bytes never depend on timing or load; measuring instead is an
explicit opt-in (``client_chunk=measure``, ``layout=measure``) whose outcome config.json records.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from ...device import DevicePolicy
from ...errors import ConfigError
from .. import client_batched
from ..models import KeyedDropout, prepare_for_clients
from .data import ClientData

# The stored samples of the local steps whose minibatches are drawn together (see gradient_call).
DRAW_AHEAD_BYTES = 16 * 2**20

# client_chunk=measure times chunks of 1, 2, 4, ... clients; on a CPU it stops once a chunk is
# this much slower per client than the best so far (grouped convolutions cost more per sample
# as the group count grows there, so larger chunks only get worse).
_TUNE_STOP = 1.15
_CPU_MARGIN = 1.1  # a larger chunk replaces a smaller one on a CPU only if 10% faster per client
_TUNE_MAX_CHUNK = 64
# Measured formulations (client_chunk/layout=measure), per (device, model, input, batch, dtype,
# path, clients, threads).
_FORMULATIONS: dict[tuple, tuple[int | None, str]] = {}

Inputs = Callable[[torch.Tensor], torch.Tensor]


class GroupedFormulation:
    """The module as a function of a flat parameter vector, and its grouped gradient call.

    ``module``: the model (prepared here for clients and moved to the device); ``params``: the
    problem's validated parameters (``client_chunk``, ``layout``, ``client_batching``, ``model``);
    ``data``: the clients' data; ``inputs``: stored samples to model inputs (the problem's, so a
    subclass's token inputs apply); ``policy``: the device's rules (device.py)."""

    def __init__(self, module: nn.Module, params: dict[str, Any], data: ClientData, inputs: Inputs,
                 policy: DevicePolicy, *,
                 input_shape: tuple, num_classes: int, num_clients: int, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.params, self.data, self.inputs, self.policy = params, data, inputs, policy
        self.input_shape, self.num_classes, self.num_clients, self.batch = input_shape, num_classes, num_clients, batch
        self.dtype, self.device = dtype, device
        module = prepare_for_clients(module).to(device=device, dtype=dtype)
        named = [(n, t) for n, t in module.named_parameters() if t.requires_grad]
        if not named:
            raise ConfigError("the model has no trainable parameters")
        self.names = [n for n, _ in named]
        self.shapes = [t.shape for _, t in named]
        self.numels = [t.numel() for _, t in named]
        self.dim = sum(self.numels)
        self.x0 = torch.cat([t.detach().reshape(-1) for _, t in named]).clone()
        self.key_names = [f"{n}.key" if n else "key" for n, m in module.named_modules() if isinstance(m, KeyedDropout)]
        self.train_model = module.train()
        self.eval_model = copy.deepcopy(module).eval()
        self.has_convolutions = any(isinstance(m, nn.Conv2d) for m in module.modules())
        self.activations_per_sample = _activation_elements(self.eval_model, input_shape, dtype, device)
        # The grouped-weights path needs every parameter trainable (it builds all of them from z).
        all_trainable = len(named) == len(list(module.parameters()))
        self.batched_sequential = (
            params["client_batching"] == "auto" and all_trainable and client_batched.supports(module)
        )
        if self.batched_sequential:
            self.client_grads = self._sequential_loss_and_gradients
        else:
            vmapped = vmap(grad_and_value(self._minibatch_loss))
            self.client_grads = lambda z, images, labels, weights, keys, channels_last=True: vmapped(
                z, images, labels, weights, keys
            )
        self.tuned = False
        self.channels_last_fails = False  # found by probe
        self.chunk: int | None = None
        self.layout = ""

    # -- the chosen formulation -------------------------------------------------------------------
    def formulation(self) -> tuple[int | None, str]:
        """(clients per batched call or None for all, convolution layout) for this run.

        ``auto`` (the default) is a rule of the device type, the model and the batch, never of
        the clock, so the same command gives the same bytes on a busy or an idle machine: on a
        CPU, channels-last convolutions (oneDNN's fastest) and the largest power-of-two chunk of
        clients whose forward activations fit the policy's budget (device.py); on an
        accelerator, NCHW and chunks bounded by its larger budget. Formulations round differently
        (grouped against per-client convolutions), so float32 results depend on the choice at
        the rounding level, and SG-FOCUS can amplify that.

        ``measure`` is the opt-in to time the candidates instead: one gradient call of the real
        model on real minibatches for chunks of 1, 2, 4, ... clients, in channels-last and NCHW
        memory where the grouped-weights path is used, the fastest per client kept (cached per
        device, model, input shape, batch, dtype and thread count). Its outcome can differ from
        one process to the next; the problem's ``describe()`` (so config.json) records it, and a
        rerun from config.json computes the same way.
        """
        if not self.tuned:
            self.tuned = True
            chunk, layout = self.params["client_chunk"], self.params["layout"]
            if chunk == "auto":
                chunk = self._rule_chunk()
            if layout == "auto":
                layout = self._rule_layout()
            if "measure" in (chunk, layout):
                key = (
                    str(self.device), str(self.train_model), self.input_shape, self.batch, self.dtype,
                    self.batched_sequential, self.num_clients, chunk, layout, torch.get_num_threads(),
                )
                if key not in _FORMULATIONS:
                    _FORMULATIONS[key] = self._measure_formulations(chunk, layout)
                chunk, layout = _FORMULATIONS[key]
            self.chunk = None if chunk in (0, None) or int(chunk) >= self.num_clients else int(chunk)
            self.layout = layout
        return self.chunk, self.layout

    def _rule_layout(self) -> str:
        if self.channels_last_fails:
            return "nchw"
        return self.policy.layout

    def _rule_chunk(self) -> int:
        """The largest power of two (0 = all clients) whose chunk's activations fit the budget."""
        budget = self.policy.chunk_budget
        per_client = self.activations_per_sample * self.batch
        chunk = 1
        while chunk * 2 * per_client <= budget and chunk * 2 <= _TUNE_MAX_CHUNK:
            chunk *= 2
        return 0 if chunk >= self.num_clients else chunk

    def eval_channels_last(self) -> bool:
        """The measured layout once known; before that, the one asked for, or the rule's:
        channels-last on a CPU (oneDNN's best) unless the model cannot take it."""
        if self.tuned:
            return self.layout == "channels_last"
        if self.channels_last_fails or self.params["layout"] == "nchw":
            return False
        return self.params["layout"] == "channels_last" or self.policy.layout == "channels_last"

    def _layouts(self, layout: str) -> list[str]:
        if layout != "measure":
            return [layout]
        if not self.has_convolutions:
            return ["channels_last"]  # nothing to lay out; eval and gradients ignore it
        if not self.batched_sequential:  # vmap path: inputs as given; eval may still use CL
            return [self._rule_layout()]
        return ["channels_last", "nchw"]

    def _measure_formulations(self, chunk, layout) -> tuple[int | None, str]:
        """The fastest (chunk, layout) per client over the candidates that ``measure`` leaves open."""
        chunks = [int(chunk)] if chunk != "measure" else _chunk_candidates(self.num_clients)
        best: tuple[float, int, str] | None = None
        for candidate_layout in self._layouts(layout):
            for k in chunks:
                try:
                    seconds = self._time_gradients(k, candidate_layout) / max(1, min(k or self.num_clients, self.num_clients))
                except torch.cuda.OutOfMemoryError:
                    break
                # On a CPU a larger chunk must win clearly: one short measurement is noisy, and
                # grouped convolutions cost more per sample as clients are added, so a near-tie
                # goes to the smaller chunk (measured: chunks of 2 picked on a tie ran 15% slower
                # than the per-client loop over whole rounds).
                margin = _CPU_MARGIN if self.device.type == "cpu" and best is not None and best[2] == candidate_layout else 1.0
                if best is None or seconds * margin < best[0]:
                    best = (seconds, k, candidate_layout)
                elif chunk == "measure" and self.device.type == "cpu" and seconds > _TUNE_STOP * best[0]:
                    break  # larger chunks only get slower on a CPU
        if best is None:  # not even one client fitted in memory while measuring: run one at a time
            return 1, self._layouts(layout)[0]
        return best[1], best[2]

    def _time_gradients(self, k: int, layout: str, repeats: int = 2) -> float:
        """Seconds of one gradient call for ``k`` clients (0: all) in ``layout`` (best of repeats)."""
        count = k or self.num_clients
        clients = torch.arange(count, device=self.device) % self.num_clients
        z = self.x0.expand(count, -1).clone()
        call = self.gradient_call(clients, seed=0, round=0, channels_last=layout == "channels_last")
        seconds = math.inf
        for attempt in range(repeats + 1):  # the first call warms up kernels and allocations
            self._synchronize()
            start = time.perf_counter()
            call(z, attempt)
            self._synchronize()
            if attempt:
                seconds = min(seconds, time.perf_counter() - start)
        return seconds

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the model as a function of flat parameters --------------------------------------------------
    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat parameter vector [d] as the module's named parameters (views, no copies)."""
        chunks = torch.split(flat, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes)}

    def forward(self, x: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of the model x (dropout off) on standardised inputs, in the chosen layout."""
        if inputs.dim() == 4 and self.has_convolutions:
            layout = torch.channels_last if self.eval_channels_last() else torch.contiguous_format
            inputs = inputs.contiguous(memory_format=layout)
        return functional_call(self.eval_model, self.unflatten(x), (inputs,))

    def _sequential_loss_and_gradients(self, z, images, labels, weights, keys, channels_last=True):
        return client_batched.loss_and_gradients(
            self.train_model, self.names, self.shapes, self.numels, z, images, labels, weights, keys,
            channels_last,
        )

    def _minibatch_loss(self, flat, images, labels, weights, key):
        """Weighted mean cross-entropy of one client's minibatch (vmapped over clients)."""
        state = self.unflatten(flat)
        for name in self.key_names:
            state[name] = key
        logits = functional_call(self.train_model, state, (images,))
        losses = F.cross_entropy(logits, labels, reduction="none")
        return (losses * weights).sum() / weights.sum()

    # -- the grouped gradient call -------------------------------------------------------------------
    def gradient_call(self, clients: torch.Tensor, *, seed: int, round: int, channels_last: bool,
                      steps: int | None = None):
        """``call(z, step) -> (gradients [n, d], losses [n])`` for the clients' minibatches.

        The minibatches of up to ``steps`` steps are drawn in one go, as many as DRAW_AHEAD_BYTES
        of stored samples hold: drawing is dozens of small operations a step, and after a
        backward pass each of them ran several times slower than alone (the CIFAR-10
        benchmark's draws took 1 ms a step). The draws are elementwise in the steps, so the
        same minibatches come out whichever steps are drawn together."""
        data = self.data
        sizes = data.sizes.index_select(0, clients)
        # Clients smaller than the batch fill its last slots with weight-0 padding; when every
        # client of the call is that small, those slots are dropped instead of computed (13% of
        # the client rounds of the CIFAR-10 preset hold 15-54 samples). Same minibatches.
        largest = data.largest_size(clients, sizes) if clients.numel() else self.batch
        width = min(self.batch, largest)
        step_bytes = max(clients.numel() * width * data.train_images[0].nbytes, 1)
        ahead = max(1, DRAW_AHEAD_BYTES // step_bytes)
        # Channels-last convolutions take per-sample HWC inputs: laying the stored images out
        # so when drawing (the crop writes them so) costs less than converting standardised floats.
        per_sample_hwc = (channels_last and self.batched_sequential and self.has_convolutions
                          and data.train_images.dim() == 4)
        drawn: dict[int, tuple[torch.Tensor, ...]] = {}

        def call(z: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            if step not in drawn:
                count = min(ahead, steps - step) if steps is not None and step < steps else 1
                drawn.clear()
                block = torch.arange(step, step + count, device=self.device)
                drawn.update(enumerate(zip(*self.draw(seed, round, clients, block, sizes, width, largest,
                                                      per_sample_hwc)), start=step))
            images, labels, weights, keys = drawn.pop(step)
            return self.client_grads(z, self.inputs(images), labels, weights, keys, channels_last)

        return call

    def draw(self, *args) -> tuple[torch.Tensor, ...]:
        """The data's keyed draw (ClientData.draw), one seam for tests to count block draws."""
        return self.data.draw(*args)

    # -- probing -------------------------------------------------------------------------------------
    def probe(self) -> None:
        """Run the model once on two samples, then one gradient, so a mismatch fails now in one line.

        A model that cannot take channels-last activations (one that calls ``.view`` on a
        convolution's output, as many hand-written CNNs do) runs NCHW when the layout is left to
        the rule: a property of the model's code, the same on every machine. Asked for
        channels-last explicitly, it is refused with that hint."""
        try:
            self._probe_once()
        except ConfigError as failure:
            if not (self.has_convolutions and self.eval_channels_last()):
                raise
            self.channels_last_fails = True  # the layouts below are NCHW now
            try:
                self._probe_once()
            except ConfigError:
                raise failure from None
            if self.params["layout"] == "channels_last":
                raise ConfigError(f"{failure} (with layout=channels_last; the model runs with layout=nchw)") from None

    def _probe_once(self) -> None:
        name = self.params["model"]
        failure = f"model {name!r} cannot train on inputs {self.input_shape}"
        try:
            with torch.no_grad():
                logits = self.forward(self.x0, self.inputs(self.data.train_images[:2]))
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None
        if tuple(logits.shape) != (2, self.num_classes):
            raise ConfigError(
                f"model {name!r} gives outputs {tuple(logits.shape[1:])} per sample, "
                f"expected ({self.num_classes},) class scores"
            )
        try:
            clients = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.gradient_call(clients, seed=0, round=0, channels_last=self.eval_channels_last())(self.x0[None, :], 0)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _activation_elements(module: nn.Module, input_shape, dtype: torch.dtype, device: torch.device) -> int:
    """Output elements of the module's leaf layers for one sample: what a forward pass keeps for
    the backward pass, from shapes alone (one forward pass of a zero sample, hooks on leaves)."""
    counted = [0]

    def count(layer, inputs, output) -> None:
        if isinstance(output, torch.Tensor):
            counted[0] += output.numel()

    leaves = [m for m in module.modules() if next(m.children(), None) is None]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            module(torch.zeros((1, *input_shape), dtype=dtype, device=device))
    except (RuntimeError, ValueError, TypeError, IndexError):
        return 0  # the probe that follows names the mismatch in one line
    finally:
        for hook in hooks:
            hook.remove()
    return max(counted[0], 1)


def _chunk_candidates(clients: int) -> list[int]:
    """1, 2, 4, ... up to the number of clients (0 = all of them, when that is few enough)."""
    chunks, k = [], 1
    while k < clients and k <= _TUNE_MAX_CHUNK:
        chunks.append(k)
        k *= 2
    if clients <= _TUNE_MAX_CHUNK:
        chunks.append(0)
    return chunks
