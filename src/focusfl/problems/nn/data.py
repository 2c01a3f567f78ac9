"""The clients' data of a neural-network problem and their keyed draws (FedJAX's client datasets
with their batching).

Data live on the problem's device: the training images once (uint8 when the files are), the
labels, and each client's rows (one array of every client's rows and their offsets). Client i's
minibatch at local step t of round r is drawn from (seed, r, i, t) with the counter-based hash of
``focusfl.rng``, so every engine sees the same samples; a client holding fewer samples than the
batch size uses all of them (its missing slots get weight 0). Dropout keys and the optional
augmentation (``crop_flip``) are drawn from the same coordinates.
"""
from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import numpy as np
import torch

from ...data import Dataset, ImageData
from ...data.partition import ClientRows, check_client_tables, client_rows
from ...device import host_values
from ...errors import ConfigError
from ...rng import hash_bits, uniform

# Last coordinate of the dropout-key hash; minibatch keys use sample positions there, which
# never reach this value, so the two streams cannot collide. Augmentation keys add one more
# coordinate (the sample's slot in the minibatch) after their own marker.
_DROPOUT_COORD = 0xFFFFFFFF
_AUGMENT_COORD = 0xFFFFFFFE
AUGMENT_PADDING = 4  # RandomCrop(32, padding=4) of the papers' CIFAR code


class ClientData:
    """The splits' samples on the device, the clients' rows, and the keyed minibatch draws.

    ``train``/``test`` have ``.images`` [M, ...] as stored and ``.labels`` [M]; ``parts`` are
    the clients' training rows, ``held`` the pooled validation rows. ``standardise``: images
    whose channels are standardised with the training set's statistics (token inputs are not).
    """

    def __init__(self, train, test, parts, held: np.ndarray, *, batch: int, num_clients: int, dtype: torch.dtype,
                 device: torch.device, augment: bool, standardise: bool) -> None:
        self.batch, self.num_clients, self.dtype, self.device, self.augment = batch, num_clients, dtype, device, augment
        self._store_samples(train, test, parts)
        if standardise:
            # Standardise every channel with the training set's mean and standard deviation.
            mean, std = channel_statistics(train.images)
            self.scale = torch.as_tensor(1.0 / std, dtype=dtype, device=device).view(-1, 1, 1)
            self.shift = torch.as_tensor(-mean / std, dtype=dtype, device=device).view(-1, 1, 1)
        # The clients' held-out samples, pooled: val_loss and val_accuracy are measured on them
        # (the data a step size is chosen on, never the test set).
        self.validation_images = torch.as_tensor(standard_strides(train.images[held]), device=device)
        self.validation_labels = torch.as_tensor(train.labels[held], dtype=torch.int64, device=device)

    def _store_samples(self, train, test, parts) -> None:
        dev = self.device
        self.train_images = torch.as_tensor(standard_strides(train.images), device=dev)
        self.train_labels = torch.as_tensor(train.labels, dtype=torch.int64, device=dev)
        self.test_images = torch.as_tensor(standard_strides(test.images), device=dev)
        self.test_labels = torch.as_tensor(test.labels, dtype=torch.int64, device=dev)
        table = client_rows(parts)
        sizes = table.sizes
        check_client_tables(sizes, self.batch, train.images[0], self.dtype.itemsize)
        # Every client's rows in one array and its offsets (no [N, largest client] table: a
        # natural partition of 10^5 writers, some with thousands of samples, would not fit).
        self.client_order = torch.as_tensor(table.rows, device=dev)
        self.client_starts = torch.as_tensor(table.starts[:-1], device=dev)
        self.sizes = torch.as_tensor(sizes, device=dev)
        self.host_sizes = np.asarray(sizes)  # the same, read on the host (largest_size)
        # Per-sample weight 1/(N m_i) of F = (1/N) sum_i mean_{s in i} loss_s (0 if unowned).
        weights = np.zeros(len(train.labels))
        weights[table.rows] = 1.0 / (self.num_clients * np.repeat(sizes, sizes))
        self.sample_weights = torch.as_tensor(weights, dtype=self.dtype, device=dev)
        # Minibatch keys cover this many positions for every client, whichever clients are active.
        self.positions = torch.arange(max(self.batch, int(sizes.max())), device=dev)

    def standardised(self, images: torch.Tensor) -> torch.Tensor:
        """Stored images (any leading shape) as standardised model inputs of the data's dtype,
        in the images' layout: NCHW, or channels-last (then the per-channel scale and shift are
        tiled over H, W, C, so the arithmetic runs along whole images, not runs of C values)."""
        if images.dim() >= 4 and not images.is_contiguous() and images.movedim(-3, -1).is_contiguous():
            h, w = images.shape[-2:]
            scale = self.scale.movedim(0, -1).expand(h, w, -1).contiguous()
            shift = self.shift.movedim(0, -1).expand(h, w, -1).contiguous()
            return (images.movedim(-3, -1).to(self.dtype) * scale + shift).movedim(-1, -3)
        return images.to(self.dtype) * self.scale + self.shift

    def largest_size(self, clients: torch.Tensor, sizes: torch.Tensor) -> int:
        """The most samples any of ``clients`` (not empty) holds; ``sizes``: theirs, on the device.
        Read on the host where the clients are a copy the host kept (the round loop's active sets,
        device.host_values): reading the device would wait for every kernel queued, once a round."""
        chosen = host_values(clients)
        if chosen is not None:
            return int(self.host_sizes[chosen].max())
        return int(sizes.max())  # a set made on the device (a batch of runs' clients): read there

    def sample_ids(self, clients: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The training samples at ``positions`` [..., n, k] of the clients' own index sets; a
        position past a client's size (a padding slot, weight 0) gives its first sample."""
        starts = self.client_starts.index_select(0, clients)[:, None]
        sizes = self.sizes.index_select(0, clients)[:, None]
        return self.client_order[torch.where(positions < sizes, starts + positions, starts)]

    def minibatch(self, seed, round_, clients, step, sizes, span=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[n, batch]`` into each client's index set, and their 0/1 weights; for a
        tensor of steps [S], ``[S, n, batch]``: each step's draw, the same as drawn alone.

        Every position j < size of client i gets the key uniform(seed, round, i, step, j); the
        ``batch`` smallest keys win (the same draw as ``rng.minibatch_indices``). Positions past
        the client's size get key 2 so they come last, and weight 0. ``span`` (at least the
        batch and the largest of ``sizes``) limits the positions hashed; the draw is the same.
        """
        positions = self.positions if span is None else self.positions[:span]
        step = step if isinstance(step, int) else step.view(-1, 1, 1)
        keys = uniform(seed, round_, clients[:, None], step, positions[None, :], device=self.device)
        keys = torch.where(positions[None, :] < sizes[:, None], keys, torch.full_like(keys, 2.0))
        picks = torch.topk(keys, self.batch, dim=-1, largest=False, sorted=True).indices
        return picks, (picks < sizes[:, None]).to(self.dtype)

    def draw(self, seed: int, round: int, clients: torch.Tensor, steps: torch.Tensor, sizes: torch.Tensor,
             width: int, largest: int, per_sample_hwc: bool) -> tuple[torch.Tensor, ...]:
        """The minibatches of ``steps`` [S]: stored images [S, n, width, ...] (cropped and flipped
        with augmentation), labels and weights [S, n, width] and dropout keys [S, n].
        ``per_sample_hwc``: each sample's values laid out H, W, C (what channels-last grouped
        convolutions take)."""
        picks, weights = self.minibatch(seed, round, clients, steps, sizes, span=max(self.batch, largest))
        picks, weights = picks[..., :width], weights[..., :width]
        ids = self.sample_ids(clients, picks)
        images = self.train_images[ids]
        step_coordinate = steps.view(-1, 1, 1)
        if self.augment:
            bits = hash_bits(seed, round, clients[:, None], step_coordinate, _AUGMENT_COORD,
                             self.positions[None, :width], device=self.device)
            images = crop_flip(images, bits, AUGMENT_PADDING, channels_last=per_sample_hwc)
        elif per_sample_hwc:
            images = images.movedim(-3, -1).contiguous().movedim(-1, -3)
        keys = hash_bits(seed, round, clients, steps.view(-1, 1), _DROPOUT_COORD, device=self.device)
        return images, self.train_labels[ids], weights, keys

    def fingerprint(self) -> str:
        """A digest of what the clients compute on: the training images and labels and the
        partition."""
        digest = hashlib.sha256()
        for tensor in (self.train_images, self.train_labels, self.client_order, self.sizes):
            array = tensor.detach().cpu().contiguous().numpy()
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.reshape(-1).view(np.uint8))
        return digest.hexdigest()[:32]


def crop_flip(images: torch.Tensor, bits: torch.Tensor, padding: int, channels_last: bool = False) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip of stored images ``[..., C, H, W]``.

    ``bits`` (32-bit hashes, one per image, shape ``images.shape[:-3]``) fix each image's crop
    offsets (0..2*padding in each direction, uniform) and its flip (probability 1/2): the
    transforms RandomCrop(H, padding) then RandomHorizontalFlip of the papers' code. Padding
    is 0 in stored units, which standardisation maps where Normalize maps a black border.

    One gather from the unpadded images, a pixel of the padding reading a clamped one that is
    then zeroed: no padded copy. With ``channels_last`` the result has the same values laid
    out channels-last (each image's pixels in H, W, C order), so the convolutions get them
    without a copy of standardised floats. Small images read every value's source from a table
    of every (offset, flip) case (128 CIFAR-10 images with their gather: 0.20 ms, against 0.39 ms
    making each pixel's source); larger ones make each pixel's source from tables of rows and
    columns (_crop_by_pixel).
    """
    *lead, c, h, w = images.shape
    count = math.prod(lead)
    bits = bits.reshape(-1)
    span = 2 * padding + 1
    top = bits % span
    left_flip = (bits // span) % span + (bits >> 31) * span  # the column table's row: left, then flipped
    tables = _crop_value_tables(c, h, w, padding, channels_last, images.device)
    if tables is not None:
        sources, inside = tables
        case = top * (2 * span) + left_flip
        picked = images.reshape(count, c * h * w).gather(1, sources.index_select(0, case))
        picked.mul_(inside.index_select(0, case))
    else:
        picked = _crop_by_pixel(images.reshape(count, c, h * w), top, left_flip, (h, w), padding, channels_last)
    if channels_last:
        return picked.view(*lead, h, w, c).movedim(-1, -3)
    return picked.view(*lead, c, h, w)


def _crop_by_pixel(flat: torch.Tensor, top: torch.Tensor, left_flip: torch.Tensor, side: tuple[int, int],
                   padding: int, channels_last: bool) -> torch.Tensor:
    """crop_flip of ``flat`` [count, C, H*W] with one source index per pixel, shared by the
    channels: for images whose table of every value would be too large."""
    count, c, hw = flat.shape
    row_starts, rows_inside, columns, columns_inside = _crop_tables(*side, padding, flat.device)
    source = (row_starts.index_select(0, top)[:, :, None] + columns.index_select(0, left_flip)[:, None, :])
    inside = rows_inside.index_select(0, top)[:, :, None] & columns_inside.index_select(0, left_flip)[:, None, :]
    picked = flat.gather(2, source.view(count, 1, hw).expand(count, c, hw))
    if channels_last:
        hwc = torch.empty((count, hw, c), dtype=flat.dtype, device=flat.device)
        torch.mul(picked.transpose(1, 2), inside.view(count, hw, 1), out=hwc)
        return hwc
    return picked.mul_(inside.view(count, 1, hw))


# The largest table of every crop case's sources (int64) and masks that crop_flip keeps per
# image shape and layout: CIFAR-10's is 4.5 MB, a 64 x 64 x 3 image's 18 MB.
CROP_TABLE_BYTES = 32 * 2**20


@functools.lru_cache(maxsize=16)
def _crop_value_tables(c: int, h: int, w: int, padding: int, channels_last: bool,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For every case ``top * 2 * span + left_flip``: the source of each output value in an
    image's C*H*W values (``[2 * span**2, C*H*W]``, in the output's layout, clamped) and whether
    it is inside the image; None when the tables would exceed CROP_TABLE_BYTES."""
    span = 2 * padding + 1
    cases = 2 * span * span
    if cases * c * h * w * 9 > CROP_TABLE_BYTES:
        return None
    row_starts, rows_inside, columns, columns_inside = _crop_tables(h, w, padding, device)
    top = torch.arange(span, device=device).repeat_interleave(2 * span)
    left_flip = torch.arange(2 * span, device=device).repeat(span)
    pixels = (row_starts[top][:, :, None] + columns[left_flip][:, None, :]).view(cases, 1, h * w)
    inside = (rows_inside[top][:, :, None] & columns_inside[left_flip][:, None, :]).view(cases, 1, h * w)
    planes = torch.arange(c, device=device).view(1, c, 1) * (h * w)
    sources, inside = pixels + planes, inside.expand(cases, c, h * w)
    if channels_last:
        sources, inside = sources.transpose(1, 2), inside.transpose(1, 2)
    return sources.reshape(cases, -1).contiguous(), inside.reshape(cases, -1).contiguous()


@functools.lru_cache(maxsize=16)
def _crop_tables(h: int, w: int, padding: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """For every crop offset: the first pixel of each source row (``[span, h]``, clamped) and
    whether the row is inside the image; for every (left offset, flip): the source column of
    each output column (``[2 * span, w]``, clamped) and whether it is inside."""
    span = 2 * padding + 1
    rows = torch.arange(span, device=device)[:, None] + torch.arange(h, device=device) - padding
    left = torch.arange(2 * span, device=device) % span
    flipped = torch.arange(2 * span, device=device) >= span
    columns = torch.arange(w, device=device).expand(2 * span, w)
    columns = torch.where(flipped[:, None], w - 1 - columns, columns) + left[:, None] - padding
    return (rows.clamp(0, h - 1) * w, (rows >= 0) & (rows < h),
            columns.clamp(0, w - 1), (columns >= 0) & (columns < w))


def standard_strides(array: np.ndarray) -> np.ndarray:
    """``array`` C-ordered with the strides a fresh array of its shape has.

    Indexing can leave an axis of size 1 with another stride: MNIST's [M, 1, 28, 28] after a
    split has strides (784, 1, 28, 1). numpy and torch call that contiguous, so neither
    ``np.ascontiguousarray`` nor ``.contiguous()`` changes it, but torch also reads it as
    channels-last: convolutions then run channels-last and a model's ``x.view(x.size(0), -1)``
    fails. A size-1 axis's stride addresses nothing, so the fix is a view, not a copy."""
    array = np.ascontiguousarray(array)
    standard, step = [], array.itemsize
    for size in reversed(array.shape):
        standard.append(step)
        step *= max(size, 1)
    standard = tuple(reversed(standard))
    if array.strides == standard or array.size == 0:
        return array
    return np.lib.stride_tricks.as_strided(array, shape=array.shape, strides=standard, writeable=array.flags.writeable)


def channel_statistics(images: np.ndarray, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of [M, C, H, W] images (1 where it is 0),
    accumulated in float64 over chunks so that CIFAR-sized uint8 data is never copied whole."""
    total = np.zeros(images.shape[1])
    squares = np.zeros(images.shape[1])
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk].astype(np.float64)
        total += block.sum(axis=(0, 2, 3))
        squares += np.square(block).sum(axis=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def split_test(dataset: Dataset, fraction: float, seed: int) -> tuple[ImageData, ImageData]:
    """(train, test): a random held-out ``fraction`` of the training images, or the dataset's
    own test split when ``fraction`` is 0."""
    if fraction > 0:
        pool = dataset.train
        order = np.random.default_rng(np.random.SeedSequence([seed, 13])).permutation(len(pool))
        held = int(round(fraction * len(pool)))
        if held < 1 or held >= len(pool):
            raise ConfigError(f"test_fraction={fraction} leaves no test or no training images")
        return pool.subset(np.sort(order[held:])), pool.subset(np.sort(order[:held]))
    if dataset.test is None:
        raise ConfigError(
            f"dataset {dataset.name!r} has no test split: hold some images out with test_fraction (e.g. 0.2)"
        )
    if dataset.test.images.shape[1:] != dataset.train.images.shape[1:]:
        raise ConfigError(f"dataset {dataset.name!r}: train and test images differ in shape")
    return dataset.train, dataset.test


def carve_validation(parts, fraction: float, seed: int) -> tuple[Any, np.ndarray]:
    """(training parts, pooled validation indices): each client holds out round(fraction * m_i)
    of its own samples, drawn by a key of (seed, client), and keeps at least one to train on.
    A fraction of 0 changes nothing (the same parts, no validation samples). A partition given as
    ClientRows comes back as ClientRows (the draw is a generator per client: a loop over clients,
    at set-up only)."""
    if fraction <= 0:
        return parts, np.zeros(0, dtype=np.int64)
    kept, held = [], []
    for client, part in enumerate(parts):
        count = min(int(round(fraction * len(part))), len(part) - 1)
        order = np.random.default_rng(np.random.SeedSequence([seed, 17, client])).permutation(len(part))
        kept.append(np.sort(part[order[count:]]))
        held.append(part[order[:count]])
    pooled = np.sort(np.concatenate(held)).astype(np.int64)
    if not len(pooled):
        raise ConfigError(f"validation={fraction} holds out no sample: the clients have too few")
    return (ClientRows.from_parts(kept) if isinstance(parts, ClientRows) else kept), pooled
