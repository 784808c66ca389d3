"""A host training step: one batch's lookups, activations and update.

`gather` deduplicates each table's ids once (after the input checks),
`activations` combines each feature's rows, and `apply` sums the gradient
per distinct row (across replicas: the global batch's, as the TPU sums it)
and updates every touched table: where the replicas share one copy of the
tables (a host TPU's, `TableStore.one_copy`), once for all of them. Nothing is written before every input and
gradient check of the step has passed, so a failing check leaves every
table and slot as it was (docs/numerics.md, "Errors").
"""

from typing import Any, Callable, Dict, List, NamedTuple, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfemb import inputs
from tfemb import replicas
from tfemb import resolution
from tfemb import validation
from tfemb.host import commit
from tfemb.host import feeding
from tfemb.host.non_finite import NonFinitePolicy
from tfemb.host import sparse_update
from tfemb.host import table_paths
from tfemb.host.paths import Member
from tfemb.host.paths import Pending
from tfemb.host.paths import TablePath

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import


class Batch(NamedTuple):
  lookups: Dict[int, inputs.Lookup]  # by flat feature index
  tables: Dict[int, Tuple[TablePath, Any]]  # by table index: (path, batch)
  checks: List[Any]  # every input check; updates wait for them


class Update(NamedTuple):
  """An update of a step beside its tables' (a `CustomCombiner`'s weights),
  all or nothing with theirs."""
  name: str  # the table named in its errors
  checks: List[Any]  # what every write of the step waits for
  prepare: Callable[[], Pending]  # called under the step's lock


def gather(config: resolution.Resolved, paths: Sequence[TablePath],
           feature_ids: Sequence[int], lookups) -> Batch:
  """Each table's lookup on its path (`paths`, by table index)."""
  members: Dict[int, List[Member]] = {}
  for i, lookup in zip(feature_ids, lookups):
    members.setdefault(config.table_index[i], []).append(
        Member(i, config.paths[i], config.features[i], lookup))
  tables, checks = {}, []
  for t, table_members in members.items():
    if not isinstance(paths[t], TablePath):
      raise TypeError(f"Table {config.tables[t].name!r}: its path is a "
                      f"{type(paths[t]).__name__}, not a "
                      "tfemb.host.paths.TablePath.")
    table_batch, table_checks = paths[t].lookup(table_members)
    tables[t] = (paths[t], table_batch)
    checks += table_checks + [g for m in table_members for g in m.lookup.gate]
  return Batch(dict(zip(feature_ids, lookups)), tables, checks)


def activations(config: resolution.Resolved, batch: Batch,
                feature_ids: Sequence[int], static_shapes=None) -> List[Any]:
  """The flat activations of `feature_ids`, combined per example.

  `static_shapes`: the output shapes fixed for every feature (the TPU
  protocol); None: each lookup's own.
  """
  out = {}
  for path, table_batch in batch.tables.values():
    dim = path.table.dim
    for i, rows in zip(table_batch.features, path.feature_rows(table_batch)):
      lookup = batch.lookups[i]
      if lookup.gate:  # rows read beside the gate's checks, used after
        with tf.control_dependencies(lookup.gate):
          rows = tf.identity(rows)
      if lookup.scales is not None:
        rows = rows * lookup.scales[:, None]
      if lookup.segments is not None:
        rows = tf.math.unsorted_segment_sum(rows, lookup.segments,
                                            lookup.num_segments)
      if lookup.static_shape.is_fully_defined():  # known when traced
        shape = lookup.static_shape.concatenate([dim])
        if rows.shape != shape:
          rows = tf.reshape(rows, shape.as_list())
      else:
        rows = tf.reshape(rows,
                          tf.concat([lookup.output_shape, [dim]], axis=0))
      static = static_shapes[i] if static_shapes else lookup.static_shape
      if static.rank is not None:
        static = static.concatenate([dim])
        if not (rows.shape.is_fully_defined() and rows.shape == static):
          rows = tf.ensure_shape(rows, static)
      out[i] = rows
  return [out[i] for i in feature_ids]


def check_gradients(config: resolution.Resolved, output_shapes, gradients):
  """The flat gradients (float32, None kept), checked as TensorFlow checks
  them: the structure of feature_config, tensors, activation shapes."""
  feeding.check_structure(config, gradients, "gradients")
  flat = []
  for path, grad, shape, feature in zip(config.paths,
                                        nest.flatten(gradients),
                                        output_shapes, config.features):
    expected = shape.concatenate([feature.table.dim])
    if grad is None:
      logging.warning(
          "No gradient passed for feature %s, sending zero gradient. This "
          "may not be correct behavior for certain optimizers like Adam.",
          path)
      flat.append(None)
      continue
    if not isinstance(grad, tf.Tensor):  # as TF: no numpy, no lists
      raise ValueError(f"found non-tensor type: {type(grad)} at path {path}.")
    if not grad.dtype.is_floating:
      raise ValueError(f"Gradient at path {path} must be a float tensor, "
                       f"got dtype {grad.dtype.name}.")
    grad = tf.cast(grad, tf.float32)
    if not grad.shape.is_compatible_with(expected):
      raise ValueError("Found gradient of shape {} at path {}. Expected "
                       "shape {}.".format(grad.shape, path, expected))
    flat.append(grad)
  return flat


def _entry_gradients(config, table_batch, batch: Batch, flat_grads,
                     keep_pieces: bool = False):
  """Per member feature, each id's share of its activation gradient, and
  the checks of the gradients' shapes. A feature's gradient may be a list
  of pieces, its rows one piece after the other (a host TPU's replicas',
  `tfemb.host.global_batch`): with `keep_pieces`, where each id is an
  activation row, its share is that list, which the update reads as it
  is (`table_paths.per_id_gradients`); else the pieces are joined."""
  entry_grads, checks = [], []
  for i in table_batch.features:
    lookup, grad = batch.lookups[i], flat_grads[i]
    dim = config.features[i].table.dim
    if grad is None:
      entry_grads.append(tf.zeros([tf.size(lookup.ids), dim], tf.float32))
      continue
    pieces = [as_rows(p, dim)
              for p in (grad if isinstance(grad, list) else [grad])]
    if len(pieces) > 1 and not (keep_pieces and lookup.segments is None and
                                lookup.scales is None):
      pieces = [tf.concat(pieces, axis=0)]
    shape_checks = validation.gradient_rows(
        config.paths[i], config.features[i].table.name, pieces,
        lookup.num_segments)
    checks += shape_checks
    # After the batch's own checks too: a batch they refuse would fail in
    # the ops below first, with TensorFlow's message. (One piece waiting
    # holds back whatever reads them all.)
    with tf.control_dependencies(shape_checks + list(lookup.checks)):
      pieces[0] = tf.identity(pieces[0])
    if len(pieces) > 1:
      entry_grads.append(pieces)
      continue
    grad = pieces[0]
    if lookup.segments is not None:
      grad = tf.gather(grad, lookup.segments)
    if lookup.scales is not None:
      grad = grad * lookup.scales[:, None]
    entry_grads.append(grad)
  return entry_grads, checks


def as_rows(x, dim: int):
  """`x` as rows of `dim` values, without an op where it is."""
  if x.shape.rank == 2 and x.shape[-1] == dim:
    return x
  return tf.reshape(x, [-1, dim])


def apply(config: resolution.Resolved, batch: Batch, flat_grads,
          policy: NonFinitePolicy, more: Sequence[Update] = (),
          loss_scaled: bool = False, one_copy: bool = False) -> None:
  """Row gradients per table, then every table's update and `more`, then
  the step of the learning rates that count steps; all or nothing under
  `policy`. `loss_scaled`: the gradients are those of a loss Keras scaled
  (`tfemb.layers.loss_scale`), already divided by its scale; a step whose
  gradients or update are not finite is then skipped, uncounted, as Keras
  skips it, whatever the policy's mode.

  Every check (inputs, gradients, learning rates) comes before the first
  write, and a table's update stays only if every table's new rows and
  slots are finite; the updates are read, computed and written under
  `policy.serialized`, or by one op that holds every table itself where
  their paths can update them together (`_commit_together`), so
  concurrent steps on one object lose no update.

  `one_copy`: the replicas share one copy of each table (a host TPU's).
  Under several replicas each then sums its own rows' gradients, and one
  update, in the cross-replica context, sums the replicas' and writes the
  global batch's, instead of every replica gathering every replica's rows
  and writing its own copy.
  """
  raising = policy.raising and not loss_scaled
  multi_replica = replicas.in_multi_replica_step()
  once = one_copy and multi_replica
  paths = [path for path, _ in batch.tables.values()]
  for path in paths:  # a table without an optimizer: an error naming it
    sparse_update.optimizer_of(path.table)
  together = commit.together(paths, more)
  updates, checks, finite = _row_updates(
      config, batch, flat_grads, raising, multi_replica and not once,
      summed_in_update=together and not multi_replica, check_sums=not once)
  checks += [c for u in more for c in u.checks]
  counted = not loss_scaled
  if once:
    written = replicas.once_for_all(
        lambda ids, grads, gates: commit.commit_global(
            config, policy, updates, ids, grads, gates, more, together,
            raising, counted),
        [u.ids for u in updates], [u.grads for u in updates], checks)
  else:
    written = commit.commit_all(config, policy, updates, more, checks, finite,
                          together, raising, counted, multi_replica)
  commit.count_step(resolution.counting_learning_rates(config.tables), written,
              raising)


def _row_updates(config: resolution.Resolved, batch: Batch, flat_grads,
                 raising: bool, multi_replica: bool,
                 summed_in_update: bool = False, check_sums: bool = True):
  """Per table, the distinct ids and their summed gradients (the global
  batch's under several replicas, as the TPU sums them), staged on the
  table's path; the checks the writes wait for, and per table whether its
  gradient is finite. With `summed_in_update`, each table's gradients
  unsummed instead (`TablePath.per_id_gradients`): the update sums and
  checks them itself. Without `check_sums`, this replica's sums, neither
  checked nor staged: the replicas' are summed and checked together
  (`apply`'s `one_copy`)."""
  updates, checks, finite = [], list(batch.checks), []
  for t, (path, table_batch) in batch.tables.items():
    entry_grads, grad_checks = _entry_gradients(
        config, table_batch, batch, flat_grads, keep_pieces=summed_in_update)
    checks += grad_checks
    if summed_in_update:  # the update's op reports the gradient's finiteness
      updates.append(commit.TableUpdate(
          t, path, table_batch, table_batch.unique_ids,
          path.per_id_gradients(table_batch, entry_grads), None))
      continue
    # Under several replicas the check is of the global gradient, below.
    grads, table_finite = path.row_gradients(
        table_batch, entry_grads, raising and not multi_replica and check_sums)
    ids = table_batch.unique_ids
    if not check_sums:
      updates.append(commit.TableUpdate(t, path, table_batch, ids, grads, None))
      continue
    if multi_replica:
      ids, grads = replicas.sum_rows_across_replicas(ids, grads)
      grads, table_finite = table_paths.checked(path.table.name, grads,
                                                raising)
    if raising:
      checks.append(grads)  # carries the table's non-finite check
    finite.append(table_finite)
    updates.append(commit.TableUpdate(t, path, table_batch, ids, grads,
                                path.stage(ids, grads)))
  return updates, checks, finite


