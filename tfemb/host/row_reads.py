"""`gather_rows`: a table's or slot's rows in id order, from any of the
variables the host engine keeps it in (plain, mirrored, sharded over
parameter servers, or an interleaved table's column view)."""

import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import

from tfemb import replicas


def gather_rows(variable, ids):
  """Rows `ids` of a table or slot, in the order of `ids`.

  A `ShardedVariable` (tables over parameter servers) is read per shard
  with TensorFlow's "div" routing; its own `sparse_read` would return the
  rows grouped by shard, not in the order asked for. A mirrored variable
  is read from the replica's own copy.
  """
  if isinstance(variable, sharded_variable.ShardedVariable):
    return tf.nn.embedding_lookup(variable, ids)
  # On a mirrored variable (no sparse_read of its own) tf.gather would read
  # the whole table: a resource gather of the replica's copy instead.
  return tf.gather(replicas.local_copy(variable), ids)
