"""Is a data set where `--data` says, on this host? Standard library only: the controller sends this file's source to
every host (``python -c``) before any trial starts, and a rank calls ``check`` again before it reads anything.

``check(kind, root)`` returns what it found ({"kind", "root", "train", "test", "classes"}) or raises ``DataMissing``
with one line naming the path and what was expected. Layouts:
  fashion-mnist  ROOT/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]  (IDX: magic 0x0803 / 0x0801, big-endian sizes)
  cifar10        DIR/cifar-10-batches-py/{data_batch_1..5,test_batch}  (or DIR is that directory)
  imagefolder    DIR/train/CLASS/FILE and DIR/test/CLASS/FILE (or DIR/val/), the same classes in both
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import sys

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")


class DataMissing(ValueError):
    """The data set is not where `--data` says, or not in the expected layout."""


def idx_path(root: str, split: str, part: str) -> str:
    """The IDX file of a split ("train" | "t10k") and part ("images" | "labels"), gzip or not."""
    name = f"{split}-{part}-{'idx3' if part == 'images' else 'idx1'}-ubyte"
    for candidate in (os.path.join(root, name + ".gz"), os.path.join(root, name)):
        if os.path.isfile(candidate):
            return candidate
    raise DataMissing(f"{os.path.join(root, name)}[.gz]: no such file (expected the Fashion-MNIST IDX files; "
                      "install the Debian package dataset-fashion-mnist)")  # fmt: skip


def idx_header(path: str) -> tuple[int, ...]:
    """The sizes an IDX file declares (images: n, rows, cols; labels: n)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise DataMissing(f"{path}: unreadable ({e})") from None
    if len(head) < 8 or head[:2] != b"\0\0" or head[2] != 8 or head[3] not in (1, 3):
        raise DataMissing(f"{path}: not an IDX file of unsigned bytes (magic {head[:4].hex() or 'none'})")
    dims = head[3]
    if len(head) < 4 + 4 * dims:
        raise DataMissing(f"{path}: truncated IDX header")
    return struct.unpack(">" + "I" * dims, head[4 : 4 + 4 * dims])


def _fashion(root: str) -> dict:
    found = {}
    for split, key in (("train", "train"), ("t10k", "test")):
        images = idx_header(idx_path(root, split, "images"))
        labels = idx_header(idx_path(root, split, "labels"))
        if len(images) != 3 or len(labels) != 1 or images[0] != labels[0] or images[1:] != (28, 28):
            raise DataMissing(f"{root}: {split} images {images} and labels {labels} do not match (28x28, same count)")
        found[key] = images[0]
    return {**found, "classes": 10}


def _cifar(root: str) -> dict:
    base = root if os.path.basename(root.rstrip("/")) == "cifar-10-batches-py" else os.path.join(root, "cifar-10-batches-py")
    missing = [f for f in CIFAR_FILES if not os.path.isfile(os.path.join(base, f))]
    if missing:
        raise DataMissing(f"{base}: missing {', '.join(missing)} (expected CIFAR-10's python version: "
                          f"{', '.join(CIFAR_FILES)})")  # fmt: skip
    return {"train": 50000, "test": 10000, "classes": 10, "root": base}


def _imagefolder(root: str) -> dict:
    test_dir = next((d for d in ("test", "val") if os.path.isdir(os.path.join(root, d))), None)
    if not os.path.isdir(os.path.join(root, "train")) or test_dir is None:
        raise DataMissing(f"{root}: expected train/CLASS/IMAGE and test/CLASS/IMAGE (or val/) subdirectories")
    counts, classes = {}, {}
    for split, sub in (("train", "train"), ("test", test_dir)):
        d = os.path.join(root, sub)
        names = sorted(c for c in os.listdir(d) if os.path.isdir(os.path.join(d, c)))
        n = sum(1 for c in names for f in os.listdir(os.path.join(d, c)) if f.lower().endswith(IMAGE_SUFFIXES))
        if not names or n == 0:
            raise DataMissing(f"{d}: no CLASS/IMAGE files ({', '.join(IMAGE_SUFFIXES)})")
        counts[split], classes[split] = n, names
    if classes["train"] != classes["test"]:
        raise DataMissing(f"{root}: train/ and {test_dir}/ have different classes")
    return {**counts, "classes": len(classes["train"])}


def check(kind: str, root: str | None) -> dict:
    if kind == "synthetic":
        return {"kind": kind, "root": None}
    if not root or not os.path.isdir(root):
        raise DataMissing(f"{root}: no such directory (--data {kind})")
    found = {"fashion-mnist": _fashion, "cifar10": _cifar, "imagefolder": _imagefolder}[kind](root)
    return {"kind": kind, "root": root, **found}


def main(argv: list[str]) -> int:
    try:
        print(json.dumps(check(argv[0], argv[1] or None)))
    except DataMissing as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
