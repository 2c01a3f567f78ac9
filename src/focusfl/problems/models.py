"""The model zoo: the papers' CNNs, an MLP, logistic regression and ResNet-18 with GroupNorm.

Every builder takes the input shape (C, H, W) and the number of classes, so the same
architecture adapts to MNIST-sized or CIFAR-sized inputs (the flattened size of the first
fully-connected layer follows from the input; the papers' sizes are noted per model).

Dropout is :class:`KeyedDropout`: its mask is a hash of a key that the problem sets per
(seed, round, client, step), so the vectorized engine and the per-client loop drop the same
units, and vmap needs no random-number generator. Batch-norm running statistics cannot be
kept per client inside one vmapped call; ResNet-18 therefore uses GroupNorm.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Callable

import torch
from torch import nn

from ..errors import ConfigError
from ..rng import hash_bits
from ..spec import parse_spec


# Dropout masks are windows of one fixed sequence of 2**20 hash-generated uniforms, starting at
# a random offset per (client, step, layer); see KeyedDropout.
_TABLE_BITS = 20
_WINDOWS: dict[tuple[float, str], torch.Tensor] = {}


def _keep_sequence(p: float, length: int, device: torch.device) -> torch.Tensor:
    """Bool [>= length]: entry j is kept when hash(j mod 2**20) / 2**32 >= p (cached, grown on demand)."""
    key = (p, str(device))
    cached = _WINDOWS.get(key)
    if cached is None or cached.numel() < length:
        period = torch.arange(2**_TABLE_BITS, device=device)
        uniform = hash_bits(period, 0x5EED, device=device).to(torch.float64) / float(2**32)
        repeats = -(-max(length, 2 ** (_TABLE_BITS + 1)) // 2**_TABLE_BITS)
        _WINDOWS[key] = cached = (uniform >= p).repeat(repeats)
    return cached


def keep_masks(p: float, offsets: torch.Tensor, numel: int, device) -> torch.Tensor:
    """Bool masks ``[*offsets.shape, numel]``: entries offset .. offset + numel - 1 of the sequence.

    ``offsets`` are 32-bit hashes; only their low 20 bits are used. Selecting whole windows
    copies contiguous rows, which is much cheaper than looking up every unit.
    """
    sequence = _keep_sequence(p, 2**_TABLE_BITS + numel, torch.device(device))
    return sequence.unfold(0, numel, 1)[offsets & (2**_TABLE_BITS - 1)]


class KeyedDropout(nn.Module):
    """Dropout whose mask is fixed by a key instead of a random-number generator.

    ``key`` is a buffer the problem overrides in every functional call (one key per client and
    local step, hashed from (seed, round, client, step)); ``stream`` tells this layer apart from
    the other dropout layers. Unit u of one client's input (u = 0..numel-1 in C order) is kept
    when entry offset + u of a fixed sequence of uniforms (period 2**20) is >= p, with
    offset = hash(key, stream). Each unit is thus dropped with probability p, independently of
    the other units and, for another key, of its own other masks (inputs of more than 2**20
    units per client would repeat the sequence); a mask is one contiguous copy, where hashing
    every unit would cost more than the layer itself.
    """

    def __init__(self, p: float = 0.5, stream: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self.stream = int(stream)
        self.register_buffer("key", torch.zeros((), dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        offset = hash_bits(self.key, self.stream, device=x.device) & (2**_TABLE_BITS - 1)
        # Under vmap the offset is per client: index units explicitly (the grouped-weights path
        # in client_batched.py selects the same windows with keep_masks, which is cheaper).
        sequence = _keep_sequence(self.p, 2**_TABLE_BITS + x.numel(), x.device)
        units = torch.arange(x.numel(), device=x.device).reshape(x.shape)
        keep = sequence[units + offset]
        return x * (keep.to(x.dtype) * (1.0 / (1.0 - self.p)))

    def extra_repr(self) -> str:
        return f"p={self.p}, stream={self.stream}"


def _pooled(size: int, pools: int) -> int:
    for _ in range(pools):
        size //= 2
    if size < 1:
        raise ConfigError(f"input of side {size} is too small for {pools} 2x2 max-pools")
    return size


def _conv(cin: int, cout: int) -> nn.Conv2d:
    # C(in, out) of the papers: kernel 3, stride 1, padding 1.
    return nn.Conv2d(cin, cout, kernel_size=3, stride=1, padding=1)


def _block(cin: int, cout: int) -> list[nn.Module]:
    """The papers' conv - ReLU - 2x2 max-pool, written conv - pool - ReLU.

    Both orders compute the same function with the same gradients (max commutes with the
    non-decreasing ReLU, and a window whose maximum is <= 0 passes no gradient either way);
    pooling first applies the ReLU to a quarter of the values.
    """
    return [_conv(cin, cout), nn.MaxPool2d(2), nn.ReLU()]


def focus_cnn(input_shape, num_classes: int) -> nn.Module:
    """FOCUS paper (seed 002, appendix G) CIFAR-10 CNN: conv 3->16->32->64, each with ReLU and
    2x2 max-pool, then fc 1024->500->num_classes (1024 = 64 * 4 * 4 for 32x32 inputs)."""
    c, h, w = input_shape
    flat = 64 * _pooled(h, 3) * _pooled(w, 3)
    return nn.Sequential(
        *_block(c, 16), *_block(16, 32), *_block(32, 64),
        nn.Flatten(), nn.Linear(flat, 500), nn.ReLU(), nn.Linear(500, num_classes),
    )


def fedsum_mnist_cnn(input_shape, num_classes: int) -> nn.Module:
    """FedSUM paper (seed 004, appendix H, table 2) MNIST CNN:
    C(1,10)-R-M-C(10,20)-D-R-M-L(50)-R-D-L(10), dropout 0.2 (980 features for 28x28)."""
    c, h, w = input_shape
    flat = 20 * _pooled(h, 2) * _pooled(w, 2)
    return nn.Sequential(
        *_block(c, 10),
        _conv(10, 20), KeyedDropout(0.2, stream=0), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(flat, 50), nn.ReLU(), KeyedDropout(0.2, stream=1),
        nn.Linear(50, num_classes),
    )


def fedsum_svhn_cnn(input_shape, num_classes: int) -> nn.Module:
    """FedSUM SVHN CNN: C(3,32)-R-M-C(32,32)-R-M-L(128)-R-L(10) (2048 features for 32x32)."""
    c, h, w = input_shape
    flat = 32 * _pooled(h, 2) * _pooled(w, 2)
    return nn.Sequential(
        *_block(c, 32), *_block(32, 32),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, num_classes),
    )


def fedsum_cifar10_cnn(input_shape, num_classes: int) -> nn.Module:
    """FedSUM CIFAR-10 CNN: C(3,32)-R-M-C(32,32)-R-M-L(256)-R-L(64)-R-L(10)."""
    c, h, w = input_shape
    flat = 32 * _pooled(h, 2) * _pooled(w, 2)
    return nn.Sequential(
        *_block(c, 32), *_block(32, 32),
        nn.Flatten(), nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def mlp(input_shape, num_classes: int) -> nn.Module:
    """Two hidden layers of 200 ReLU units (the "2NN" of McMahan et al., 2017)."""
    features = int(torch.Size(input_shape).numel())
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
        nn.Linear(200, num_classes),
    )


def logistic_regression(input_shape, num_classes: int) -> nn.Module:
    """Multinomial logistic regression (a convex baseline on images)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.Size(input_shape).numel()), num_classes))


class BasicBlock(nn.Module):
    """ResNet basic block with GroupNorm in place of BatchNorm."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(groups, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images (3x3 stem, no initial max-pool), GroupNorm with 2 groups
    (the FL-standard swap of Hsieh et al., 2020: batch-norm statistics do not federate)."""

    def __init__(self, input_shape, num_classes: int, groups: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 64, 3, padding=1, bias=False), nn.GroupNorm(groups, 64), nn.ReLU()
        )
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride, groups), BasicBlock(cout, cout, 1, groups)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.layers(self.stem(x))
        return self.head(features.mean(dim=(-2, -1)))


MODELS: dict[str, Callable[..., nn.Module]] = {
    "focus-cnn": focus_cnn,
    "fedsum-mnist-cnn": fedsum_mnist_cnn,
    "fedsum-svhn-cnn": fedsum_svhn_cnn,
    "fedsum-cifar10-cnn": fedsum_cifar10_cnn,
    "mlp": mlp,
    "logreg": logistic_regression,
    "resnet18-gn": ResNet18,
}

# The model a dataset gets when the spec says model=auto.
DEFAULT_MODELS = {
    "mnist": "fedsum-mnist-cnn",
    "fashion-mnist": "fedsum-mnist-cnn",
    "svhn": "fedsum-svhn-cnn",
    "cifar10": "focus-cnn",
    "cifar100": "resnet18-gn",
}


def default_model(dataset: str, input_shape) -> str:
    if dataset in DEFAULT_MODELS:
        return DEFAULT_MODELS[dataset]
    # An .npz: grayscale digits-like data gets the MNIST CNN, colour images the FOCUS CNN.
    return "fedsum-mnist-cnn" if input_shape[0] == 1 else "focus-cnn"


def make_model(name: str, input_shape, num_classes: int, *, allow_import: bool = False) -> nn.Module:
    """A zoo model by name, or ``package.module:factory`` for a user's own model.

    A user factory is called with whichever of ``input_shape`` and ``num_classes`` it accepts
    as keyword arguments and must return an ``nn.Module`` mapping [B, C, H, W] to [B, classes].
    Importing it runs that package's code, so it needs ``allow_import=True``: a spec may come
    from a file someone else wrote (``--allow-model-import`` on the command line).
    """
    if name in MODELS:
        return MODELS[name](tuple(input_shape), num_classes)
    if is_model_import(name):
        if not allow_import:
            raise ConfigError(
                f"model {name!r} would import and run Python code; pass --allow-model-import to allow it "
                "(never from a config file)"
            )
        return _user_model(name, tuple(input_shape), num_classes)
    raise ConfigError(f"unknown model {name!r} (known: {', '.join(MODELS)}, or package.module:factory)")


# Model folders read as data, never imported (problems/text_models.py): model=hf:FOLDER.
HF_MODEL_PREFIXES = ("hf:", "hf-config:")


def is_model_import(name: object) -> bool:
    """Whether a model name is ``package.module:factory`` (code to import), not a zoo name."""
    return isinstance(name, str) and ":" in name and name not in MODELS and not name.startswith(HF_MODEL_PREFIXES)


def refuse_model_import(problem: str | dict, source: str) -> None:
    """ConfigError when a problem spec read from ``source`` (a config file) names a model to import.

    Opening a config file must never run its author's code, so this holds whatever the command
    line allows; the CLI calls it on every problem it reads from a file.
    """
    try:
        _, params = parse_spec(problem)
    except ConfigError:
        return  # not a spec: make_problem will say so
    model = params.get("model")
    if not is_model_import(model):
        return
    if str(model).startswith("custom:"):
        raise ConfigError(
            f"{source} names model {model!r}, a module passed from Python, which a config file cannot rebuild"
        )
    raise ConfigError(
        f"{source} names model {model!r}, which would import and run Python code; a config file may not do "
        "that (give --problem with --allow-model-import instead)"
    )


def _user_model(name: str, input_shape, num_classes: int) -> nn.Module:
    module_name, _, attribute = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import model factory {name!r}: {exc}") from None
    offered = {"input_shape": input_shape, "num_classes": num_classes}
    try:
        accepted = inspect.signature(factory).parameters
        kwargs = {k: v for k, v in offered.items() if k in accepted}
    except (TypeError, ValueError):
        kwargs = {}
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model factory {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def prepare_for_clients(model: nn.Module) -> nn.Module:
    """Check that a model can be trained per client under vmap; swap nn.Dropout for KeyedDropout.

    Batch norm with running statistics mutates buffers in the forward pass, which per-client
    vectorized training cannot do; other random layers would need a generator inside vmap.
    """
    stream = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and child.track_running_stats:
                raise ConfigError(
                    f"model layer {child_name!r} is batch norm with running statistics, which per-client "
                    "training does not support; use nn.GroupNorm instead (docs/neural-networks.md)"
                )
            if type(child) is nn.Dropout:
                setattr(parent, child_name, KeyedDropout(child.p, stream=1000 + stream))
                stream += 1
            elif isinstance(child, nn.modules.dropout._DropoutNd):
                raise ConfigError(
                    f"model layer {child_name!r} ({type(child).__name__}) is not supported; use nn.Dropout"
                )
    return model
