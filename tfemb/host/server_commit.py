"""A step's update of tables on their parameter servers, with no lock held
across servers.

Where every table of a step is updated on the parameter servers holding it
(`TablePath.updates_per_shard`: tables sharded, or placed, over the
servers of a `ParameterServerStrategy`), each shard's update is read,
computed, checked and written on its server under the engine's lock there
(`NonFinitePolicy.run_per_server`), once every check of the step has
passed where the step runs. Steps of other workers update the other
servers meanwhile, and a server's update waits for no other server.

What that gives up against the engine's one lock
(`Options.cluster_update_lock`): a step is all or nothing per shard, not
across the cluster. Non-finite gradients are refused before anything is
sent, so no shard changes; but a shard whose new rows or slots would not be
finite (an overflow in the optimizer) keeps its old values while the
step's other shards are written, and the step fails naming the table and
the shard ("raise") or is counted in `skipped_steps` ("skip").
"""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from tfemb.host import update_lock
from tfemb.host.non_finite import NonFinitePolicy
from tfemb.host.paths import TablePath


def commit(policy: NonFinitePolicy,
           tables: Sequence[Tuple[TablePath, tf.Tensor, tf.Tensor]], rates,
           checks: List[Any], finite: List[Any], raising: bool,
           counted: bool) -> tf.Tensor:
  """Every table's update (`tables`: each one's path, distinct ids and
  summed gradients; `rates`, their learning rates) on its servers, after
  `checks`; `finite`: whether each table's gradient is (under "skip").
  Returns whether every shard was written."""

  def send():
    # The ids and gradients leave for the servers only once the step's
    # checks (the gradients' finiteness among them) have passed.
    with tf.control_dependencies(checks):
      return [part for (path, ids, grads), lr in zip(tables, rates)
              for part in path.shard_updates(ids, grads, lr)]

  if raising:
    parts = send()
    flags = update_lock.in_order(lambda: policy.run_per_server(parts))
    with tf.control_dependencies(policy.shard_checks(parts, flags)):
      return tf.constant(True)
  go = tf.reduce_all(finite) if finite else tf.constant(True)
  written = update_lock.in_order(lambda: tf.cond(
      go, lambda: tf.reduce_all(policy.run_per_server(send())),
      lambda: tf.constant(False)))
  # Counted in `skipped_steps` unless every shard was written.
  return policy.run([written], lambda: tf.constant(True), False, counted)
