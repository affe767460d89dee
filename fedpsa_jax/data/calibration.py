"""The shared calibration batch D_b of FedPSA (paper Sec. 5.2, "Common calibration data").

Every client computes its parameter sensitivity on the same small batch, so sensitivities of
different clients are comparable. The batch is drawn once per run and fixed:
- `gaussian`: inputs i.i.d. N(0, 1) in the model's input space (the normalised image space), labels
  uniform at random over the classes; needs no client data, which is the paper's privacy argument.
- `real`: `size` training samples drawn without replacement.
"""

from __future__ import annotations

import numpy as np

from fedpsa_jax.data.sources import Dataset

CALIBRATION_KINDS = ("gaussian", "real")


def make_calibration_batch(kind: str, size: int, dataset: Dataset,
                           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(inputs float32 [size, H, W, C], labels int32 [size]) of the given kind, drawn with `rng`."""
  if kind not in CALIBRATION_KINDS:
    raise ValueError(f"sensitivity.calibration must be one of {CALIBRATION_KINDS}, got {kind!r}")
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
    raise ValueError(f"sensitivity.calibration_size must be an integer >= 1, got {size!r}")
  if kind == "gaussian":
    inputs = rng.standard_normal((size, *dataset.input_shape)).astype(np.float32)
    labels = rng.integers(0, dataset.num_classes, size=size).astype(np.int32)
    return inputs, labels
  num_train = len(dataset.y_train)
  if size > num_train:
    raise ValueError(f"sensitivity.calibration_size must be <= {num_train} (the number of training "
                     f"samples) with sensitivity.calibration='real', got {size}")
  chosen = rng.choice(num_train, size=size, replace=False)
  return (np.asarray(dataset.x_train[chosen], dtype=np.float32),
          np.asarray(dataset.y_train[chosen], dtype=np.int32))
