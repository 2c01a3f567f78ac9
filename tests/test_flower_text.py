"""A Flower federation on loopback trains a text problem (``nn:data=hf:...``), each node reading
its own copy of the dataset, tokenizer and model folders (``--data-path copies/node{k}``).

The server reads the SPEC's folders; node k reads copies/node{k}/<the same names>
(flower/node.py). Through the ``focusfl`` console script: 2 SuperNodes, 3 rounds, FedAvg on the
tiny random BERT of tests/hf_fixtures.py in float64; the federation's model equals ``focusfl
run`` of the same config in the reference engine bit for bit. A node whose copy of the model
differs is refused at the handshake (the digest covers the data and the initial model).
Every process is stopped afterwards.
"""
from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")
pytest.importorskip("datasets")
pytest.importorskip("transformers")

from cli_harness import assert_one_line_error, run_cli  # noqa: E402
from hf_fixtures import text_dataset, tiny_bert, tokenizer_folder  # noqa: E402

from focusfl.flower.node import node_problem  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """The server's folders (srv/sst, srv/tok, srv/bert) and a copy of them per node (node0, node1)."""
    root = tmp_path_factory.mktemp("fedtext")
    tokenizer_folder(root / "srv" / "tok")
    tiny_bert(root / "srv" / "bert")
    text_dataset(root / "srv" / "sst", rows=80, test=20)
    for k in range(2):
        shutil.copytree(root / "srv", root / "copies" / f"node{k}")
    return root


def text_problem(root, clients: int = 2, srv=None) -> str:
    srv = srv or root / "srv"
    return (f"nn:data=hf:{srv / 'sst'},input=sentence,tokenizer={srv / 'tok'},model=hf:{srv / 'bert'},"
            f"clients={clients},partition=iid,batch=4")


RUN = ("--algorithm", "fedavg", "--participation", "full", "--rounds", "3", "--local-steps", "2", "--lr", "0.05",
       "--dtype", "float64", "--eval-every", "1")


def test_relative_paths_become_absolute_where_typed(copies, monkeypatch):
    from focusfl.flower.cli import absolute_paths

    monkeypatch.chdir(copies)
    spec = absolute_paths("nn:data=hf:srv/sst,tokenizer=srv/tok,model=hf:srv/bert,clients=2")
    assert spec == {"name": "nn", "data": f"hf:{copies / 'srv' / 'sst'}", "tokenizer": str(copies / "srv" / "tok"),
                    "model": f"hf:{copies / 'srv' / 'bert'}", "clients": 2}
    assert absolute_paths("nn:data=mnist,clients=2") == "nn:data=mnist,clients=2"  # a name, not a path
    assert absolute_paths("ridge:clients=3") == "ridge:clients=3"


def test_nodes_rebase_the_hf_folders_into_their_data_path(copies):
    spec = {"name": "nn", "data": f"hf:{copies / 'srv' / 'sst'}", "tokenizer": str(copies / "srv" / "tok"),
            "model": f"hf:{copies / 'srv' / 'bert'}"}
    node = copies / "copies" / "node1"
    assert node_problem(spec, str(node)) == {"name": "nn", "data": f"hf:{node / 'sst'}",
                                             "tokenizer": str(node / "tok"), "model": f"hf:{node / 'bert'}"}
    assert node_problem({**spec, "model": "text-mean"}, str(node))["model"] == "text-mean"
    assert node_problem(spec, str(node / "train.parquet"))["data"] == f"hf:{node / 'train.parquet'}"
    # The digest covers the model: another pretrained copy of the same shape is another problem.
    server = make_problem(text_problem(copies))
    same = make_problem(node_problem(server.describe(), str(node)))
    assert same.data_fingerprint() == server.data_fingerprint()
    other = copies / "other"
    shutil.copytree(node, other)
    tiny_bert(other / "bert", seed=1)
    assert make_problem(node_problem(server.describe(), str(other))).data_fingerprint() != server.data_fingerprint()


def test_nodes_train_on_their_own_copies_after_the_servers_is_gone(copies, tmp_path):
    """In process (FakeGrid, no Flower processes): the server builds the problem from its folders,
    which are then deleted; the nodes build their clients from their copies, and the model equals
    the reference replay bit for bit. A node whose model copy differs is refused."""
    from test_flower_protocol import assert_same, replay

    from focusfl.flower.client_app import make_client_app
    from focusfl.flower.server_app import FederationConfig, build_strategy
    from focusfl.flower.testing import FakeGrid

    shutil.copytree(copies / "srv", tmp_path / "srv")
    config = FederationConfig(algorithm="fedavg", participation="full", rounds=3, local_steps=2, lr=0.05,
                              problem=text_problem(copies, srv=tmp_path / "srv"), audit=False)
    said = []
    strategy, built = build_strategy(config, log=said.append)
    shutil.rmtree(tmp_path / "srv")
    impostor_copy = tmp_path / "impostor"
    shutil.copytree(copies / "copies" / "node1", impostor_copy)
    tiny_bert(impostor_copy / "bert", seed=1)
    grid = FakeGrid(make_client_app(), [])
    for k in range(2):
        grid.add_node(k, **{"data-path": str(copies / "copies" / f"node{k}")})
    impostor = grid.add_node(1, **{"data-path": str(impostor_copy)})
    result = strategy.start(grid)
    assert sorted(result.nodes.values()) == [0, 1] and impostor not in result.nodes
    assert any("its data differs" in line for line in said)
    assert result.mask.sum() == 6
    assert_same(result.server, replay(strategy.algorithm, built.problem, result.mask).server)


@pytest.mark.flower
@pytest.mark.slow
def test_a_text_federation_with_node_copies_equals_focusfl_run(copies, tmp_path):
    # As typed in the folder that holds srv/ and copies/: relative paths (the ServerApp runs in
    # --workdir, so the command makes them absolute).
    fed, alone = tmp_path / "fed", tmp_path / "run"
    relative = text_problem(copies).replace(f"{copies}/", "")
    proc = run_cli("federation", "local", "--nodes", "2", "--problem", relative, *RUN,
                   "--data-path", "copies/node{k}", "--workdir", str(tmp_path / "work"),
                   "--out", str(fed), cwd=copies, limit_gib=None, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "work" / "logs").glob("node*.log"))
    assert "Traceback" not in logs
    proc = run_cli("run", "--problem", text_problem(copies), *RUN, "--engine", "reference", "--out", str(alone),
                   limit_gib=None)
    assert proc.returncode == 0, proc.stderr
    federated = torch.load(fed / "model.pt", weights_only=True)["x"]
    reference = torch.load(alone / "model.pt", weights_only=True)
    reference = reference if isinstance(reference, torch.Tensor) else reference["x"]
    assert federated.dtype == torch.float64 and torch.equal(federated, reference)
    assert (fed / "metrics.csv").read_text().count("\n") == 5  # header and rounds 0-3


def test_a_missing_node_copy_is_one_line_before_any_process_starts(copies, tmp_path):
    proc = run_cli("federation", "local", "--nodes", "2", "--problem", text_problem(copies), *RUN,
                   "--data-path", str(tmp_path / "nowhere" / "node{k}"), "--workdir", str(tmp_path / "work"),
                   "--out", str(tmp_path / "fed"), limit_gib=None)
    assert_one_line_error(proc, 2, "node 0's copy")
    assert not (tmp_path / "fed").exists() and not (tmp_path / "work").exists()
