"""The Flower adapter in process: the real AlgorithmStrategy and ClientApp over a fake Grid that
loses, duplicates, corrupts, delays and misaddresses messages. For every algorithm in the
registry, the final state equals the reference engine replaying the realized trace, bit for
bit in float64. No Ray, no processes."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

from focusfl.algorithms import ALGORITHMS, make_algorithm  # noqa: E402
from focusfl.engine import simulate  # noqa: E402
from focusfl.engine.reference import reference_round  # noqa: E402
from focusfl.flower.client_app import make_client_app  # noqa: E402
from focusfl.flower.codec import CTX, MESSAGE, Malformed, decode_tree, encode_tree, unpack  # noqa: E402
from focusfl.flower.strategy import REASONS, AlgorithmStrategy  # noqa: E402
from focusfl.flower.testing import FAULTS, FakeGrid, Faults  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402

pytestmark = pytest.mark.flower

PROBLEM = "ridge:clients=6,dim=4,samples=20"
# Every fault at once: about 45% of train replies are lost or bad.
HEAVY = {name: 0.04 for name in FAULTS}


def replay(algorithm, problem, mask, seed=0):
    """The reference engine on the realized trace (a fresh algorithm from its description)."""
    algorithm = make_algorithm(algorithm.describe())
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    for r, row in enumerate(mask):
        active = torch.as_tensor(np.flatnonzero(row), dtype=torch.int64)
        state = reference_round(algorithm, state, problem, active, r, seed)
    return state


def federate(name, *, rounds=14, faults=None, participation="bernoulli", seed=0, local_steps=2, grid_hook=None,
             node_config=None):
    problem = make_problem(PROBLEM)
    algorithm = make_algorithm(name, local_steps=local_steps)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), problem.num_clients))
    process = None if participation is None else make_participation(participation, problem.num_clients, seed=seed)
    strategy = AlgorithmStrategy(algorithm, problem, rounds=rounds, participation=process, seed=seed,
                                 on_round=grid_hook)
    grid = FakeGrid(make_client_app(), range(problem.num_clients), faults=faults or Faults(), node_config=node_config)
    result = strategy.start(grid)
    return strategy, grid, result, problem


def assert_same(a, b):
    for name, x, y in zip(a._fields, a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), f"{name} differs by {float((x - y).abs().max())}"


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_is_exact_under_faults(name):
    faults = Faults(HEAVY, finish_drop=0.15, seed=3)
    strategy, grid, result, problem = federate(name, faults=faults, participation="full", rounds=16)
    assert result.diverged_at is None
    assert sum(result.counts.values()) > 0 and result.mask.sum() > 0
    reference = replay(strategy.algorithm, problem, result.mask)
    assert_same(result.server, reference.server)
    # Nodes hold exactly the reference's client rows (those whose state was not lost).
    audit = strategy.audit(grid)
    assert len(audit["rows"]) >= problem.num_clients - len(result.lost) - 1
    for client, rows in audit["rows"].items():
        assert_same(rows, type(rows)(*(field[client:client + 1] for field in reference.clients)))
    if ALGORITHMS[name].tracking is not None and "tracking_gap" in audit:
        assert audit["tracking_gap"] <= 1e-12


def test_a_blow_up_stops_a_federation_where_it_stops_a_simulation():
    # The notebook's MIFA at a step it cannot take: the loss stays finite and leaves its start
    # for good; the blow-up rule (engine/rows.py) must end both runs at the same round.
    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("mifa:notebook=true", lr=0.01, local_steps=2)
    simulated = simulate(algorithm, problem, make_participation("uniform:m=2", problem.num_clients, seed=0), 300,
                         engine="reference")
    strategy = AlgorithmStrategy(algorithm, problem, rounds=300,
                                 participation=make_participation("uniform:m=2", problem.num_clients, seed=0))
    result = strategy.start(FakeGrid(make_client_app(), range(problem.num_clients), faults=Faults()))
    assert simulated.diverged_at is not None and result.diverged_at == simulated.diverged_at
    assert result.rows[-1]["diverged"] is True and len(result.rows) == len(simulated.rows)
    for federated, row in zip(result.rows, simulated.rows):
        assert {key: federated[key] for key in row} == row


def test_every_fault_is_rejected_and_counted():
    strategy, grid, result, problem = federate("focus", rounds=30, faults=Faults(HEAVY, seed=1),
                                               participation="full")
    counts = result.counts
    for reason in ("timeout", "error", "non_finite", "malformed", "duplicate", "stale", "unknown_node"):
        assert counts[reason] > 0, (reason, counts)
    assert result.rows[-1]["rejected_timeout"] == counts["timeout"]
    assert set(f"rejected_{r}" for r in REASONS) <= set(result.rows[-1])
    reference = replay(strategy.algorithm, problem, result.mask)
    assert_same(result.server, reference.server)


def test_available_participation_and_trace_replay(tmp_path):
    """participation=available: whoever answers takes part; the recorded trace replays through
    `--participation trace:path=...` (the reference engine) to the same bits."""
    strategy, grid, result, problem = federate("focus", rounds=12, participation=None,
                                               faults=Faults({"drop_reply": 0.3}, seed=2))
    assert 0 < result.mask.sum() < result.mask.size
    path = tmp_path / "trace.csv"
    np.savetxt(path, result.mask.astype(int), fmt="%d", delimiter=",")
    process = make_participation(f"trace:path={path}", problem.num_clients)
    algorithm = make_algorithm(strategy.algorithm.describe())
    run = simulate(algorithm, problem, process, rounds=12, engine="reference")
    assert_same(result.server, run.state.server)
    assert run.rows[-1]["rel_error"] == result.rows[-1]["rel_error"]


def test_restarted_node_without_state_is_detected_and_excluded():
    def hook(strategy, entry):
        if entry.round == 4:  # client 2's SuperNode restarts and forgets everything
            strategy._grid.restart(strategy._grid.node_of(2))

    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("focus", lr=2e-3, local_steps=2)
    strategy = AlgorithmStrategy(algorithm, problem, rounds=10, participation=make_participation("full", 6),
                                 on_round=hook)
    strategy._grid = FakeGrid(make_client_app(), range(6))
    result = strategy.start(strategy._grid)
    assert result.lost == [2]
    assert result.counts["lost_state"] >= 1
    assert not result.mask[5:, 2].any() and result.mask[:5, 2].all()
    assert_same(result.server, replay(strategy.algorithm, problem, result.mask).server)
    audit = strategy.audit(strategy._grid)
    assert audit["unverified_clients"] == [2] and "tracking_gap" not in audit


def test_restarted_node_with_durable_state_continues_exactly(tmp_path):
    """A node given a state-dir writes its memory before replying: after a restart (new node id,
    empty context) it resumes, and FOCUS still converges exactly."""
    killed = {}

    def hook(strategy, entry):
        if entry.round == 5:
            killed["old"] = strategy._grid.node_of(1)
            strategy._grid.kill(killed["old"])
        if entry.round == 9:
            strategy._grid.nodes[killed["old"]].alive = True
            strategy._grid.restart(killed["old"])

    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("focus", local_steps=2)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), 6))
    strategy = AlgorithmStrategy(algorithm, problem, rounds=300, participation=make_participation("full", 6),
                                 on_round=hook, eval_every=100)
    nodes = [{"state-dir": str(tmp_path / f"node{k}")} for k in range(6)]
    strategy._grid = grid = FakeGrid(make_client_app(), [], faults=Faults({"drop_reply": 0.2}, seed=5))
    for k in range(6):
        grid.add_node(k, **nodes[k])
    result = strategy.start(grid)
    assert result.lost == []
    assert not result.mask[6:10, 1].any()  # dropped while it was down
    assert result.mask[10:, 1].any()
    assert_same(result.server, replay(strategy.algorithm, problem, result.mask).server)
    assert result.rows[-1]["rel_error"] < 1e-10
    audit = strategy.audit(grid)
    assert audit["tracking_gap"] < 1e-12


def test_naive_commit_breaks_tracking_and_protocol_keeps_it():
    """The measurement behind the commit protocol: if a node committed its new gradient as soon
    as it computed it, a lost reply would leave y != sum_i g_prev_i for good."""
    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("focus", local_steps=1)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), 6))
    strategy, grid, result, _ = federate("focus", rounds=200, participation="full", local_steps=1,
                                         faults=Faults({"drop_reply": 0.2}, seed=7))
    assert result.rows[-1]["rel_error"] < 1e-8
    assert strategy.audit(grid)["tracking_gap"] < 1e-12
    # The naive adapter, simulated: rows advance even when the reply is lost.
    state = algorithm.init(problem.initial_point(), 6)
    server, g_prev = state.server, state.clients.g_prev.clone()
    from focusfl.algorithms.base import RoundContext

    rng = np.random.default_rng(7)
    for r in range(200):
        received = []
        for i in range(6):
            one = torch.tensor([i])
            rows, message = algorithm.client_round(server, type(state.clients)(g_prev[i:i + 1]),
                                                   problem.oracle(one, seed=0, round=r), RoundContext(r, one, 6))
            g_prev[i] = rows.g_prev[0]  # committed at once
            if rng.random() >= 0.2:
                received.append((i, message))
        active = torch.tensor([i for i, _ in received], dtype=torch.int64)
        msg = type(received[0][1])(torch.cat([m.u for _, m in received])) if received else \
            type(message)(message.u[:0])
        server = algorithm.server_round(server, msg, RoundContext(r, active, 6))
    gap = float(torch.linalg.vector_norm(server.y - g_prev.sum(0)) / torch.linalg.vector_norm(server.y))
    error = float(torch.linalg.vector_norm(server.x - problem.x_star) / torch.linalg.vector_norm(problem.x_star))
    assert gap > 1e-3 and error > 1e-3


def test_codec_rejects_bad_records():
    problem = make_problem(PROBLEM)
    state = make_algorithm("focus").init(problem.initial_point(), 6)
    record = encode_tree(state.server)
    assert_same(decode_tree(record, state.server), state.server)
    bad = state.server._replace(x=state.server.x.clone().fill_(float("nan")))
    with pytest.raises(Malformed, match="non_finite"):
        decode_tree(encode_tree(bad), state.server)
    with pytest.raises(Malformed, match="dtype"):
        decode_tree(encode_tree(state.server._replace(x=state.server.x.float())), state.server)
    with pytest.raises(Malformed, match="shape"):
        decode_tree(encode_tree(state.server._replace(x=state.server.x[:2])), state.server)
    with pytest.raises(Malformed, match="missing"):
        decode_tree(encode_tree(state.server, ("x",)), state.server)
    with pytest.raises(Malformed, match="missing array record"):
        decode_tree(None, state.server)


def test_handshake_refuses_bad_and_duplicate_nodes():
    strategy, grid, result, problem = federate("focus", rounds=1, participation="full")
    grid.add_node(17)  # not a client index
    twin = grid.add_node(3)  # a second node claiming client 3
    strategy._discover(grid)
    assert 17 not in strategy.node_client.values()
    assert twin not in strategy.node_client and strategy.client_node[3] != twin
    assert strategy.counts["malformed"] >= 1 and strategy.counts["duplicate"] >= 1


def test_throwaway_credentials_load_as_flower_loads_them(tmp_path):
    """flower-supernode reads its key with load_ssh_private_key (PEM is refused, exit code 302);
    `flwr supernode register` reads an OpenSSH public key; the SuperLink certificate names
    127.0.0.1 and is signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    from focusfl.flower.tls import make_certificates, make_node_key

    private, public = make_node_key(tmp_path / "keys", 0)
    key = load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert load_ssh_public_key(public.read_bytes()).public_numbers() == key.public_key().public_numbers()
    certs = make_certificates(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate(certs["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(certs["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def image_npz(path, seed, count=240, classes=4):
    """A small image data set: 8x8 images whose label lights up one row."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    images = rng.integers(0, 200, (count, 8, 8)).astype(np.uint8)
    images[np.arange(count), 2 * labels] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=images, labels=labels)
    return path


def test_nn_problem_nodes_build_clients_from_their_own_data(tmp_path):
    """nn problems: each node builds its client from the run's SPEC and its own copy of the
    data set, named by data-path in its node config (a file, or a folder that holds the SPEC's
    file name); the server's copy is gone before any node builds. Under every fault, the model
    equals the reference replay bit for bit in float64. A node whose copy differs is refused
    (the handshake compares digests of the client data); one whose data-path does not exist
    never joins, and the server says why."""
    from focusfl.flower.server_app import FederationConfig, build_strategy

    server = image_npz(tmp_path / "server" / "digits.npz", seed=0)
    config = FederationConfig(algorithm="focus", participation="full", rounds=8, local_steps=2, lr=0.05,
                              problem=f"nn:data=digits.npz,data_dir={server.parent},clients=4,batch=8,"
                                      "model=logreg,test_fraction=0.25")
    said = []
    strategy, built = build_strategy(config, log=said.append)
    assert built.problem.dtype == torch.float64
    nodes = tmp_path / "node"
    image_npz(nodes / "digits.npz", seed=0)  # the same data set, the node's own copy
    server.unlink()
    grid = FakeGrid(make_client_app(), [], faults=Faults(HEAVY, seed=3))
    for k in range(4):
        grid.add_node(k, **{"data-path": str(nodes if k % 2 else nodes / "digits.npz")})
    impostor = grid.add_node(1, **{"data-path": str(image_npz(tmp_path / "other" / "digits.npz", seed=1))})
    missing = grid.add_node(2, **{"data-path": str(tmp_path / "nowhere.npz")})
    result = strategy.start(grid)
    assert sorted(result.nodes.values()) == [0, 1, 2, 3] and impostor not in result.nodes
    assert impostor in strategy.refused and any("its data differs" in line for line in said)
    assert missing not in result.nodes and sum("nowhere.npz" in line for line in said) == 1
    assert result.mask.sum() > 0 and sum(result.counts.values()) > 0
    reference = replay(strategy.algorithm, built.problem, result.mask)
    assert_same(result.server, reference.server)
    audit = strategy.audit(grid)
    assert audit["tracking_gap"] <= 1e-12
    for client, rows in audit["rows"].items():
        assert_same(rows, type(rows)(*(field[client:client + 1] for field in reference.clients)))


def test_a_federation_folder_is_a_run_folder_that_plot_reads_as_one(tmp_path):
    """write_results writes through runs/ (metrics.csv, config.json with a run's keys): `focusfl
    plot` reads a federation's folder and a `focusfl run` folder alike, and --config replays it."""
    import json

    from focusfl.cli import main
    from focusfl.flower.server_app import FederationConfig, run_federation
    from focusfl.runs.config import _REQUIRED, config_from_json

    config = FederationConfig(algorithm="focus", problem=PROBLEM, participation="full", rounds=4, timeout=5.0,
                              out=str(tmp_path / "fed"), audit=False)
    problem = make_problem(PROBLEM)
    run_federation(FakeGrid(make_client_app(), range(problem.num_clients)), config, log=lambda text: None)
    assert main(["run", "--algorithm", "focus", "--problem", PROBLEM, "--rounds", "4",
                 "--out", str(tmp_path / "run")]) == 0
    federated, alone = (json.loads((tmp_path / name / "config.json").read_text()) for name in ("fed", "run"))
    assert set(federated) == set(alone) and federated["status"] == "complete"
    config_from_json(federated)  # the same keys, every one known
    assert all(key in federated for key in _REQUIRED)
    assert main(["plot", str(tmp_path / "fed"), str(tmp_path / "run"), "--out", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").is_file()


def test_a_message_travels_as_one_config_record_and_unpacks_to_its_records(monkeypatch):
    """pack: every record in one ConfigRecord (Flower sends a RecordDict and a ConfigRecord, two
    objects, rather than one per record, array and chunk); unpack gives the records back."""
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from focusfl.flower import codec

    problem = make_problem(PROBLEM)
    state = make_algorithm("focus").init(problem.initial_point(), 6)
    records = {codec.CTX: ConfigRecord({"round": 3, "client": 1, "losses": [0.5, 0.25]}),
               codec.SERVER: encode_tree(state.server), codec.ROWS: ArrayRecord()}
    content = codec.pack(records)
    assert len(get_all_nested_objects(content)) == 2
    unpacked = codec.unpack(content)
    assert list(unpacked) == list(records) and dict(unpacked[codec.CTX]) == dict(records[codec.CTX])
    assert_same(decode_tree(unpacked[codec.SERVER], state.server), state.server)
    assert isinstance(unpacked[codec.ROWS], ArrayRecord) and not unpacked[codec.ROWS]
    # arrays beyond one chunk keep their ArrayRecord (Flower chunks it)
    monkeypatch.setattr(codec, "INLINE_BYTES", 100)
    content = codec.pack(records)
    assert isinstance(content[codec.SERVER], ArrayRecord) and codec.SERVER not in json_index(content)
    assert_same(decode_tree(codec.unpack(content)[codec.SERVER], state.server), state.server)


def json_index(content):
    import json

    from focusfl.flower import codec
    return json.loads(content[codec.PACKED][codec.INDEX])


def test_unpack_refuses_what_pack_would_not_write():
    import json

    from flwr.app import ConfigRecord, RecordDict

    from focusfl.flower import codec

    problem = make_problem(PROBLEM)
    state = make_algorithm("focus").init(problem.initial_point(), 6)
    good = dict(codec.pack({codec.CTX: ConfigRecord({"round": 1}), codec.SERVER: encode_tree(state.server)})
                [codec.PACKED])
    index = json.loads(good[codec.INDEX])

    def packed(**change):
        entries = {**good, **change}
        return RecordDict({codec.PACKED: ConfigRecord({k: v for k, v in entries.items() if v is not None})})

    array = index[codec.SERVER]["arrays"][0]
    cases = {
        "no content": None,
        "missing packed record": RecordDict({codec.CTX: ConfigRecord({"round": 1})}),
        "readable index": packed(index=None),
        "without a readable index": packed(index="[" * 100_000),  # deeper than the JSON parser goes
        "not a mapping": packed(index="[1]"),
        "no kind or names": packed(index=json.dumps({**index, codec.CTX: {"kind": "other", "names": []}})),
        "lacks a value": packed(**{f"{codec.CTX}/round": None}),
        "describes an array badly": packed(index=json.dumps(
            {**index, codec.SERVER: {"kind": "arrays", "arrays": [[array[0], array[1], [-1], array[3]]]}})),
        "missing or repeated": packed(**{f"{codec.SERVER}/{array[0]}": "not bytes"}),
        "unindexed entry": packed(**{"smuggled/x": b"1"}),
    }
    for reason, content in cases.items():
        with pytest.raises(codec.Malformed, match=reason):
            codec.unpack(content)


def test_a_reply_whose_packing_is_unreadable_is_rejected_as_malformed():
    """A train reply whose packed record lost its index: counted as malformed, the round goes on
    without it, and the run equals the reference on the realized trace."""
    from flwr.app import ConfigRecord, RecordDict

    from focusfl.flower import codec

    class Garbling(FakeGrid):
        garbled = 0

        def _deliver(self, message):
            replies = super()._deliver(message)
            if message.metadata.message_type == "train" and message.metadata.group_id == "2":
                for reply in replies:
                    if not reply.has_error():
                        entries = dict(reply.content[codec.PACKED])
                        del entries[codec.INDEX]
                        reply.content = RecordDict({codec.PACKED: ConfigRecord(entries)})
                        self.garbled += 1
            return replies

    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("focus", local_steps=2)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), problem.num_clients))
    strategy = AlgorithmStrategy(algorithm, problem, rounds=5, participation=None, seed=0)
    grid = Garbling(make_client_app(), range(problem.num_clients))
    result = strategy.start(grid)
    assert grid.garbled == problem.num_clients and result.counts["malformed"] == grid.garbled
    assert result.mask[2].sum() == 0
    assert_same(result.server, replay(strategy.algorithm, problem, result.mask).server)


def test_a_node_answers_an_unreadable_request_with_a_malformed_error():
    from flwr.app import ConfigRecord, Message, RecordDict

    from focusfl.flower import codec

    grid = FakeGrid(make_client_app(), range(2))
    node = grid.nodes[next(iter(grid.nodes))]
    request = Message(RecordDict({codec.RUN: ConfigRecord({"seed": 0})}), dst_node_id=node.node_id,
                      message_type="query", group_id="hello")
    reply = grid.app(request, node.context)
    assert reply.has_error() and "packed" in reply.error.reason


def test_arrays_too_large_to_pack_travel_as_array_records_and_the_run_is_the_same(monkeypatch):
    from focusfl.flower import codec

    monkeypatch.setattr(codec, "INLINE_BYTES", 64)  # every message's arrays go as ArrayRecords
    strategy, grid, result, problem = federate("scaffold", rounds=6, participation="full")
    assert sum(result.counts.values()) == 0
    assert_same(result.server, replay(strategy.algorithm, problem, result.mask).server)



# -- local differential privacy: the nodes noise before they send ---------------------------------
LOCAL_DP = "clip=0.5,noise=0.7,mode=local,delta=1e-5"


def _private_federation(name, dp, *, rounds=10, faults=None, grid=None):
    from focusfl.privacy import run_privacy

    problem = make_problem(PROBLEM)
    algorithm = make_algorithm(name, local_steps=2, lr=0.01)
    privacy = run_privacy(dp, algorithm, problem, None, seed=0, end_round=rounds, federated=True)
    strategy = AlgorithmStrategy(algorithm, problem, rounds=rounds, seed=0, privacy=privacy,
                                 participation=make_participation("bernoulli", problem.num_clients, seed=0))
    grid = grid or FakeGrid(make_client_app(), range(problem.num_clients), faults=faults or Faults())
    return strategy, grid, strategy.start(grid), problem


@pytest.mark.parametrize("name", ["focus", "scaffold", "fedau"])
def test_local_dp_federation_equals_the_simulation_under_faults(name, tmp_path):
    """The nodes add the simulation's keyed noise to their own rows, so the federation's model
    and rows (epsilons included) are the reference engine's on the realised trace, bit for bit
    (fedau: an algorithm central mode refuses)."""
    from focusfl.privacy import run_privacy

    strategy, grid, result, problem = _private_federation(name, LOCAL_DP, faults=Faults({"drop_reply": 0.2}, seed=4))
    assert 0 < result.mask.sum() < result.mask.size
    path = tmp_path / "trace.csv"
    np.savetxt(path, result.mask.astype(int), fmt="%d", delimiter=",")
    process = make_participation(f"trace:path={path}", problem.num_clients)
    algorithm = make_algorithm(strategy.algorithm.describe())
    privacy = run_privacy(LOCAL_DP, algorithm, problem, process, seed=0, end_round=len(result.mask))
    simulated = simulate(algorithm, problem, process, len(result.mask), engine="reference", privacy=privacy)
    assert_same(result.server, simulated.state.server)
    assert len(result.rows) == len(simulated.rows)
    for federated, row in zip(result.rows, simulated.rows):
        for key in ("loss", "rel_error", "epsilon_max", "epsilon_median", "epsilon_client"):
            assert federated[key] == row[key], key


class _Listening(FakeGrid):
    """A FakeGrid that keeps every train reply's message as the server receives it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.heard: list[tuple[int, int, dict]] = []  # (round, client, fields)

    def _deliver(self, message):
        replies = super()._deliver(message)
        for reply in replies:
            if message.metadata.message_type == "train" and not reply.has_error():
                records = unpack(reply.content)
                fields = {key: torch.as_tensor(records[MESSAGE][key].numpy()) for key in records[MESSAGE].keys()}
                self.heard.append((int(records[CTX]["round"]), int(records[CTX]["client"]), fields))
        return replies


@pytest.mark.parametrize("dp", ["clip=0.05,noise=0,mode=local", "clip=0.05,noise=0.7,mode=local",
                                "clip=0.05,noise=0.7,mode=central"])
def test_the_server_receives_local_dp_messages_clipped_and_noised(dp):
    """Local mode: every vector a node sends is clipped to C and carries the keyed noise sigma C
    before it leaves (what the server receives, minus that noise, is within C; with the noise it
    is not). Central mode: the nodes send their messages bare (the server noises)."""
    from focusfl.privacy import parse_dp
    from focusfl.privacy.mechanism import keyed_gaussian

    config = parse_dp(dp)
    problem = make_problem(PROBLEM)
    grid = _Listening(make_client_app(), range(problem.num_clients))
    strategy, _, result, _ = _private_federation("scaffold", dp, grid=grid)
    template = strategy.message_template
    assert grid.heard and len(grid.heard) == int(result.mask.sum())
    norms = []
    for round_, client, fields in grid.heard:
        for k, name in enumerate(template._fields):
            sent = fields[name].flatten()
            norms.append(float(sent.norm()))
            if config.mode == "local":
                noise = keyed_gaussian(0, round_, torch.tensor([client]), k, sent.numel())[0] * config.noise * config.clip
                assert float((sent - noise).norm()) <= config.clip * (1 + 1e-12)
    if config.mode == "local" and not config.noise:
        assert max(norms) <= config.clip * (1 + 1e-12)
    else:  # noised on the node (local), or sent bare and clipped by the server (central)
        assert max(norms) > 2 * config.clip


def test_a_node_floor_on_local_noise_accepts_only_runs_at_or_above_it():
    """dp_floor.py: a node owner's dp-min-noise (its node config, or `federation local
    --dp-min-noise`) against the run's local-DP record; bad floors are one line."""
    from focusfl.errors import ConfigError
    from focusfl.flower.dp_floor import check_floor, node_floor, parse_floors
    from focusfl.privacy import parse_dp

    local = parse_dp("clip=1,noise=0.7,mode=local")
    for dp, floor in ((local, None), (None, None), (local, 0.7), (local, 0.0), (parse_dp("clip=1,noise=0,mode=local"), 0)):
        check_floor(dp, floor)
    for dp, floor, reason in ((local, 0.71, "sigma=0.7, below this node's dp-min-noise=0.71"),
                              (None, 0.0, "dp-min-noise=0 accepts only local DP"),
                              (None, 1.0, "the run has no local DP")):
        with pytest.raises(Malformed, match=reason):
            check_floor(dp, floor)
    assert node_floor({}) is None and node_floor({"dp-min-noise": ""}) is None
    assert node_floor({"dp-min-noise": 1}) == 1.0 and node_floor({"dp-min-noise": "0.5"}) == 0.5
    for bad in (-1, -0.5, float("nan"), float("inf"), "abc", "nan", True, [1.0]):
        with pytest.raises(Malformed, match="node config dp-min-noise: .* is not a noise multiplier") as refused:
            node_floor({"dp-min-noise": bad})
        assert "\n" not in str(refused.value)
    assert parse_floors("1.0", 3) == {0: 1.0, 1: 1.0, 2: 1.0} and parse_floors("1=2,node2=0", 3) == {1: 2.0, 2: 0.0}
    for bad, reason in (("-1", "'-1' is not a noise multiplier"), ("nan", "is not a noise multiplier"),
                        ("abc", "is not a noise multiplier"), ("1=-0.5", "'-0.5' is not"), ("inf", "is not"),
                        ("3=1", "node 3 does not exist"), ("1=1,1=2", "given twice"), ("", "give SIGMA")):
        with pytest.raises(ConfigError, match=reason) as refused:
            parse_floors(bad, 3)
        assert str(refused.value).startswith("--dp-min-noise: ") and "\n" not in str(refused.value)


@pytest.mark.parametrize("dp", [LOCAL_DP, "clip=0.05,noise=0.7,mode=central", None])
def test_a_node_with_a_floor_refuses_a_run_below_it_and_never_sends(dp):
    """A node whose floor (1.0) is above the run's local sigma (0.7), or a run without local DP
    (central: the nodes would send bare messages; none), answers the handshake with a malformed
    error: the server refuses it in one line and never asks it to train, and nothing it could
    send reaches the server. The other nodes run as before."""
    problem = make_problem(PROBLEM)
    grid = _Listening(make_client_app(), range(problem.num_clients))
    floored = grid.node_of(2)
    grid.nodes[floored].context.node_config["dp-min-noise"] = 1.0
    strategy, _, result, _ = _private_federation("scaffold", dp, grid=grid)
    assert list(strategy.refusals) == [floored]
    why = strategy.refusals[floored]
    assert why.startswith("focusfl:malformed") and "dp-min-noise=1" in why and "\n" not in why
    assert "malformed malformed" not in why  # the reason named once
    assert ("below this node's" if dp == LOCAL_DP else "the run has no local DP") in why
    assert not result.mask[:, 2].any() and result.mask.sum() > 0
    assert {client for _, client, _ in grid.heard} == set(range(problem.num_clients)) - {2}
    # at or below the run's sigma, the floor changes nothing
    if dp == LOCAL_DP:
        grid = FakeGrid(make_client_app(), range(problem.num_clients), node_config={"dp-min-noise": 0.7})
        strategy, _, floored_result, _ = _private_federation("scaffold", dp, grid=grid)
        _, _, plain, _ = _private_federation("scaffold", dp)
        assert not strategy.refusals and np.array_equal(floored_result.mask, plain.mask)
        assert_same(floored_result.server, plain.server)


def test_a_node_with_a_bad_floor_is_refused_in_one_line():
    problem = make_problem(PROBLEM)
    for bad in (-1.0, float("nan"), "abc"):
        grid = FakeGrid(make_client_app(), range(problem.num_clients), node_config={"dp-min-noise": bad})
        strategy, _, result, _ = _private_federation("focus", LOCAL_DP, grid=grid, rounds=2)
        assert len(strategy.refusals) == problem.num_clients and result.mask.sum() == 0
        assert all("node config dp-min-noise" in why and "is not a noise multiplier (sigma) >= 0" in why
                   and "\n" not in why for why in strategy.refusals.values())


def test_a_node_refuses_a_run_record_with_a_bad_or_central_dp():
    from focusfl.flower.codec import RunSpec, decode_run, encode_run

    run = RunSpec({"name": "focus"}, {"name": "ridge"}, 0, "float64", "t", dp={"clip": 1.0, "noise": 1.0,
                                                                               "mode": "local"})
    assert decode_run(encode_run(run)) == run
    for dp, reason in (({"clip": 0, "noise": 1.0, "mode": "local"}, "clip must be"),
                       ({"clip": 1.0, "noise": 1.0, "mode": "central"}, "only in local mode"),
                       ({"clip": 1.0}, "noise is required"), ([1], "must be 'none'")):
        with pytest.raises(Malformed, match=reason):
            decode_run(encode_run(run._replace(dp=dp)))


class _Arriving(FakeGrid):
    """A FakeGrid whose nodes connect a few at a time, as Flower's simulation registers its
    nodes while the ServerApp starts: one more node each time the node list is asked for."""

    def __init__(self, *args, connected: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.connected = connected

    def get_node_ids(self) -> list[int]:
        live = super().get_node_ids()[:self.connected]
        self.connected += 1
        return live


def _waiting_strategy(min_nodes: int, timeout: float = 30.0):
    problem = make_problem(PROBLEM)
    algorithm = make_algorithm("focus", local_steps=2)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), problem.num_clients))
    return AlgorithmStrategy(algorithm, problem, rounds=3, participation=None, seed=0, timeout=timeout,
                             min_nodes=min_nodes), problem


def test_min_nodes_waits_for_every_node_before_the_first_round(monkeypatch):
    monkeypatch.setattr("focusfl.flower.strategy.NODE_POLL_SECONDS", 0.0)
    strategy, problem = _waiting_strategy(min_nodes=6)
    n = problem.num_clients
    result = strategy.start(_Arriving(make_client_app(), range(n), connected=1))
    assert result.mask[0].sum() == n and sum(result.counts.values()) == 0
    # Without the wait, the first round runs with the few nodes connected by then.
    strategy, _ = _waiting_strategy(min_nodes=0)
    result = strategy.start(_Arriving(make_client_app(), range(n), connected=1))
    assert 0 < result.mask[0].sum() < n


def test_too_few_nodes_within_the_timeout_is_one_line():
    from focusfl.errors import FederationError

    strategy, problem = _waiting_strategy(min_nodes=6, timeout=0.3)
    grid = FakeGrid(make_client_app(), range(problem.num_clients))
    grid.nodes[next(iter(grid.nodes))].alive = False
    with pytest.raises(FederationError, match=r"^5 of the 6 nodes min_nodes asks for connected within 0.3 s"):
        strategy.start(grid)


@pytest.mark.parametrize("min_nodes", [-1, True, 1.5, "2"])
def test_a_min_nodes_that_is_not_a_count_is_refused(min_nodes):
    from focusfl.errors import ConfigError
    from focusfl.flower.server_app import FederationConfig

    with pytest.raises(ConfigError, match="min_nodes must be a whole number >= 0"):
        FederationConfig(algorithm="focus", min_nodes=min_nodes)
    with pytest.raises(ConfigError, match="min_nodes must be a whole number >= 0"):
        FederationConfig.from_json(json.dumps({"min_nodes": min_nodes}))


def test_min_nodes_beyond_the_clients_is_refused_and_travels_in_the_run_config():
    from focusfl.errors import ConfigError
    from focusfl.flower.server_app import FederationConfig, build_strategy

    config = FederationConfig(algorithm="focus", problem="ridge:clients=3,dim=4", min_nodes=3)
    assert FederationConfig.from_json(config.to_json()).min_nodes == 3
    assert build_strategy(config, log=lambda text: None)[0].min_nodes == 3
    with pytest.raises(ConfigError, match="min_nodes is 4, but the problem has 3 clients"):
        build_strategy(FederationConfig(algorithm="focus", problem="ridge:clients=3,dim=4", min_nodes=4))
