"""Neural-network presets: ``focusfl reproduce focus-cifar10 | fedsum-mnist | fedsum-resnet18 |
fedsum-biased | fedsum-sst2 | mnist-demo``.

- ``focus-cifar10``: the FOCUS paper's SG-FOCUS experiment (seed 002, appendix G): CIFAR-10,
  its three-layer CNN, N = 32 clients, Dirichlet alpha = 0.05, tau = 3, eta = 2e-3 for every
  method, batch 128, 10,000 rounds, under Bernoulli (the FOCUS rate preset) and Markov
  participation; SG-FOCUS, FedAvg, FedAU, SCAFFOLD, MIFA; random crop and flip as in its code.
- ``fedsum-mnist``: the FedSUM paper's MNIST experiment (seed 004, appendix H): its MNIST CNN,
  N = 100 clients, K = 10 local steps, batch 128, 2,000 rounds, decaying local step size,
  patterns P1/P2/P3. The paper's alpha, step sizes and pattern rates were lost in extraction;
  the values below are our choices (P1-P3 as in ``focusfl reproduce delays``).
- ``fedsum-resnet18``: the FedSUM paper's appendix H.6: ResNet-18 on CIFAR-10 or CIFAR-100
  (``--dataset``), N = 50 clients, 10 sampled uniformly per round, K = 10 local steps, batch 32,
  Dirichlet split, SGD without weight decay; FedSUM, FedAvg, SCAFFOLD. alpha, both step sizes
  and the number of rounds were lost in extraction or never given: the values below are ours.
- ``fedsum-biased``: the FedSUM paper's appendix H.8: biased sampling, client i (from 1) joins
  each round with probability 0.5 - 0.05 * floor((i - 1) / 11) (the ``banded`` process);
  FedSUM against FedAvg. The paper names neither the data nor the model: ours is
  fedsum-mnist's setting (MNIST, its CNN, N = 100, K = 10, batch 128, 2,000 rounds).
- ``fedsum-sst2``: the FedSUM paper's appendix H.7: bert-base-uncased with a linear classifier
  fine-tuned on SST-2, its training set split into 8 equal iid parts, 2 clients sampled
  uniformly per round, K = 3 local steps, batch 4, SGD without weight decay; FedSUM against
  FedAvg (SCAFFOLD and FedSUM-CR did not converge there). The step sizes, rounds, maximum
  sequence length and evaluation split are ours. It runs on the user's local folders (``--data``,
  ``--model``); nothing is downloaded.
- ``mnist-demo``: a small version on an .npz of MNIST digits that runs on a CPU in minutes
  (the acceptance setting: 32 clients, alpha = 0.1, Bernoulli preset, 20% held out).

Every preset runs on the user's data (``--data-dir``, ``--download``; fedsum-sst2: ``--data``,
``--model``), builds the problem once, runs each (scenario, algorithm) pair with the vectorized
engine, and writes summary.csv,
one metrics CSV per run, figure.png/pdf (test accuracy and losses per scenario) and
partition.png (the clients' label histograms). Algorithms not registered in this build are
skipped with a note.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import ALGORITHMS, algorithm_class
from ..algorithms.importing import ALLOW_FLAG, allow_flag_help, is_algorithm_import
from ..data.plots import plot_label_histograms, plot_training_bands
from ..argtypes import BATCH_RUNS_HELP, batch_runs_value
from ..errors import ConfigError
from ..io.atomic import read_csv, write_csv, write_text
from ..io.folders import open_store
from ..problems import make_problem
from ..runs.config import DTYPES, RunConfig, WithRun
from ..runs.driver import resolve_device
from ..runs.folder import METRICS, read_config
from ..spec import format_spec, parse_spec
from ..sweeps.layout import RUNS
from .preset import Preset
from ..sweeps.sweep import make_experiment, restart_note, run_sweep
from ..sweeps.tune import choice_columns, choose, grid_rows, is_diverged, search_steps, split_algorithms, with_validation


@dataclass(frozen=True)
class Setup:
    """One preset: the problem, the participation scenarios and per-algorithm hyperparameters."""

    title: str
    problem: dict[str, Any]
    scenarios: dict[str, str]  # label -> participation spec
    algorithms: dict[str, dict[str, Any]]  # name -> make_algorithm overrides (lr, local_steps, ...)
    rounds: int
    eval_every: int
    schedule: str = "constant"
    notes: list[str] = field(default_factory=list)
    # The step-size search (`--steps tuned`, the default): the preset's step times these factors,
    # each run tune_rounds rounds (evaluated every tune_eval_every) on the clients' validation share.
    tune_rounds: int = 30
    tune_eval_every: int = 3
    factors: tuple[float, ...] = (1 / 9, 1 / 3, 1.0, 3.0)


FOCUS_CIFAR10 = Setup(
    title="FOCUS appendix G: CIFAR-10, 32 clients, Dirichlet alpha=0.05, tau=3, eta=2e-3",
    problem={"name": "nn", "data": "cifar10", "model": "focus-cnn", "clients": 32, "partition": "dirichlet",
             "alpha": 0.05, "batch": 128, "augment": "crop-flip"},  # the paper's code crops and flips
    scenarios={"bernoulli (FOCUS preset p_i)": "bernoulli", "markov (p_i, rho_i per client)": "markov"},
    algorithms={name: {"lr": 2e-3, "local_steps": 3} for name in ("sg_focus", "fedavg", "fedau", "scaffold", "mifa")},
    rounds=10_000,
    eval_every=50,
    tune_rounds=1_000,
    tune_eval_every=50,
)

# The FOCUS authors' CIFAR-10 experiment as they ran it (github.com/BichengYing/FedASL: main.py with
# figures/bashes/run.sh, --seed=66, 32 clients). Their "bern" participation draws, after seeding
# numpy's global generator with the seed, p_i ~ U(0.1, 0.3) for the first int(0.9 N) clients and
# U(0.1, 0.9) for the other N - int(0.9 N), then flips one coin per client and round. Their
# "markov" participation steps every client's state with the transition matrix below, whose two
# rows are equal: the next state is present with probability 0.2 whatever the current one, so each
# client joins each round i.i.d. with p = 0.2 (the p_i it draws only set the state before the first
# transition). That is what the "Markov" panel of their Figure 9 measured.
AUTHORS_SEED = 66
AUTHORS_MARKOV_MATRIX = ((0.8, 0.2), (0.8, 0.2))  # rows: from absent, from present; columns: to absent, to present


def authors_bernoulli_rates(num_clients: int, seed: int = AUTHORS_SEED) -> list[float]:
    """The p_i of the authors' "bern" participation for ``num_clients`` clients (numpy's legacy
    generator seeded as their main.py seeds it: the same numbers on every machine)."""
    rng = np.random.RandomState(seed)
    low = rng.uniform(0.1, 0.3, size=int(num_clients * 0.9))
    high = rng.uniform(0.1, 0.9, size=num_clients - int(num_clients * 0.9))
    return [float(f"{p:.6g}") for p in np.concatenate([low, high])]


def authors_markov_rate(matrix=AUTHORS_MARKOV_MATRIX) -> float | None:
    """The join probability of the authors' "markov" chain when both rows are equal (then the chain
    has no memory: i.i.d. Bernoulli with this p); None for a chain with memory."""
    (_, from_absent), (_, from_present) = matrix
    return from_absent if from_absent == from_present else None


def authors_scenarios(num_clients: int) -> dict[str, str]:
    """The two participation forms of the authors' CIFAR-10 runs, as focusfl SPECs."""
    rates = ";".join(f"{p:g}" for p in authors_bernoulli_rates(num_clients))
    return {"the authors' bern (their p_i, seed 66)": f"bernoulli:p={rates}",
            f"the authors' \"markov\" (i.i.d. Bernoulli({authors_markov_rate():g}): equal rows)":
                f"bernoulli:p={authors_markov_rate():g}"}


# Their logs' final test accuracy (iteration 9,999, the last evaluation of 10,000 rounds).
PUBLISHED_SOURCE = ("BichengYing/FedASL, figures/logs/<method>_arbitrary_cifar10_0.002_<bern|markov>_3.log: "
                    "the test accuracy of the last evaluation (iteration 9999)")
PUBLISHED = {
    "bern": {"sg_focus": 0.778320, "fedau": 0.751465, "scaffold": 0.485254},
    "markov": {"sg_focus": 0.789551, "fedau": 0.760547, "fedavg": 0.764453, "scaffold": 0.482715},
}
PARTICIPATION_FORMS = ("focusfl", "authors", "both")


def published_for(label: str) -> dict[str, float]:
    """The authors' published accuracies of the scenario ``label`` (one of authors_scenarios')."""
    if label.startswith("the authors' bern"):
        return PUBLISHED["bern"]
    if label.startswith("the authors' \"markov\""):
        return PUBLISHED["markov"]
    return {}


FEDSUM_MNIST = Setup(
    title="FedSUM appendix H: MNIST, 100 clients, K=10, batch 128, eta_r = eta/sqrt(r/10+1)",
    problem={"name": "nn", "data": "mnist", "model": "fedsum-mnist-cnn", "clients": 100, "partition": "dirichlet",
             "alpha": 0.1, "batch": 128},
    scenarios={"P1: uniform, 20 of 100": "uniform:m=20", "P2: independent, FOCUS preset p_i": "bernoulli",
               "P3: sine p_i(r), a=0.3, period 20": "sine:a=0.3,period=20"},
    algorithms={
        **{name: {"lr": 0.05, "local_steps": 10, "server_lr": 1.0}
           for name in ("fedsum", "fedsum_cr", "fedavg", "fedau", "fedawe", "fedvarp", "mifa", "scaffold")},
        # FOCUS's server step is eta times the SUM of 100 gradients: the same per-round move as
        # FedAvg's K * eta_local needs eta = K * 0.05 / 100; 0.002 keeps it stable.
        "sg_focus": {"lr": 0.002, "local_steps": 10},
    },
    rounds=2_000,
    eval_every=20,
    tune_rounds=200,
    tune_eval_every=20,
    schedule="sqrt",
    notes=["alpha=0.1, the step sizes and the P1-P3 rates are our choices (lost in the paper's extraction)"],
)

# FedSUM appendix H.6. The paper gives N, m, K, the batch, plain SGD and the three algorithms; the
# values of alpha, the local and global steps (one per dataset) did not survive the extraction, and
# the number of rounds is not given. The two datasets share every other setting, so that one
# command line (`--dataset`) serves both.
RESNET18_ALGORITHMS = ("fedsum", "fedavg", "scaffold")


def fedsum_resnet18(dataset: str, label: str) -> Setup:
    """The H.6 preset on one dataset (cifar10 or cifar100)."""
    return Setup(
        title=f"FedSUM appendix H.6: ResNet-18 on {label}, 50 clients, 10 sampled per round, K=10, batch 32",
        problem={"name": "nn", "data": dataset, "model": "resnet18-gn", "clients": 50, "partition": "dirichlet",
                 "alpha": 0.1, "batch": 32},
        scenarios={"uniform, 10 of 50": "uniform:m=10"},
        algorithms={name: {"lr": 0.05, "local_steps": 10, "server_lr": 1.0} for name in RESNET18_ALGORITHMS},
        rounds=2_000,
        eval_every=20,
        tune_rounds=200,
        tune_eval_every=20,
        notes=[
            "alpha=0.1, the local step 0.05 (tuned over x1/9..x3 by default) and the global step 1.0 are our "
            "choices (lost in the paper's extraction)",
            "2,000 rounds (Table 2's; H.6 gives none), a constant local step and no augmentation are our choices",
            "ResNet-18 here has GroupNorm (2 groups) in place of batch norm, whose running statistics do not "
            "federate; the paper does not say which normalisation it used",
        ],
    )


FEDSUM_RESNET18 = {"cifar10": fedsum_resnet18("cifar10", "CIFAR-10"),
                   "cifar100": fedsum_resnet18("cifar100", "CIFAR-100")}

# FedSUM appendix H.8: client i (counted from 1) joins with p = 0.5 for i = 1..11, 0.45 for 12..22,
# 0.40 for 23..33, ..., which is `banded` with bands of 11 from 0.5 down by 0.05 (with N = 100 the
# last band, client 100, has 0.05). The paper states only the rates and the two algorithms; the
# rest is fedsum-mnist's setting (appendix H's Table 2, the one with N = 100 that the bands fit).
FEDSUM_BIASED = Setup(
    title="FedSUM appendix H.8: biased sampling, p=0.5 for clients 1-11, 0.45 for 12-22, ...; MNIST, 100 clients",
    problem=dict(FEDSUM_MNIST.problem),
    scenarios={"biased: p=0.5, 0.45, ... per 11 clients": "banded:width=11,top=0.5,step=0.05"},
    algorithms={name: {"lr": 0.05, "local_steps": 10, "server_lr": 1.0} for name in ("fedsum", "fedavg")},
    rounds=2_000,
    eval_every=20,
    tune_rounds=200,
    tune_eval_every=20,
    schedule="sqrt",
    notes=["MNIST, the fedsum-mnist-cnn, N=100, K=10, batch 128, 2,000 rounds and the decaying step are our "
           "choices (H.8 names no data set or model: appendix H's main setting); alpha=0.1 and the step sizes "
           "are our choices, as in fedsum-mnist"],
)

# FedSUM appendix H.7. The paper gives the model (bert-base-uncased + one linear layer), the
# 8 equal iid parts, 2 clients sampled per round, K = 3, batch 4, plain SGD and the two
# algorithms; the step sizes were lost in the extraction and rounds, sequence length and the
# evaluation split are not given. GLUE's SST-2 test split has no labels (-1), so the labelled
# validation split (872 sentences) is the test set here.
SST2_MAX_LENGTH = 66  # about SST-2's longest sentence in bert-base-uncased tokens; longer ones are truncated

FEDSUM_SST2 = Setup(
    title="FedSUM appendix H.7 setting (the paper: bert-base-uncased on SST-2): 8 iid clients, 2 sampled per round, "
          "K=3, batch 4",
    problem={"name": "nn", "data": "hf:", "input": "sentence", "label": "label", "test_split": "validation",
             "clients": 8, "partition": "iid", "batch": 4, "max_length": SST2_MAX_LENGTH},
    scenarios={"uniform, 2 of 8": "uniform:m=2"},
    algorithms={name: {"lr": 0.01, "local_steps": 3, "server_lr": 1.0} for name in ("fedsum", "fedavg")},
    rounds=1_000,
    eval_every=50,
    tune_rounds=100,
    tune_eval_every=10,
    notes=[
        "SCAFFOLD and FedSUM-CR are left out: the paper reports that they do not converge in this experiment",
        "the local step 0.01 (tuned over x1/9..x3 by default) and the global step 1.0 are our choices (lost in "
        "the paper's extraction)",
        f"1,000 rounds, max_length={SST2_MAX_LENGTH} tokens and SST-2's labelled validation split as the test set "
        "(GLUE's test labels are hidden) are our choices (H.7 gives none of them)",
        "the classifier is transformers' BertForSequenceClassification head (the pretrained pooler, then one new "
        "linear layer), trained with dropout off (docs/neural-networks.md says why)",
    ],
)

MNIST_DEMO = Setup(
    title="MNIST demo: 32 clients, Dirichlet alpha=0.1, Bernoulli preset, 20% held out, tau=5, batch 32",
    problem={"name": "nn", "model": "fedsum-mnist-cnn", "clients": 32, "partition": "dirichlet", "alpha": 0.1,
             "batch": 32, "test_fraction": 0.2},
    scenarios={"bernoulli (FOCUS preset p_i)": "bernoulli"},
    algorithms={
        # The server steps on the SUM of 32 tracked gradients: the stable step is about N times
        # FedAvg's over the clients' averaging. 0.01 reached 0.95 here but sits at the edge (on 45
        # digits per client it blew up: test loss 2.3 -> 2,500); 0.005 keeps a factor 2 of margin
        # (0.943 here; 50 digits per client and gamma-2 contrast checked, docs/neural-networks.md).
        "sg_focus": {"lr": 0.005, "local_steps": 5},
        "fedavg": {"lr": 0.05, "local_steps": 5},
        "fedau": {"lr": 0.05, "local_steps": 5},
        # SCAFFOLD diverged within 50 rounds at 0.05 in this setting; 0.02 is stable.
        "scaffold": {"lr": 0.02, "local_steps": 5},
    },
    rounds=300,
    eval_every=25,
)


def with_own_algorithms(setup: Setup, only: list[str] | None) -> tuple[Setup, list[str] | None]:
    """The preset with the user's own algorithms among ``only`` (``file.py:Class[:key=value,...]``,
    imported with --allow-algorithm-import) added to its algorithms, and ``only`` by their names.
    Such an algorithm starts from the preset's FedAvg step and local steps (the SPEC may give its
    own lr and local_steps); --steps tuned then searches its step around that as for the others."""
    if not only:
        return setup, only
    added, names = {}, []
    for item in only:
        name, params = parse_spec(item)
        if is_algorithm_import(name):
            if name in added:
                raise ConfigError(f"--algorithms names {name!r} twice")
            algorithm_class(name)  # imported now, with the command's permission
            base = setup.algorithms.get("fedavg") or next(iter(setup.algorithms.values()))
            added[name] = {"lr": base["lr"], "local_steps": base["local_steps"], **params}
        names.append(name)
    return dataclasses.replace(setup, algorithms={**setup.algorithms, **added}), names


def available(setup: Setup, only: list[str] | None) -> tuple[list[str], list[str]]:
    """(algorithms to run, notes about skipped ones)."""
    wanted = only or list(setup.algorithms)
    unknown = [a for a in wanted if a not in setup.algorithms]
    if unknown:
        raise ConfigError(f"algorithm {unknown[0]!r} is not part of this preset (has: {', '.join(setup.algorithms)})")
    missing = [a for a in wanted if a not in ALGORITHMS and not is_algorithm_import(a)]
    notes = [f"note: {a} is not registered in this build of focusfl; skipped" for a in missing]
    return [a for a in wanted if a not in missing], notes


# -- step sizes -----------------------------------------------------------------------------------
def _entry(name: str, hyperparameters: dict, lr) -> dict:
    """The sweep's algorithm table of a preset algorithm at step(s) ``lr``."""
    return {"name": name, **hyperparameters, "lr": lr}


def _label(name: str, hyperparameters: dict) -> str:
    """How the sweep names the algorithm (its SPEC without lr and local_steps)."""
    return format_spec(name, {k: v for k, v in hyperparameters.items() if k not in ("lr", "local_steps")})


def _sweep(name: str, algorithms: list[dict], run: RunConfig, participation: str, seeds: list[int], rounds: int,
           eval_every: int):
    """The sweep of ``algorithms`` (tables with their steps) under ``participation``: the
    preset's run record ``run`` (its problem, dtype, device, schedule) over ``seeds``."""
    return make_experiment(name=name, algorithms=algorithms, problems=[run.problem], participation=[participation],
                           seeds=seeds, rounds=rounds, eval_every=eval_every, schedule=run.schedule, dtype=run.dtype,
                           device=run.device)


def tune_steps(setup: Setup, run: RunConfig, algorithms: list[str], args: PresetOptions, folder: Path) -> list[dict]:
    """Each algorithm's step per scenario, chosen on the clients' validation share (never the
    test set): the preset's step times ``setup.factors``, extended past an end by the search rule
    of ``focusfl tune`` (:func:`focusfl.sweeps.tune.search_steps`) until the chosen step is
    interior or bounded by a diverged step; ``--tune-rounds`` rounds, ``--seeds`` seeds, ranked by
    the mean validation loss over the last third of the evaluations (a step whose runs diverge, or
    oscillate at the end, loses), one grid point below the edge of stability
    (:func:`focusfl.sweeps.tune.pick_stable`). One row per (scenario, algorithm) with the
    chosen step, its neighbours, the reason and every grid point's score."""
    tuned = run.replace(problem=with_validation(run.problem, args.validation))
    seeds = list(range(run.seed, run.seed + (args.tune_seeds or args.seeds)))
    rounds = args.tune_rounds or setup.tune_rounds
    eval_every = min(args.tune_eval_every or setup.tune_eval_every, rounds)
    grids = {name: [float(f"{setup.algorithms[name]['lr'] * f:.3g}") for f in setup.factors] for name in algorithms}
    choices = []
    for scenario, participation in setup.scenarios.items():
        steps = {name: list(grid) for name, grid in grids.items()}
        found: dict = {}

        def tables(experiment, runs, where, *, band, failures) -> list[str]:
            found["trials"] = grid_rows(runs, where, None)
            write_csv(where / "grid.csv", found["trials"])
            return ["grid.csv"]

        def evaluate(asked: dict[str, list[float]]) -> dict[str, list[dict]]:
            for name, new in asked.items():
                steps[name] = sorted(set(steps[name]) | set(new))
            entries = [_entry(name, setup.algorithms[name], lrs) for name, lrs in steps.items()]
            experiment = _sweep("tune steps", entries, tuned, participation, seeds, rounds, eval_every)
            report = run_sweep(experiment, folder / f"tuning-{scenario_tag(participation)}", workers=args.workers,
                               threads=run.threads, progress=True, kind="tune", tables=tables,
                               batch_runs=args.batch_runs)
            _raise_failures(report, "tuning")
            return {name: [t for t in found["trials"] if t["algorithm"] == _label(name, setup.algorithms[name])
                           and t["lr"] in new] for name, new in asked.items()}

        searched = search_steps(evaluate, grids, pick=choose)
        for name in algorithms:
            choice = searched[name]
            label = _label(name, setup.algorithms[name])
            trials = sorted((t for t in found["trials"] if t["algorithm"] == label), key=lambda t: t["lr"])
            choices.append({
                "scenario": scenario, "algorithm": name, "lr": choice.lr, "steps": "tuned",
                "preset_lr": setup.algorithms[name]["lr"], "score": choice.trial["final"],
                "every_step_diverged": all(is_diverged(t) for t in trials),
                **choice_columns(choice),
                "grid": ";".join(f"{t['lr']:g}={t['final']:.4g}" + (" (diverged)" if is_diverged(t) else "")
                                 for t in trials),
            })
    return choices


def step_reason(row: dict) -> str:
    """Why a tuned step was chosen, with its neighbours (a steps.csv row)."""
    def neighbour(lr, score) -> str:
        if lr is None:
            return "none"
        return f"{lr:g} ({score})" if isinstance(score, str) else f"{lr:g} ({score:.3g})"

    text = (f"{row['reason']}; below {neighbour(row['lower_lr'], row['lower_score'])}, above "
            f"{neighbour(row['upper_lr'], row['upper_score'])}")
    if row["added_steps"]:
        text += f"; added beyond the grid: {row['added_steps'].replace(';', ', ')}"
    if row["capped"]:
        text += "; CAPPED: a step further out may do better"
    return text


def fixed_steps(setup: Setup, algorithms: list[str]) -> list[dict]:
    return [{"scenario": scenario, "algorithm": name, "lr": setup.algorithms[name]["lr"], "steps": "fixed",
             "preset_lr": setup.algorithms[name]["lr"]}
            for scenario in setup.scenarios for name in algorithms]


def _raise_failures(report, phase: str) -> None:
    if report.restarted:
        print(restart_note(report))
    if report.failed:
        first = report.failed[0]
        raise ConfigError(f"{len(report.failed)} {phase} run(s) failed (the first, {first['algorithm']} seed "
                          f"{first['seed']}: {first['error']}); run the same command again to retry them")


# -- the runs -------------------------------------------------------------------------------------
def run_final(setup: Setup, run: RunConfig, steps: list[dict], args: PresetOptions, folder: Path):
    """The preset's runs at the chosen steps, ``--seeds`` seeds each, ``--workers`` at a time:
    (panels: scenario -> algorithm -> one row list per seed, summary rows)."""
    seeds = list(range(run.seed, run.seed + args.seeds))
    rounds, eval_every = run.rounds, run.eval_every
    panels: dict[str, dict[str, list[list[dict]]]] = {}
    summary = []
    for scenario, participation in setup.scenarios.items():
        chosen = [row for row in steps if row["scenario"] == scenario]
        entries = [_entry(row["algorithm"], setup.algorithms[row["algorithm"]], row["lr"]) for row in chosen]
        experiment = _sweep(setup.title, entries, run, participation, seeds, rounds, eval_every)
        where = folder / f"runs-{scenario_tag(participation)}"
        report = run_sweep(experiment, where, workers=args.workers, threads=run.threads, progress=True, kind="sweep",
                           tables=lambda *a, **k: [], batch_runs=args.batch_runs)
        _raise_failures(report, "preset")
        by_label: dict[str, list[tuple[list[dict], int | None]]] = {}
        for done in report.runs:
            info = read_config(where / RUNS / done.key)
            rows = [_typed(row) for row in read_csv(where / RUNS / done.key / METRICS)]
            by_label.setdefault(done.axes["algorithm"], []).append((rows, info.get("diverged_at_round")))
        panels[scenario] = {}
        for row in chosen:
            name = row["algorithm"]
            runs = by_label[_label(name, setup.algorithms[name])]
            panels[scenario][name] = [rows for rows, _ in runs]
            summary.append(summary_row(name, participation, runs, row["lr"], row["steps"]))
    return panels, summary


def _typed(row: dict) -> dict:
    """A metrics.csv row with numbers as numbers (empty cells dropped, the diverged flag kept)."""
    out: dict = {}
    for key, cell in row.items():
        if cell in ("", None):
            continue
        try:
            out[key] = float(cell)
        except ValueError:
            out[key] = cell
    return out


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def summary_row(name: str, spec: str, runs: list[tuple[list[dict], int | None]], lr: float, steps: str) -> dict:
    """One (scenario, algorithm) over its seeds. A run that diverged is named as diverged at its
    round, never given a final accuracy: the final columns are left empty then, and ``status``
    says which seeds diverged where."""
    diverged = [at for _, at in runs if at is not None]
    finished = [rows for rows, at in runs if at is None]
    finals = [rows[-1]["test_accuracy"] for rows in finished]
    bests = [max(r["test_accuracy"] for r in rows if math.isfinite(r.get("test_accuracy", math.nan)))
             for rows, _ in runs if any(math.isfinite(r.get("test_accuracy", math.nan)) for r in rows)]
    if not diverged:
        status = "complete"
    elif len(runs) == 1:
        status = f"diverged at round {diverged[0]}"
    else:
        status = f"{len(diverged)} of {len(runs)} seeds diverged (first at round {min(diverged)})"
    return {
        "algorithm": name,
        "participation": spec,
        "lr": lr,
        "steps": steps,
        "seeds": len(runs),
        "rounds": int(max(rows[-1]["round"] for rows, _ in runs)),
        "status": status,
        "final_test_accuracy": None if diverged else _mean(finals),
        "final_test_accuracy_min": None if diverged else min(finals),
        "final_test_accuracy_max": None if diverged else max(finals),
        "best_test_accuracy": _mean(bests),
        "final_test_loss": None if diverged else _mean([rows[-1]["test_loss"] for rows in finished]),
        "diverged_at": min(diverged) if diverged else None,
    }


def format_table(summary: list[dict]) -> str:
    # The participation column is as wide as the longest spec (banded:width=11,... is 36 characters).
    width = max([22] + [len(row["participation"]) for row in summary])
    header = (f"{'algorithm':<10} {'participation':<{width}} {'lr':>8} {'steps':>6} {'final acc':>9} "
              f"{'(min - max)':>15} {'best acc':>9} {'test loss':>10}")
    lines = [header, "-" * len(header)]
    for row in summary:
        head = f"{row['algorithm']:<10} {row['participation']:<{width}} {row['lr']:>8.3g} {row['steps']:>6}"
        best = "" if row["best_test_accuracy"] is None else f"{row['best_test_accuracy']:>9.4f}"
        if row["final_test_accuracy"] is None:
            lines.append(f"{head} {row['status']}" + (f"; best acc before {best.strip()}" if best else ""))
            continue
        span = f"({row['final_test_accuracy_min']:.3f} - {row['final_test_accuracy_max']:.3f})" if row["seeds"] > 1 else ""
        lines.append(f"{head} {row['final_test_accuracy']:>9.4f} {span:>15} {best:>9} {row['final_test_loss']:>10.4f}")
    return "\n".join(lines)


def docs_table(summary: list[dict], steps: list[dict], scenarios: dict[str, str]) -> str:
    """table.md: the preset's result as docs/neural-networks.md shows it (a Markdown table), made
    from its summary.csv and steps.csv rows (``scenarios``: the setting's name -> participation
    SPEC), so that the page shows what the command gives."""
    several = len({row["participation"] for row in summary}) > 1
    seeds = max((int(row["seeds"]) for row in summary), default=1)
    header = (["scenario"] if several else []) + [
        "algorithm", "preset's step", "grid (mean validation loss, last third of the trial)",
        "chosen (the search's reason)", f"final test accuracy, mean (min - max) over {seeds} seeds", "best",
        "final test loss"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    chosen = {(scenarios[row["scenario"]], row["algorithm"]): row for row in steps}
    for row in summary:
        step = chosen.get((row["participation"], row["algorithm"]), {})
        cells = ([row["participation"]] if several else []) + [
            row["algorithm"], format(float(step.get("preset_lr") or row["lr"]), "g"),
            _grid_cell(step), _chosen_cell(row, step), _accuracy_cell(row),
            "" if row["best_test_accuracy"] in (None, "") else f"{float(row['best_test_accuracy']):.4f}",
            "" if row["final_test_loss"] in (None, "") else f"{float(row['final_test_loss']):.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _grid_cell(step: dict) -> str:
    if not step.get("grid"):
        return "-"
    added = set(str(step.get("added_steps") or "").split(";")) - {""}
    cells = []
    for point in str(step["grid"]).split(";"):
        lr, _, score = point.partition("=")
        mark = " (added)" if lr in added else ""
        shown = "diverged" if score.endswith("(diverged)") else format(float(score), ".3g")
        cells.append(f"{float(lr):.3g}{mark}: {shown}")
    return ", ".join(cells)


def _chosen_cell(row: dict, step: dict) -> str:
    lr = format(float(row["lr"]), ".3g")
    return f"{lr} ({step['reason']})" if step.get("reason") else f"{lr} ({row['steps']})"


def _accuracy_cell(row: dict) -> str:
    if row["final_test_accuracy"] in (None, ""):
        return str(row["status"])
    mean = f"{float(row['final_test_accuracy']):.4f}"
    if int(row["seeds"]) < 2:
        return mean
    return f"{mean} ({float(row['final_test_accuracy_min']):.3f} - {float(row['final_test_accuracy_max']):.3f})"


TAG_LENGTH = 48  # a longer tag (a spec with per-client rates) keeps its start and a digest of the whole


def scenario_tag(spec: str) -> str:
    """The <scenario> of the file names: the participation spec made file-safe
    (``bernoulli`` -> figure_bernoulli.png, ``uniform:m=20`` -> figure_uniform-m-20.png); a spec
    too long for a readable name (32 per-client rates) becomes its start and a digest."""
    tag = re.sub(r"[^A-Za-z0-9]+", "-", spec).strip("-")
    if len(tag) <= TAG_LENGTH:
        return tag
    return f"{tag[:24].rstrip('-')}-{hashlib.sha256(spec.encode()).hexdigest()[:10]}"


def _named(value: Any) -> str:
    """A data set or model as a title names it: a folder or file by its name, a zoo entry as is."""
    text = str(value)
    for prefix in ("hf-config:", "hf:"):
        text = text.removeprefix(prefix)
    return Path(text).name if ("/" in text or text.endswith(".npz")) else text


def ran_line(problem: Any, summary: list[dict]) -> str:
    """What a preset actually ran, for its figures' titles: the data and model as given (not the
    setting's name for them), the clients and split, the rounds and seeds of its runs."""
    spec = problem.describe() if hasattr(problem, "describe") else dict(problem)
    split = spec.get("partition", "")
    if split == "dirichlet":
        split = f"Dirichlet α={spec.get('alpha'):g}"
    rounds = max((row["rounds"] for row in summary), default=0)
    seeds = max((row["seeds"] for row in summary), default=0)
    return (f"ran: {_named(spec.get('model'))} on {_named(spec.get('data'))}, {spec.get('clients')} clients "
            f"({split}), batch {spec.get('batch')}, {rounds} rounds, {seeds} seed(s)")


def write_outputs(folder: Path, setup: Setup, panels, summary, steps, problem) -> list[str]:
    """summary.csv, steps.csv, figure_<scenario>.png/pdf (seed bands) and partition.png; the names.
    A figure's title is the setting's, then what was actually run (ran_line), then the scenario."""
    written = ["summary.csv", "steps.csv", "table.md", "partition.png"]
    write_csv(folder / "summary.csv", summary)
    write_csv(folder / "steps.csv", steps)
    write_text(folder / "table.md", docs_table(summary, steps, setup.scenarios))
    ran = ran_line(problem, summary)
    for scenario, runs in panels.items():
        tag = scenario_tag(setup.scenarios[scenario])
        chosen = {row["algorithm"]: row for row in steps if row["scenario"] == scenario}
        labelled = {f"{name} (lr {chosen[name]['lr']:g}, {chosen[name]['steps']})": seeds for name, seeds in runs.items()}
        plot_training_bands(labelled, [folder / f"figure_{tag}.png", folder / f"figure_{tag}.pdf"],
                            title=f"{setup.title}\n{ran}\n{scenario}")
        written += [f"figure_{tag}.png", f"figure_{tag}.pdf"]
    plot_label_histograms(problem.label_histograms(), folder / "partition.png")
    return written


def run_preset(setup: Setup, spec: dict, algorithms: list[str], args: PresetOptions, folder: Path):
    """The whole preset on the user's data ``spec`` into the focusfl folder ``folder`` (a rerun
    skips finished runs): steps (tuned unless ``--steps fixed``), the runs over the seeds, tables
    and figures. Returns (summary rows, steps rows)."""
    summary, steps, _ = run_preset_runs(setup, spec, algorithms, args, folder)
    return summary, steps


def run_preset_runs(setup: Setup, spec: dict, algorithms: list[str], args: PresetOptions, folder: Path):
    """:func:`run_preset`, returning the runs too: (summary rows, steps rows, panels: scenario ->
    algorithm -> one row list per seed)."""
    run = preset_run(setup, args, spec)
    resolved = run.with_problem_defaults()
    problem = make_problem(run.problem, dtype=DTYPES[resolved.dtype], device=str(resolve_device(run.device)))
    with open_store(folder, kind="reproduce-nn") as store:
        steps = (tune_steps(setup, run, algorithms, args, store.path) if args.steps == "tuned"
                 else fixed_steps(setup, algorithms))
        panels, summary = run_final(setup, resolved, steps, args, store.path)
        written = write_outputs(store.path, setup, panels, summary, steps, problem)
        store.mark(written, folders=[p.name for p in store.path.iterdir() if p.is_dir() and not p.name.startswith(".")])
    return summary, steps, panels


@dataclass(frozen=True)
class PresetOptions(WithRun):
    """A preset's command line as a record: its run fields (rounds, eval_every, seed, dtype,
    device: a RunConfig; None: the preset's own) and its own knobs."""

    out: str
    run: RunConfig | None = None
    data: str | None = None
    model: str | None = None  # fedsum-sst2: the local transformers model (and tokenizer) folder
    data_dir: str | None = None
    download: bool = False
    algorithms: str | None = None
    seeds: int = 2
    steps: str = "tuned"
    validation: float | None = None
    tune_rounds: int | None = None
    tune_eval_every: int | None = None
    workers: int | None = None  # None: 2, or 1 on a one-core machine (speed only: each run has its threads)
    batch_runs: int | str = "auto"  # runs stepped together (runs/batch.py)
    tune_seeds: int | None = None  # seeds per step-size trial (None: ``seeds``)


# The run fields a preset's command line takes.
RUN_OPTIONS = ("rounds", "eval_every", "seed", "dtype", "device", "dp")


def preset_run(setup: Setup, args: PresetOptions, spec: dict) -> RunConfig:
    """The preset's run record on the user's data ``spec``: the command line's run fields (the
    preset's rounds and evaluation cadence unless given), its problem and its schedule."""
    run = args.run or RunConfig(rounds=setup.rounds, eval_every=setup.eval_every, dtype=None)
    return run.replace(problem=spec, schedule=setup.schedule, eval_every=run.eval_every or setup.eval_every)


def preset_arguments(setup: Setup, default_out: str | None, *, npz_required: bool = False,
                     out_help: str = "output folder", folders=None):
    """The preset's own options (its run fields are generated by the command line from RUN_OPTIONS);
    ``folders(parser)``, when given, adds the data options in place of ``--data-dir``/``--download``
    (or ``--data`` for an .npz)."""
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        if folders is not None:
            folders(parser)
        elif npz_required:
            parser.add_argument("--data", required=True, help="an .npz of digits: images [M,28,28], labels [M]")
        else:
            parser.add_argument("--data-dir",
                                help="folder with the dataset files (default $FOCUSFL_DATA or ~/.cache/focusfl)")
            parser.add_argument("--download", action="store_true", help="fetch a missing dataset (checksum-verified)")
        parser.add_argument("--out", default=default_out, help=out_help)
        parser.add_argument("--algorithms", default=None,
                            help=f"comma-separated subset of {','.join(setup.algorithms)}; your own algorithm "
                            "as path/to/file.py:Class[:key=value,...] with --allow-algorithm-import (it starts "
                            "from the preset's FedAvg step and local steps)")
        parser.add_argument(ALLOW_FLAG, action="store_true", help=allow_flag_help("--algorithms"))
        parser.add_argument("--seeds", type=int, default=2,
                            help="seeds per step size and per final run; figures draw their mean and min-max band")
        parser.add_argument("--steps", choices=["tuned", "fixed"], default="tuned",
                            help="tuned (default): each algorithm's step chosen on the clients' validation share; "
                            "fixed: the preset's steps")
        parser.add_argument("--validation", type=float, default=None,
                            help="share of each client's data held out to choose the steps on (default 0.1)")
        parser.add_argument("--tune-rounds", type=int, default=None,
                            help=f"rounds per step-size trial (default {setup.tune_rounds})")
        parser.add_argument("--tune-eval-every", type=int, default=None,
                            help=f"evaluate the trials every E rounds (default {setup.tune_eval_every})")
        parser.add_argument("--tune-seeds", type=int, default=None,
                            help="seeds per step-size trial (default: --seeds)")
        parser.add_argument("--workers", type=int, default=None,
                            help="runs at a time on this machine, each with one thread (default: 2, or 1 on a "
                            "one-core machine; the numbers do not depend on it)")
        parser.add_argument("--batch-runs", type=batch_runs_value, default="auto", metavar="auto|K",
                            help=BATCH_RUNS_HELP)

    return add_arguments


def run_defaults(setup: Setup) -> dict:
    """The preset's defaults of its run fields on the command line."""
    return {"rounds": setup.rounds, "eval_every": setup.eval_every}


def problem_spec(setup: Setup, args: PresetOptions) -> dict:
    spec = dict(setup.problem)
    if args.data:
        spec["data"] = str(Path(args.data).expanduser())
    if args.data_dir:
        spec["data_dir"] = str(args.data_dir)
    if args.download:
        spec["download"] = True
    return spec


def sst2_folders(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="SST-2 in a local folder: glue/sst2 saved with save_to_disk, or its parquet files "
                        "(train-*.parquet, validation-*.parquet)")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="a local bert-base-uncased folder: config.json, model.safetensors and its tokenizer")


def sst2_spec(setup: Setup, args: PresetOptions) -> dict:
    """fedsum-sst2's problem on the user's folders (absolute paths: config.json replays anywhere)."""
    data, model = (Path(folder).expanduser().absolute() for folder in (args.data, args.model))
    return {**setup.problem, "data": f"hf:{data}", "tokenizer": str(model), "model": f"hf:{model}"}


def make_runner(setup: Setup, spec_of=problem_spec, notes_after=None):
    """The preset's command, taking its PresetOptions; ``spec_of(setup, options)`` is its problem
    on the user's data; ``notes_after(summary)``: lines printed after the table."""
    def run(args: PresetOptions) -> int:
        for key in ("tune_rounds", "tune_eval_every", "seeds", "workers", "tune_seeds"):
            value = getattr(args, key)
            if value is not None and value < 1:
                raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {value}")
        if args.validation is not None and not 0 < args.validation < 1:
            raise ConfigError(f"--validation must be in (0, 1), got {args.validation}")
        if args.workers is None:  # speed only: every run computes with its own threads whatever the count
            args = dataclasses.replace(args, workers=min(2, os.cpu_count() or 1))
        only = split_algorithms(args.algorithms) if args.algorithms else None
        chosen, only = with_own_algorithms(setup, only)
        algorithms, notes = available(chosen, only)
        for note in notes + [f"note: {n}" for n in chosen.notes]:
            print(note)
        if not algorithms:
            raise ConfigError("none of the preset's algorithms is registered")
        summary, steps = run_preset(chosen, spec_of(chosen, args), algorithms, args, Path(args.out))
        if args.steps == "tuned":
            print("steps chosen on the clients' validation share (steps.csv has every grid point's score):")
            for row in steps:
                print(f"  {row['scenario']}: {row['algorithm']} lr {row['lr']:g} (preset {row['preset_lr']:g}); "
                      f"{step_reason(row)}")
        print(format_table(summary))
        for line in (notes_after(summary) if notes_after is not None else []):
            print(line)
        print(f"\nwrote {Path(args.out) / 'summary.csv'}, steps.csv, table.md, figure_*.png, partition.png and the runs' "
              "folders")
        return 0

    return run


def dataset_arguments(setups: dict[str, Setup], name: str):
    """A preset with one Setup per dataset: ``--dataset`` picks it, the rest is
    :func:`preset_arguments` (the Setups share rounds, evaluation and tuning horizons, which the
    options' defaults show), and ``--out`` defaults to runs/<name>-<dataset>."""
    first = next(iter(setups))
    common = preset_arguments(setups[first], None, out_help=f"output folder (default runs/{name}-DATASET)")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dataset", choices=list(setups), default=first,
                            help=f"the data set and its setting (default {first})")
        common(parser)

    return add_arguments


@dataclass(frozen=True)
class DatasetPresetOptions(PresetOptions):
    """A preset with one setting per data set: PresetOptions and the ``--dataset`` it runs."""

    dataset: str | None = None


def make_dataset_runner(setups: dict[str, Setup], name: str):
    runners = {dataset: make_runner(setup) for dataset, setup in setups.items()}

    def run(args: DatasetPresetOptions) -> int:
        dataset = args.dataset or next(iter(setups))
        if dataset not in setups:
            raise ConfigError(f"--dataset must be one of {', '.join(setups)}, got {dataset!r}")
        if args.out is None:
            args = dataclasses.replace(args, out=f"runs/{name}-{dataset}")
        return runners[dataset](args)

    return run


@dataclass(frozen=True)
class CifarPresetOptions(PresetOptions):
    """focus-cifar10's options: PresetOptions and which participation forms it runs."""

    participation_form: str = "focusfl"


def cifar_arguments(setup: Setup, default_out: str):
    common = preset_arguments(setup, default_out)

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        common(parser)
        parser.add_argument("--participation-form", choices=PARTICIPATION_FORMS, default="focusfl",
                            help="the default, 'focusfl': Bernoulli with the FOCUS preset p_i and a real Markov chain; "
                            "authors: the authors' own runs' forms (their bern p_i, seed 66, and their \"markov\", "
                            "which is i.i.d. Bernoulli(0.2)), printed beside their published accuracies; both: all four")

    return add_arguments


def cifar_setup(setup: Setup, form: str) -> Setup:
    """focus-cifar10's setting under the participation ``form`` (PARTICIPATION_FORMS)."""
    if form not in PARTICIPATION_FORMS:
        raise ConfigError(f"--participation-form must be one of {', '.join(PARTICIPATION_FORMS)}, got {form!r}")
    authors = authors_scenarios(int(setup.problem["clients"]))
    scenarios = {"focusfl": setup.scenarios, "authors": authors, "both": {**setup.scenarios, **authors}}[form]
    return dataclasses.replace(setup, scenarios=scenarios)


def format_published(summary: list[dict], scenarios: dict[str, str]) -> list[str]:
    """Lines: the authors' published final accuracy beside ours, per scenario and algorithm they ran."""
    lines = []
    for label, spec in scenarios.items():
        published = published_for(label)
        for name, accuracy in published.items():
            ours = next((row for row in summary if row["algorithm"] == name and row["participation"] == spec), None)
            shown = ("not run" if ours is None else ours["status"] if ours["final_test_accuracy"] is None
                     else f"{ours['final_test_accuracy']:.4f} after {ours['rounds']} rounds")
            lines.append(f"  {label}: {name} published {accuracy:.4f} (10,000 rounds), ours {shown}")
    if lines:
        lines.insert(0, f"the authors' published final test accuracy beside ours (source: {PUBLISHED_SOURCE}):")
    return lines


def make_cifar_runner(setup: Setup):
    """focus-cifar10's command: make_runner over the setting of the asked participation forms, then
    the authors' published accuracies beside ours."""
    def run(args: CifarPresetOptions) -> int:
        chosen = cifar_setup(setup, args.participation_form)
        return make_runner(chosen, notes_after=lambda summary: format_published(summary, chosen.scenarios))(args)

    return run


def _preset(name: str, help_text: str, setup: Setup, add_arguments, run, options: type = PresetOptions) -> Preset:
    return Preset(name, help_text, add_arguments, options, run, RUN_OPTIONS, run_defaults(setup))


PRESETS = (
    _preset("focus-cifar10", "FOCUS paper appendix G: SG-FOCUS and baselines on CIFAR-10 (32 clients, alpha=0.05); "
            "--participation-form authors runs the authors' own participation forms",
            FOCUS_CIFAR10, cifar_arguments(FOCUS_CIFAR10, "runs/focus-cifar10"), make_cifar_runner(FOCUS_CIFAR10),
            CifarPresetOptions),
    _preset("fedsum-mnist", "FedSUM paper appendix H: MNIST CNN, 100 clients, patterns P1-P3",
            FEDSUM_MNIST, preset_arguments(FEDSUM_MNIST, "runs/fedsum-mnist"), make_runner(FEDSUM_MNIST)),
    _preset("fedsum-resnet18",
            "FedSUM paper appendix H.6: ResNet-18 on CIFAR-10 or CIFAR-100 (--dataset), 50 clients, 10 per round; "
            "FedSUM, FedAvg, SCAFFOLD", FEDSUM_RESNET18["cifar10"],
            dataset_arguments(FEDSUM_RESNET18, "fedsum-resnet18"),
            make_dataset_runner(FEDSUM_RESNET18, "fedsum-resnet18"), DatasetPresetOptions),
    _preset("fedsum-biased",
            "FedSUM paper appendix H.8: FedSUM vs FedAvg under biased sampling (p=0.5 for clients 1-11, "
            "0.45 for 12-22, ...)",
            FEDSUM_BIASED, preset_arguments(FEDSUM_BIASED, "runs/fedsum-biased"), make_runner(FEDSUM_BIASED)),
    _preset("fedsum-sst2",
            "FedSUM paper appendix H.7: bert-base-uncased on SST-2, 8 iid clients, 2 per round; FedSUM vs FedAvg "
            "(--data DIR --model DIR, local folders)",
            FEDSUM_SST2, preset_arguments(FEDSUM_SST2, "runs/fedsum-sst2", folders=sst2_folders),
            make_runner(FEDSUM_SST2, sst2_spec)),
    _preset("mnist-demo",
            "small MNIST run on CPU in minutes: SG-FOCUS vs FedAvg, FedAU, SCAFFOLD (--data PATH.npz)",
            MNIST_DEMO, preset_arguments(MNIST_DEMO, "runs/mnist-demo", npz_required=True), make_runner(MNIST_DEMO)),
)
