"""Models as users write them, trained by the nn problem: a zoo of common idioms.

The FOCUS authors' own MNIST CNN flattens with ``x.view(x.size(0), -1)``; on MNIST with
``test_fraction=0.2`` it could not be built whatever ``layout`` said: the split's numpy indexing
left 1-channel images with strides (784, 1, 28, 1), which torch also reads as channels-last, so
convolutions ran channels-last and the model's ``view`` failed with a message that blamed the
model. Stored samples and validation shares now have standard strides, and a model that cannot
take channels-last activations runs NCHW when the layout is left to the rule (a property of its
code, the same on every machine; config.json records the layout).
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_harness import assert_one_line_error, cli_env, run_cli
from focusfl.errors import ConfigError
from focusfl.problems import make_problem

MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"

ZOO = textwrap.dedent("""
    import torch
    from torch import nn
    import torch.nn.functional as F


    class FocusMnistCNN(nn.Module):
        # The FOCUS authors' MNIST CNN, as published: flattens with view.
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2(x), 2))
            x = x.view(x.size(0), -1)
            return self.fc2(F.relu(self.fc1(x)))


    class Flattening(nn.Module):
        # view, view(-1, n), reshape, torch.flatten or x.flatten(1) after a convolution.
        def __init__(self, channels, classes, how):
            super().__init__()
            self.how = how
            self.conv = nn.Conv2d(channels, 8, 3, padding=1)
            self.head = nn.LazyLinear(classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv(x)), 2)
            if self.how == "view":
                x = x.view(x.size(0), -1)
            elif self.how == "view-fixed":
                x = x.view(-1, x[0].numel())
            elif self.how == "reshape":
                x = x.reshape(x.shape[0], -1)
            elif self.how == "torch.flatten":
                x = torch.flatten(x, 1)
            else:
                x = x.flatten(1)
            return self.head(x)


    class View(nn.Module):
        def forward(self, x):
            return x.view(x.size(0), -1)


    def focus_mnist():
        return FocusMnistCNN()


    def flattening(input_shape, num_classes, how="view"):
        return Flattening(input_shape[0], num_classes, how)


    def sequential_view(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(nn.Conv2d(c, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), View(),
                             nn.Linear(6 * (h // 2) * (w // 2), num_classes))


    def sequential_flatten(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(nn.Conv2d(c, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Dropout(0.25), nn.Linear(6 * (h // 2) * (w // 2), num_classes))


    def groupnorm_cnn(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, num_classes))


    def mlp_view(input_shape, num_classes):
        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(int(torch.Size(input_shape).numel()), num_classes)

            def forward(self, x):
                return self.fc(x.view(x.size(0), -1))

        return MLP()
""")

FACTORIES = ["focus_mnist", "sequential_view", "sequential_flatten", "groupnorm_cnn", "mlp_view",
             *[f"flattening_{how}" for how in ("view", "view-fixed", "reshape", "torch.flatten", "method")]]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    text = ZOO + "".join(
        f"\n\ndef flattening_{how.replace('-', '_').replace('.', '_')}(input_shape, num_classes):\n"
        f"    return Flattening(input_shape[0], num_classes, {how!r})\n"
        for how in ("view", "view-fixed", "reshape", "torch.flatten", "method"))
    (folder / "user_zoo.py").write_text(text)
    sys.path.insert(0, str(folder))
    rng = np.random.default_rng(0)
    colour = folder / "colour.npz"
    np.savez(colour, images=rng.integers(0, 256, (120, 16, 16, 3), dtype=np.uint8), labels=np.arange(120) % 4)
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop("user_zoo", None)


def factory(name: str) -> str:
    return "user_zoo:" + name.replace("-", "_").replace(".", "_")


def build(data: Path, model: str, layout: str = "auto", **extra):
    params = {"data": str(data), "test_fraction": 0.2, "validation": 0.1, "clients": 4, "batch": 8,
              "partition": "iid", "model": factory(model), "layout": layout, **extra}
    return make_problem({"name": "nn", **params}, allow_model_import=True)


def trains(problem) -> None:
    """Metrics of the initial model, and one round of gradients of every client, are finite."""
    x = problem.initial_point()
    metrics = problem.metrics(x)
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    grads = problem.oracle(torch.arange(problem.num_clients), seed=0, round=0)(x.expand(problem.num_clients, -1), 0)
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0


def standard(tensor: torch.Tensor) -> bool:
    expected, step = [], 1
    for size in reversed(tensor.shape):
        expected.append(step)
        step *= size
    return tuple(tensor.stride()) == tuple(reversed(expected))


@pytest.mark.parametrize("model", FACTORIES)
@pytest.mark.parametrize("layout", ["auto", "nchw"])
def test_user_models_train_on_a_split_of_mnist(zoo, model, layout):
    problem = build(MNIST, model, layout)
    assert all(standard(t) for t in (problem.train_images, problem.test_images, problem.validation_images))
    trains(problem)


@pytest.mark.parametrize("model", [m for m in FACTORIES if m != "focus_mnist"])
def test_user_models_train_on_colour_images(zoo, model):
    problem = build(zoo / "colour.npz", model)
    trains(problem)
    views = model in ("sequential_view", "flattening_view", "flattening_view-fixed")
    # A model that views a convolution's output runs NCHW; the others keep the CPU rule's channels-last.
    assert problem.describe()["layout"] == ("nchw" if views else "channels_last")


def test_asking_channels_last_of_a_model_that_views_its_activations_says_what_to_do(zoo):
    with pytest.raises(ConfigError) as info:
        build(zoo / "colour.npz", "flattening_view", layout="channels_last")
    assert "view size is not compatible" in str(info.value) and "the model runs with layout=nchw" in str(info.value)


def test_the_focus_authors_mnist_cnn_through_the_console_script(zoo, tmp_path):
    env = cli_env()
    env["PYTHONPATH"] += f":{zoo}"
    out = tmp_path / "run"
    spec = f"nn:data={MNIST},test_fraction=0.2,clients=4,batch=8,partition=iid,model=user_zoo:focus_mnist"
    proc = run_cli("run", "--algorithm", "fedavg", "--lr", "0.05", "--rounds", "2", "--problem", spec,
                   "--allow-model-import", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["problem"]["layout"] == "channels_last"
    proc = run_cli("run", "--algorithm", "fedavg", "--lr", "0.05", "--rounds", "1",
                   "--problem", f"nn:data={zoo / 'colour.npz'},test_fraction=0.2,clients=4,batch=8,partition=iid,"
                   "model=user_zoo:flattening_view,layout=channels_last", "--allow-model-import",
                   "--out", str(tmp_path / "refused"), env=env)
    assert_one_line_error(proc, 2, "the model runs with layout=nchw")
    assert not (tmp_path / "refused").exists()
