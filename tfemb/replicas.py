"""Replicas: whose batch a replica looks up, which copy of a mirrored table
it reads and writes (`local_copy`), and the global-batch gradient.

The TPU sums the gradient of a row over the whole global batch, across all
replicas. Under a multi-replica strategy (`MirroredStrategy`,
`MultiWorkerMirroredStrategy`) each replica deduplicates its own ids and
sums its own row gradients; `sum_rows_across_replicas` all-gathers those
`(ids, gradients)` pairs from every replica, in the same order everywhere,
and sums them per distinct row again. Every replica then holds the same
global gradient and applies the same update to its own copy of the
(mirrored, aggregation NONE) table, so the copies stay identical without a
dense all-reduce.
"""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import device_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import distribute_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import values as values_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import values_util  # pylint: disable=g-direct-tensorflow-import

from tfemb import tpu_strategies


def is_distributed(structure: Any) -> bool:
  """True if `structure` holds per-replica values (a distributed batch)."""
  return any(isinstance(x, values_lib.DistributedValues)
             for x in tf.nest.flatten(structure))


def local_devices(strategy=None) -> List[str]:
  """This worker's replica devices under `strategy` (default: current)."""
  strategy = strategy or tf.distribute.get_strategy()
  return list(strategy.extended.worker_devices)


def index_of_device(device: str, strategy) -> int:
  """The index among this worker's replicas of the one on `device`."""
  wanted = tf.DeviceSpec.from_string(device_util.canonicalize(device))
  devices = local_devices(strategy)
  for i, name in enumerate(devices):
    if tf.DeviceSpec.from_string(device_util.canonicalize(name)) == wanted:
      return i
  raise ValueError(f"enqueue(device={device!r}): no replica of this worker "
                   f"runs on that device; its replicas' devices are "
                   f"{devices}.")


def is_tpu_device(device: str, strategy) -> bool:
  """Whether `device` is a TPU core's: a TPU device, or under a host TPU
  strategy (for the host engine, any TPU strategy) one of its replicas'
  devices, which stand for the cores."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.device_type == "TPU":
    return True
  if not tpu_strategies.is_tpu_strategy(strategy):
    return False
  wanted = device_util.canonicalize(device)
  return any(device_util.canonicalize(d) == wanted
             for d in local_devices(strategy))


def split(structure: Any, strategy) -> List[Any]:
  """One structure per local replica, from a distributed structure."""
  return [distribute_utils.select_replica(i, structure)
          for i in range(len(local_devices(strategy)))]


def local_index() -> int:
  """This replica's index among this worker's replicas (0 off-strategy)."""
  if (not tf.distribute.has_strategy() or
      tf.distribute.in_cross_replica_context()):
    return 0
  replica_id = values_util.get_current_replica_id_as_int()
  if replica_id is None:
    return 0
  return replica_id % max(1, len(local_devices()))


def copies(variable) -> Tuple[Any, ...]:
  """The variables that hold `variable`: a mirrored variable's copy on each
  replica's device, else the variable itself."""
  if isinstance(variable, values_lib.MirroredVariable):
    return tuple(variable.values)
  return (variable,)


def local_copy(variable):
  """The copy of a mirrored variable to read or write here: this replica's
  (in a replica's context), else the one on the current device (e.g. an
  enqueue outside strategy.run), else the first. Any other variable is
  returned as is."""
  if isinstance(variable, values_lib.MirroredVariable):
    return variable._get_on_device_or_primary()  # pylint: disable=protected-access
  return variable


def in_replica_context_of(strategy) -> bool:
  """True inside `strategy.run` of `strategy`, a strategy other than the
  default one."""
  return (tf.distribute.has_strategy() and
          not tf.distribute.in_cross_replica_context() and
          tf.distribute.get_strategy() is strategy)


def in_multi_replica_step() -> bool:
  """True inside `strategy.run` with more than one replica in sync."""
  context = tf.distribute.get_replica_context()
  return context is not None and context.num_replicas_in_sync > 1


def once_for_all(fn, ids, grads, checks) -> Any:
  """`fn(ids, grads, gates)` run once for a step of every replica (in the
  cross-replica context, `merge_call`), its result returned to each:
  `ids` and `grads` are this replica's (lists, by table), and `fn` gets
  each entry as a tuple of every replica's, in the replicas' order, and
  `gates`, one tensor per replica that waits for its `checks`."""
  with tf.control_dependencies(checks):
    gate = tf.constant(True)

  def merged(strategy, all_ids, all_grads, all_gates):
    local = strategy.experimental_local_results
    return fn([local(t) for t in all_ids], [local(g) for g in all_grads],
              list(local(all_gates)))

  return tf.distribute.get_replica_context().merge_call(
      merged, args=(list(ids), list(grads), gate))


def sum_rows(ids: Sequence[tf.Tensor], grads: Sequence[tf.Tensor]
             ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Rows of several replicas (`(distinct ids, row gradients)` each, in
  the replicas' order) summed per id: the global ones."""
  all_ids, all_grads = tf.concat(list(ids), 0), tf.concat(list(grads), 0)
  unique_ids, idx = tf.unique(all_ids, out_idx=tf.int64)
  summed = tf.math.unsorted_segment_sum(
      all_grads, idx, tf.size(unique_ids, out_type=tf.int64))
  return unique_ids, summed


def sum_rows_across_replicas(ids: tf.Tensor,
                             grads: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """Every replica's `(distinct ids, row gradients)` -> the global ones.

  Each replica adds one placeholder row (id -1, zero gradient) before the
  all-gather and the placeholders are dropped after it: TensorFlow 2.21's
  all-gather of a tensor empty on every replica kills the process (a table
  that gets no id in a step, e.g. an optional feature empty in the whole
  global batch, or every id dropped). The other rows keep their order, so
  the sums are those of the gather without placeholders.
  """
  context = tf.distribute.get_replica_context()
  all_ids = context.all_gather(tf.pad(ids, [[0, 1]], constant_values=-1),
                               axis=0)
  all_grads = context.all_gather(tf.pad(grads, [[0, 1], [0, 0]]), axis=0)
  real = all_ids >= 0
  return sum_rows([tf.boolean_mask(all_ids, real)],
                  [tf.boolean_mask(all_grads, real)])
