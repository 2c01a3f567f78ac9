"""Flower's simulation runtime (Ray) with 32 virtual SuperNodes: the real ServerApp and
ClientApp, equal to the reference engine replaying the realized trace (float64, bit for bit).
min_nodes=32: Flower registers the virtual nodes while the ServerApp starts (CI once found 16
of 32 missing in the first round)."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")
pytest.importorskip("ray", reason="Flower's simulation extra is not installed (pip install 'focusfl[flower]')")

from focusfl.flower.client_app import make_client_app  # noqa: E402
from focusfl.flower.server_app import FederationConfig, build_strategy, make_server_app  # noqa: E402
from test_flower_protocol import assert_same, replay  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time (test_sweep.RAY)


def test_simulation_32_virtual_nodes_equals_reference(tmp_path, monkeypatch):
    from flwr.simulation import run_simulation

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    config = FederationConfig(algorithm="focus", problem="ridge:clients=32,dim=8,samples=20",
                              participation="bernoulli", rounds=4, local_steps=2, timeout=300.0,
                              min_nodes=32)  # the simulation registers its nodes while the ServerApp starts
    sink: dict = {}
    run_simulation(make_server_app(config, sink, log=lambda text: None), make_client_app(), num_supernodes=32,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": min(2, os.cpu_count() or 1),
                                                 "object_store_memory": 200 * 2**20}})
    result = sink["result"]
    assert len(result.nodes) == 32 and result.mask.sum() > 0
    assert sum(result.counts.values()) == 0
    strategy, built = build_strategy(config, log=lambda text: None)
    reference = replay(strategy.algorithm, built.problem, result.mask)
    assert_same(result.server, reference.server)
    assert result.audit["tracking_gap"] <= 1e-12
    assert torch.isfinite(result.server.x).all()
