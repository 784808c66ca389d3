"""The SparseCore's id limits, counted on the host as TensorFlow 2.21's
preprocessing ops count them (docs/sparsecore.md, "Id limits").

On one chip, a stacked table's batch goes through these steps:

1. `ConvertToListOfSparseCoreCooTensors`, per feature: sample k of the
   feature's `S = prod(output_shape)` samples goes to the chip's SparseCore
   `k // (S / C)` (C SparseCores per chip); id i of table t goes to the
   partition (the SparseCore of the whole TPU holding its row)
   `(i + rotation_t) mod N`, N = chips x C.
2. `SortListOfSparseCoreCooTensors`, per SparseCore of the chip: the ids are
   deduplicated per (feature, sample, id); per partition, more than
   `max_ids_per_table[stacked table]` ids, or more than
   `max_unique_ids_per_table[...]` distinct (table, id), fail the batch
   (256 each when not given). Partition by partition, the ids follow each
   other table by table (in stacking order), by id, then in input order.
3. `ConvertToSparseCoreCsrWrappedCooTensor`: the chip's ids, SparseCore by
   SparseCore and partition by partition in that order, fill a buffer of
   `max_ids_per_chip_per_sample x (the stacked table's samples)` ids, each
   partition's run padded to a multiple of 8. Ids past its end fail the
   batch, or with `allow_id_dropping` are dropped.

`counts` gives the per-partition counts of step 2 (what
`TPUEmbeddingV2.compute_sparse_core_stats` reports), `plan` the ids that
steps 2 and 3 keep, or the error they raise. NumPy on one chip's batch.
"""

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

DEFAULT_MAX_IDS = 256  # TPUEmbeddingV2.DEFAULT_MAX_IDS_PER_TABLE
DEFAULT_MAX_UNIQUE_IDS = 256  # DEFAULT_MAX_UNIQUE_IDS_PER_TABLE
_PAD = 8  # each partition's run in the chip's buffer: a multiple of 8


@dataclasses.dataclass(frozen=True)
class FeatureIds:
  """One feature's ids on one chip, in input order.

  `samples[k]` is the sample of `ids[k]` among the feature's
  `sample_count` samples (the flattened `output_shape`)."""
  path: str
  table: str
  ids: np.ndarray
  samples: np.ndarray
  sample_count: int


@dataclasses.dataclass(frozen=True)
class Counts:
  """One stacked table on one chip: deduplicated ids and distinct ids per
  (SparseCore of the chip, partition), each `[C, N]`."""
  ids: np.ndarray
  unique: np.ndarray


@dataclasses.dataclass(frozen=True)
class Limits:
  """A `SparseCoreEmbeddingConfig`'s limits, TensorFlow's defaults where it
  says nothing."""
  max_ids_per_chip_per_sample: int = 64
  max_ids_per_table: Optional[Mapping[str, int]] = None
  max_unique_ids_per_table: Optional[Mapping[str, int]] = None
  allow_id_dropping: bool = False

  @classmethod
  def of(cls, config) -> "Limits":
    return cls(config.max_ids_per_chip_per_sample, config.max_ids_per_table,
               config.max_unique_ids_per_table, config.allow_id_dropping)

  def max_ids(self, stacked: str) -> int:
    return (self.max_ids_per_table or {}).get(stacked, DEFAULT_MAX_IDS)

  def max_unique_ids(self, stacked: str) -> int:
    return (self.max_unique_ids_per_table or {}).get(stacked,
                                                     DEFAULT_MAX_UNIQUE_IDS)


class LimitError(tf.errors.InvalidArgumentError, ValueError):
  """A batch over a SparseCore limit (the TPU would fail it): TensorFlow's
  InvalidArgumentError, as the TPU's preprocessing ops raise, eagerly and
  in a tf.function."""

  def __init__(self, message: str):
    super().__init__(None, None, message)


@dataclasses.dataclass
class _Entries:
  """A stacked table's deduplicated ids on one chip, in packing order:
  SparseCore, partition, table (stacking order: `offset`), id, then input
  order (feature, position)."""
  feature: np.ndarray  # index into the features given
  sample: np.ndarray
  id: np.ndarray
  core: np.ndarray  # SparseCore of the chip
  partition: np.ndarray
  offset: np.ndarray  # the table's row offset in the stack

  def cells(self, stacking) -> np.ndarray:
    return self.core * stacking.num_sparse_cores + self.partition

  def new_ids(self) -> np.ndarray:
    """True where (SparseCore, partition, table, id) starts a run: the
    distinct ids of each cell."""
    new = np.ones(self.id.size, bool)
    new[1:] = ((self.core[1:] != self.core[:-1]) |
               (self.partition[1:] != self.partition[:-1]) |
               (self.offset[1:] != self.offset[:-1]) |
               (self.id[1:] != self.id[:-1]))
    return new


def _entries(stacking, features: Sequence[FeatureIds],
             stacked: str) -> _Entries:
  cores = stacking.num_sc_per_chip
  n = stacking.num_sparse_cores
  parts = []
  for f, feature in enumerate(features):
    table = stacking.tables[feature.table]
    if table.stacked_table_name != stacked or not feature.ids.size:
      continue
    if feature.sample_count % cores:
      raise ValueError(
          f"Feature {feature.path!r}: its {feature.sample_count} samples "
          f"(output_shape's size) do not divide among the {cores} "
          "SparseCores of a chip.")
    key = feature.samples * table.vocabulary_size + feature.ids
    _, first = np.unique(key, return_index=True)
    ids, samples = feature.ids[first], feature.samples[first]
    parts.append((np.full(first.size, f), samples, ids,
                  samples // (feature.sample_count // cores),
                  (ids + table.rotation) % n,
                  np.full(first.size, table.row_offset), first))
  if not parts:
    return _Entries(*([np.zeros(0, np.int64)] * 6))
  feature, sample, ids, core, partition, offset, first = map(
      np.concatenate, zip(*parts))
  order = np.lexsort((first, feature, ids, offset, partition, core))
  return _Entries(feature[order], sample[order], ids[order], core[order],
                  partition[order], offset[order])


def _per_cell(stacking, cells: np.ndarray) -> np.ndarray:
  cores, n = stacking.num_sc_per_chip, stacking.num_sparse_cores
  return np.bincount(cells, minlength=cores * n).reshape(cores, n)


def counts(stacking, features: Sequence[FeatureIds]) -> Dict[str, Counts]:
  """Per stacked table, the deduplicated and the distinct ids per
  (SparseCore of the chip, partition)."""
  out = {}
  for stacked in stacking.stacked_tables:
    entries = _entries(stacking, features, stacked)
    cells = entries.cells(stacking)
    out[stacked] = Counts(_per_cell(stacking, cells),
                          _per_cell(stacking, cells[entries.new_ids()]))
  return out


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the SparseCore keeps of a batch: per feature, a mask over its
  ids (in input order); per stacked table, the ids dropped."""
  kept: List[np.ndarray]
  dropped: Dict[str, int]


def plan(stacking, features: Sequence[FeatureIds], limits: Limits) -> Plan:
  """The ids the SparseCore keeps, or `LimitError` where it fails the
  batch (the first failure in the order the TPU checks)."""
  kept = [np.ones(f.ids.size, bool) for f in features]
  dropped = {}
  cores = stacking.num_sc_per_chip
  for stacked, table in stacking.stacked_tables.items():
    entries = _entries(stacking, features, stacked)
    cells = entries.cells(stacking)
    grid = Counts(_per_cell(stacking, cells),
                  _per_cell(stacking, cells[entries.new_ids()]))
    for core in range(cores):
      for part in range(stacking.num_sparse_cores):
        for what, count, limit in (
            ("ids", grid.ids, limits.max_ids(stacked)),
            ("unique ids", grid.unique, limits.max_unique_ids(stacked))):
          if count[core, part] > limit:
            raise LimitError(
                f"Stacked table {stacked!r}: SparseCore {core} of the chip "
                f"sends {count[core, part]} {what} to partition {part} "
                f"(SparseCore {part} of the TPU), over the limit of {limit} "
                f"(max_{what.replace(' ', '_')}_per_table[{stacked!r}] of "
                "the SparseCoreEmbeddingConfig; 256 when not given).")
    capacity = (limits.max_ids_per_chip_per_sample *
                (table.sample_count // cores) * cores)
    if capacity % _PAD:
      raise LimitError(
          f"Stacked table {stacked!r}: max_ids_per_chip_per_sample x "
          f"samples = {capacity} is not a multiple of {_PAD}.")
    keep, filled = np.ones(entries.id.size, bool), 0
    runs = np.bincount(cells, minlength=cores * stacking.num_sparse_cores)
    start = 0
    for run in runs:  # partition by partition, in the chip's order
      room = capacity - filled
      if run > room:
        if not limits.allow_id_dropping:
          raise LimitError(
              f"Stacked table {stacked!r}: the chip's "
              f"{int(runs.sum())} ids do not fit in its buffer of "
              f"{capacity} (max_ids_per_chip_per_sample "
              f"{limits.max_ids_per_chip_per_sample} x "
              f"{table.sample_count} samples, each partition's ids padded "
              f"to a multiple of {_PAD}); allow_id_dropping would drop "
              f"{int(runs.sum()) - _fitting(runs, capacity)} of them.")
        keep[start + room:start + run] = False
        filled = capacity
      else:
        filled += run
      filled = -(-filled // _PAD) * _PAD
      start += run
    dropped[stacked] = int((~keep).sum())
    for f in np.unique(entries.feature[~keep]):
      feature = features[f]
      gone = entries.feature == f
      gone &= ~keep
      size = stacking.tables[feature.table].vocabulary_size
      kept[f] &= ~np.isin(feature.samples * size + feature.ids,
                          entries.sample[gone] * size + entries.id[gone])
  return Plan(kept, dropped)


def _fitting(runs: np.ndarray, capacity: int) -> int:
  """How many ids of `runs` the buffer keeps, dropping the rest."""
  filled = kept = 0
  for run in runs:
    taken = min(run, capacity - filled)
    kept += taken
    filled = min(capacity, -(-(filled + taken) // _PAD) * _PAD)
  return kept
