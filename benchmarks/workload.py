"""The workload every stack trains (docs/performance.md): numpy only, no TensorFlow.

8 features, each with its own table of `dim` 32, a batch of 4096 ids per
feature drawn from a Zipf law over the table's rows, labels for a Dense(1)
head with a mean squared error. Every stack gets the same batches (same
seed), cycled, so the per-step work is the same everywhere.
"""

import dataclasses
from typing import Dict, List, Tuple

import numpy as np

OPTIMIZERS = ("sgd", "adagrad", "adam")
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2}
LEARNING_RATES = {"sgd": 0.1, "adagrad": 0.1, "adam": 0.001}
# A bijection of [0, vocab) for any vocab it does not divide (a prime):
# spreads the popular ranks over the table instead of its first rows.
_SCATTER = 2_654_435_761

Batch = Tuple[Dict[str, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark configuration; `vocab` rows in each of the tables."""
  vocab: int
  optimizer: str
  features: int = 8
  dim: int = 32
  batch: int = 4096
  zipf: float = 1.1
  distinct_batches: int = 8
  seed: int = 0

  @property
  def names(self) -> List[str]:
    return [f"f{i}" for i in range(self.features)]

  @property
  def learning_rate(self) -> float:
    return LEARNING_RATES[self.optimizer]

  @property
  def slots(self) -> int:
    return SLOTS[self.optimizer]

  def table_and_slot_bytes(self) -> int:
    """float32 bytes of all tables and their optimizer slots."""
    return self.features * self.vocab * self.dim * 4 * (1 + self.slots)

  def zipf_ids(self, rng: np.random.Generator, feature: int) -> np.ndarray:
    """`batch` ids: rank r has probability ~ r**-zipf (bounded power law)."""
    s, n = self.zipf, self.vocab
    u = rng.random(self.batch)
    rank = np.floor(((n ** (1 - s) - 1) * u + 1) ** (1 / (1 - s)))
    rank = np.clip(rank.astype(np.int64) - 1, 0, n - 1)
    return (rank * _SCATTER + feature * 7919) % n

  def make_batches(self) -> List[Batch]:
    rng = np.random.default_rng(self.seed)
    out = []
    for _ in range(self.distinct_batches):
      features = {name: self.zipf_ids(rng, i)
                  for i, name in enumerate(self.names)}
      labels = rng.random(self.batch).astype(np.float32)
      out.append((features, labels))
    return out

  def traffic_bytes_per_step(self, batches: List[Batch]) -> Dict[str, float]:
    """Bytes a sparse step must move at the least (docs/performance.md, 'Method': bytes
    gathered and scattered), by part:

    * `rows`: the distinct rows of every table and of each of its slots,
      read once and written back once;
    * `activations`: the gather's output, one row per id of the batch;
    * `gradients`: the activations' gradients, read by the update.

    `total` is their sum; `rows` alone was the previous run's bound.
    """
    distinct = np.mean([sum(len(np.unique(ids)) for ids in f.values())
                        for f, _ in batches])
    per_batch = self.features * self.batch * self.dim * 4.0
    rows = 2.0 * (1 + self.slots) * distinct * self.dim * 4
    return {"rows": rows, "activations": per_batch, "gradients": per_batch,
            "total": rows + 2 * per_batch}


def parse_size(text: str) -> int:
  """'100k' -> 100000, '5M' -> 5000000, '2500' -> 2500."""
  text = text.strip().lower()
  scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
  return int(float(text[:-1] if scale > 1 else text) * scale)


def format_size(n: int) -> str:
  for unit, scale in (("M", 1_000_000), ("k", 1_000)):
    if n >= scale and n % (scale // 10) == 0:
      return f"{n / scale:g}{unit}"
  return str(n)
