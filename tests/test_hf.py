"""Hugging Face datasets and text models behind the nn problem (problems/hf.py, data/hf.py).

Everything is built here, nothing downloaded: a tiny random BERT (hidden 16, 2 layers, 2 heads)
saved as safetensors, a WordPiece tokenizer with a 45-token vocabulary, and a 200-row text
dataset saved with save_to_disk (tests/hf_fixtures.py). The acceptance runs go through the
``focusfl`` console script in both engines and compare in float64.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")
pytest.importorskip("transformers")

from cli_harness import assert_one_line_error, cli_env, run_cli, run_cli_together  # noqa: E402
from hf_fixtures import text_dataset, tiny_bert, tokenizer_folder  # noqa: E402

from focusfl.algorithms import make_algorithm  # noqa: E402
from focusfl.engine import simulate  # noqa: E402
from focusfl.errors import ConfigError, DataError  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402
from focusfl.problems.hf import HuggingFaceNetwork  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Folders of the tiny BERT, its tokenizer and the text dataset (made once per module)."""
    root = tmp_path_factory.mktemp("hf")
    tokenizer_folder(root / "tok")
    tiny_bert(root / "bert")
    text_dataset(root / "sst")
    return root


def text_spec(root: Path, **extra) -> str:
    params = {"data": f"hf:{root / 'sst'}", "input": "sentence", "tokenizer": str(root / "tok"),
              "model": f"hf:{root / 'bert'}", "clients": 6, "batch": 8, "alpha": 0.5, "min_size": 5, **extra}
    return "nn:" + ",".join(f"{k}={v}" for k, v in params.items())


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


ENGINES = ("vectorized", "reference")


def run_args(out: Path, algorithm: str, problem: str, engine: str, lr: float = 0.05) -> tuple[str, ...]:
    return ("run", "--algorithm", algorithm, "--problem", problem, "--participation", "bernoulli:p=0.5",
            "--rounds", "3", "--local-steps", "2", "--lr", str(lr), "--dtype", "float64",
            "--eval-every", "1", "--engine", engine, "--out", str(out))


def both_engines(folder: Path, algorithm: str, problem: str, lr: float = 0.05):
    """``focusfl run`` in the vectorized and the reference engine (side by side), into folder/ENGINE."""
    return run_cli_together([run_args(folder / engine, algorithm, problem, engine, lr) for engine in ENGINES],
                            limit_gib=None)



def assert_same_runs(a: Path, b: Path) -> None:
    rows_a, rows_b = read_rows(a / "metrics.csv"), read_rows(b / "metrics.csv")
    assert len(rows_a) == len(rows_b) == 4
    for row_a, row_b in zip(rows_a, rows_b):
        for key in ("test_loss", "test_accuracy", "train_loss"):
            if row_a[key] or row_b[key]:
                assert abs(float(row_a[key]) - float(row_b[key])) < 1e-9, (key, row_a, row_b)
    model_a = torch.load(a / "model.pt", weights_only=True)
    model_b = torch.load(b / "model.pt", weights_only=True)
    tensors_a = model_a if isinstance(model_a, torch.Tensor) else model_a["x"]
    tensors_b = model_b if isinstance(model_b, torch.Tensor) else model_b["x"]
    assert torch.allclose(tensors_a, tensors_b, rtol=0, atol=1e-9)


# -- acceptance: the tiny BERT in both engines, through the console script ----------------------------
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedsum", "fedavg", "sg_focus"])
def test_tiny_bert_trains_the_same_in_both_engines(files, tmp_path, algorithm):
    problem = text_spec(files)
    lr = 0.005 if algorithm == "sg_focus" else 0.05  # SG-FOCUS steps on the sum of N gradients
    for proc in both_engines(tmp_path, algorithm, problem, lr):
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "Loading weights" not in proc.stderr
    assert_same_runs(tmp_path / "vectorized", tmp_path / "reference")
    rows = read_rows(tmp_path / "vectorized" / "metrics.csv")
    assert float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"])  # it trains
    config = json.loads((tmp_path / "vectorized" / "config.json").read_text())
    assert config["problem"]["data"] == f"hf:{files / 'sst'}" and config["problem"]["tokenizer"] == str(files / "tok")


@pytest.mark.slow
def test_natural_id_partition_through_the_console_script(files, tmp_path):
    problem = text_spec(files, partition="natural", id_column="writer")
    for proc in both_engines(tmp_path, "fedsum", problem):
        assert proc.returncode == 0, proc.stderr
    assert_same_runs(tmp_path / "vectorized", tmp_path / "reference")


def engine_runs(problem_factory, algorithm: str, lr: float, rounds: int = 3):
    runs = {}
    for engine in ("vectorized", "reference"):
        problem = problem_factory()
        participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        runs[engine] = simulate(make_algorithm(algorithm, lr=lr, local_steps=2), problem, participation, rounds,
                                seed=3, engine=engine)
    return runs["vectorized"], runs["reference"]


@pytest.mark.parametrize("algorithm,lr", [("fedsum", 0.05), ("fedavg", 0.05), ("sg_focus", 0.005)])
def test_natural_id_partition_trains_the_same_in_both_engines(files, algorithm, lr):
    spec = text_spec(files, partition="natural", id_column="writer")
    vec, ref = engine_runs(lambda: make_problem(spec, dtype=torch.float64), algorithm, lr)
    for a, b in zip(vec.state.server, ref.state.server):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)


# -- partitions -------------------------------------------------------------------------------------
def test_natural_id_clients_are_the_writers(files):
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    problem = make_problem(text_spec(files, partition="natural", id_column="writer", clients=12, model="text-mean"))
    train = datasets.load_from_disk(str(files / "sst"))["train"]
    flower = NaturalIdPartitioner(partition_by="writer")
    flower.dataset = train
    for client, rows in enumerate(problem.client_rows()):
        assert rows.tolist() == sorted(flower.load_partition(client)["row"])
        assert len(set(np.asarray(train["writer"])[rows])) == 1


def test_flwr_dirichlet_split_is_flowers_row_for_row(files):
    """partition=flwr-dirichlet gives client i exactly the rows of Flower's DirichletPartitioner
    (same alpha, min size and seed) on the same dataset; focusfl's own dirichlet is another
    algorithm (NIID-Bench's draw with a size cap), so it gives other rows."""
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    train = datasets.load_from_disk(str(files / "sst"))["train"]
    for seed in (0, 42):
        spec = text_spec(files, partition="flwr-dirichlet", alpha=1.0, min_size=5, seed=seed, model="text-mean")
        problem = make_problem(spec)
        flower = DirichletPartitioner(num_partitions=6, partition_by="label", alpha=1.0, min_partition_size=5,
                                      seed=seed)
        flower.dataset = train
        theirs = [sorted(flower.load_partition(i)["row"]) for i in range(6)]
        assert [rows.tolist() for rows in problem.client_rows()] == theirs
    own = make_problem(text_spec(files, partition="dirichlet", alpha=1.0, min_size=5, seed=42, model="text-mean"))
    assert [rows.tolist() for rows in own.client_rows()] != theirs


@pytest.mark.parametrize("partition", ["flwr-iid", "flwr-pathological", "flwr-shard", "iid", "shards"])
def test_every_partition_covers_disjoint_rows(files, partition):
    problem = make_problem(text_spec(files, partition=partition, model="text-mean", shards=2))
    rows = problem.client_rows()
    joined = np.concatenate(rows)
    assert len(joined) == len(set(joined.tolist())) and all(len(r) for r in rows)


# -- the built-in model, pre-tokenized data, images -------------------------------------------------------
def test_builtin_text_model_trains_without_transformers(files, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files / "tok"), local_files_only=True)
    text_dataset(tmp_path / "ids", ids=True, tokenizer=tokenizer)
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    spec = f"nn:data=hf:{tmp_path / 'ids'},clients=6,batch=8,min_size=5"
    problem = make_problem(spec, dtype=torch.float64)
    assert problem.params["model"] == "text-mean" and problem.params["input"] == "auto"
    assert problem.input_shape[0] == 2 and problem.kind == "tokens"
    vec, ref = engine_runs(lambda: make_problem(spec, dtype=torch.float64), "fedavg", 0.5, rounds=5)
    for a, b in zip(vec.state.server, ref.state.server):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    before = problem.metrics(problem.initial_point())["test_loss"]
    assert problem.metrics(vec.state.server[0])["test_loss"] < before
    with pytest.raises(ConfigError, match=r'pip install "\.\[hf\]" in a clone of focusfl'):
        make_problem(text_spec(files))  # a tokenizer and a BERT need transformers


def test_batches_are_cut_to_their_longest_sequence(files):
    problem = make_problem(text_spec(files, model="text-mean"), dtype=torch.float64)
    lengths = problem.train_images[:, 1].sum(-1)
    stored = problem.train_images[torch.argsort(lengths, stable=True)[:5]]  # five short ones
    cut = problem.inputs(stored)
    assert cut.shape[-1] == int(stored[:, 1].sum(-1).max()) < stored.shape[-1]
    assert torch.equal(cut, stored[..., : cut.shape[-1]]) and not stored[..., cut.shape[-1]:].any()


def test_image_dataset_from_parquet_trains_like_images(tmp_path):
    import datasets

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 90)
    images = rng.integers(0, 100, (90, 8, 8)).astype(np.uint8)
    images[np.arange(90), labels * 2, :] = 250
    table = datasets.Dataset.from_dict({"img": images.tolist(), "label": labels.tolist()},
                                       features=datasets.Features({"img": datasets.Array2D((8, 8), "uint8"),
                                                                   "label": datasets.Value("int64")}))
    table.to_parquet(str(tmp_path / "digits.parquet"))
    spec = f"nn:data=hf:{tmp_path / 'digits.parquet'},test_fraction=0.2,clients=4,batch=8,model=logreg,min_size=5"
    problem = make_problem(spec, dtype=torch.float64)
    assert problem.kind == "image" and problem.input_shape == (1, 8, 8) and problem.num_classes == 3
    vec, ref = engine_runs(lambda: make_problem(spec, dtype=torch.float64), "fedavg", 0.1)
    for a, b in zip(vec.state.server, ref.state.server):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_image_feature_folder_natural_ids_and_replay_from_describe(tmp_path):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (10, 10, 3)).astype(np.uint8)) for _ in range(60)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=3),
                                  "writer": datasets.Value("string")})
    datasets.Dataset.from_dict({"image": images, "label": [i % 3 for i in range(60)],
                                "writer": [f"w{i % 5}" for i in range(60)]}, features=features).save_to_disk(
        str(tmp_path / "pictures"))
    spec = f"nn:data=hf:{tmp_path / 'pictures'},test_fraction=0.2,clients=5,batch=4,partition=natural,id_column=writer"
    problem = make_problem(spec)
    assert problem.kind == "image" and problem.input_shape == (3, 10, 10) and problem.train_images.dtype == torch.uint8
    assert sum(len(rows) for rows in problem.client_rows()) == 48 and problem.params["model"] == "focus-cnn"
    again = make_problem(problem.describe())
    assert again.describe() == problem.describe() and again.data_fingerprint() == problem.data_fingerprint()


def test_a_run_replays_from_its_config_json(files, tmp_path, capsys):
    from focusfl.cli import main
    from focusfl.problems.models import refuse_model_import

    refuse_model_import(text_spec(files), "config x")  # a model folder is data, not code to import
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["--algorithm", "fedavg", "--participation", "bernoulli:p=0.5", "--rounds", "2", "--lr", "0.5",
            "--eval-every", "1"]
    assert main(["run", "--problem", text_spec(files, model="text-mean"), *args, "--out", str(first)]) == 0
    assert main(["run", "--config", str(first / "config.json"), "--out", str(second)]) == 0
    assert (first / "metrics.csv").read_bytes() == (second / "metrics.csv").read_bytes()


def test_errors_in_the_library_are_one_line(files, tmp_path):
    with pytest.raises(ConfigError, match="partition=natural and id_column"):
        make_problem(text_spec(files, partition="natural"))
    with pytest.raises(ConfigError, match="has no split named 'test'"):
        text_dataset(tmp_path / "single", with_test=False)
        make_problem(text_spec(files, data=f"hf:{tmp_path / 'single'}", model="text-mean"))
    with pytest.raises(DataError, match="classification head has 3 labels"):
        tiny_bert(tmp_path / "three", labels=3)
        make_problem(text_spec(files, model=f"hf:{tmp_path / 'three'}"))
    with pytest.raises(DataError, match="longer than the model's 64 positions"):
        text_dataset(tmp_path / "long", rows=50, test=10, long=True)
        make_problem(text_spec(files, data=f"hf:{tmp_path / 'long'}"))
    problem = make_problem(text_spec(files, data=f"hf:{tmp_path / 'single'}", test_fraction=0.25, model="text-mean"))
    assert len(problem.test_labels) == 50 and isinstance(problem, HuggingFaceNetwork)


# -- bad inputs through the console script: one line, exit 2, nothing written --------------------------------
def bad_inputs(files: Path, tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (problem spec, words the error line must hold)."""
    import datasets
    from transformers import ViTConfig

    ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16).save_pretrained(
        str(tmp / "vit"))
    tiny_bert(tmp / "small", vocab=30)  # the tokenizer has 45 tokens
    (tmp / "pickled").mkdir()
    (tmp / "pickled" / "config.json").write_text((files / "bert" / "config.json").read_text())
    (tmp / "pickled" / "pytorch_model.bin").write_bytes(b"not read")
    out_of_range = datasets.Dataset.from_dict({"sentence": ["good w1", "bad w2", "w3 w4"], "label": [0, 1, 7]})
    out_of_range.to_parquet(str(tmp / "labels.parquet"))
    with open(tmp / "huge.parquet", "wb") as handle:  # sparse: claims 1 TiB, takes no disk
        handle.truncate(1 << 40)
    return {
        "missing model folder": (text_spec(files, model=f"hf:{tmp / 'nothing'}"), "not found"),
        "not a classifier": (text_spec(files, model=f"hf:{tmp / 'vit'}"), "no sequence-classification"),
        "pickle weights": (text_spec(files, model=f"hf:{tmp / 'pickled'}"), "refusing pytorch_model.bin"),
        "vocabulary too large": (text_spec(files, model=f"hf:{tmp / 'small'}"), "larger than the model's embedding"),
        "missing column": (text_spec(files, input="review"), "no column 'review'"),
        "labels out of range": (text_spec(files, data=f"hf:{tmp / 'labels.parquet'}", test_fraction=0.3, clients=2,
                                          min_size=1), "label 7"),
        "fewer ids than clients": (text_spec(files, partition="natural", id_column="writer", clients=20),
                                   "12 distinct ids, fewer than 20 clients"),
        "oversized file": (text_spec(files, data=f"hf:{tmp / 'huge.parquet'}"), "would need 1 TiB"),
    }


@pytest.mark.slow
def test_bad_inputs_get_one_line_and_exit_2_with_nothing_written(files, tmp_path):
    cases = bad_inputs(files, tmp_path)
    outs = {name: tmp_path / f"out-{k}" for k, name in enumerate(cases)}
    procs = run_cli_together([("run", "--algorithm", "fedavg", "--problem", spec, "--rounds", "1", "--lr", "0.1",
                               "--out", str(outs[name])) for name, (spec, _) in cases.items()])
    for (name, (_, words)), proc in zip(cases.items(), procs):
        assert_one_line_error(proc, 2, words)
        assert not outs[name].exists(), name


def test_missing_packages_get_the_install_hint(files, tmp_path):
    """Where transformers is not installed (a package that fails to import stands in for it)."""
    shim = tmp_path / "shim" / "transformers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named transformers')\n")
    env = cli_env()
    env["PYTHONPATH"] = f"{tmp_path / 'shim'}:{env['PYTHONPATH']}"
    proc = run_cli("run", "--algorithm", "fedavg", "--problem", text_spec(files), "--rounds", "1", "--lr", "0.1",
                   "--out", str(tmp_path / "out"), env=env)
    assert_one_line_error(proc, 2, 'pip install ".[hf]" in a clone of focusfl')
    assert not (tmp_path / "out").exists()


def test_focusfl_and_its_help_import_no_hugging_face_package():
    code = ("import sys, contextlib, io\n"
            "import focusfl, focusfl.problems, focusfl.data\n"
            "from focusfl.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    for args in (['--help'], ['run', '--help']):\n"
            "        try: main(args)\n"
            "        except SystemExit: pass\n"
            "print(sorted(m for m in ('transformers', 'datasets', 'flwr_datasets', 'pyarrow', 'tokenizers') "
            "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
