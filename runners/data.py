"""Real data inside a rank: load a data set, give each rank its own seeded shard, evaluate on the held-out split.

Sharding (documented in docs/results-format.md, "Data and evaluation"): every epoch e all ranks draw the same
permutation of the training set from ``torch.Generator().manual_seed(seed * 1_000_003 + e)``; rank r of w takes
positions r, r + w, r + 2w, ... of it and cuts its batches in order, so the ranks' shards are disjoint, together cover
the epoch (up to w - 1 samples dropped), and the order depends on the seed only, never on timing or the link rate.
No augmentation. Pixels are scaled to [0, 1] and normalised with the data set's mean and std (runners/catalog.py).
Evaluation: rank r scores test samples r, r + w, ...; losses, correct counts and each rank's count are summed with one
all-reduce, so every rank holds the same result (and can decide the same way whether the target is reached).
"""

from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass

import numpy as np
import torch

from runners import catalog, datafiles


@dataclass
class Split:
    images: torch.Tensor  # uint8, (n, channels, height, width)
    labels: torch.Tensor  # int64, (n,)


@dataclass
class DataSource:
    kind: str
    train: Split
    test: Split
    channels: int
    image_size: int
    classes: int
    mean: float
    std: float


def _read_idx(path: str) -> np.ndarray:
    dims = datafiles.idx_header(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    offset = 4 + 4 * len(dims)
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def _fashion(root: str) -> tuple[Split, Split]:
    def split(name: str) -> Split:
        images = _read_idx(datafiles.idx_path(root, name, "images"))
        labels = _read_idx(datafiles.idx_path(root, name, "labels"))
        return Split(torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))

    return split("train"), split("t10k")


def _cifar(root: str) -> tuple[Split, Split]:
    base = datafiles.check("cifar10", root)["root"]

    def load(files) -> Split:
        xs, ys = [], []
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                d = pickle.load(f, encoding="latin1")
            xs.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(d["labels"], dtype=np.int64))
        return Split(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))

    return load(datafiles.CIFAR_FILES[:5]), load(datafiles.CIFAR_FILES[5:])


def _imagefolder(root: str, image_size: int) -> tuple[Split, Split]:
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.Resize((image_size, image_size)), transforms.PILToTensor()])
    test_dir = "test" if os.path.isdir(os.path.join(root, "test")) else "val"

    def load(sub: str) -> Split:
        ds = datasets.ImageFolder(os.path.join(root, sub), transform=tf)
        xs = [ds[i][0].expand(3, -1, -1) for i in range(len(ds))]
        return Split(torch.stack(xs), torch.tensor(ds.targets, dtype=torch.int64))

    return load("train"), load(test_dir)


def load(spec: str, image_size: int) -> DataSource:
    """The data set `--data` names, both splits in memory (uint8). ValueError / DataMissing with one line."""
    entry, root = catalog.parse_data(spec)
    if entry.kind == "synthetic":
        raise ValueError("synthetic data is made by runners.models.build, not loaded")
    found = datafiles.check(entry.kind, root)
    if entry.kind == "fashion-mnist":
        train, test = _fashion(root)
    elif entry.kind == "cifar10":
        train, test = _cifar(root)
    else:
        train, test = _imagefolder(root, image_size)
    size = entry.image_size or image_size
    return DataSource(entry.kind, train, test, entry.channels or 3, size, entry.classes or found["classes"],
                      entry.mean, entry.std)  # fmt: skip


class ShardedBatches:
    """Rank `rank`'s batches of the training set, epoch after epoch (see the module docstring)."""

    def __init__(self, source: DataSource, *, rank: int, world_size: int, batch_size: int, seed: int,
                 device: torch.device) -> None:  # fmt: skip
        self.source, self.rank, self.world, self.batch, self.seed, self.device = (
            source, rank, world_size, batch_size, seed, device)  # fmt: skip
        n = len(source.train.labels)
        self.per_epoch = (n // world_size) // batch_size
        if self.per_epoch < 1:
            raise ValueError(f"--batch-size {batch_size} x {world_size} ranks is more than the {n} training samples")
        self._epoch, self._order = -1, None

    def shard(self, epoch: int) -> torch.Tensor:
        """The indices rank `rank` trains on in `epoch`, in order."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self.source.train.labels), generator=g)
        return perm[self.rank :: self.world][: self.per_epoch * self.batch]

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.shard(epoch)
        idx = self._order[i * self.batch : (i + 1) * self.batch]
        return self.inputs(self.source.train.images[idx]), self.source.train.labels[idx].to(self.device)

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32).div_(255.0).sub_(self.source.mean).div_(self.source.std)
        return x.to(self.device)


def evaluate(module: torch.nn.Module, source: DataSource, *, rank: int, world_size: int, device: torch.device,
             batch_size: int = 500) -> dict:  # fmt: skip
    """Test loss and accuracy on the whole test split, sharded across ranks and summed (one all-reduce).
    Returns {"test_loss", "test_accuracy", "counts": [samples scored by each rank]} (the same on every rank)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    images, labels = source.test.images[rank::world_size], source.test.labels[rank::world_size]
    loss_sum = correct = 0.0
    was_training = module.training
    module.eval()
    with torch.no_grad():
        for a in range(0, len(labels), batch_size):
            x = images[a : a + batch_size].to(torch.float32).div_(255.0).sub_(source.mean).div_(source.std)
            y = labels[a : a + batch_size].to(device)
            out = module(x.to(device))
            loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
            correct += float((out.argmax(dim=1) == y).sum())
    module.train(was_training)
    sums = torch.zeros(2 + world_size, dtype=torch.float64, device=device)
    sums[0], sums[1], sums[2 + rank] = loss_sum, correct, float(len(labels))
    dist.all_reduce(sums)
    counts = [int(c) for c in sums[2:].tolist()]
    total = sum(counts)
    return {"test_loss": float(sums[0]) / total, "test_accuracy": float(sums[1]) / total, "counts": counts}
