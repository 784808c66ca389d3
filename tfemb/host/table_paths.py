"""One table's share of a step, on the path chosen for the table once.

Every table is served by one of two paths with the same interface and the
same numbers:

| path | when | lookup | row gradients | update |
|---|---|---|---|---|
| `FusedTable` | training steps of CPU tables (plain or mirrored) | one kernel: range check, dedup, gather | one kernel | one kernel, in place, all or nothing (taken back if another table's is not finite); one kernel for every table of a step that shares one rule |
| `OpsTable` | direct lookups; tables on a GPU or parameter servers; non-lazy Adam; `Options(fused_kernels=False)` | `tf.unique` beside a resource gather (each id's row in training, each distinct row otherwise) | `scatter_nd` | gather, `update_rules`, scatter |

A table whose rows are laid out as on a SparseCore (`TPUEmbeddingV2`'s,
`tfemb.sparsecore.trained_config`) gives its path a `Remap`: ids are checked
against the table's own vocabulary and looked up at their rows of its
variable (inside the fused kernel, or with TensorFlow's ops).

Both derive from `tfemb.host.paths.TablePath`, the interface a step runs
every table through (`lookup`, `feature_rows`, `row_gradients`, `prepare`).
"""

from typing import (Any, Callable, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import tensorflow as tf

from tfemb import validation
from tfemb.host import sharded
from tfemb.host import sparse_update
from tfemb.host.paths import InPlace
from tfemb.host.paths import Member
from tfemb.host.paths import Pending
from tfemb.host.paths import PerIdGradients
from tfemb.host.paths import ShardUpdate
from tfemb.host.paths import TablePath
from tfemb.host.row_reads import gather_rows
from tfemb.host.table_store import TableVariables
from tfemb.kernels import fused_ops


class Remap(NamedTuple):
  """A table whose rows sit elsewhere than at their ids (as on a
  SparseCore): its own vocabulary, and where each id's row is."""
  vocabulary_size: int  # the table's own; ids are checked against it
  kernel_attr: Tuple[int, ...]  # TfembDedupGather's `stacked`
  rows_of: Callable[[tf.Tensor], tf.Tensor]  # ids -> rows (TF ops)


class OpsBatch(NamedTuple):
  features: List[int]  # flat feature indices, parallel to positions
  unique_ids: tf.Tensor
  positions: List[tf.Tensor]  # per feature: each id's index in unique_ids
  rows: Optional[tf.Tensor]  # the rows of unique_ids, as gathered
  id_rows: Optional[List[tf.Tensor]] = None  # or per feature: each id's row


class FusedBatch(NamedTuple):
  features: List[int]
  unique_ids: tf.Tensor
  positions: tf.Tensor  # every feature's positions, concatenated
  id_rows: List[tf.Tensor]  # per feature: each id's row


def concat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=0)


def _split(tensor, members: Sequence[Member]) -> List[tf.Tensor]:
  if len(members) == 1:
    return [tensor]
  return tf.split(tensor, [tf.size(m.lookup.ids) for m in members])


def quantize(rows, config):
  """Simulated quantization of looked-up rows (`QuantizationConfig`)."""
  lower, upper = config.lower, config.upper
  quantum = (upper - lower) / (config.num_buckets - 1)
  rows = tf.clip_by_value(rows, lower, upper)
  return tf.floor((rows - lower) / quantum + 0.5) * quantum + lower


class _Path(TablePath):
  """What both paths share: the table, its variables, the quantization."""

  def __init__(self, table, variables: TableVariables,
               remap: Optional[Remap] = None):
    self.table = table
    self.variables = variables
    self.remap = remap

  def _quantized(self, rows):
    config = self.table.quantization_config
    return rows if config is None else quantize(rows, config)


class OpsTable(_Path):
  """TensorFlow's ops; differentiable, so direct lookups use it too.

  `each_id` (training steps of tables in one variable): each id's row is
  gathered from the variable, in one gather beside the deduplication,
  instead of each distinct row, then expanded to the ids (two ops in a
  row); the same rows. Without it (direct lookups, whose gradient reaches
  the distinct rows; tables over parameter servers, which send each
  distinct row once), the distinct rows.
  """

  def __init__(self, table, variables: TableVariables,
               remap: Optional[Remap] = None, each_id: bool = False,
               servers: Optional[sharded.Servers] = None):
    super().__init__(table, variables, remap)
    self.each_id = each_id
    self.servers = servers  # where the update runs, if on the servers

  def lookup(self, members: Sequence[Member]) -> Tuple[OpsBatch, List[Any]]:
    checks = []
    vocabulary = (self.table.vocabulary_size if self.remap is None else
                  self.remap.vocabulary_size)
    for m in members:
      checks += list(m.lookup.checks)
      # A stacked table's ids are always checked: beyond its vocabulary
      # they would be other tables' rows.
      if m.feature.validate_weights_and_indices or self.remap is not None:
        checks += validation.id_range(m.path, self.table.name, m.lookup.ids,
                                      vocabulary)
    with tf.control_dependencies(checks):  # no gather before the checks
      all_ids = tf.identity(concat([m.lookup.ids for m in members]))
    if self.remap is not None:
      all_ids = self.remap.rows_of(all_ids)
    unique_ids, idx = tf.unique(all_ids, out_idx=tf.int64)
    features = [m.index for m in members]
    if self.each_id:
      id_rows = _split(gather_rows(self.variables["parameters"], all_ids),
                       members)
      return OpsBatch(features, unique_ids, _split(idx, members), None,
                      id_rows), checks
    rows = gather_rows(self.variables["parameters"], unique_ids)
    return OpsBatch(features, unique_ids, _split(idx, members),
                    rows), checks

  def feature_rows(self, batch: OpsBatch) -> List[tf.Tensor]:
    if batch.id_rows is not None:
      return [self._quantized(rows) for rows in batch.id_rows]
    rows = self._quantized(batch.rows)
    return [tf.gather(rows, pos) for pos in batch.positions]

  def row_gradients(self, batch: OpsBatch, entry_grads, raising):
    # unsorted_segment_sum's bits (each distinct id's contributions added
    # to zero in the order of the ids) in one pass over the ids; on a CPU,
    # unsorted_segment_sum counts them, then scans them in every thread.
    grads = tf.scatter_nd(
        tf.expand_dims(concat(batch.positions), 1), concat(entry_grads),
        tf.stack([tf.size(batch.unique_ids, out_type=tf.int64),
                  self.table.dim]))
    return checked(self.table.name, grads, raising)

  def stage(self, ids, grads) -> Optional[sharded.Routes]:
    # A table on parameter servers is updated there, under the policy's
    # one lock: its routes are sent ahead of it. With a lock per server,
    # nothing is sent before every check has passed (`shard_updates`).
    if self.servers is None or self.servers.per_shard_locks:
      return None
    return sharded.route(self.servers.shards, ids, grads)

  def updates_per_shard(self) -> bool:
    return self.servers is not None and self.servers.per_shard_locks

  def shard_updates(self, ids, grads, lr) -> List[ShardUpdate]:
    return sharded.shard_updates(
        self.table, sharded.route(self.servers.shards, ids, grads), lr)

  def prepare(self, batch: OpsBatch, ids, grads, lr, global_batch: bool,
              staged: Optional[sharded.Routes] = None) -> Pending:
    # The rows are read again here, not taken from the lookup: a concurrent
    # step may have written them since (each step's update reads, computes
    # and writes under one lock).
    if self.servers is not None:  # on the parameter servers holding them
      if staged is None:  # per shard, in a step that takes the one lock
        staged = sharded.route(self.servers.shards, ids, grads)
      return Pending(*sharded.prepare(self.table, staged, lr))
    return ops_update(self.table, self.variables, ids, grads, lr)


class FusedTable(_Path):
  """The fused CPU kernels of `tfemb.kernels`, one op per part."""

  def lookup(self, members: Sequence[Member]):
    checks = [c for m in members for c in m.lookup.checks]
    with tf.control_dependencies(checks):
      unique_ids, positions, rows = fused_ops.dedup_gather(
          self.table, self.variables["parameters"],
          [m.lookup.ids for m in members], [m.path for m in members],
          self.remap)
    # The kernel checks the ids' range: every update waits for it too.
    return FusedBatch([m.index for m in members], unique_ids, positions,
                      _split(rows, members)), checks + [unique_ids]

  def feature_rows(self, batch: FusedBatch) -> List[tf.Tensor]:
    return [self._quantized(rows) for rows in batch.id_rows]

  def row_gradients(self, batch: FusedBatch, entry_grads, raising):
    grads, finite = fused_ops.row_gradients(
        self.table, concat(entry_grads), batch.positions, batch.unique_ids,
        raising)
    return grads, tf.constant(True) if raising else finite

  def updates_in_place(self) -> bool:
    return fused_ops.in_place_here(self.variables)

  def together_key(self):
    if not self.updates_in_place():
      return None
    return fused_ops.update_key(self.table, self.variables)

  def per_id_gradients(self, batch: FusedBatch, entry_grads
                       ) -> PerIdGradients:
    # A feature's pieces (`step._entry_gradients`) stay pieces: the op
    # reads them where they are.
    pieces = [p for g in entry_grads
              for p in (g if isinstance(g, list) else [g])]
    return PerIdGradients(pieces[0] if len(pieces) == 1 else pieces,
                          batch.positions)

  @classmethod
  def update_together(cls, paths, ids, grads, lrs, gradients_finite,
                      raising=False):
    # Every table's optimizer was checked before (step.apply).
    per_id = isinstance(grads[0], PerIdGradients)
    return fused_ops.apply_tables(
        [p.table for p in paths], [p.variables for p in paths], ids,
        [g.rows for g in grads] if per_id else grads, lrs, gradients_finite,
        positions=[g.positions for g in grads] if per_id else None,
        raise_non_finite=raising)

  def prepare(self, batch: FusedBatch, ids, grads, lr, global_batch: bool,
              staged: None = None) -> Union[Pending, InPlace]:
    # The kernels read the rows they update; every table's optimizer was
    # checked before (step.apply).
    del batch, global_batch, staged
    table, variables = self.table, self.variables
    if self.updates_in_place():
      applied = fused_ops.apply_rows(table, variables, ids, grads, lr)
      return InPlace(applied.finite, lambda keep: fused_ops.restore_rows(
          table, variables, ids, applied, keep))
    # Several mirrored copies, outside a replica: TensorFlow's mirrored ops.
    return ops_update(table, variables, ids, grads, lr)


def ops_update(table, variables: TableVariables, ids, grads, lr) -> Pending:
  """The update of rows `ids` with TensorFlow's ops: the new rows and slots
  computed, checked, and written by the `Pending`'s write."""
  values = sparse_update.new_rows(table, variables, ids, grads, lr)
  return Pending(all_finite(list(values.values())),
                 lambda: sparse_update.write_rows(table, variables, ids,
                                                  values))


def all_finite(values: Sequence[tf.Tensor]) -> tf.Tensor:
  """True iff every element of every tensor is finite: as
  `validation.all_finite`, one test for all of them (a sum of NaN or 0s)."""
  if len(values) == 1:
    return validation.all_finite(values[0])
  return tf.math.is_finite(tf.add_n([tf.reduce_sum(v * 0.0) for v in values]))


def checked(table_name: str, grads, raising: bool):
  """`(grads, finite)` as `row_gradients` returns them, for gradients
  computed with TensorFlow's ops (or summed across replicas)."""
  if not raising:
    return grads, validation.all_finite(grads)
  with tf.control_dependencies(validation.finite_gradients(table_name,
                                                           grads)):
    return tf.identity(grads), tf.constant(True)


def training_path(table, variables: TableVariables, partitioned: bool,
                  options, remap: Optional[Remap] = None) -> _Path:
  """The path of `table`'s training steps: the fused kernels where they
  can take its variables, else TensorFlow's ops."""
  if fused_ops.usable(variables, table.optimizer, partitioned, options):
    return FusedTable(table, variables, remap)
  return OpsTable(table, variables, remap, each_id=not partitioned,
                  servers=sharded.servers(table, variables, partitioned,
                                          options))
