"""How TensorFlow 2.21's `TPUEmbeddingV2` stacks tables and lays out rows.

`stack` runs TensorFlow's own stacker (`_pywrap_sparse_core_layout.
SparseCoreLayoutStacker`, which runs on the CPU) exactly as
`tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer` drives it,
on data of its own: the given configs are never changed (TensorFlow changes
its clones: `layout`, `vocabulary_size` and `dim` become the padded ones).

The stacker puts tables of the same padded width (`dim` rounded up to 8), the
same `hash(optimizer)` and the same `repr(quantization_config)` into one
stacked table, in table name order, and pads each table's rows to a multiple
of 8 * N, where N = num_partitions * num_sc_per_chip is the number of
SparseCores. Table k of a stack (from 0) gets `sparse_core_shard_row_offset`
o_k = (padded rows of tables 0..k-1) / N and rotation
r_k = k * num_sc_per_chip mod N. The stacked variable has
R = (sum of padded rows) rows; TensorFlow shards it by contiguous rows over
the partitions, and each partition's part over its SparseCores, so SparseCore
shard s (0..N-1) holds rows [s * T, (s + 1) * T) of the variable as saved in a
checkpoint, T = R / N = `total_rows_per_sparse_core_shard`. Inside each shard
the tables follow each other; id i of table k (mod sharding, rotated) is
  row(i) = ((i mod N + r_k) mod N) * T + o_k + i div N,
the same as `(col_id mod N) * T + col_id div N` for the column id TensorFlow's
preprocessing computes, col_id = (i + r_k) mod N + (i div N) * N + o_k * N
(`col_shift` = r_k, `col_offset` = o_k * N), and as
`TpuEmbeddingV3CheckpointAdapter` (`_shard_from_cpu_to_sc`) and
`tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu` place and read rows.
"""

import collections
import copy
import dataclasses
import functools
import hashlib
import operator
import types
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2

from tfemb import tf_versions

_Layout = sparse_core_layout_pb2.SparseCoreTableLayout


@dataclasses.dataclass(frozen=True)
class PlacedTable:
  """Where one table lies in its stacked table.

  `layout` is TensorFlow's proto for it (`embedding_layouts[name]`; treat it
  as read-only, `Stacking.embedding_layouts()` gives copies). `row_offset`
  is TensorFlow's `table_to_stacked_table_offset[name][1]`, the `col_offset`
  of its preprocessing: `shard_row_offset * N`. `rotation` is its `col_shift`.
  """
  name: str
  stacked_table_name: str
  layout: _Layout
  vocabulary_size: int
  dim: int
  padded_vocabulary_size: int
  padded_dim: int
  shard_row_offset: int
  row_offset: int
  rotation: int

  @property
  def padding_rows(self) -> int:
    return self.padded_vocabulary_size - self.vocabulary_size

  @property
  def padding_columns(self) -> int:
    return self.padded_dim - self.dim


@dataclasses.dataclass(frozen=True)
class StackedTable:
  """One stacked table: TensorFlow's variable `name` of shape `shape`.

  `table_names` in TensorFlow's order (`stacked_table_to_tables`: by name,
  which is also the order of their row offsets). `sample_count` is
  TensorFlow's `table_to_sample_count[name]`: the per-replica samples of all
  features of its tables.
  """
  name: str
  table_names: Tuple[str, ...]
  shape: Tuple[int, int]
  rows_per_shard: int
  sample_count: int


@dataclasses.dataclass(frozen=True, eq=False)
class Stacking:
  """The result of `stack`: stacked tables and tables, in TensorFlow's order.

  `feature_to_sample_offset` is TensorFlow's, keyed by feature path: where a
  feature's samples start among its stacked table's (the COO `row_offset`).
  Hashed by identity, so a `tf.function` may take it as an argument.
  """
  num_partitions: int
  num_sc_per_chip: int
  stacked_tables: Mapping[str, StackedTable]
  tables: Mapping[str, PlacedTable]
  feature_to_sample_offset: Mapping[str, int]

  @property
  def num_sparse_cores(self) -> int:
    return self.num_partitions * self.num_sc_per_chip

  def embedding_layouts(self) -> Dict[str, _Layout]:
    """Copies of the layouts, as `TPUEmbeddingV2.embedding_layouts`."""
    return {name: copy.deepcopy(t.layout) for name, t in self.tables.items()}

  def layouts_proto(self) -> sparse_core_layout_pb2.SparseCoreTableLayouts:
    """What TensorFlow saves under `_sparse_core_table_layouts`."""
    layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
    layouts.tables.extend(t.layout for t in self.tables.values())
    return layouts


def _num_samples(path: str, feature: Any) -> int:
  shape = tf.TensorShape(feature.output_shape)
  if shape.rank is None or shape.rank == 0 or not shape.is_fully_defined():
    raise ValueError(
        f"Feature {path!r} needs a fully defined per-replica output_shape to "
        f"be stacked on the SparseCore; got {shape}.")
  return functools.reduce(operator.mul, shape.as_list())


def _group(table: Any) -> str:
  """TensorFlow's stacking key: tables stack only if their keys are equal."""
  key_tuple = (hash(table.optimizer), repr(table.quantization_config))
  digest = hashlib.sha1(repr(key_tuple).encode(), usedforsecurity=False)
  return "_xxtpuv3internal_" + digest.hexdigest()


def _layouts(tables: Sequence[Any], features: Sequence[Tuple[str, Any]],
             num_partitions: int, num_sc_per_chip: int,
             disable_table_stacking: bool) -> Dict[str, _Layout]:
  """Each table's layout (by name, in name order), as TensorFlow 2.21 has it.

  In TensorFlow 2.21 the stacking loop (and its `return`) sits inside the
  loop over features, so the stacker runs once, after the first feature has
  been counted: that feature's table is added with its samples and one
  feature, every other table with 0 samples and 0 features. The counts set
  the layouts' `per_sparse_core_batch_size` and `num_features`, and they
  decide stacking once a stack's activations reach the stacker's limit (2 MiB
  per SparseCore by default): TensorFlow then stacks tables that correct
  counts would have kept apart. This does the same. A table whose `layout`
  is given keeps it, as in TensorFlow.
  """
  first_path, first = features[0]
  stacker_lib = tf_versions.sparse_core_layout("TPUEmbeddingV2 on the host")
  stacker = stacker_lib.SparseCoreLayoutStacker(
      num_partitions=num_partitions,
      sparse_cores_per_partition=num_sc_per_chip,
      disable_table_stacking=disable_table_stacking)
  sorted_tables = sorted(tables, key=lambda t: t.name)
  # Older stackers (TensorFlow 2.17 to 2.20) take no feature count.
  takes_features = "num_features" in (stacker.AddTable.__doc__ or "")
  for table in sorted_tables:
    if not table.layout:
      counted = table.name == first.table.name
      stacker.AddTable(
          table_name=table.name,
          table_height=table.vocabulary_size,
          table_width=table.dim,
          group=_group(table),
          output_samples=_num_samples(first_path, first) if counted else 0,
          **({"num_features": 1 if counted else 0} if takes_features else {}))
  with warnings.catch_warnings():
    # The stacker of TensorFlow 2.17 to 2.20 builds its proto through
    # protobuf's deprecated MessageFactory (TensorFlow's own call warns
    # too); the warning is theirs, reported at this line.
    warnings.filterwarnings("ignore", "MessageFactory class is deprecated",
                            UserWarning)
    computed = {layout.table_name: layout
                for layout in stacker.GetLayouts().tables}
  return {t.name: copy.deepcopy(t.layout) if t.layout else computed[t.name]
          for t in sorted_tables}


def _placed_table(layout: _Layout, num_sparse_cores: int) -> PlacedTable:
  offset = layout.sparse_core_shard_row_offset
  return PlacedTable(layout.table_name, layout.stacked_table_name, layout,
                     *layout.unsharded_shape, *layout.unsharded_padded_shape,
                     offset, offset * num_sparse_cores,
                     layout.sparse_core_shard_rotation)


def _stacked_table(name: str, tables: Sequence[PlacedTable],
                   sample_count: int, num_sparse_cores: int) -> StackedTable:
  """TensorFlow's variable: (sum of padded rows) x padded dim."""
  rows = sum(t.padded_vocabulary_size for t in tables)
  dims = {t.padded_dim for t in tables}
  per_shard = {t.layout.total_rows_per_sparse_core_shard for t in tables}
  if len(dims) != 1 or per_shard != {rows // num_sparse_cores} or (
      rows % num_sparse_cores):
    raise ValueError(f"The layouts of stacked table {name!r} do not fit "
                     f"together: {[t.layout for t in tables]}")
  return StackedTable(name, tuple(t.name for t in tables), (rows, dims.pop()),
                      rows // num_sparse_cores, sample_count)


def stack(tables: Sequence[Any],
          features: Sequence[Tuple[str, Any]],
          num_partitions: int,
          num_sc_per_chip: int,
          sparse_core_embedding_config: Optional[Any] = None) -> Stacking:
  """Stacks `tables` as `TPUEmbeddingV2.__init__` does.

  `tables`: resolved table configs (tfemb's or TensorFlow's: `name`,
  `vocabulary_size`, `dim`, `optimizer`, `quantization_config`, `layout`).
  `features`: `(path, feature)` in TensorFlow's order
  (`nest.flatten_with_joined_string_paths(feature_config)`), each with a
  fully defined per-replica `output_shape`. `num_partitions` is TensorFlow's
  `strategy.num_replicas_in_sync`, `num_sc_per_chip` its SparseCores per chip
  (4 when the hardware does not say). Nothing given is changed.
  """
  tables, features = list(tables), list(features)
  names = [t.name for t in tables]
  if None in names or len(set(names)) != len(names):
    raise ValueError(f"SparseCore tables need distinct names; got {names}.")
  if not features:
    raise ValueError("TPUEmbeddingV2 needs at least one feature.")
  disable = bool(sparse_core_embedding_config and
                 sparse_core_embedding_config.disable_table_stacking)
  num_sc = num_partitions * num_sc_per_chip
  layouts = _layouts(tables, features, num_partitions, num_sc_per_chip, disable)
  table_layouts = {n: _placed_table(l, num_sc) for n, l in layouts.items()}
  by_stack = collections.defaultdict(list)
  for layout in table_layouts.values():
    by_stack[layout.stacked_table_name].append(layout)
  counts = dict.fromkeys(by_stack, 0)
  offsets = {}
  for path, feature in features:
    name = table_layouts[feature.table.name].stacked_table_name
    offsets[path] = counts[name]
    counts[name] += _num_samples(path, feature)
  stacked = {n: _stacked_table(n, ts, counts[n], num_sc)
             for n, ts in by_stack.items()}
  return Stacking(num_partitions, num_sc_per_chip,
                  types.MappingProxyType(stacked),
                  types.MappingProxyType(table_layouts),
                  types.MappingProxyType(offsets))


def _row_parameters(stacking: Stacking, table_name: str):
  table = stacking.tables[table_name]
  stacked = stacking.stacked_tables[table.stacked_table_name]
  return (stacking.num_sparse_cores, table.rotation, stacked.rows_per_shard,
          table.shard_row_offset)


def _sharded_rows(ids, n: int, rotation: int, per_shard: int, offset: int):
  """`((ids mod N + rotation) mod N) * per_shard + offset + ids div N`, in
  numpy or TF ops (a tensor's `%` and `//` floor as numpy's do)."""
  rows = ((ids % n + rotation) % n) * per_shard + ids // n
  return rows + offset if offset else rows


def layout_rows(layout: _Layout, ids: Any) -> tf.Tensor:
  """The rows of `ids` in the stacked variable, from the table's layout
  proto alone (as a checkpoint's `_sparse_core_table_layouts` holds it):
  `((ids mod N + rotation) mod N) * T + shard_row_offset + ids div N`, in
  the dtype of `ids` (TensorFlow's SparseCore takes int32 ids)."""
  return _sharded_rows(tf.convert_to_tensor(ids), layout.num_sparse_cores,
                       layout.sparse_core_shard_rotation,
                       layout.total_rows_per_sparse_core_shard,
                       layout.sparse_core_shard_row_offset)


def stacked_rows(stacking: Stacking, table_name: str, ids: Any) -> tf.Tensor:
  """The rows of `ids` of `table_name` in its stacked variable (TF ops):
  `layout_rows` of its layout, the rows of the unsharded variable as
  TensorFlow saves it in a checkpoint."""
  return layout_rows(stacking.tables[table_name].layout, ids)


def stacked_rows_numpy(stacking: Stacking, table_name: str,
                       ids: Any) -> np.ndarray:
  """`stacked_rows` in numpy (int64)."""
  return _sharded_rows(np.asarray(ids, dtype=np.int64),
                       *_row_parameters(stacking, table_name))


def _table_row_parameters(stacking: Stacking, table_name: str):
  n, rotation, _, _ = _row_parameters(stacking, table_name)
  per_shard = stacking.tables[table_name].padded_vocabulary_size // n
  return n, rotation, per_shard, 0


def table_rows(stacking: Stacking, table_name: str, ids: Any) -> tf.Tensor:
  """The rows of `ids` in the host's variable of `table_name` alone
  (`tfemb.sparsecore.stacked_blocks`): its rows of each SparseCore
  shard of the stacked variable, shard after shard,
  `((ids mod N + rotation) mod N) * P + ids div N` with P the table's
  padded rows / N (TF ops, in the dtype of `ids`)."""
  return _sharded_rows(tf.convert_to_tensor(ids),
                       *_table_row_parameters(stacking, table_name))


def table_rows_numpy(stacking: Stacking, table_name: str,
                     ids: Any) -> np.ndarray:
  """`table_rows` in numpy (int64)."""
  return _sharded_rows(np.asarray(ids, dtype=np.int64),
                       *_table_row_parameters(stacking, table_name))


def _check_keys(given: Mapping[str, Any], expected, what: str):
  if set(given) != set(expected):
    raise ValueError(f"Expected arrays for the {what} {sorted(expected)}; "
                     f"got {sorted(given)}.")


def _check_shape(what: str, name: str, array: np.ndarray, shape):
  if array.shape != tuple(shape):
    raise ValueError(f"{what} {name!r} has shape {tuple(shape)}; got "
                     f"{array.shape}.")


def to_stacked(stacking: Stacking,
               arrays_by_table: Mapping[str, Any]) -> Dict[str, np.ndarray]:
  """Per-table arrays [vocabulary_size, dim] to stacked variables' values.

  What `TpuEmbeddingV3CheckpointAdapter` makes of an unstacked checkpoint:
  padding rows and columns are zero. Works for parameters and for slots.
  """
  _check_keys(arrays_by_table, stacking.tables, "tables")
  out = {}
  for name, stacked in stacking.stacked_tables.items():
    dtype = np.result_type(*(arrays_by_table[t] for t in stacked.table_names))
    value = np.zeros(stacked.shape, dtype=dtype)
    for table_name in stacked.table_names:
      table = stacking.tables[table_name]
      array = np.asarray(arrays_by_table[table_name])
      _check_shape("Table", table_name, array,
                   (table.vocabulary_size, table.dim))
      rows = stacked_rows_numpy(stacking, table_name,
                                np.arange(table.vocabulary_size))
      value[rows, :table.dim] = array
    out[name] = value
  return out


def to_unstacked(stacking: Stacking,
                 arrays_by_stacked_table: Mapping[str, Any]
                 ) -> Dict[str, np.ndarray]:
  """Stacked variables' values to per-table arrays [vocabulary_size, dim].

  As `tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu` then
  `remove_padding_from_sc`; padding is dropped. Tables in name order.
  """
  _check_keys(arrays_by_stacked_table, stacking.stacked_tables,
              "stacked tables")
  out = {}
  for name, table in stacking.tables.items():
    stacked = stacking.stacked_tables[table.stacked_table_name]
    value = np.asarray(arrays_by_stacked_table[stacked.name])
    _check_shape("Stacked table", stacked.name, value, stacked.shape)
    rows = stacked_rows_numpy(stacking, name, np.arange(table.vocabulary_size))
    out[name] = value[rows, :table.dim]
  return out
