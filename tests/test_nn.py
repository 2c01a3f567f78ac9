"""Neural-network problems: per-client gradients, engines, models, metrics and the CLI.

The acceptance check of the issue is here: the vectorized engine and the one-client-at-a-time
reference loop give the same trajectory (to 1e-6 in float64) for the small CNN over 5 rounds.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.cli import main
from focusfl.data import Dataset, ImageData
from focusfl.engine import simulate
from focusfl.errors import ConfigError
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, execute
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.problems.models import MODELS, KeyedDropout, make_model
from focusfl.problems.nn import data as nn_data, formulation as nn_formulation
from focusfl.problems.nn import GroupedFormulation, NeuralNetwork, crop_flip

# Real MNIST digits committed with the tests (see tests/fixtures/README.md).
REAL_MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"


def toy_dataset(shape=(1, 12, 12), train=480, test=60, seed=0, classes=10) -> Dataset:
    """Random images whose label shifts the mean brightness of a class-specific patch."""
    rng = np.random.default_rng(seed)

    def split(count):
        labels = rng.integers(0, classes, count)
        images = rng.integers(0, 160, (count, *shape))
        for k in range(count):
            images[k, :, labels[k] % shape[1], :] += 90
        return ImageData(images.astype(np.uint8), labels)

    return Dataset("toy", split(train), split(test), classes)


TOY = toy_dataset()


def toy_problem(**params) -> NeuralNetwork:
    kwargs = {"clients": 8, "alpha": 0.5, "batch": 16, "model": "fedsum-mnist-cnn", "dtype": torch.float64, **params}
    return NeuralNetwork(dataset=kwargs.pop("dataset", TOY), **kwargs)


# -- engines: vectorized == reference ------------------------------------------------------------
ENGINE_CASES = [(name, "auto") for name in ALGORITHMS] + [("sg_focus", "vmap"), ("fedavg", "vmap")]


@pytest.mark.parametrize("algorithm,batching", ENGINE_CASES)
def test_vectorized_equals_reference_loop_for_the_small_cnn(algorithm, batching):
    runs = {}
    for engine in ("vectorized", "reference"):
        problem = toy_problem(client_batching=batching)
        participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        alg = make_algorithm(algorithm, lr=0.02, local_steps=3)
        runs[engine] = simulate(alg, problem, participation, 5, seed=7, engine=engine)
    vec, ref = runs["vectorized"], runs["reference"]
    assert vec.rounds_done == ref.rounds_done == 5
    assert problem.batched_sequential == (batching == "auto")
    for a, b in zip(vec.state.server, ref.state.server):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    for a, b in zip(vec.state.clients, ref.state.clients):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    moved = alg.model(vec.state) - problem.initial_point()
    assert float(moved.abs().max()) > 1e-3  # the runs did train
    # FedPBC's masked catch-up steps tell the oracle which rows take them: train_loss too is every
    # engine's (fedpbc.py).
    for row_v, row_r in zip(vec.rows, ref.rows):
        assert row_v.keys() == row_r.keys()
        for key in row_v:
            if row_v[key] is None or row_r[key] is None:  # approx refuses None (pytest 9)
                assert row_v[key] is row_r[key], key
            else:
                assert row_v[key] == pytest.approx(row_r[key], rel=1e-9, abs=1e-12)


def test_fedpbc_train_loss_is_each_engines_under_a_work_process():
    # With step counts too, train_loss counts the steps each client took (its catch-up included):
    # the engines agree row for row.
    from focusfl.work import make_work

    rows = {}
    for engine in ("vectorized", "reference"):
        problem = toy_problem()
        participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        work = make_work("uniform", problem.num_clients, 3, seed=2)
        rows[engine] = simulate(make_algorithm("fedpbc", lr=0.02, local_steps=3), problem, participation, 4, seed=7,
                                engine=engine, work=work).rows
    losses = {engine: [r.get("train_loss") for r in rows[engine]] for engine in rows}
    # Rows without a train loss (round 0's evaluation) hold None in both engines; approx only
    # compares numbers (pytest 9 refuses None), so the None rows are compared as they are.
    assert [loss is None for loss in losses["vectorized"]] == [loss is None for loss in losses["reference"]]
    assert [loss for loss in losses["vectorized"] if loss is not None] == pytest.approx(
        [loss for loss in losses["reference"] if loss is not None], rel=1e-12)
    assert any(loss is not None for loss in losses["vectorized"])
    assert rows["vectorized"][-1]["train_loss"] > 0


@pytest.mark.parametrize(
    "model", ["fedsum-mnist-cnn", "fedsum-cifar10-cnn", "fedsum-svhn-cnn", "focus-cnn", "mlp", "logreg"]
)
def test_grouped_weights_path_equals_vmap(model):
    dataset = toy_dataset(shape=(3, 16, 16), train=240) if "mnist" not in model else TOY
    fast = toy_problem(model=model, dataset=dataset)
    generic = toy_problem(model=model, dataset=dataset, client_batching="vmap")
    assert fast.batched_sequential and not generic.batched_sequential
    clients = torch.tensor([0, 3, 5])
    noise = torch.randn(3, fast.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    z = fast.initial_point() + 0.05 * noise
    a = fast.oracle(clients, seed=2, round=4)(z, 1)
    b = generic.oracle(clients, seed=2, round=4)(z, 1)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_sample_ids_read_the_clients_rows_as_the_padded_table_did():
    """Every client's rows are one array and N offsets; a position reads the client's own row,
    and a padding position (weight 0) a row of that client."""
    problem = toy_problem(partition="dirichlet", alpha=0.3, min_size=2)
    sizes = problem.sizes.tolist()
    assert len(set(sizes)) > 1
    starts = problem.client_starts.tolist()
    order = problem.client_order
    clients = torch.arange(problem.num_clients)
    positions = torch.arange(max(sizes) + 3).expand(len(clients), -1)
    ids = problem.sample_ids(clients, positions)
    for client, (start, size) in enumerate(zip(starts, sizes)):
        own = order[start : start + size]
        assert torch.equal(ids[client, :size], own)
        assert bool(torch.isin(ids[client, size:], own).all())
    assert sum(sizes) == order.numel() == len(torch.unique(order))  # each row owned once


def test_gradients_are_the_minibatch_gradients_of_the_module():
    problem = toy_problem(model="fedsum-cifar10-cnn", partition="iid", dataset=toy_dataset(shape=(3, 8, 8)))
    clients = torch.tensor([1, 6])
    sizes = problem.sizes.index_select(0, clients)
    picks, weights = problem.minibatch(3, 5, clients, 2, sizes)
    grads = problem.oracle(clients, seed=3, round=5)(problem.initial_point().expand(2, -1), 2)
    for row, client in enumerate(clients.tolist()):
        ids = problem.sample_ids(torch.tensor([client]), picks[row : row + 1])[0]
        model = make_model("fedsum-cifar10-cnn", problem.input_shape, 10).double()
        torch.nn.utils.vector_to_parameters(problem.initial_point(), model.parameters())
        F.cross_entropy(model(problem.inputs(problem.train_images[ids])), problem.train_labels[ids]).backward()
        expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert torch.allclose(grads[row], expected, atol=1e-12)
        assert weights[row].sum() == problem.batch


def test_small_clients_use_all_their_samples():
    problem = toy_problem(model="logreg", partition="iid", clients=8, batch=100)  # 60 samples each
    clients = torch.tensor([2])
    picks, weights = problem.minibatch(0, 0, clients, 0, problem.sizes[clients])
    assert int(weights.sum()) == 60
    assert sorted(picks[0][weights[0] > 0].tolist()) == list(range(60))
    x = problem.initial_point()
    minibatch = problem.oracle(clients, seed=0, round=0)(x[None], 0)[0]
    other_step = problem.oracle(clients, seed=0, round=9)(x[None], 3)[0]
    assert torch.allclose(minibatch, other_step, atol=1e-12)  # full client gradient every time


@pytest.mark.parametrize("augment", ["none", "crop-flip"])
def test_minibatches_drawn_together_are_the_ones_drawn_alone(augment, monkeypatch):
    """An oracle told the round's steps draws several steps' minibatches in one go (as many as
    DRAW_AHEAD_BYTES of samples): the gradients and losses are those of drawing each step
    alone, bit for bit, in blocks of any size, and a step past the hint is still served."""
    problem = toy_problem(augment=augment, partition="dirichlet", alpha=0.3, min_size=2)  # with dropout
    clients = torch.tensor([1, 6, 3])
    z = problem.initial_point() + 0.01 * torch.randn(3, problem.dim, generator=torch.Generator().manual_seed(4),
                                                     dtype=torch.float64)
    alone = []
    for step in range(5):
        oracle = problem.oracle(clients, seed=2, round=7)
        alone.append((oracle(z, step), oracle.calls[0][1]))
    draws = []
    original_draw = problem.grouped.draw
    monkeypatch.setattr(problem.grouped, "draw", lambda *a: draws.append(len(a[3])) or original_draw(*a))
    step_bytes = 3 * problem.batch * problem.train_images[0].nbytes
    for budget, blocks in ((nn_formulation.DRAW_AHEAD_BYTES, [4, 1]), (2 * step_bytes, [2, 2, 1])):
        monkeypatch.setattr(nn_formulation, "DRAW_AHEAD_BYTES", budget)
        draws.clear()
        oracle = problem.oracle(clients, seed=2, round=7, steps=4)
        for step, (gradients, losses) in enumerate(alone):
            assert torch.equal(oracle(z, step), gradients), (budget, step)
            assert torch.equal(oracle.calls[step][1], losses)
        assert draws == blocks
    # The draw of several steps is each step's draw.
    sizes = problem.sizes.index_select(0, clients)
    picks, weights = problem.minibatch(3, 5, clients, torch.tensor([0, 2]), sizes)
    for row, step in enumerate((0, 2)):
        alone_picks, alone_weights = problem.minibatch(3, 5, clients, step, sizes)
        assert torch.equal(picks[row], alone_picks) and torch.equal(weights[row], alone_weights)


def test_client_chunks_give_the_same_run():
    runs = []
    for chunk in (0, 2):
        problem = toy_problem(client_chunk=chunk)
        assert problem.client_chunk == (chunk or None)
        participation = make_participation("full", problem.num_clients)
        runs.append(simulate(make_algorithm("sg_focus", lr=0.02, local_steps=2), problem, participation, 2))
    assert torch.allclose(runs[0].state.server.x, runs[1].state.server.x, rtol=0, atol=1e-12)
    assert runs[0].rows[-1]["train_loss"] == pytest.approx(runs[1].rows[-1]["train_loss"], rel=1e-12)


def test_auto_formulation_is_a_rule_that_never_reads_the_clock(monkeypatch):
    """client_chunk/layout=auto follow the device type, the activations and the batch: the timer
    is never called, and the choice is the same in every process (issue 17: timing picked the
    formulation, so the same command gave SG-FOCUS 0.485 in one process and 0.721 in another)."""
    def no_clock(*args, **kwargs):
        raise AssertionError("auto must not time anything")

    monkeypatch.setattr(GroupedFormulation, "_time_gradients", no_clock)
    monkeypatch.setattr(GroupedFormulation, "_measure_formulations", no_clock)
    problem = toy_problem(batch=16)  # client_chunk and layout default to auto
    assert problem.describe()["client_chunk"] == "auto"  # nothing chosen at build
    # The MNIST CNN on 12x12 images keeps 4,300 activations a sample: 16 x 4,300 a client, so
    # 64 clients would fit the CPU budget of 2**23 elements, and the problem has 8: all at once.
    assert problem.grouped.activations_per_sample == 4_300
    assert problem.formulation() == (None, "channels_last")
    assert toy_problem(batch=2048).formulation() == (1, "channels_last")  # 8.8M a client: one at a time
    assert toy_problem(batch=256, clients=16).formulation() == (4, "channels_last")  # 1.1M a client
    assert toy_problem(model="mlp", clients=8).formulation() == (None, "channels_last")
    described = toy_problem(batch=256, clients=16)
    described.formulation()
    assert described.describe()["client_chunk"] == 4 and described.describe()["layout"] == "channels_last"


def test_measured_formulation_is_an_opt_in_measured_once_reported_and_replayed(monkeypatch):
    measured = []
    real = GroupedFormulation._measure_formulations
    monkeypatch.setattr(nn_formulation, "_FORMULATIONS", {})
    monkeypatch.setattr(GroupedFormulation, "_measure_formulations",
                        lambda self, *a: measured.append(1) or real(self, *a))
    problem = toy_problem(batch=16, client_chunk="measure", layout="measure")
    assert problem.describe()["client_chunk"] == "measure" and not measured  # nothing measured at build
    chunk, layout = problem.formulation()
    assert chunk is None or 1 <= chunk < problem.num_clients
    assert layout in ("channels_last", "nchw") and problem.client_chunk == chunk
    described = problem.describe()
    assert described["client_chunk"] == (chunk or 0) and described["layout"] == layout
    assert toy_problem(batch=16, client_chunk="measure", layout="measure").formulation() == (chunk, layout)
    assert len(measured) == 1  # cached
    pinned = {k: v for k, v in described.items() if k not in ("name", "data")}
    assert toy_problem(**pinned).formulation() == (chunk, layout) and len(measured) == 1
    assert toy_problem(batch=16, client_chunk=3).client_chunk == 3
    # measure one part, the rule the other
    assert toy_problem(batch=16, client_chunk=2, layout="measure").formulation()[0] == 2
    assert toy_problem(batch=16, client_chunk="measure").formulation()[1] == "channels_last"
    with pytest.raises(ConfigError, match="client_chunk must be auto, measure or an integer"):
        toy_problem(client_chunk="big")
    with pytest.raises(ConfigError, match="layout must be auto, measure, channels_last or nchw"):
        toy_problem(layout="nhwc")


@pytest.mark.parametrize("chunk,layout", [(1, "channels_last"), (3, "nchw"), (0, "channels_last"), (0, "nchw")])
def test_every_formulation_gives_the_same_run(chunk, layout):
    problem = toy_problem(client_chunk=chunk, layout=layout, model="fedsum-mnist-cnn")
    generic = toy_problem(client_batching="vmap")
    participation = make_participation("bernoulli:p=0.6", problem.num_clients, seed=3)
    algorithm = make_algorithm("sg_focus", lr=0.02, local_steps=2)
    a = simulate(algorithm, problem, participation, 3, seed=1)
    b = simulate(algorithm, generic, participation, 3, seed=1, engine="reference")
    assert problem.formulation() == (chunk or None, layout)
    assert torch.allclose(a.state.server.x, b.state.server.x, rtol=0, atol=1e-12)
    assert a.rows[-1]["test_loss"] == pytest.approx(b.rows[-1]["test_loss"], rel=1e-12)


def test_empty_round_gives_no_gradients():
    problem = toy_problem()
    z = torch.zeros(0, problem.dim, dtype=torch.float64)
    out = problem.oracle(torch.zeros(0, dtype=torch.int64), seed=0, round=0)(z, 0)
    assert out.shape == (0, problem.dim)


# -- objective, metrics ----------------------------------------------------------------------------
def test_loss_and_gradient_agree():
    problem = toy_problem(model="logreg")  # smooth: no ReLU kinks for the finite difference
    x = problem.initial_point()
    direction = torch.randn(problem.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    h = 1e-5
    numeric = (problem.loss(x + h * direction) - problem.loss(x - h * direction)) / (2 * h)
    assert float(problem.gradient(x) @ direction) == pytest.approx(float(numeric), rel=1e-5)


def test_metrics_rows_have_test_columns_and_participant_loss():
    problem = toy_problem()
    participation = make_participation("full", problem.num_clients)
    result = simulate(make_algorithm("sg_focus", lr=0.01, local_steps=2), problem, participation, 4, eval_every=2)
    first, later = result.rows[0], result.rows[1:]
    assert {"test_accuracy", "test_loss"} <= first.keys() and "train_loss" not in first
    for row in later:
        assert 0 <= row["test_accuracy"] <= 1 and row["test_loss"] > 0 and row["train_loss"] > 0
    x = result.state.server.x
    loss, accuracy = problem.evaluate(x, problem.test_images, problem.test_labels)
    assert (loss, accuracy) == (result.rows[-1]["test_loss"], result.rows[-1]["test_accuracy"])


def test_evaluation_equals_the_plain_module_in_nchw():
    # Evaluation runs in inference mode, channels-last where measured fastest, at eval_batch=auto,
    # on a test set standardised once: the numbers are the plain module's, to float rounding.
    dataset = toy_dataset(shape=(3, 16, 16), test=300)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        problem = toy_problem(model="focus-cnn", dataset=dataset, dtype=dtype, layout="channels_last")
        x = problem.initial_point() + 0.05 * torch.randn(problem.dim, generator=torch.Generator().manual_seed(2)).to(dtype)
        model = make_model("focus-cnn", problem.input_shape, 10).to(dtype).eval()
        torch.nn.utils.vector_to_parameters(x, model.parameters())
        with torch.no_grad():
            logits = model(problem.inputs(problem.test_images))
        expected_loss = float(F.cross_entropy(logits.double(), problem.test_labels))
        expected_accuracy = float((logits.argmax(1) == problem.test_labels).double().mean())
        for _ in range(2):  # the second evaluation reuses the standardised test set
            row = problem.metrics(x)
            assert row["test_loss"] == pytest.approx(expected_loss, rel=tolerance)
            assert row["test_accuracy"] == pytest.approx(expected_accuracy, abs=1.5 / 300)
        assert problem.test_inputs().is_contiguous(memory_format=torch.channels_last)
        assert problem.eval_batch == 256  # auto, on a CPU


def test_augmentation_is_the_papers_crop_and_flip():
    images = torch.arange(2 * 3 * 5 * 6, dtype=torch.uint8).view(2, 3, 5, 6)
    # A hash gives top = bits % 9, left = (bits // 9) % 9 and the flip in its highest bit.
    flipped = next(v for v in range(1 << 31, (1 << 31) + 200) if v % 9 == 8 and v // 9 % 9 == 0)
    bits = torch.tensor([2 + 9 * 7, flipped])  # (top 2, left 7, no flip), (top 8, left 0, flip)
    out = crop_flip(images, bits, padding=4)
    padded = F.pad(images, (4, 4, 4, 4))
    assert torch.equal(out[0], padded[0, :, 2:7, 7:13])
    assert torch.equal(out[1], padded[1, :, 8:13, 0:6].flip(-1))


@pytest.mark.parametrize("table_bytes", [nn_data.CROP_TABLE_BYTES, 0], ids=["value-table", "pixel-sources"])
def test_augmentation_equals_padding_then_cropping_every_offset_and_flip(table_bytes, monkeypatch, request):
    """The one-gather crop against its definition (pad with zeros, take the window, flip), for
    every offset and both flips, images smaller than the padding included, float images too;
    from the table of every value's source and, for larger images, from each pixel's."""
    monkeypatch.setattr(nn_data, "CROP_TABLE_BYTES", table_bytes)
    nn_data._crop_value_tables.cache_clear()  # tables made under the limit set here only
    request.addfinalizer(nn_data._crop_value_tables.cache_clear)
    span = 9
    offsets = torch.arange(span * span)
    bits = torch.cat([offsets, offsets + (1 << 31)])  # top = k % 9, left = k // 9, then flipped
    for shape, dtype in (((3, 5, 6), torch.uint8), ((1, 3, 2), torch.uint8), ((2, 4, 4), torch.float64)):
        images = (torch.arange(len(bits) * math.prod(shape)) % 251 + 1).to(dtype).view(len(bits), *shape)
        out = crop_flip(images, bits, padding=4)
        padded = F.pad(images, (4, 4, 4, 4))
        for k, value in enumerate(bits.tolist()):
            top, left, flip = value % span, value // span % span, value >> 31
            window = padded[k, :, top:top + shape[1], left:left + shape[2]]
            assert torch.equal(out[k], window.flip(-1) if flip else window), (shape, k)
    leading = crop_flip(images.view(2, len(bits) // 2, *shape), bits.view(2, -1), padding=4)
    assert torch.equal(leading.view_as(out), out)
    # Laid out channels-last for the convolutions: the same values, each image's pixels in HWC order.
    hwc = crop_flip(images.view(2, len(bits) // 2, *shape), bits.view(2, -1), padding=4, channels_last=True)
    assert torch.equal(hwc, leading)
    assert hwc.permute(0, 1, 3, 4, 2).is_contiguous()


def test_channels_last_images_standardise_to_the_same_numbers_laid_out_channels_last():
    """The convolutions' layout is chosen before standardising (a copy of bytes, not of
    floats); the tiled scale and shift give the NCHW path's numbers, float32 and float64."""
    for dtype in (torch.float32, torch.float64):
        problem = toy_problem(dataset=toy_dataset(shape=(3, 12, 12)), model="focus-cnn", dtype=dtype)
        images = problem.train_images[:20].view(2, 10, 3, 12, 12)
        hwc = images.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
        plain, laid_out = problem.inputs(images), problem.inputs(hwc)
        assert torch.equal(plain, laid_out) and laid_out.dtype == dtype
        assert laid_out.permute(0, 1, 3, 4, 2).is_contiguous()


def test_augmentation_is_keyed_by_seed_round_client_and_step():
    # Clients smaller than the batch use all their samples at every step: without augmentation
    # their gradients repeat, with it every (seed, round, client, step) has its own crops.
    dataset = toy_dataset(shape=(3, 12, 12))
    plain = toy_problem(dataset=dataset, model="logreg", partition="iid", batch=100)  # 60 samples each
    augmented = toy_problem(dataset=dataset, model="logreg", partition="iid", batch=100, augment="crop-flip")
    x = augmented.initial_point()[None] + 0.1
    together = torch.tensor([1, 2, 5])

    def gradient(problem, clients, seed, round_, step):
        return problem.oracle(clients, seed=seed, round=round_)(x.expand(len(clients), -1), step)

    assert torch.allclose(gradient(plain, together[:1], 0, 0, 0), gradient(plain, together[:1], 3, 4, 1), atol=1e-12)
    base = gradient(augmented, together, 0, 0, 0)
    for seed, round_, step in ((1, 0, 0), (0, 1, 0), (0, 0, 1)):
        assert not torch.allclose(base[0], gradient(augmented, together, seed, round_, step)[0])
    assert not torch.allclose(base[0], base[1])  # clients draw differently
    alone = gradient(augmented, together[1:2], 0, 0, 0)[0]  # the same draw whoever else is batched
    assert torch.allclose(alone, base[1], rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="augment must be none or crop-flip"):
        toy_problem(augment="mixup")


@pytest.mark.parametrize("algorithm", ["sg_focus", "fedavg", "scaffold"])
def test_augmented_vectorized_run_equals_the_reference_loop(algorithm):
    runs = {}
    for engine in ("vectorized", "reference"):
        problem = toy_problem(dataset=toy_dataset(shape=(3, 16, 16)), model="focus-cnn", augment="crop-flip")
        participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        runs[engine] = simulate(make_algorithm(algorithm, lr=0.02, local_steps=3), problem, participation, 4,
                                seed=7, engine=engine)
    for a, b in zip(runs["vectorized"].state, runs["reference"].state):
        for u, v in zip(a, b):
            assert torch.allclose(u, v, rtol=0, atol=1e-9)


def test_library_default_dtype_is_float32_for_neural_networks(toy_npz):
    assert make_problem(f"nn:data={toy_npz},test_fraction=0.2,clients=4,batch=8,model=logreg").dtype == torch.float32
    assert make_problem("ridge:dim=5,clients=2,samples=10").dtype == torch.float64


def test_held_out_split_and_its_errors():
    pooled = Dataset("pool", TOY.train, None, 10)
    problem = toy_problem(dataset=pooled, test_fraction=0.25, model="logreg")
    assert len(problem.test_labels) == 120 and len(problem.train_labels) == 360
    assert int(problem.sizes.sum()) == 360
    with pytest.raises(ConfigError, match="no test split"):
        toy_problem(dataset=pooled, model="logreg")
    with pytest.raises(ConfigError, match="test_fraction"):
        toy_problem(test_fraction=1.0)


def test_label_histograms_match_the_partition():
    problem = toy_problem(alpha=0.1)
    hist = problem.label_histograms()
    assert hist.shape == (8, 10) and hist.sum() == 480
    assert np.array_equal(hist.sum(1), problem.sizes.numpy())


# -- models --------------------------------------------------------------------------------------
def test_papers_models_have_the_papers_shapes():
    focus = make_model("focus-cnn", (3, 32, 32), 10)
    assert [m.in_features for m in focus if isinstance(m, nn.Linear)] == [1024, 500]
    assert [m.out_channels for m in focus if isinstance(m, nn.Conv2d)] == [16, 32, 64]
    mnist = make_model("fedsum-mnist-cnn", (1, 28, 28), 10)
    assert [m.in_features for m in mnist if isinstance(m, nn.Linear)] == [980, 50]
    assert [m.p for m in mnist if isinstance(m, KeyedDropout)] == [0.2, 0.2]
    svhn = make_model("fedsum-svhn-cnn", (3, 32, 32), 10)
    assert [m.out_features for m in svhn if isinstance(m, nn.Linear)] == [128, 10]
    cifar = make_model("fedsum-cifar10-cnn", (3, 32, 32), 10)
    assert [m.out_features for m in cifar if isinstance(m, nn.Linear)] == [256, 64, 10]
    assert set(MODELS) >= {"mlp", "logreg", "resnet18-gn"}


def test_resnet18_with_group_norm_trains_per_client():
    problem = toy_problem(model="resnet18-gn", dataset=toy_dataset(shape=(3, 8, 8), train=64, test=8),
                          clients=2, batch=2, dtype=torch.float32, alpha=100.0)
    assert not problem.batched_sequential  # not a Sequential: the generic vmap path
    assert 11_000_000 < problem.dim < 11_300_000
    x = problem.initial_point()
    both = problem.oracle(torch.tensor([0, 1]), seed=0, round=0)(x.expand(2, -1), 0)
    one = problem.oracle(torch.tensor([1]), seed=0, round=0)(x[None], 0)
    assert torch.isfinite(both).all()
    assert torch.allclose(both[1], one[0], atol=1e-5)


def test_keyed_dropout_rate_and_keys():
    layer = KeyedDropout(0.3, stream=0).double()
    x = torch.ones(200, 50, dtype=torch.float64)
    layer.key = torch.tensor(11)
    a = layer(x)
    assert set(torch.unique(a).tolist()) == {0.0, 1 / 0.7}
    assert (a == 0).double().mean().item() == pytest.approx(0.3, abs=0.02)
    layer.key = torch.tensor(12)
    assert not torch.equal(layer(x), a)
    layer.key = torch.tensor(11)
    assert torch.equal(layer(x), a)
    assert torch.equal(layer.eval()(x), x)


class Residual(nn.Module):
    """Not a Sequential: exercises the vmap path, and nn.Dropout is swapped for KeyedDropout."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(144, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Dropout(0.1))
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.inp(x.flatten(1)))
        return self.out(h + self.block(h))


def test_any_module_through_the_python_api():
    runs = {}
    for engine in ("vectorized", "reference"):
        torch.manual_seed(0)  # a user's module keeps its own initialisation
        problem = toy_problem(module=Residual())
        participation = make_participation("uniform:m=3", problem.num_clients, seed=0)
        algorithm = make_algorithm("sg_focus", lr=0.01, local_steps=2)
        runs[engine] = simulate(algorithm, problem, participation, 3, engine=engine)
    assert isinstance(problem.grouped.train_model.block[2], KeyedDropout)
    assert problem.describe()["model"] == "custom:Residual"
    assert torch.allclose(runs["vectorized"].state.server.x, runs["reference"].state.server.x, atol=1e-9)


def test_batch_norm_without_running_statistics_is_accepted():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, track_running_stats=False), nn.ReLU(),
                        nn.Flatten(), nn.Linear(400, 10))
    problem = toy_problem(module=net)
    assert not problem.batched_sequential
    grads = problem.oracle(torch.tensor([0, 2]), seed=0, round=0)(problem.initial_point().expand(2, -1), 0)
    assert torch.isfinite(grads).all()


def test_unsupported_models_fail_in_one_line():
    with pytest.raises(ConfigError, match="GroupNorm"):
        toy_problem(module=nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10)))
    with pytest.raises(ConfigError, match="Dropout2d"):
        toy_problem(module=nn.Sequential(nn.Dropout2d(0.1), nn.Flatten(), nn.Linear(144, 10)))
    with pytest.raises(ConfigError, match=r"expected \(10,\)"):
        toy_problem(module=nn.Sequential(nn.Flatten(), nn.Linear(144, 7)))
    with pytest.raises(ConfigError, match="cannot train on inputs"):
        toy_problem(module=nn.Sequential(nn.Flatten(), nn.Linear(100, 10)))
    with pytest.raises(ConfigError, match="unknown model"):
        toy_problem(model="vgg")


def test_model_factory_from_a_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from torch import nn
        def tiny(input_shape, num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[1] * input_shape[2], num_classes))
        def not_a_model():
            return 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = toy_problem(model="my_models:tiny", allow_model_import=True)
    assert problem.dim == 144 * 10 + 10 and problem.batched_sequential
    with pytest.raises(ConfigError, match="not a torch.nn.Module"):
        toy_problem(model="my_models:not_a_model", allow_model_import=True)
    with pytest.raises(ConfigError, match="cannot import"):
        toy_problem(model="my_models:missing", allow_model_import=True)
    sys.modules.pop("my_models", None)


# -- specs, runner and CLI -----------------------------------------------------------------------
@pytest.fixture
def toy_npz(tmp_path):
    path = tmp_path / "toy.npz"
    np.savez(path, images=TOY.train.images[:, 0], labels=TOY.train.labels)
    return path


def test_problem_spec_and_label_participation_through_the_runner(toy_npz):
    spec = f"nn:data={toy_npz},test_fraction=0.2,clients=6,batch=8,model=logreg,alpha=0.3"
    built = build(RunConfig(algorithm="sg_focus", problem=spec, participation="label", rounds=3, lr=0.01,
                            dtype="float32"))
    assert built.problem.dtype == torch.float32 and built.problem.num_clients == 6
    p = built.participation.nominal_p()
    hist = built.problem.label_histograms()
    expected = hist / hist.sum(1, keepdims=True) @ built.participation.phi
    assert np.allclose(p, np.clip(expected, 0.02, 1.0))
    rows = execute(built).rows
    assert rows[-1]["round"] == 3 and "test_accuracy" in rows[-1]
    assert make_problem(built.problem.describe(), dtype=torch.float32).describe() == built.problem.describe()


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_cli_run_writes_test_columns_in_float32(toy_npz, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--algorithm", "sg_focus", "--problem", "nn:data=toy.npz,test_fraction=0.2,clients=4,batch=8",
                 "--data-dir", str(toy_npz.parent), "--participation", "bernoulli", "--rounds", "4",
                 "--eval-every", "2", "--lr", "0.01", "--schedule", "sqrt", "--out", str(out)])
    assert code == 0
    rows = read_rows(out / "metrics.csv")
    assert [r["round"] for r in rows] == ["0", "2", "4"]
    assert {"test_accuracy", "test_loss", "train_loss"} <= rows[-1].keys() and rows[0]["train_loss"] == ""
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and config["problem"]["data_dir"] == str(toy_npz.parent)
    assert config["problem"]["model"] == "fedsum-mnist-cnn" and (out / "curve.png").stat().st_size > 5000
    assert (out / "partition.png").is_file()


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["run", "--algorithm", "sg_focus", "--problem", "nn:data=mnist", "--data-dir", str(tmp_path),
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("focusfl: error: mnist not found: put train-images-idx3-ubyte.gz") and "\n" not in err
    assert not (tmp_path / "x").exists()
    assert main(["run", "--algorithm", "sg_focus", "--problem", "ridge", "--data-dir", str(tmp_path)]) == 2
    assert "apply to neural-network problems" in capsys.readouterr().err


def test_cli_divergence_keeps_what_was_written(toy_npz, tmp_path, capsys):
    out = tmp_path / "boom"
    problem = f"nn:data={toy_npz},test_fraction=0.2,clients=4,batch=8,model=mlp"
    code = main(["run", "--algorithm", "fedavg", "--problem", problem,
                 "--rounds", "30", "--eval-every", "1", "--lr", "1e6", "--out", str(out)])
    assert code == 1
    assert "diverged" in capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    rows = read_rows(out / "metrics.csv")
    assert config["diverged_at_round"] == int(rows[-1]["round"]) < 30


def test_real_mnist_trains():
    problem = NeuralNetwork(data=str(REAL_MNIST), test_fraction=0.2, clients=16, alpha=0.3, batch=32, model="logreg")
    participation = make_participation("bernoulli", 16, seed=0)
    result = simulate(make_algorithm("sg_focus", lr=0.02, local_steps=2), problem, participation, 40, eval_every=40)
    assert result.rows[0]["test_accuracy"] < 0.3
    assert result.rows[-1]["test_accuracy"] > 0.8
    assert math.isfinite(result.rows[-1]["train_loss"])


# -- presets -------------------------------------------------------------------------------------
def test_mnist_demo_tunes_its_steps_on_validation_and_runs_seeds(tmp_path):
    # As a user types it, at toy sizes: steps chosen per algorithm on the clients' validation
    # share, the final runs over two seeds (two workers), tables and figures; the same command
    # again reuses every run and writes the same tables.
    from cli_harness import run_cli, run_main

    out = tmp_path / "demo"
    command = ["reproduce", "mnist-demo", "--data", str(REAL_MNIST), "--rounds", "2", "--eval-every", "1",
               "--tune-rounds", "2", "--tune-eval-every", "1", "--algorithms", "sg_focus,fedavg", "--workers", "2",
               "--out", str(out)]
    proc = run_cli(*command)
    assert proc.returncode == 0, proc.stderr
    assert "final acc" in proc.stdout and "steps chosen on the clients' validation share" in proc.stdout
    summary = read_rows(out / "summary.csv")
    assert [row["algorithm"] for row in summary] == ["sg_focus", "fedavg"]
    assert all(row["steps"] == "tuned" and row["seeds"] == "2" and row["status"] == "complete" for row in summary)
    steps = read_rows(out / "steps.csv")
    grid = {row["algorithm"]: row["grid"].split(";") for row in steps}
    assert all(len(points) >= 4 for points in grid.values())  # the preset's step x 1/9, 1/3, 1, 3, and its extension
    assert all(row["reason"] and (row["lower_lr"] or row["upper_lr"]) for row in steps)  # neighbours and reason
    assert {row["algorithm"]: float(row["lr"]) for row in steps} == {r["algorithm"]: float(r["lr"]) for r in summary}
    # Named as docs/neural-networks.md says: <scenario> is the participation spec.
    for name in ("figure_bernoulli.png", "figure_bernoulli.pdf", "partition.png", "steps.csv",
                 "tuning-bernoulli/grid.csv", "runs-bernoulli/experiment.toml"):
        assert (out / name).is_file()
    # table.md (the table docs/neural-networks.md shows) is made from the two CSVs as written.
    from focusfl.reproduce.reproduce_nn import MNIST_DEMO, docs_table

    assert (out / "table.md").read_text() == docs_table(summary, steps, MNIST_DEMO.scenarios)
    first = (out / "summary.csv").read_bytes()
    again = run_main(*command)  # in this process: what is checked is the reuse
    assert again.returncode == 0 and "16 runs; 16 finished earlier" in again.stdout
    assert (out / "summary.csv").read_bytes() == first


def test_a_diverged_run_is_named_as_diverged_never_as_an_accuracy():
    from focusfl.reproduce import reproduce_nn

    good = [{"round": 0.0, "test_accuracy": 0.1, "test_loss": 2.3}, {"round": 50.0, "test_accuracy": 0.9, "test_loss": 0.3}]
    bad = [{"round": 0.0, "test_accuracy": 0.1, "test_loss": 2.3}, {"round": 50.0, "test_accuracy": 0.6, "test_loss": 1.0},
           {"round": 100.0, "test_accuracy": math.nan, "test_loss": math.nan, "diverged": "True"}]
    row = reproduce_nn.summary_row("scaffold", "bernoulli", [(bad, 100)], 0.02, "fixed")
    assert row["status"] == "diverged at round 100" and row["final_test_accuracy"] is None
    assert row["best_test_accuracy"] == 0.6
    table = reproduce_nn.format_table([row])
    assert "diverged at round 100" in table and "nan" not in table
    both = reproduce_nn.summary_row("scaffold", "bernoulli", [(good, None), (bad, 100)], 0.02, "tuned")
    assert both["status"] == "1 of 2 seeds diverged (first at round 100)" and both["final_test_accuracy"] is None


def write_cifar10(folder: Path, per_batch: int = 64) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, per_batch).tolist()}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle, protocol=2)


def test_paper_preset_runs_every_scenario_on_local_files(tmp_path):
    from focusfl.reproduce import reproduce_nn

    write_cifar10(tmp_path / "cifar10" / "cifar-10-batches-py")
    paper = reproduce_nn.FOCUS_CIFAR10
    assert paper.problem["alpha"] == 0.05 and paper.rounds == 10_000
    assert {a: p["lr"] for a, p in paper.algorithms.items()} == dict.fromkeys(paper.algorithms, 2e-3)
    # The paper's alpha = 0.05 cannot give 32 clients 10 samples each out of 320 images.
    setup = dataclasses.replace(paper, problem={**paper.problem, "alpha": 1.0, "min_size": 2, "batch": 8},
                                rounds=2, eval_every=1)
    args = reproduce_nn.PresetOptions(out=str(tmp_path / "out"), run=RunConfig(dtype="float32", rounds=2, eval_every=1),
                                      data_dir=str(tmp_path), steps="fixed", seeds=1, workers=1)
    spec = reproduce_nn.problem_spec(setup, args)
    summary, steps = reproduce_nn.run_preset(setup, spec, ["sg_focus", "mifa"], args, tmp_path / "out")
    assert [row["scenario"] for row in steps] == [s for s in paper.scenarios for _ in range(2)] and len(summary) == 4
    assert all(row["rounds"] == 2 and 0 <= row["final_test_accuracy"] <= 1 and row["lr"] == 2e-3 for row in summary)
    config = json.loads(next((tmp_path / "out" / "runs-markov" / "runs").glob("*/config.json")).read_text())
    assert config["problem"]["model"] == "focus-cnn" and config["problem"]["clients"] == 32


def test_presets_skip_unregistered_algorithms(monkeypatch):
    from focusfl.reproduce import reproduce_nn

    # A build without mifa, seen by reproduce_nn alone: the registry itself is never touched (a
    # delitem restored by monkeypatch would put mifa back at the end and reorder every listing).
    registry = {name: cls for name, cls in reproduce_nn.ALGORITHMS.items() if name != "mifa"}
    monkeypatch.setattr(reproduce_nn, "ALGORITHMS", registry)
    runnable, notes = reproduce_nn.available(reproduce_nn.FOCUS_CIFAR10, None)
    assert "mifa" not in runnable and "sg_focus" in runnable
    assert notes == ["note: mifa is not registered in this build of focusfl; skipped"]
    with pytest.raises(ConfigError, match="not part of this preset"):
        reproduce_nn.available(reproduce_nn.FOCUS_CIFAR10, ["fedsum"])


def test_sg_focus_is_the_authors_client_server_loop_in_float64(monkeypatch):
    """focusfl's SG-FOCUS against a re-creation of the FOCUS authors' FedASLClient/FedASLServer
    loop: the same masks, float64, full-batch gradients, a small CNN; equal to 1e-10."""
    from focusfl.reproduce.authors_loop import compare, comparison_config

    fixture = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
    # 3 rounds: more participations than clients, so some client comes back with its memory (grad_prev).
    result = compare(comparison_config(str(fixture), clients=4, rounds=3, local_steps=3))
    assert result.participants > 4 and result.rounds == 3
    assert result.max_relative_gap < 1e-10
    # The check can fail: an authors' loop that forgets grad_prev (plain local SGD sums) differs.
    from focusfl.reproduce import authors_loop

    step = authors_loop.AuthorsServer.train_one_step
    monkeypatch.setattr(authors_loop.AuthorsServer, "train_one_step",
                        lambda self, lr, tau, active: step(self, lr * 1.01, tau, active))
    changed = compare(comparison_config(str(fixture), clients=4, rounds=2, local_steps=3))  # shows in 2 rounds
    assert changed.max_relative_gap > 1e-4


def test_focus_cifar10_runs_the_authors_participation_forms_and_prints_their_accuracies(tmp_path, capsys):
    from focusfl.reproduce import reproduce_nn

    # Their "markov" chain has equal rows: i.i.d. Bernoulli(0.2); a chain with memory is not reduced.
    assert reproduce_nn.authors_markov_rate() == 0.2 and reproduce_nn.authors_markov_rate(((0.9, 0.1), (0.2, 0.8))) is None
    rates = reproduce_nn.authors_bernoulli_rates(32)
    assert len(rates) == 32 and all(0.1 <= p <= 0.3 for p in rates[:28]) and all(0.1 <= p <= 0.9 for p in rates[28:])
    assert rates == reproduce_nn.authors_bernoulli_rates(32)  # seeded as their main.py: the same on every machine
    write_cifar10(tmp_path / "cifar10" / "cifar-10-batches-py")
    paper = reproduce_nn.FOCUS_CIFAR10
    setup = dataclasses.replace(paper, problem={**paper.problem, "alpha": 1.0, "min_size": 2, "batch": 8},
                                algorithms={k: paper.algorithms[k] for k in ("sg_focus", "fedau")}, rounds=2,
                                eval_every=1)
    chosen = reproduce_nn.cifar_setup(setup, "authors")
    specs = list(chosen.scenarios.values())
    assert specs[1] == "bernoulli:p=0.2" and specs[0].startswith("bernoulli:p=") and len(specs[0].split(";")) == 32
    args = reproduce_nn.CifarPresetOptions(out=str(tmp_path / "out"), run=RunConfig(dtype="float32", rounds=2,
                                                                                    eval_every=1),
                                           data_dir=str(tmp_path), steps="fixed", seeds=1, workers=1,
                                           participation_form="authors")
    assert reproduce_nn.make_cifar_runner(setup)(args) == 0
    out = capsys.readouterr().out
    assert "source: BichengYing/FedASL, figures/logs/" in out
    assert "the authors' bern (their p_i, seed 66): sg_focus published 0.7783 (10,000 rounds), ours " in out
    assert "fedau published 0.7605 (10,000 rounds), ours " in out and "scaffold published 0.4853" in out
    assert "ours not run" in out  # scaffold was not asked here
    summary = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert {row["participation"] for row in summary} == set(specs) and len(summary) == 4
    with pytest.raises(ConfigError, match="--participation-form"):
        reproduce_nn.cifar_setup(setup, "mine")


def test_focus_cifar10_refuses_an_unknown_participation_form_as_a_user_types_it(tmp_path):
    from cli_harness import run_cli

    proc = run_cli("reproduce", "focus-cifar10", "--participation-form", "theirs", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "participation-form" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "authors" in proc.stderr
    assert not (tmp_path / "out").exists()
