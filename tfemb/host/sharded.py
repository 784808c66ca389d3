"""A sharded table's update on its parameter servers.

Under `ParameterServerStrategy` a table and its slots are `ShardedVariable`s
whose shards live on the parameter servers. Computing the update where the
step runs would fetch every touched row of the table and of each slot from
the parameter servers and send them all back. Instead each shard's part of
the step's distinct ids and their summed gradients is sent to the shard's
parameter server (`route`, before the step takes its update lock), which
gathers its rows, applies the optimizer (`update_rules.apply`, with the
numbers of one process) and checks them there (`prepare`, under the lock);
only the ids, the gradients and one "finite" flag per shard cross the
network, and the write (`sparse_update.write_rows`) stays on that server
too.

Shards split the rows as TensorFlow's "div" routing does (the first shards
take one row more), the routing `tf.nn.embedding_lookup` uses for a
`ShardedVariable`.
"""

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers
from tfemb import update_rules
from tfemb import validation
from tfemb.host import sparse_update
from tfemb.host.table_store import slot_names


def shards(variables: Dict[str, object]) -> Optional[List[Dict[str, object]]]:
  """Per shard, the table's and slots' variables of that shard, when the
  table and all its slots are sharded alike; else None."""
  values = list(variables.values())
  if not all(isinstance(v, sharded_variable.ShardedVariable)
             for v in values):
    return None
  counts = {tuple(int(s.shape[0]) for s in v.variables) for v in values}
  if len(counts) != 1:
    return None
  n = len(values[0].variables)
  return [{name: v.variables[i] for name, v in variables.items()}
          for i in range(n)]


class Routes(NamedTuple):
  """A step's ids and gradients of a sharded table, split by shard and
  already on each shard's parameter server."""
  shards: List[Dict[str, object]]  # per shard, its table and slot variables
  local_ids: List[tf.Tensor]  # per shard, its rows (from 0 in the shard)
  grads: List[tf.Tensor]
  positions: List[tf.Tensor]  # per shard, where its rows sit among all
  count: tf.Tensor  # the step's distinct ids


def route(table, variables, ids, grads) -> Optional[Routes]:
  """Each shard's part of rows `ids` and their gradients `grads`, sent to
  the shard's parameter server; None when the table is not sharded alike
  or its optimizer updates every row (non-lazy Adam).

  The step calls this before it takes its lock (`step.apply`), so that
  the split runs where the step runs and the transfer while another
  step's update holds the lock; under the lock only the parameter servers
  work (`prepare`)."""
  per_shard = shards(variables)
  if per_shard is None or not optimizers.is_lazy(
      sparse_update.optimizer_of(table)):
    return None
  sizes = [int(s["parameters"].shape[0]) for s in per_shard]
  starts, ends, total = [], [], 0
  for size in sizes:
    starts.append(total)
    total += size
    ends.append(total)
  which = tf.searchsorted(tf.constant(ends, ids.dtype), ids, side="right")
  which = tf.cast(which, tf.int32)
  count = tf.size(ids)
  part_ids = tf.dynamic_partition(ids, which, len(sizes))
  part_grads = tf.dynamic_partition(grads, which, len(sizes))
  part_positions = tf.dynamic_partition(tf.range(count), which, len(sizes))
  local_ids, sent_grads, positions = [], [], []
  for shard, start, local, g, where in zip(
      per_shard, starts, part_ids, part_grads, part_positions):
    with tf.device(shard["parameters"].device):
      local_ids.append(local - tf.cast(start, local.dtype))
      sent_grads.append(tf.identity(g))
      positions.append(tf.identity(where))
  return Routes(per_shard, local_ids, sent_grads, positions, count)


def prepare(table, routes: Routes, lr) -> Tuple[tf.Tensor,
                                               Callable[[], List]]:
  """`(finite, write)` of the update `routes` carry, computed on each
  shard's parameter server."""
  opt = sparse_update.optimizer_of(table)
  finites, writes = [], []
  for shard, local, g, positions in zip(routes.shards, routes.local_ids,
                                        routes.grads, routes.positions):
    with tf.device(shard["parameters"].device):
      values = _new_rows(table, opt, shard, local, g, positions,
                         routes.count, lr)
      finites.append(tf.reduce_all(
          [validation.all_finite(v) for v in values.values()]))
    writes.append((shard, local, values))

  def write():
    out = []
    for shard, local, values in writes:
      with tf.device(shard["parameters"].device):
        out += sparse_update.write_rows(table, shard, local, values)
    return out

  return tf.reduce_all(finites), write


# Floats in the widest SIMD register TensorFlow's CPU kernels use (AVX-512).
_LANES = 16


def _new_rows(table, opt, shard, local, grads, positions, count, lr):
  """`sparse_update.new_rows` of one shard's rows, with the same numbers.

  TensorFlow's CPU kernels may round an element differently when it falls
  in a tensor's last, partial SIMD register (e.g. `exp` and `log` there
  are the C library's, not Eigen's: the float64 power of
  `update_rules._pow` can differ in its last bit, and, rarely, in the
  float32 it rounds to). With rows a whole number of registers wide, no
  element does. Otherwise the shard's rows are computed at their places
  in a tensor of all the step's `count` rows (the others zero, then
  dropped), as they are in one process."""
  names = slot_names(table)
  whole = all(v.shape.rank == 2 and v.shape[1] % _LANES == 0
              for v in shard.values())
  if whole:
    spread = lambda x: x
  else:
    spread = lambda x: tf.scatter_nd(
        positions[:, None], x, tf.concat([[count], tf.shape(x)[1:]], 0))
  read = lambda v: spread(tf.gather(v, local))
  new_w, new_slots = update_rules.apply(
      optimizers.identify(opt).rule, opt, read(shard["parameters"]),
      spread(grads), {n: read(shard[n]) for n in names}, lr)
  values = dict(new_slots, parameters=new_w)
  if whole:
    return values
  return {name: tf.gather(value, positions) for name, value in values.items()}
