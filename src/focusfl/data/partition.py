"""Splitting a labelled training set among N clients: iid, shards, Dirichlet label skew.

A partition is a list of N disjoint index arrays into the training set, or (natural-id partitions,
which may have 10^5 clients and more) a :class:`ClientRows`: every client's rows in one array with
N + 1 offsets, never a copy per client. Every partitioner is
deterministic given its numpy Generator, so (dataset, parameters, seed) fixes the clients' data.

- ``iid``: a random permutation cut into N near-equal parts.
- ``shards`` (McMahan et al., 2017): samples sorted by label, cut into N * ``shards`` equal
  shards, each client gets ``shards`` random ones (so about ``shards`` classes per client).
- ``dirichlet`` (label skew as in Hsu et al., 2019 and the NIID-Bench code that the FOCUS and
  FedSUM experiments follow): for each class c, proportions p_c ~ Dirichlet(alpha * 1_N) split
  that class's samples among the clients; small alpha gives each client one or two classes.
  While drawing, clients that already hold more than M/N samples get no more (this keeps sizes
  from exploding), and the whole draw is repeated until every client has ``min_size`` samples.
  When many clients share few classes (N = 100 at alpha = 0.05 on a 10-class dataset: each
  class lands on one or two clients, and about 8 clients get nothing in every draw) no draw
  succeeds; after MAX_DIRICHLET_DRAWS the draw that came closest is topped up: each client
  short of ``min_size`` takes the missing samples, at random, from the client that holds the
  most (so it gets that client's one or two classes: the skew stays as extreme).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import ConfigError
from ..limits import check_allocation

# Draws tried before topping up the closest one (the presets' partitions need at most 20).
MAX_DIRICHLET_DRAWS = 100


@dataclass(frozen=True)
class ClientRows:
    """The clients' training rows, compressed: client i holds ``rows[starts[i]:starts[i + 1]]``
    (sorted). Reads as the list of per-client arrays it replaces (``len``, indexing, iteration
    give views), while the problem keeps the two arrays only."""

    rows: np.ndarray  # int64 [total]
    starts: np.ndarray  # int64 [N + 1]

    @classmethod
    def from_parts(cls, parts: Sequence[np.ndarray]) -> "ClientRows":
        sizes = np.fromiter((len(part) for part in parts), dtype=np.int64, count=len(parts))
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        rows = np.concatenate([np.asarray(part, dtype=np.int64) for part in parts]) if len(parts) else \
            np.zeros(0, dtype=np.int64)
        return cls(rows, starts)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    def owners(self) -> np.ndarray:
        """The client of each entry of ``rows``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, client: int) -> np.ndarray:
        return self.rows[self.starts[client] : self.starts[client + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


def client_rows(parts: Sequence[np.ndarray] | ClientRows) -> ClientRows:
    """A partition as :class:`ClientRows` (itself if it is one)."""
    return parts if isinstance(parts, ClientRows) else ClientRows.from_parts(parts)


def partition_iid(labels: np.ndarray, clients: int, rng: np.random.Generator, **_) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), clients)]


def partition_shards(
    labels: np.ndarray, clients: int, rng: np.random.Generator, *, shards: int = 2, **_
) -> list[np.ndarray]:
    total = clients * shards
    if total > len(labels):
        raise ConfigError(f"shards partition: {clients} clients x {shards} shards exceeds {len(labels)} samples")
    # A stable sort after a shuffle: ties (same label) are in random order.
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, total)
    owner = rng.permutation(total).reshape(clients, shards)
    return [np.sort(np.concatenate([pieces[j] for j in owner[i]])) for i in range(clients)]


def partition_dirichlet(
    labels: np.ndarray,
    clients: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    min_size: int = 10,
    **_,
) -> list[np.ndarray]:
    if not alpha > 0:
        raise ConfigError(f"dirichlet partition: alpha must be > 0, got {alpha}")
    if min_size < 1 or min_size * clients > len(labels):
        raise ConfigError(
            f"dirichlet partition: min_size must be in 1..{len(labels) // clients} for {clients} clients "
            f"and {len(labels)} samples, got {min_size}"
        )
    classes = np.unique(labels)
    closest, missing = None, None
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts = _dirichlet_draw(labels, classes, clients, alpha, rng)
        short = sum(max(0, min_size - len(p)) for p in parts)
        if short == 0:
            return [np.sort(p) for p in parts]
        if missing is None or short < missing:
            closest, missing = parts, short
    return [np.sort(p) for p in _top_up(closest, min_size, rng)]


def _top_up(parts: list[np.ndarray], min_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Give every client short of ``min_size`` samples taken at random from the largest client."""
    parts = [rng.permutation(p) for p in parts]
    for i in range(len(parts)):
        need = min_size - len(parts[i])
        if need > 0:
            donor = int(np.argmax([len(p) for p in parts]))
            parts[i] = np.concatenate([parts[i], parts[donor][:need]])
            parts[donor] = parts[donor][need:]
    return parts


def _dirichlet_draw(labels, classes, clients, alpha, rng) -> list[np.ndarray]:
    cap = len(labels) / clients
    chunks: list[list[np.ndarray]] = [[] for _ in range(clients)]
    sizes = np.zeros(clients, dtype=np.int64)
    for c in classes:
        members = rng.permutation(np.flatnonzero(labels == c))
        open_clients = sizes < cap
        if not open_clients.any():
            open_clients[:] = True
        share = rng.dirichlet(np.full(clients, alpha)) * open_clients
        if not share.sum() > 0:  # tiny alpha: all mass fell on full clients; its limit is one client
            share = np.zeros(clients)
            share[rng.choice(np.flatnonzero(open_clients))] = 1.0
        cuts = (np.cumsum(share / share.sum()) * len(members)).astype(np.int64)[:-1]
        for i, piece in enumerate(np.split(members, cuts)):
            chunks[i].append(piece)
            sizes[i] += len(piece)
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in chunks]


# Flower's partitioners (flwr-datasets), by the name a spec gives them: partition=flwr-dirichlet
# splits the rows as DirichletPartitioner(..., seed=seed) does in a Flower app, row for row.
FLWR_PARTITIONERS = {
    "flwr-iid": "IidPartitioner",
    "flwr-dirichlet": "DirichletPartitioner",
    "flwr-pathological": "PathologicalPartitioner",
    "flwr-shard": "ShardPartitioner",
}


def flwr_partition(
    name: str, labels: np.ndarray, clients: int, seed: int, *, alpha: float = 0.5, min_size: int = 10,
    shards: int = 2, classes_per_client: int = 2,
) -> list[np.ndarray]:
    """Index arrays of the N clients as flwr-datasets' partitioner ``name`` makes them.

    The partitioner runs on a dataset of the labels alone (column ``label``) and the row
    numbers: Flower's label-based partitioners read nothing else, so client i gets the rows
    that ``load_partition(i)`` gives for the full dataset with the same arguments:
    ``IidPartitioner(N)`` (contiguous shards of the rows, in their order);
    ``DirichletPartitioner(N, "label", alpha, min_partition_size=min_size, seed=seed)``;
    ``PathologicalPartitioner(N, "label", classes_per_client, seed=seed)``;
    ``ShardPartitioner(N, "label", num_shards_per_partition=shards, seed=seed)``.
    """
    try:
        import datasets
        import flwr_datasets.partitioner as flwr
    except ImportError:
        raise ConfigError(f'partition={name} needs flwr-datasets: pip install ".[hf]" in a clone of focusfl '
                          '(or "focusfl[hf]" from a package index)') from None
    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict({"label": labels.astype(np.int64), "row": np.arange(len(labels))})
    kind = getattr(flwr, FLWR_PARTITIONERS[name])
    arguments = {
        "flwr-iid": {},
        "flwr-dirichlet": {"partition_by": "label", "alpha": alpha, "min_partition_size": min_size, "seed": seed},
        "flwr-pathological": {"partition_by": "label", "num_classes_per_partition": classes_per_client, "seed": seed},
        "flwr-shard": {"partition_by": "label", "num_shards_per_partition": shards, "seed": seed},
    }[name]
    try:
        with warnings.catch_warnings():  # its retries warn on stderr; the outcome is what counts
            warnings.simplefilter("ignore")
            partitioner = kind(num_partitions=clients, **arguments)
            partitioner.dataset = table
            return [np.sort(np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64)) for i in range(clients)]
    except (ValueError, KeyError, IndexError) as exc:
        text = str(exc).strip().splitlines()
        raise ConfigError(f"partition={name}: {text[0] if text else type(exc).__name__}") from None


def natural_partition(ids: np.ndarray, clients: int, column: str) -> ClientRows:
    """Client k holds the rows whose ``column`` has the k-th smallest distinct value (strings in
    lexicographic order), as flwr-datasets' NaturalIdPartitioner numbers its partitions.

    With more distinct values than clients, the first N values make the clients and the other
    rows are left out; with fewer, there is no such split. One stable sort of the rows by owner
    (O(M log M)), whatever the number of ids: 10^5 writers cost what 10 do.
    """
    values, owner = np.unique(ids, return_inverse=True)
    if len(values) < clients:
        raise ConfigError(f"partition=natural: column {column!r} has {len(values)} distinct ids, fewer than {clients} clients")
    owner = owner.reshape(-1)
    kept = np.flatnonzero(owner < clients)
    order = kept[np.argsort(owner[kept], kind="stable")]  # by owner, rows ascending within one
    starts = np.concatenate([[0], np.cumsum(np.bincount(owner[kept], minlength=clients))]).astype(np.int64)
    return ClientRows(order.astype(np.int64), starts)


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": partition_iid,
    "shards": partition_shards,
    "dirichlet": partition_dirichlet,
}


def make_partition(
    name: str, labels: np.ndarray, clients: int, seed: int, **params
) -> list[np.ndarray]:
    """Index arrays of the N clients; every client gets at least one sample."""
    if name not in PARTITIONERS:
        raise ConfigError(f"unknown partition {name!r} (known: {', '.join(PARTITIONERS)})")
    if clients < 1 or clients > len(labels):
        raise ConfigError(f"cannot split {len(labels)} samples among {clients} clients")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    parts = PARTITIONERS[name](np.asarray(labels), clients, rng, **params)
    if min(len(p) for p in parts) < 1:
        raise ConfigError(f"{name} partition left a client without data; use fewer clients")
    return parts


def check_client_tables(sizes: np.ndarray, batch: int, image: np.ndarray, itemsize: int) -> None:
    """ConfigError unless memory holds the clients' index table (their rows and offsets, 8 bytes
    an entry) and one client's minibatch (keys and positions, the stored and the standardised
    images), whose sizes come from options (clients, batch) rather than from the data."""
    width = max(batch, int(sizes.max()))
    per_sample = 32 + image.nbytes + image.size * itemsize
    check_allocation(
        8 * (int(sizes.sum()) + 2 * len(sizes)) + width * per_sample,
        f"nn problem: {len(sizes):,} clients' index tables and a minibatch of {batch:,} images",
        error=ConfigError,
    )


def label_histograms(labels: np.ndarray, parts: Sequence[np.ndarray] | ClientRows, num_classes: int) -> np.ndarray:
    """Counts ``[N, C]``: how many samples of each class every client holds (one bincount)."""
    what = f"label histograms of {len(parts):,} clients x {num_classes:,} classes"
    check_allocation(2 * 8 * len(parts) * num_classes, what, error=ConfigError)
    table = client_rows(parts)
    cells = table.owners() * num_classes + np.asarray(labels)[table.rows]
    return np.bincount(cells, minlength=len(table) * num_classes).reshape(len(table), num_classes).astype(np.int64)
