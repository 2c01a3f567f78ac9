"""A faster client-batched path for sequential models: n clients' networks as ONE network.

``torch.func.vmap`` handles any module, but on CPU its batching rule for a convolution whose
weights differ per client copies activations between layouts at every layer, which makes it
slower than training the clients one after another. For an ``nn.Sequential`` of common layers
the n client networks can instead be written directly as one network with grouped weights:

- activations of the convolutional part are kept as ``[b, n*C, H, W]`` (client k owns channels
  k*C..k*C+C-1), so a convolution is ``conv2d(..., groups=n)`` with the clients' kernels
  stacked, and pooling and activations act per channel unchanged. The memory layout is the
  caller's choice: channels-last (the default; oneDNN's fastest on x86 CPUs) or NCHW (which
  cuDNN may prefer); the problem chooses by rule, or measures both on request
  (NeuralNetwork.formulation);
- after ``Flatten`` activations are ``[n, b, F]`` and a linear layer is one ``baddbmm``;
- dropout masks are KeyedDropout's, computed per client from the same keys as in vmap.

The loss is the sum over clients of each client's weighted mean cross-entropy; its gradient
with respect to the stacked parameters ``[n, d]`` has client k's own gradient in row k, so one
backward pass gives every client's gradient. The result equals vmap's up to rounding (tests
check both against the one-client-at-a-time loop).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..rng import hash_bits
from .models import KeyedDropout, keep_masks

# Layers that act on every channel / feature independently and have no parameters.
_ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)
_POOLS = (nn.MaxPool2d, nn.AvgPool2d)


def supports(model: nn.Module) -> bool:
    """True for an nn.Sequential whose layers this path can batch over clients."""
    if type(model) is not nn.Sequential:
        return False
    layout = "input"  # input -> conv ([b, n*C, H, W]) -> flat ([n, b, F])
    for layer in model:
        if isinstance(layer, nn.Conv2d):
            if layout == "flat" or layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
                return False
            layout = "conv"
        elif isinstance(layer, _POOLS):
            if layout == "flat":
                return False
            layout = "conv"
        elif isinstance(layer, nn.Flatten):
            if layer.start_dim != 1 or layer.end_dim != -1 or layout == "flat":
                return False
            layout = "flat"
        elif isinstance(layer, nn.Linear):
            if layout != "flat":
                return False
        elif not isinstance(layer, _ELEMENTWISE + (KeyedDropout,)):
            return False
    return layout == "flat"


def _to_grouped(x: torch.Tensor, channels_last: bool = True) -> torch.Tensor:
    """[n, b, C, H, W] -> [b, n*C, H, W] in channels-last (or NCHW) memory (one copy)."""
    n, b, c, h, w = x.shape
    if not channels_last:
        return x.transpose(0, 1).reshape(b, n * c, h, w)
    physical = x.permute(1, 3, 4, 0, 2).contiguous()  # (b, H, W, n, C)
    return physical.view(b, h, w, n * c).permute(0, 3, 1, 2)


def _grouped_to_flat(x: torch.Tensor, n: int) -> torch.Tensor:
    """[b, n*C, H, W] -> [n, b, C*H*W], features in each client's own C, H, W order."""
    b, nc, h, w = x.shape
    per_client = x.reshape(b, n, nc // n, h, w).permute(1, 0, 2, 3, 4)
    return per_client.reshape(n, b, -1)


def _grouped_dropout(layer: KeyedDropout, x: torch.Tensor, keys: torch.Tensor, n: int) -> torch.Tensor:
    """KeyedDropout on grouped activations with each client's own mask (as vmap would draw it)."""
    b, nc, h, w = x.shape
    offsets = hash_bits(keys, layer.stream, device=x.device)  # [n]
    masks = keep_masks(layer.p, offsets, b * (nc // n) * h * w, x.device)  # [n, b*C*H*W]
    # Client k's mask is in its own C order (b, c, h, w); lay it out like x.
    keep = _to_grouped(masks.view(n, b, nc // n, h, w), x.is_contiguous(memory_format=torch.channels_last))
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - layer.p)))


def _flat_dropout(layer: KeyedDropout, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    n, b, f = x.shape
    offsets = hash_bits(keys, layer.stream, device=x.device)
    keep = keep_masks(layer.p, offsets, b * f, x.device).view(n, b, f)
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - layer.p)))


class _BatchedLinear(torch.autograd.Function):
    """``x [n, b, F] @ weight[k].T`` for every client k, whose weight gradient comes back laid
    out like the weight ``[n, out, F]``: bmm's own backward gives it transposed, and copying
    that into the flat gradient's columns cost 0.6 ms a step on the CIFAR-10 benchmark. Given
    ``grad_weight_into`` (a contiguous tensor shaped like the weight, used once: the flat
    gradient's columns of one client), the weight gradient is written there and never copied.
    Several clients' columns are strided; bmm writes those with other roundings, so they are
    left to the copy (the same bits whichever way the clients are chunked)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, grad_weight_into: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.grad_weight_into = grad_weight_into
        return torch.bmm(x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            into = ctx.grad_weight_into
            if into is not None and into.is_contiguous():
                grad_weight = torch.bmm(grad.transpose(1, 2), x, out=into)
            else:
                grad_weight = torch.bmm(grad.transpose(1, 2), x)
        return grad_x, grad_weight, None


def batched_forward(
    model: nn.Sequential,
    params: Callable[[str], torch.Tensor | None],
    images: torch.Tensor,
    keys: torch.Tensor,
    channels_last: bool = True,
    gradients_into: Callable[[str], torch.Tensor | None] = lambda name: None,
) -> torch.Tensor:
    """Logits ``[n, b, classes]`` of n client networks on their own inputs ``[n, b, C, H, W]``.

    ``params(name)`` gives the stacked parameter ``[n, *shape]`` of that name (None if absent);
    ``channels_last`` picks the memory layout of the convolutional activations;
    ``gradients_into(name)``, where the backward pass may write that parameter's gradient.
    """
    n = images.shape[0]
    x, layout = images, "input"
    for index, layer in enumerate(model):
        weight, bias = params(f"{index}.weight"), params(f"{index}.bias")
        if isinstance(layer, (nn.Conv2d,) + _POOLS) and layout == "input":
            x, layout = _to_grouped(x, channels_last), "conv"
        if isinstance(layer, nn.Conv2d):
            cout, cin, kh, kw = weight.shape[1:]
            x = F.conv2d(
                x, weight.reshape(n * cout, cin, kh, kw), None if bias is None else bias.reshape(-1),
                stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=n,
            )
        elif isinstance(layer, nn.Flatten):
            x = _grouped_to_flat(x, n) if layout == "conv" else x.reshape(n, x.shape[1], -1)
            layout = "flat"
        elif isinstance(layer, nn.Linear):
            out = _BatchedLinear.apply(x, weight, gradients_into(f"{index}.weight"))
            x = out if bias is None else out + bias[:, None, :]
        elif isinstance(layer, KeyedDropout):
            if layer.training and layer.p > 0:
                x = _flat_dropout(layer, x, keys) if layout == "flat" else _grouped_dropout(layer, x, keys, n)
        else:  # pools and elementwise activations act per channel
            x = layer(x)
    return x


def loss_and_gradients(
    model: nn.Sequential,
    names: list[str],
    shapes: list[torch.Size],
    numels: list[int],
    z: torch.Tensor,
    images: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    channels_last: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradients [n, d], losses [n]) of every client's weighted mean cross-entropy at z[k]."""
    n = z.shape[0]
    flat = z.new_empty(n, sum(numels))
    columns = [column.view(n, *shape) for column, shape in zip(torch.split(flat, numels, dim=1), shapes)]
    with torch.enable_grad():
        # Each layer's stacked parameters are a leaf viewing z (no copy of the [n, d] stack).
        leaves = [
            chunk.detach().view(n, *shape).requires_grad_(True)
            for chunk, shape in zip(torch.split(z, numels, dim=1), shapes)
        ]
        logits = batched_forward(model, dict(zip(names, leaves)).get, images, keys, channels_last,
                                 dict(zip(names, columns)).get)
        per_sample = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        losses = (per_sample.view_as(weights) * weights).sum(1) / weights.sum(1)
        grads = torch.autograd.grad(losses.sum(), leaves)
    # The other gradients are copied once, straight into their columns.
    for column, grad in zip(columns, grads):
        if not _same_memory(column, grad):
            column.copy_(grad)
    return flat, losses.detach()


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` is ``a`` itself (a gradient the backward pass wrote in place)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
