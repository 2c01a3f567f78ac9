"""Evaluation of a neural-network problem's server model: test and validation metrics, the full
objective F and its exact gradient (FedJAX's evaluation, apart from the clients' data and the
grouped training computation).

Evaluation runs in inference mode on a test set standardised once, in the formulation's layout,
in batches of ``eval_batch``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

from .data import ClientData
from .formulation import GroupedFormulation, Inputs


class Evaluation:
    """Metrics and full-data quantities of a model x, computed with dropout off."""

    def __init__(self, data: ClientData, model: GroupedFormulation, inputs: Inputs, eval_batch: int) -> None:
        self.data, self.model, self.inputs, self.eval_batch = data, model, inputs, eval_batch
        self.test_inputs: torch.Tensor | None = None  # the standardised test set, made once

    def logits(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return self.model.forward(x, self.inputs(images))

    def standardised_test_inputs(self) -> torch.Tensor:
        """The test images standardised once, in the layout evaluation uses (kept for the run)."""
        model = self.model
        model.formulation()  # the layout is the measured one
        if self.test_inputs is None:
            images = self.data.test_images
            layout = torch.channels_last if images.dim() == 4 and model.has_convolutions and model.eval_channels_last() \
                else torch.contiguous_format
            standardised = torch.empty(images.shape, dtype=model.dtype, device=model.device).contiguous(memory_format=layout)
            for start in range(0, len(images), 4096):  # no full-size float temporary
                standardised[start : start + 4096] = self.inputs(images[start : start + 4096])
            self.test_inputs = standardised
        return self.test_inputs

    def evaluate(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the model x on a split, in batches of eval_batch.

        ``images`` are stored images, or the standardised test inputs (``standardised_test_inputs``).
        """
        device = self.model.device
        total_loss = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        standardised = images.dtype == self.model.dtype and images is self.test_inputs
        with torch.inference_mode():
            for start in range(0, len(labels), self.eval_batch):
                batch = images[start : start + self.eval_batch]
                logits = self.model.forward(x, batch if standardised else self.inputs(batch))
                target = labels[start : start + self.eval_batch]
                total_loss += F.cross_entropy(logits, target, reduction="sum").to(torch.float64)
                correct += (logits.argmax(dim=1) == target).sum()
        count = max(len(labels), 1)
        return float(total_loss) / count, float(correct) / count

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """F(x) = (1/N) sum_i f_i(x) over all training data (dropout off); costs a full pass."""
        data = self.data
        total = torch.zeros((), dtype=self.model.dtype, device=self.model.device)
        with torch.no_grad():
            for start in range(0, len(data.train_labels), self.eval_batch):
                stop = start + self.eval_batch
                losses = F.cross_entropy(
                    self.logits(x, data.train_images[start:stop]), data.train_labels[start:stop], reduction="none"
                )
                total = total + (losses * data.sample_weights[start:stop]).sum()
        return total

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """Exact gradient of F at x (dropout off), accumulated over batches of training data."""
        data, model = self.data, self.model

        def weighted_loss(flat, images, labels, weights):
            logits = functional_call(model.eval_model, model.unflatten(flat), (self.inputs(images),))
            return (F.cross_entropy(logits, labels, reduction="none") * weights).sum()

        total = torch.zeros_like(x)
        for start in range(0, len(data.train_labels), self.eval_batch):
            stop = start + self.eval_batch
            total = total + grad(weighted_loss)(
                x, data.train_images[start:stop], data.train_labels[start:stop], data.sample_weights[start:stop]
            )
        return total
