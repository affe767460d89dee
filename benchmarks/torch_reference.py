"""The same client updates in PyTorch, on the machine it runs on: the bar FLGo cannot beat, measured beside ours.

    pip install torch==2.13.0   # (not a dependency of fedpsa-jax; the CPU build)
    python benchmarks/torch_reference.py [--threads=1,2] [--updates=24]

FLGo, the framework the paper used, trains each client with a PyTorch loop. This times that loop alone,
without any framework around it: the default job's clients (the embedded MNIST, 50 clients, Dirichlet
α = 0.1 as fedpsa-jax partitions them), the paper's MNIST CNN (conv5x5-32, pool, conv5x5-64, pool,
dense 512, dense 10), E = 5 epochs of SGD at B = 64 with the last partial batch kept, the global model
copied in before each update as a framework does. Clients are drawn uniformly at random (seeded).

Prints, per torch thread count, client updates per second and milliseconds per full-batch step. Compare
the updates/s with `benchmarks/throughput.py --method=fedbuff` run the same hour (its rows include
the whole simulation; these do not): machines drift by several percent from day to day.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_list("threads", ["1", "2"], "torch intra-op thread counts to time")
flags.DEFINE_integer("updates", 24, "client updates timed per thread count (after 2 warm-up updates)")
FLAGS = flags.FLAGS


def default_job_clients() -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
  """(x_train as NCHW float32, each client's sample indices, y_train) of configs/default.py's job."""
  from configs import default
  from fedpsa_jax.sim import build

  dataset, fed = build.build_data(default.get_config())
  sizes, rows = np.asarray(fed.client_sizes), np.asarray(fed.client_indices)
  clients = [rows[i, :sizes[i]] for i in range(len(sizes))]
  return np.ascontiguousarray(np.transpose(dataset.x_train, (0, 3, 1, 2)), np.float32), clients, dataset.y_train


def main(argv):
  del argv
  import torch
  from torch import nn

  x_np, clients, y_np = default_job_clients()
  x, y = torch.from_numpy(x_np), torch.from_numpy(np.asarray(y_np, np.int64))
  batch, epochs = 64, 5

  def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Conv2d(32, 64, 5, padding=2), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, 512), nn.ReLU(), nn.Linear(512, 10))

  torch.manual_seed(0)
  global_model, local_model = cnn(), cnn()
  loss_fn = nn.CrossEntropyLoss()
  sizes = [len(c) for c in clients]
  print(f"clients: {len(clients)}, samples per client min/median/max {min(sizes)}/{int(np.median(sizes))}/"
        f"{max(sizes)}; E = {epochs}, B = {batch}; torch {torch.__version__}")

  def client_update(indices: np.ndarray, generator: torch.Generator) -> int:
    local_model.load_state_dict(global_model.state_dict())
    opt = torch.optim.SGD(local_model.parameters(), lr=0.01)
    steps = 0
    for _ in range(epochs):
      order = torch.from_numpy(np.array(indices))[torch.randperm(len(indices), generator=generator)]
      for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        opt.zero_grad(set_to_none=True)
        loss_fn(local_model(x[idx]), y[idx]).backward()
        opt.step()
        steps += 1
    return steps

  for threads in map(int, FLAGS.threads):
    torch.set_num_threads(threads)
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    picks = rng.integers(0, len(clients), FLAGS.updates + 2)
    for c in picks[:2]:
      client_update(clients[c], gen)
    start, steps = time.perf_counter(), 0
    for c in picks[2:]:
      steps += client_update(clients[c], gen)
    seconds = time.perf_counter() - start
    full = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(local_model.parameters(), lr=0.01)
    step_start = time.perf_counter()
    for _ in range(20):
      opt.zero_grad(set_to_none=True)
      loss_fn(local_model(full[0]), full[1]).backward()
      opt.step()
    step_ms = 1e3 * (time.perf_counter() - step_start) / 20
    print(f"torch threads {threads}: {FLAGS.updates / seconds:.2f} client updates/s "
          f"({steps} steps in {seconds:.1f} s), {step_ms:.1f} ms per full-batch step", flush=True)


if __name__ == "__main__":
  app.run(main)
