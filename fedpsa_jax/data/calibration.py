"""The shared calibration batch D_b of FedPSA (paper Sec. 5.2, "Common calibration data").

Every client computes its parameter sensitivity on the same small batch, so sensitivities of
different clients are comparable. The batch is drawn once per run and fixed:
- `gaussian`: inputs i.i.d. N(0, 1) in the model's input space (the normalised image space), labels
  uniform at random over the classes; needs no client data, which is the paper's privacy argument
  (`gaussian_batch`);
- `real`: `size` training samples drawn without replacement (`StrategyContext.sample`).
"""

from __future__ import annotations

import numpy as np

from fedpsa_jax import choices

CALIBRATION_KINDS = choices.CALIBRATION_KINDS  # fedpsa.calibration: defined once, in the config's vocabularies


def gaussian_batch(size: int, input_shape: tuple[int, ...], num_classes: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(inputs float32 [size, *input_shape] i.i.d. N(0, 1), labels int32 [size] uniform over the classes)."""
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
    raise ValueError(f"fedpsa.calibration_size must be an integer >= 1, got {size!r}")
  inputs = rng.standard_normal((size, *input_shape)).astype(np.float32)
  labels = rng.integers(0, num_classes, size=size).astype(np.int32)
  return inputs, labels
