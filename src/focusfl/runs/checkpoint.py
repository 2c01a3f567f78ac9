"""Checkpoints of a run: algorithm state, round, traffic so far, participation stream, metrics length.

A checkpoint is a ``torch.save`` of plain containers of tensors and numbers, read back with
``torch.load(weights_only=True)``: loading one never executes code. Every tensor is checked
against a freshly initialised state of the same algorithm and problem (field names, shapes,
dtypes) before it is used, and the file's size against the memory available before it is read.
Randomness is keyed by (seed, round, client), so the round number is the whole RNG position;
a sequential participation process (Markov) also saves the last row it drew.
"""
from __future__ import annotations

import math
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..algorithms.base import State
from ..engine.divergence import BlowUpDetector
from ..engine.loop import Resume, RunResult, TrainLoss
from ..errors import DataError
from ..io.atomic import open_atomic
from ..limits import check_allocation, human_bytes

CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
FORMAT = 1


@dataclass
class Checkpoint:
    state: State
    round: int  # rounds completed
    comm: tuple[float, float]  # cumulative floats sent (down, up) after ``round``
    metrics_bytes: int  # length of metrics.csv that belongs to rounds 0..round
    stream: dict[str, Any]  # participation.stream_state()
    blow_up: dict[str, Any] = field(default_factory=dict)  # BlowUpDetector.state()
    # TrainLoss.state(): the minibatch losses the rounds since the last row returned (an nn run's).
    metrics_state: dict[str, float | int] = field(default_factory=dict)


def take_checkpoint(result: RunResult, participation: Any, metrics_bytes: int) -> Checkpoint:
    """The checkpoint of a run after ``result.rounds_done`` rounds, whose metrics.csv is
    ``metrics_bytes`` long (without a closing row: engine/loop.py): everything
    :func:`resume_from` needs to go on exactly."""
    return Checkpoint(
        state=result.state, round=result.rounds_done, comm=result.comm, metrics_bytes=metrics_bytes,
        stream=participation.stream_state(), blow_up=result.blow_up.state(), metrics_state=result.train_loss.state(),
    )


def resume_from(checkpoint: Checkpoint, participation: Any) -> Resume:
    """Put the checkpoint's participation stream back into the run's (fresh) ``participation``;
    the Resume to execute it from. The row of the checkpoint's round is in metrics.csv already
    (unless it was a closing row, which the checkpoint leaves out), and rounds are evaluated as
    from round 0."""
    participation.restore_stream(checkpoint.stream)
    return Resume(state=checkpoint.state, start_round=checkpoint.round, comm_before=checkpoint.comm,
                  evaluate_start=False, eval_origin=0, blow_up=BlowUpDetector().restore(checkpoint.blow_up),
                  train_loss=TrainLoss.restore(checkpoint.metrics_state))


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor alone: torch.save writes a view's whole storage, so a view is copied."""
    tensor = tensor.detach()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size() or not tensor.is_contiguous():
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _fields(named_tuple: Any) -> dict[str, torch.Tensor]:
    return {name: _owned(value) for name, value in named_tuple._asdict().items()}


def atomic_torch_save(payload: Any, path: Path) -> None:
    """Write ``payload`` to ``path`` so that the file is either the old one or the new one, whole;
    durably, as it is what a run resumes from after a crash."""
    with open_atomic(path, "wb", durable=True) as handle:
        torch.save(payload, handle)


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    stream = dict(checkpoint.stream)
    if "last" in stream:
        stream = {"next": int(stream["next"]), "last": torch.as_tensor(stream["last"], dtype=torch.bool)}
    payload = {
        "format": FORMAT,
        "round": int(checkpoint.round),
        "comm_down": float(checkpoint.comm[0]),
        "comm_up": float(checkpoint.comm[1]),
        "metrics_bytes": int(checkpoint.metrics_bytes),
        "server": _fields(checkpoint.state.server),
        "clients": _fields(checkpoint.state.clients),
        "participation": stream,
        "blow_up": dict(checkpoint.blow_up),
        "metrics_state": dict(checkpoint.metrics_state),
    }
    atomic_torch_save(payload, path)


def save_model(path: Path, model: torch.Tensor) -> None:
    """The final server model as a flat tensor ``{"x": [d]}`` (``torch.load(weights_only=True)``)."""
    atomic_torch_save({"format": FORMAT, "x": _owned(model)}, path)


# What a checkpoint holds beyond its tensors' bytes: the zip's records and directory, the
# pickled structure and the numbers (a few kB), and each tensor's record aligned to 64 bytes.
CHECKPOINT_OVERHEAD = 1 << 20
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
RECORD_OVERHEAD = 4096


def expected_size(reference: State, num_clients: int) -> int:
    """The most bytes a checkpoint of a run whose fresh state is ``reference`` can take: its
    tensors, the participation stream's row (N bools) and the container's overhead."""
    tensors = [*reference.server, *reference.clients]
    stored = sum(t.numel() * t.element_size() for t in tensors)
    return stored + num_clients + len(tensors) * RECORD_OVERHEAD + CHECKPOINT_OVERHEAD


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise DataError(f"checkpoint {str(path)!r}: cannot read it ({exc.strerror or exc})") from None


def _read(path: Path, device: torch.device, limit: int | None = None) -> dict:
    """The checkpoint's payload, read in place (never copied), after its size is checked: against
    ``limit`` (the size this run's checkpoint can have) and the memory available."""
    size = _size(path)
    if limit is not None and size > limit:
        raise DataError(f"checkpoint {str(path)!r} is {human_bytes(size)}, more than the {human_bytes(limit)} a "
                        "checkpoint of this run takes; it is not this run's checkpoint")
    check_allocation(2 * size, f"checkpoint {str(path)!r} ({human_bytes(size)})")
    if _head(path) != ZIP_MAGIC:
        raise DataError(f"checkpoint {str(path)!r} is not a torch checkpoint (a zip archive of tensors); "
                        "focusfl reads no other kind of file (never a pickle)")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing a file
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"checkpoint {str(path)!r} is unreadable ({_load_failure(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise DataError(f"checkpoint {str(path)!r} is not a focusfl checkpoint of format {FORMAT}")
    return payload


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(ZIP_MAGIC))
    except OSError as exc:
        raise DataError(f"checkpoint {str(path)!r}: cannot read it ({exc.strerror or exc})") from None


def _load_failure(exc: BaseException) -> str:
    """torch.load's reason in a few words (its weights-only refusal is a page of advice)."""
    text = str(exc).strip()
    if "Weights only load failed" in text:
        return "it holds objects other than tensors and numbers, which focusfl never loads"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first.split(". ")[0][:160]


def _number(payload: dict, key: str, kind: type, path: Path):
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise DataError(f"checkpoint {str(path)!r}: {key!r} is missing or not a{'n integer' if kind is int else ' number'}")
    if value < 0:
        raise DataError(f"checkpoint {str(path)!r}: {key!r} is negative")
    return kind(value)


def _match(saved: Any, reference: Any, part: str, path: Path) -> Any:
    """Rebuild ``reference``'s NamedTuple from the saved tensors, checking names, shapes, dtypes."""
    fields = reference._asdict()
    if not isinstance(saved, dict) or set(saved) != set(fields):
        got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise DataError(f"checkpoint {str(path)!r}: {part} state has fields {got}, expected {sorted(fields)}")
    rebuilt = {}
    for name, ref in fields.items():
        value = saved[name]
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape or value.dtype != ref.dtype:
            what = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise DataError(
                f"checkpoint {str(path)!r}: {part}.{name} is {what}, expected {tuple(ref.shape)} {ref.dtype}"
                " (was it written by another problem or algorithm?)"
            )
        rebuilt[name] = value.to(ref.device)
    return type(reference)(**rebuilt)


def load_checkpoint(path: Path, reference: State, num_clients: int) -> Checkpoint:
    """Read and validate a checkpoint against ``reference`` (a fresh ``algorithm.init`` state)."""
    path = Path(path)
    device = next(iter(reference.server._asdict().values())).device
    payload = _read(path, device, limit=expected_size(reference, num_clients))
    state = State(
        _match(payload.get("server"), reference.server, "server", path),
        _match(payload.get("clients"), reference.clients, "clients", path),
    )
    stream = payload.get("participation") or {}
    if stream:
        last = stream.get("last")
        if not isinstance(last, torch.Tensor) or last.shape != (num_clients,) or not isinstance(stream.get("next"), int):
            raise DataError(f"checkpoint {str(path)!r}: its participation stream does not fit {num_clients} clients")
        stream = {"next": stream["next"], "last": last.cpu().numpy()}
    return Checkpoint(
        state=state,
        round=_number(payload, "round", int, path),
        comm=(_number(payload, "comm_down", float, path), _number(payload, "comm_up", float, path)),
        metrics_bytes=_number(payload, "metrics_bytes", int, path),
        stream=stream,
        blow_up=_blow_up(payload.get("blow_up") or {}, path),
        metrics_state=_metrics_state(payload.get("metrics_state") or {}, path),
    )


def _metrics_state(state: Any, path: Path) -> dict[str, float | int]:
    """TrainLoss.state() as saved: a small dict of names to finite numbers."""
    if not isinstance(state, dict) or len(state) > 16 or not all(
        isinstance(k, str) and not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        for k, v in state.items()
    ):
        raise DataError(f"checkpoint {str(path)!r}: its metrics state is malformed")
    return state


def _blow_up(state: Any, path: Path) -> dict[str, Any]:
    try:
        BlowUpDetector().restore(state)
    except (ValueError, AttributeError):
        raise DataError(f"checkpoint {str(path)!r}: its blow-up detector state is malformed") from None
    return state


def load_model(path: Path) -> torch.Tensor:
    """The model saved by :func:`save_model` (tensors only; no code runs)."""
    payload = _read(Path(path), torch.device("cpu"))
    if not isinstance(payload, dict) or not isinstance(payload.get("x"), torch.Tensor):
        raise DataError(f"model file {str(path)!r} holds no model tensor 'x'")
    return payload["x"]
