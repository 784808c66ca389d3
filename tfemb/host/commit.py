"""A step's update, written all or nothing (`tfemb.host.step.apply` calls
it with each table's distinct ids and summed gradients).

`commit_all` writes every table's update once every check has passed:
under the policy's lock (`_commit`), or as one op of the tables' paths
that holds every variable it writes (`_commit_together`), or, for tables
on parameter servers, each shard's under the lock of its own server
(`tfemb.host.server_commit`). Where the
replicas share one copy of the tables (a host TPU's), `commit_global` sums
the replicas' rows and writes the global batch's update once. Afterwards
`count_step` advances the learning rates that count steps.
"""

from typing import Any, List, NamedTuple, Sequence

import tensorflow as tf

from tfemb import optimizers
from tfemb import replicas
from tfemb import resolution
from tfemb import update_rules
from tfemb import validation
from tfemb.host import server_commit
from tfemb.host import table_paths
from tfemb.host.non_finite import NonFinitePolicy
from tfemb.host.paths import InPlace
from tfemb.host.paths import Pending
from tfemb.host.paths import TablePath


class TableUpdate(NamedTuple):
  """One table's share of a step's update, before the lock."""
  index: int  # the table's, in the step's configuration
  path: TablePath
  batch: Any  # the table's batch on its path
  ids: Any  # the distinct ids (the global batch's under several replicas)
  grads: Any  # their summed gradients
  staged: Any  # what the path sent ahead of the lock (`TablePath.stage`)


def commit_all(config, policy, updates, more, checks, finite, together,
                raising, counted, global_batch) -> tf.Tensor:
  """Every table's update (`_commit_together` where one op takes them all,
  `server_commit.commit` where the parameter servers take them, else
  `_commit`), with the learning rates' checks; whether it was written."""
  rates, rate_checks = learning_rates(config, updates)
  checks = list(checks) + rate_checks
  if together:
    return _commit_together(policy, updates, rates, checks, finite, raising,
                            counted)
  if on_servers([u.path for u in updates], more):
    return server_commit.commit(
        policy, [(u.path, u.ids, u.grads) for u in updates], rates, checks,
        finite, raising, counted)
  return _commit(policy, updates, rates, more, checks, finite, raising,
                 counted, global_batch)


def commit_global(config, policy, updates: Sequence[TableUpdate],
                   ids, grads, gates, more, together, raising, counted
                   ) -> tf.Tensor:
  """The one update of a step whose replicas share one copy of the tables,
  in the cross-replica context: `ids` and `grads` by table, each a tuple
  of every replica's distinct ids and their summed gradients; `gates`,
  each replica's checks passed. Together, the one op sums each id's rows
  itself; otherwise they are summed here, in the replicas' order, as the
  all-gather of `_row_updates` sums them."""
  global_updates, checks, finite = [], list(gates), []
  for u, table_ids, table_grads in zip(updates, ids, grads):
    if together:
      unique, positions = tf.unique(tf.concat(table_ids, 0), tf.int64)
      rows = table_paths.PerIdGradients(tf.concat(table_grads, 0), positions)
      global_updates.append(u._replace(ids=unique, grads=rows))
      continue
    unique, summed = replicas.sum_rows(table_ids, table_grads)
    summed, table_finite = table_paths.checked(u.path.table.name, summed,
                                               raising)
    if raising:
      checks.append(summed)  # carries the table's non-finite check
    finite.append(table_finite)
    global_updates.append(u._replace(ids=unique, grads=summed,
                                     staged=u.path.stage(unique, summed)))
  return commit_all(config, policy, global_updates, more, checks, finite,
                     together, raising, counted, global_batch=True)


def learning_rates(config: resolution.Resolved,
                    updates: Sequence[TableUpdate]):
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


def _commit(policy: NonFinitePolicy, updates: Sequence[TableUpdate],
            rates, more: Sequence[Any], checks, finite, raising: bool,
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


def together(paths: Sequence[TablePath], more: Sequence[Any]) -> bool:
  """Whether one op of the tables' paths can take the step's whole update
  (`TablePath.update_together`, `_commit_together` instead of `_commit`):
  no update beside the tables', and every table's path of one class with
  one key."""
  if more or not paths:
    return False
  keys = [(type(p), p.together_key()) for p in paths]
  return keys[0][1] is not None and all(k == keys[0] for k in keys)


def on_servers(paths: Sequence[TablePath], more: Sequence[Any]) -> bool:
  """Whether the parameter servers take the step's update, each shard's
  under its server's lock (`server_commit.commit` instead of `_commit`):
  no update beside the tables', and every table's path updates it per
  shard. Otherwise a table there is updated under the policy's one lock,
  all or nothing with the others."""
  return bool(paths) and not more and all(p.updates_per_shard()
                                          for p in paths)


def _commit_together(policy: NonFinitePolicy,
                     updates: Sequence[TableUpdate], rates, checks, finite,
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


def count_step(counting: Sequence[optimizers.CountingLearningRate],
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
