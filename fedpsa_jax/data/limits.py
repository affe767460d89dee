"""What a dataset may declare before any of it is read: checked from a file's header or a tfds spec, so that data
that cannot fit is refused in one line (`DataError`) before an allocation that would fail or take the machine.

- The images a run holds must fit in this machine's memory: a split (a tfds split, or a whole .npz) as stored
  plus its float32 copy, the least that loading and normalising it holds at once (`check_fits_memory`).
- One image, as the float32 sample a model takes, must fit in a batch (`config.rules.MAX_BATCH_BYTES`): a batch of
  one is the least any step holds (`check_image`).
- At most `MAX_CLASSES` classes: the labels are counted per class and the model's output layer has one unit per
  class, both allocated from the declared number.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from fedpsa_jax.config.rules import MAX_BATCH_BYTES
from fedpsa_jax.errors import DataError

# ImageNet-21k, the largest image-classification label set in common use, has 21,841 classes; this leaves room
# for far more while refusing a count whose per-class arrays alone would not fit.
MAX_CLASSES = 2**20
FLOAT32_BYTES = 4


def physical_memory_bytes() -> int | None:
  """This machine's physical memory (None where the OS does not say)."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def check_image(where: str, shape: Sequence[int]) -> None:
  """DataError unless one image of `shape` (H x W x C), as a float32 sample, fits in a batch (MAX_BATCH_BYTES)."""
  sample = math.prod(int(d) for d in shape) * FLOAT32_BYTES
  if sample > MAX_BATCH_BYTES:
    raise DataError(f"{where}: its images are {'x'.join(str(int(d)) for d in shape)}, {sample / 2**30:,.1f} GiB each "
                    f"as float32; allowed: images of at most {MAX_BATCH_BYTES // 2**30} GiB as float32 (a batch of one "
                    "must fit in the batch bound)")


def check_fits_memory(where: str, what: str, stored_bytes: int, pixels: int) -> None:
  """DataError unless `stored_bytes` (the arrays as read) plus a float32 copy of `pixels` values fit in this
  machine's physical memory; `what` names the arrays (a split, the file's arrays)."""
  need = stored_bytes + pixels * FLOAT32_BYTES
  have = physical_memory_bytes()
  if have is not None and need > have:
    raise DataError(f"{where}: {what} need {need / 2**30:,.1f} GiB in memory (as stored and as float32), more than "
                    f"this machine's {have / 2**30:,.1f} GiB; allowed: data whose images fit in memory (fewer or "
                    "smaller images)")


def check_classes(where: str, num_classes: int) -> None:
  """DataError unless `num_classes` is in [1, MAX_CLASSES]."""
  if not 1 <= num_classes <= MAX_CLASSES:
    raise DataError(f"{where}: it declares {num_classes:,} classes; allowed: 1 to {MAX_CLASSES:,} classes (the "
                    "labels are counted per class and the model has one output per class)")
