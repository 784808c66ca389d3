"""A table's update on the parameter servers that hold it.

Under `ParameterServerStrategy` a table and its slots are `ShardedVariable`s
whose shards live on the parameter servers (or, unsharded, variables there).
Computing the update where the step runs would fetch every touched row of
the table and of each slot from the parameter servers and send them all
back. Instead each shard's part of the step's distinct ids and their summed
gradients is sent to the shard's parameter server (`route`), which gathers
its rows, applies the optimizer (`update_rules.apply`, with the numbers of
one process), checks them and writes them there; only the ids, the
gradients and one "finite" flag per shard cross the network.

A step's update is atomic in one of two ways (`Servers.per_shard_locks`):

* per shard (the default): each shard's gather, update, check and write run
  on its server under the engine's lock there (`shard_updates`, committed
  by `tfemb.host.server_commit`), so other servers take other steps
  meanwhile. A shard whose new rows or slots are not all finite writes
  nothing; the step's other shards are written.
* under the engine's one lock (`Options.cluster_update_lock`): the routes
  are sent before the lock (`route`), every shard's new rows computed and
  checked under it (`prepare`), and written only if all are finite.

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
from tfemb.host.paths import ShardUpdate
from tfemb.host.table_store import slot_names


class Servers(NamedTuple):
  """A table whose update runs on the parameter servers holding it."""
  shards: List[Dict[str, object]]  # per shard, its table and slot variables
  per_shard_locks: bool  # else under the engine's lock


def servers(table, variables: Dict[str, object], partitioned: bool,
            options) -> Optional[Servers]:
  """Where `table`'s update runs, if on its parameter servers: when its
  optimizer updates only the touched rows (not non-lazy Adam), and the
  table and all its slots are sharded alike, or, under a parameter-server
  strategy (`partitioned`), each one variable on the same server."""
  if table.optimizer is None or not optimizers.is_lazy(table.optimizer):
    return None
  per_shard = shards(variables)
  if per_shard is None and partitioned:
    devices = {getattr(v, "device", None) for v in variables.values()}
    if len(devices) == 1 and "/job:ps/" in (devices.pop() or ""):
      per_shard = [dict(variables)]
  if per_shard is None:
    return None
  return Servers(per_shard, not options.cluster_update_lock)


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
  """A step's ids and gradients of a table on its servers, split by shard
  and already on each shard's parameter server."""
  shards: List[Dict[str, object]]  # per shard, its table and slot variables
  local_ids: List[tf.Tensor]  # per shard, its rows (from 0 in the shard)
  grads: List[tf.Tensor]
  positions: List[Optional[tf.Tensor]]  # per shard, where its rows sit
  # among all (None: one shard, every row in order)
  count: tf.Tensor  # the step's distinct ids


def route(per_shard: List[Dict[str, object]], ids, grads) -> Routes:
  """Each shard's part of rows `ids` and their gradients `grads`, sent to
  the shard's parameter server."""
  sizes = [int(s["parameters"].shape[0]) for s in per_shard]
  count = tf.size(ids)
  if len(sizes) == 1:  # every row, in the step's order
    with tf.device(per_shard[0]["parameters"].device):
      return Routes(per_shard, [tf.identity(ids)], [tf.identity(grads)],
                    [None], count)
  starts, ends, total = [], [], 0
  for size in sizes:
    starts.append(total)
    total += size
    ends.append(total)
  which = tf.searchsorted(tf.constant(ends, ids.dtype), ids, side="right")
  which = tf.cast(which, tf.int32)
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
  shard's parameter server (under the engine's lock)."""
  opt = sparse_update.optimizer_of(table)
  finites, writes = [], []
  for shard, local, g, positions in zip(routes.shards, routes.local_ids,
                                        routes.grads, routes.positions):
    with tf.device(shard["parameters"].device):
      _, values = _new_rows(table, opt, shard, local, g, positions,
                            routes.count, lr)
      finites.append(_finite(values))
    writes.append((shard, local, values))

  def write():
    out = []
    for shard, local, values in writes:
      with tf.device(shard["parameters"].device):
        out += sparse_update.write_rows(table, shard, local, values)
    return out

  return tf.reduce_all(finites), write


def shard_updates(table, routes: Routes, lr) -> List[ShardUpdate]:
  """Each shard's update that `routes` carry, to run under that shard's
  own lock on its server: its rows and slots read, updated and checked,
  and written unless a new value is not finite (then the old values are
  written back: nothing changes). Each returns whether it was finite."""
  opt = sparse_update.optimizer_of(table)

  def update(shard, local, g, positions):
    old, new = _new_rows(table, opt, shard, local, g, positions,
                         routes.count, lr)
    finite = _finite(new)
    kept = {name: tf.where(finite, value, old[name])
            for name, value in new.items()}
    with tf.control_dependencies(
        sparse_update.write_rows(table, shard, local, kept)):
      return tf.identity(finite)

  out = []
  for i, args in enumerate(zip(routes.shards, routes.local_ids,
                               routes.grads, routes.positions)):
    out.append(ShardUpdate(table.name, i, len(routes.shards),
                           args[0]["parameters"].device,
                           lambda args=args: update(*args)))
  return out


def _finite(values: Dict[str, tf.Tensor]) -> tf.Tensor:
  return tf.reduce_all([validation.all_finite(v) for v in values.values()])


# Floats in the widest SIMD register TensorFlow's CPU kernels use (AVX-512).
_LANES = 16


def _new_rows(table, opt, shard, local, grads, positions, count, lr):
  """`(old, new)`: one shard's rows `local` and their slots as read, and
  `sparse_update.new_rows` of them, with the same numbers.

  TensorFlow's CPU kernels may round an element differently when it falls
  in a tensor's last, partial SIMD register (e.g. `exp` and `log` there
  are the C library's, not Eigen's: the float64 power of
  `update_rules._pow` can differ in its last bit, and, rarely, in the
  float32 it rounds to). With rows a whole number of registers wide, no
  element does. Otherwise the shard's rows are computed at their places
  in a tensor of all the step's `count` rows (the others zero, then
  dropped), as they are in one process."""
  names = slot_names(table)
  old = {name: tf.gather(shard[name], local)
         for name in ["parameters"] + list(names)}
  whole = positions is None or all(
      v.shape.rank == 2 and v.shape[1] % _LANES == 0 for v in shard.values())
  if whole:
    spread = lambda x: x
  else:
    spread = lambda x: tf.scatter_nd(
        positions[:, None], x, tf.concat([[count], tf.shape(x)[1:]], 0))
  new_w, new_slots = update_rules.apply(
      optimizers.identify(opt).rule, opt, spread(old["parameters"]),
      spread(grads), {n: spread(old[n]) for n in names}, lr)
  new = dict(new_slots, parameters=new_w)
  if not whole:
    new = {name: tf.gather(value, positions) for name, value in new.items()}
  return old, new
