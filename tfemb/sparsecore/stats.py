"""`TPUEmbeddingV2.compute_sparse_core_stats` on any CPU, and a report of
the SparseCore's id limits for an input pipeline (docs/sparsecore.md, "Id
limits").

TensorFlow's own `compute_sparse_core_stats` runs the TPU host's
preprocessing ops, which the CPU wheel does not have; the same counts come
from `tfemb.sparsecore.limits`, on the tables stacked by TensorFlow's own
stacker (`tfemb.sparsecore.layout`).
"""

import dataclasses
import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers
from tfemb import resolution
from tfemb.sparsecore import feeding
from tfemb.sparsecore import layout
from tfemb.sparsecore import limits

HEADROOM = 1.25  # the suggested limits: the largest count seen x this, / 8


def stacking_for(feature_config: Any, num_tpu_chips: int,
                 num_sc_per_chip: int = 4, optimizer: Optional[Any] = None,
                 sparse_core_embedding_config: Optional[Any] = None):
  """`(resolved config, Stacking)` as a TPU of `num_tpu_chips` chips would
  stack the tables of `feature_config`."""
  for name, value in (("num_tpu_chips", num_tpu_chips),
                      ("num_sc_per_chip", num_sc_per_chip)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name} must be a positive integer; got {value!r}.")
  config = resolution.resolve(feature_config, optimizer)
  stacking = layout.stack(config.tables,
                          list(zip(config.paths, config.features)),
                          num_tpu_chips, num_sc_per_chip,
                          sparse_core_embedding_config)
  return config, stacking


def _ids_of(path: str, x: Any, sample_count: int) -> Tuple[np.ndarray,
                                                           np.ndarray]:
  """(ids, samples) of one feature's input, as TensorFlow's COO
  conversion reads it."""
  if isinstance(x, tf.SparseTensor):
    values, samples = x.values, x.indices[:, 0]
  elif isinstance(x, tf.RaggedTensor):
    if x.nrows() != sample_count:
      raise ValueError(
          f"Feature {path!r}: a ragged input of {int(x.nrows())} rows; "
          f"output_shape has {sample_count} samples.")
    values, samples = x.flat_values, x.value_rowids()
  else:
    values = tf.reshape(x, [-1])
    samples = tf.range(tf.size(values, out_type=tf.int64))
  if not values.dtype.is_integer:
    raise ValueError(f"Feature {path!r}: ids must be integers; got "
                     f"{values.dtype.name}.")
  ids = values.numpy().astype(np.int64)
  samples = samples.numpy().astype(np.int64)
  if samples.size and (samples.min() < 0 or samples.max() >= sample_count):
    raise ValueError(
        f"Feature {path!r}: a sample index {int(samples.max())} outside the "
        f"{sample_count} samples of output_shape.")
  return ids, samples


def feature_ids(config, features: Any) -> List[limits.FeatureIds]:
  """One chip's batch `features` (the structure of the feature config) as
  `limits.FeatureIds`, under TensorFlow's V2 input rules."""
  try:
    nest.assert_same_structure(config.structure, features)
  except (ValueError, TypeError) as e:
    raise ValueError(f"features must have the structure of feature_config "
                     f"({config.paths}): {e}") from None
  out = []
  for path, feature, x in zip(config.paths, config.features,
                              nest.flatten(features)):
    x, _ = feeding.prepare(path, feature, x, None)
    count = tf.TensorShape(feature.output_shape).num_elements()
    ids, samples = _ids_of(path, x, count)
    vocabulary = feature.table.vocabulary_size
    bad = (ids < 0) | (ids >= vocabulary)
    if bad.any():
      raise ValueError(f"Feature {path!r}: id {int(ids[bad][0])} outside "
                       f"[0, {vocabulary}) (table {feature.table.name!r}).")
    out.append(limits.FeatureIds(path, feature.table.name, ids, samples,
                                 count))
  return out


def compute_sparse_core_stats(features: Any, feature_config: Any,
                              num_tpu_chips: int, num_sc_per_chip: int = 4,
                              optimizer: Optional[Any] = None,
                              sparse_core_embedding_config: Optional[Any] = None
                              ) -> Tuple[Dict[str, tf.Tensor],
                                         Dict[str, tf.Tensor]]:
  """Per stacked table, the most ids and the most distinct ids one
  SparseCore partition gets from `features` (one chip's batch): TensorFlow's
  `(max_ids_per_table, max_unique_ids_per_table)`, int32 scalars."""
  config, stacking = stacking_for(feature_config, num_tpu_chips,
                                  num_sc_per_chip, optimizer,
                                  sparse_core_embedding_config)
  counts = limits.counts(stacking, feature_ids(config, features))
  return ({n: tf.constant(int(c.ids.max()), tf.int32)
           for n, c in counts.items()},
          {n: tf.constant(int(c.unique.max()), tf.int32)
           for n, c in counts.items()})


@dataclasses.dataclass
class TableReport:
  """What a pipeline's batches asked of one stacked table."""
  tables: List[str]
  max_ids: int = 0
  max_unique_ids: int = 0
  dropped: int = 0
  failed: int = 0  # batches the config would fail
  bytes_per_chip: int = 0


def _suggest(count: int) -> int:
  return max(8, int(math.ceil(count * HEADROOM / 8)) * 8)


def _row_width(table, dim: int) -> int:
  """float32 values per stacked row: the row and each slot's (a
  CustomOptimizer's 1-D slot, `slot_dims` 1, holds one value per row)."""
  opt = table.optimizer
  if opt is None:
    return dim
  names = optimizers.slot_names(opt)
  dims = list(getattr(opt, "slot_dims", ()) or ())
  dims += [2] * (len(names) - len(dims))
  return dim + sum(1 if d == 1 else dim for d in dims)


def report(batches: Iterable[Any], feature_config: Any, num_tpu_chips: int,
           num_sc_per_chip: int = 4, optimizer: Optional[Any] = None,
           sparse_core_embedding_config: Optional[Any] = None
           ) -> Dict[str, Any]:
  """Scans one chip's `batches`: per stacked table the largest counts, the
  ids `sparse_core_embedding_config` drops (or the batches it fails), the
  tables' and slots' bytes per chip; and a suggested config (the largest
  counts x `HEADROOM`, rounded up to 8). JSON-ready."""
  config, stacking = stacking_for(feature_config, num_tpu_chips,
                                  num_sc_per_chip, optimizer,
                                  sparse_core_embedding_config)
  given = limits.Limits.of(sparse_core_embedding_config) if (
      sparse_core_embedding_config is not None) else limits.Limits()
  tables = {n: TableReport(list(s.table_names))
            for n, s in stacking.stacked_tables.items()}
  by_name = {t.name: t for t in config.tables}
  for name, stacked in stacking.stacked_tables.items():
    tables[name].bytes_per_chip = (
        stacked.shape[0] * _row_width(by_name[stacked.table_names[0]],
                                      stacked.shape[1]) * 4 // num_tpu_chips)
  scanned = 0
  for batch in batches:
    ids = feature_ids(config, batch)
    scanned += 1
    for name, c in limits.counts(stacking, ids).items():
      tables[name].max_ids = max(tables[name].max_ids, int(c.ids.max()))
      tables[name].max_unique_ids = max(tables[name].max_unique_ids,
                                        int(c.unique.max()))
    for name in stacking.stacked_tables:
      try:
        one = limits.plan(_only(stacking, name), ids, given)
        tables[name].dropped += one.dropped.get(name, 0)
      except limits.LimitError:
        tables[name].failed += 1
  if not scanned:
    raise ValueError("The input pipeline gave no batch.")
  return {
      "num_tpu_chips": num_tpu_chips,
      "num_sc_per_chip": num_sc_per_chip,
      "batches": scanned,
      "tables": {n: dataclasses.asdict(t) for n, t in tables.items()},
      "suggested_config": {
          "max_ids_per_table": {n: _suggest(t.max_ids)
                                for n, t in tables.items()},
          "max_unique_ids_per_table": {n: _suggest(t.max_unique_ids)
                                       for n, t in tables.items()},
          "max_ids_per_chip_per_sample": given.max_ids_per_chip_per_sample,
      },
      "bytes_per_chip": sum(t.bytes_per_chip for t in tables.values()),
  }


def _only(stacking, name: str):
  """`stacking` with only stacked table `name` (so one table's failure
  does not hide another's counts)."""
  return dataclasses.replace(
      stacking, stacked_tables={name: stacking.stacked_tables[name]})


def format_report(result: Dict[str, Any]) -> str:
  """`report`'s result as a table."""
  rows = [("stacked table", "tables", "max ids", "max unique", "dropped",
           "failed", "MiB/chip")]
  for name, t in result["tables"].items():
    rows.append((name, ",".join(t["tables"]), str(t["max_ids"]),
                 str(t["max_unique_ids"]), str(t["dropped"]), str(t["failed"]),
                 f"{t['bytes_per_chip'] / 2**20:.1f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  suggested = result["suggested_config"]
  lines += [
      "",
      f"{result['batches']} batches, {result['num_tpu_chips']} chips x "
      f"{result['num_sc_per_chip']} SparseCores; tables and slots: "
      f"{result['bytes_per_chip'] / 2**20:.1f} MiB per chip.",
      f"Suggested (largest count x {HEADROOM}, rounded up to 8):",
      "  tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(",
      f"      max_ids_per_table={suggested['max_ids_per_table']},",
      f"      max_unique_ids_per_table="
      f"{suggested['max_unique_ids_per_table']},",
      f"      max_ids_per_chip_per_sample="
      f"{suggested['max_ids_per_chip_per_sample']})",
  ]
  return "\n".join(lines)
