"""Seconds per round of a text problem: the tiny random BERT of the tests, both engines, float32/64.

The problem is what tests/test_hf.py trains (tests/hf_fixtures.py builds it into a temporary
folder: a 2-layer BERT with hidden size 16, its WordPiece tokenizer and a 200-row text dataset
saved with save_to_disk): 6 clients, Bernoulli p = 0.5, batch 8, tau = 2, FedSUM. Each cell runs
``--rounds`` rounds after 2 warm-up rounds, one torch thread, and prints milliseconds per round;
the cells run side by side in one process, so their ratios are what to compare.

    python benchmarks/text_round.py [--rounds 40]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hf_fixtures import text_dataset, tiny_bert, tokenizer_folder  # noqa: E402

from focusfl.algorithms import make_algorithm  # noqa: E402
from focusfl.engine import simulate  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402


def ms_per_round(root: Path, engine: str, dtype: torch.dtype, rounds: int) -> float:
    problem = make_problem(f"nn:data=hf:{root / 'data'},tokenizer={root / 'tok'},model=hf:{root / 'bert'},"
                           "clients=6,batch=8", dtype=dtype)
    participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=0)
    algorithm = make_algorithm("fedsum", lr=0.05, local_steps=2)
    simulate(algorithm, problem, participation, 2, engine=engine, eval_every=2)  # warm-up
    started = time.perf_counter()
    simulate(algorithm, problem, participation, rounds, engine=engine, eval_every=rounds)
    return 1000 * (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        text_dataset(root / "data")
        tokenizer_folder(root / "tok")
        tiny_bert(root / "bert")
        print(f"tiny BERT, 6 clients, bernoulli 0.5, batch 8, tau 2, fedsum; ms per round over {args.rounds} rounds")
        print(f"{'dtype':<8} {'vectorized':>11} {'reference':>10}")
        for dtype in (torch.float32, torch.float64):
            cells = [ms_per_round(root, engine, dtype, args.rounds) for engine in ("vectorized", "reference")]
            print(f"{str(dtype).removeprefix('torch.'):<8} {cells[0]:>11.1f} {cells[1]:>10.1f}")


if __name__ == "__main__":
    main()
