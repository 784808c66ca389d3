"""A host training step: one batch's lookups, activations and update.

`gather` deduplicates each table's ids once (after the input checks),
`activations` combines each feature's rows, and `apply` sums the gradient
per distinct row (across replicas: the global batch's, as the TPU sums it)
and updates every touched table. Nothing is written before every input and
gradient check of the step has passed, so a failing check leaves every
table and slot as it was (docs/numerics.md, "Errors").
"""

from typing import Any, Callable, Dict, List, NamedTuple, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfemb import inputs
from tfemb import optimizers
from tfemb import replicas
from tfemb import resolution
from tfemb import update_rules
from tfemb import validation
from tfemb.host import feeding
from tfemb.host.non_finite import NonFinitePolicy
from tfemb.host import sparse_update
from tfemb.host import table_paths
from tfemb.host.paths import InPlace
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


def _entry_gradients(config, table_batch, batch: Batch, flat_grads):
  """Per member feature, each id's share of its activation gradient, and
  the checks of the gradients' shapes."""
  entry_grads, checks = [], []
  for i in table_batch.features:
    lookup, grad = batch.lookups[i], flat_grads[i]
    dim = config.features[i].table.dim
    if grad is None:
      entry_grads.append(tf.zeros([tf.size(lookup.ids), dim], tf.float32))
      continue
    grad = tf.reshape(grad, [-1, dim])
    shape_checks = validation.gradient_rows(
        config.paths[i], config.features[i].table.name, grad,
        lookup.num_segments)
    checks += shape_checks
    # After the batch's own checks too: a batch they refuse would fail in
    # the ops below first, with TensorFlow's message.
    with tf.control_dependencies(shape_checks + list(lookup.checks)):
      grad = tf.identity(grad)
    if lookup.segments is not None:
      grad = tf.gather(grad, lookup.segments)
    if lookup.scales is not None:
      grad = grad * lookup.scales[:, None]
    entry_grads.append(grad)
  return entry_grads, checks


class _TableUpdate(NamedTuple):
  """One table's share of a step's update, before the lock."""
  index: int  # the table's, in the step's configuration
  path: TablePath
  batch: Any  # the table's batch on its path
  ids: Any  # the distinct ids (the global batch's under several replicas)
  grads: Any  # their summed gradients
  staged: Any  # what the path sent ahead of the lock (`TablePath.stage`)


def apply(config: resolution.Resolved, batch: Batch, flat_grads,
          policy: NonFinitePolicy, more: Sequence[Update] = (),
          loss_scaled: bool = False) -> None:
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
  """
  raising = policy.raising and not loss_scaled
  multi_replica = replicas.in_multi_replica_step()
  paths = [path for path, _ in batch.tables.values()]
  for path in paths:  # a table without an optimizer: an error naming it
    sparse_update.optimizer_of(path.table)
  together = _together(paths, more)
  updates, checks, finite = _row_updates(
      config, batch, flat_grads, raising, multi_replica,
      summed_in_update=together and not multi_replica)
  rates, rate_checks = _learning_rates(config, updates)
  checks += rate_checks + [c for u in more for c in u.checks]
  if together:
    written = _commit_together(policy, updates, rates, checks, finite,
                               raising, counted=not loss_scaled)
  else:
    written = _commit(policy, updates, rates, more, checks, finite, raising,
                      counted=not loss_scaled, global_batch=multi_replica)
  _count_step(resolution.counting_learning_rates(config.tables), written,
              raising)


def _row_updates(config: resolution.Resolved, batch: Batch, flat_grads,
                 raising: bool, multi_replica: bool,
                 summed_in_update: bool = False):
  """Per table, the distinct ids and their summed gradients (the global
  batch's under several replicas, as the TPU sums them), staged on the
  table's path; the checks the writes wait for, and per table whether its
  gradient is finite. With `summed_in_update`, each table's gradients
  unsummed instead (`TablePath.per_id_gradients`): the update sums and
  checks them itself."""
  updates, checks, finite = [], list(batch.checks), []
  for t, (path, table_batch) in batch.tables.items():
    entry_grads, grad_checks = _entry_gradients(config, table_batch, batch,
                                                flat_grads)
    checks += grad_checks
    if summed_in_update:  # the update's op reports the gradient's finiteness
      updates.append(_TableUpdate(
          t, path, table_batch, table_batch.unique_ids,
          path.per_id_gradients(table_batch, entry_grads), None))
      continue
    # Under several replicas the check is of the global gradient, below.
    grads, table_finite = path.row_gradients(
        table_batch, entry_grads, raising and not multi_replica)
    ids = table_batch.unique_ids
    if multi_replica:
      ids, grads = replicas.sum_rows_across_replicas(ids, grads)
      grads, table_finite = table_paths.checked(path.table.name, grads,
                                                raising)
    if raising:
      checks.append(grads)  # carries the table's non-finite check
    finite.append(table_finite)
    updates.append(_TableUpdate(t, path, table_batch, ids, grads,
                                path.stage(ids, grads)))
  return updates, checks, finite


def _learning_rates(config: resolution.Resolved,
                    updates: Sequence[_TableUpdate]):
  """Every table's learning rate (a callable is called here, before any
  write) and its checks: one per table, and one per stack of tables laid
  out as on a SparseCore, which share the stack's optimizer."""
  rates, checks, by_stack = [], [], {}
  for u in updates:
    stack = config.stacks[u.index] if config.stacks else None
    if stack is None or stack not in by_stack:
      table = u.path.table
      lr, lr_checks = update_rules.checked_rate(
          table.optimizer.learning_rate,
          f"{validation.table(table.name)}: the learning rate",
          optimizers.divides_by_learning_rate(table.optimizer))
      checks += lr_checks
      if stack is not None:
        by_stack[stack] = lr
    rates.append(lr if stack is None else by_stack[stack])
  return rates, checks


def _commit(policy: NonFinitePolicy, updates: Sequence[_TableUpdate],
            rates, more: Sequence[Update], checks, finite, raising: bool,
            counted: bool, global_batch: bool) -> tf.Tensor:
  """Under the policy's lock, once every check has passed: each table's
  (and `more`'s) update and its finiteness, all or none. A `Pending`
  update is written once every update is known finite; an `InPlace` one,
  written as it was computed, is taken back unless they all are, before
  anything else of the step can see it (a refused step fails after that).
  Returns whether the step was written."""

  def update():
    def prepare(u, lr):
      return u.path.prepare(u.batch, u.ids, u.grads, lr, global_batch,
                            u.staged)

    last = [u.path.updates_in_place() for u in updates]
    with tf.control_dependencies(checks):
      prepared = [None if later else prepare(u, lr)
                  for u, lr, later in zip(updates, rates, last)]
      prepared += [u.prepare() for u in more]
      # The writes in place, once every other update is computed (each
      # one's `finite` waits for all of its ops), so that a failing assert
      # among them stops the step before anything is written.
      with tf.control_dependencies([p.finite for p in prepared if p]):
        prepared[:len(updates)] = [
            prepare(u, lr) if later else p
            for u, lr, later, p in zip(updates, rates, last, prepared)]
    ok = finite + [p.finite for p in prepared]
    in_place = [p for p in prepared if isinstance(p, InPlace)]
    keep = tf.reduce_all(ok) if in_place else None
    restored = created_by(lambda: [p.restore(keep) for p in in_place])
    with tf.control_dependencies(restored):
      value_checks = policy.checks(
          [p.finite for p in prepared],
          [u.path.table.name for u in updates] + [u.name for u in more]
      ) if raising else []

    def write():
      with tf.control_dependencies(value_checks + restored):
        writes = created_by(lambda: [p.write() for p in prepared
                                     if isinstance(p, Pending)])
      with tf.control_dependencies(writes):
        return tf.constant(True)

    written = policy.run(ok, write, raising, counted)
    if not restored:
      return written
    with tf.control_dependencies(restored):  # before the lock is released
      return tf.identity(written)

  return policy.serialized(update)


def _together(paths: Sequence[TablePath], more: Sequence[Update]) -> bool:
  """Whether one op of the tables' paths can take the step's whole update
  (`TablePath.update_together`, `_commit_together` instead of `_commit`):
  no update beside the tables', and every table's path of one class with
  one key."""
  if more or not paths:
    return False
  keys = [(type(p), p.together_key()) for p in paths]
  return keys[0][1] is not None and all(k == keys[0] for k in keys)


def _commit_together(policy: NonFinitePolicy,
                     updates: Sequence[_TableUpdate], rates, checks, finite,
                     raising: bool, counted: bool) -> tf.Tensor:
  """`_commit` as one op of the tables' paths, once every check has
  passed. It locks every variable it writes for as long as it runs and
  waits for nothing meanwhile, so it needs no lock of the step's: what
  the lock keeps (no update lost to a concurrent step, none half taken
  back) the op keeps by itself. Where it sums the gradients itself
  (`_row_updates`' `summed_in_update`), `finite` is empty: each table's
  answer covers its gradient too."""
  go = tf.constant(True) if raising or not finite else tf.reduce_all(finite)
  with tf.control_dependencies(checks):
    applied = type(updates[0].path).update_together(
        [u.path for u in updates], [u.ids for u in updates],
        [u.grads for u in updates], rates, go, raising)
  value_checks = policy.checks(
      applied, [u.path.table.name for u in updates]) if raising else []

  def write():
    with tf.control_dependencies(value_checks + list(applied)):
      return tf.constant(True)

  return policy.run(list(finite) + list(applied), write, raising, counted)


def _count_step(counting: Sequence[optimizers.CountingLearningRate],
                written: tf.Tensor, raising: bool) -> None:
  """The learning rates that count steps advance once the step is written.
  Outside the lock: a rate's step counter may synchronize the replicas (a
  mirrored variable), which must not wait while one of them holds it."""
  if not counting:
    return

  def advance():
    for rate in counting:
      rate.advance()
    return tf.constant(True)

  with tf.control_dependencies([written]):
    if raising:
      advance()
    else:
      tf.cond(written, advance, lambda: tf.constant(False))


def created_by(fn) -> List[Any]:
  """The ops `fn` creates in a graph (every write, whatever variable kind
  made it), for what must wait for them; [] eagerly, where ops run at
  once."""
  if tf.executing_eagerly():
    fn()
    return []
  graph = tf.compat.v1.get_default_graph()
  before = len(graph.get_operations())
  fn()
  return graph.get_operations()[before:]
