"""A `TPUStrategy` whose replicas are logical CPU devices: a TPU program's
strategy on the CPU (docs/tpu.md, "TPU programs on the CPU").

`HostTPUStrategy` is an instance of `tf.distribute.TPUStrategy` and of
`tf.distribute.experimental.TPUStrategy`, so every branch that asks
`isinstance(strategy, TPUStrategy)` (tensorflow-recommenders, keras-rs,
Keras' `fit`, Model Garden, the user's own code) takes its TPU path, and
`extended.tpu_hardware_feature` and `num_hosts` are the emulated type's
(`tfemb.tpu.tpu_types`). What a replica computes runs as
`MirroredStrategy` runs it on the same devices (TensorFlow's own
`MirroredExtended`): variables are mirrored, gradients all-reduced, and N
replicas equal one replica on the global batch. As on a TPU, `run` outside
a `tf.function` traces its function into one.

The embedding engines see the strategy through `tfemb.tpu.delegate`:
on a real TPU TensorFlow's engines do the work; under this strategy
tfemb's host engines of the type's generation do (`V1`:
`tfemb.TPUEmbedding`, `V2`: `tfemb.TPUEmbeddingV2`, `UNSUPPORTED`:
`tfemb.TPUEmbeddingV0`).
"""

import contextlib
import itertools
import weakref
from typing import Any, List, Optional

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import mirrored_strategy  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import tpu_strategy  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_hardware_feature  # pylint: disable=g-direct-tensorflow-import

from tfemb.tpu import host_devices
from tfemb.tpu import host_input
from tfemb.tpu import host_system
from tfemb.tpu import tpu_types

# Each strategy's collectives get keys of their own, as two MirroredStrategy
# objects in one process need.
_KEY_BASES = itertools.count(start=1 << 20, step=1 << 16)


class HostTPUExtended(mirrored_strategy.MirroredExtended):
  """`MirroredExtended` over the type's logical CPU devices, with the
  attributes a TPU program reads of `TPUStrategy.extended`."""

  def __init__(self, container_strategy, tpu_type: tpu_types.TPUType,
               devices: List[str], resolver: Any,
               device_assignment: Optional[Any]):
    # Reductions gather on one device: TensorFlow's collectives take their
    # instance keys as call-time captures, which a step called inside
    # `tf.cond` (Keras' `steps_per_execution` loop) cannot feed.
    super().__init__(container_strategy, devices=devices,
                     cross_device_ops=tf.distribute.ReductionToOneDevice())
    self._tpu_type = tpu_type
    self._tpu_cluster_resolver = resolver
    self._device_assignment = device_assignment
    self._tpu_function_cache = weakref.WeakKeyDictionary()
    self._logical_device_stack = [0]

  @property
  def tpu_type(self) -> tpu_types.TPUType:
    return self._tpu_type

  @property
  def tpu_hardware_feature(self):
    """The type's embedding hardware (`tf.tpu.experimental.HardwareFeature`)."""
    return tpu_hardware_feature.HardwareFeature(
        self._tpu_type.hardware_feature_proto())

  @property
  def num_hosts(self) -> int:
    return self._tpu_type.num_hosts

  @property
  def num_replicas_per_host(self) -> int:
    return self._num_replicas_in_sync // self.num_hosts

  @property
  def steps_per_run(self) -> int:  # TPUStrategyV1's attribute
    return 1

  def tpu_run(self, fn, args, kwargs, options=None):
    """`TPUStrategy.run`'s step: each replica runs `fn`; a `tf.function`
    called eagerly is traced into one function first, as a TPU compiles
    it (TensorFlow's `run` refuses any other eager `fn`)."""
    del options  # a TPU's compile options
    if not tf.executing_eagerly():
      return self._call_for_each_replica(fn, args, kwargs or {})
    function = self._tpu_function_cache.get(fn)
    if function is None:
      function = tf.function(
          lambda a, k: self._call_for_each_replica(fn, a, k or {}),
          autograph=False)
      self._tpu_function_cache[fn] = function
    return function(args, kwargs)

  def _experimental_distribute_dataset(self, dataset, options):
    """`MirroredStrategy`'s, but each replica's batch comes from one host
    iterator (`host_input`): no `MultiDeviceIterator` to trace at every
    epoch of a Keras `fit`."""
    return host_input.distribute(self, dataset, options)

  @contextlib.contextmanager
  def experimental_logical_device(self, logical_device_id: int):
    """Model parallelism is not emulated: each replica is one device."""
    if logical_device_id != 0:
      raise ValueError(
          f"logical_device_id={logical_device_id}: a host TPUStrategy runs "
          "each replica on one device (logical device 0); model parallelism "
          "across a replica's cores is not emulated.")
    yield

  def _experimental_initialize_system(self):
    """Nothing to initialise: the devices are the host's."""

  def _in_multi_worker_mode(self) -> bool:
    return False


class HostTPUStrategy(tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy):
  """`tf.distribute.TPUStrategy` on the host's logical CPU devices, for the
  TPU type of `tpu_cluster_resolver` (a host resolver from
  `tfemb.patch(tpu=TYPE)`), or of the active patch when None.

  Args:
    tpu_cluster_resolver: the resolver (`tfemb.tpu.host_system`), or None.
    experimental_device_assignment: a `tf.tpu.experimental.DeviceAssignment`
      over the type's topology: its replicas (one core each) become the
      strategy's, on the devices of their cores.
    experimental_spmd_xla_partitioning: an XLA setting; no effect here.
    device_assignment: `tf.distribute.experimental.TPUStrategy`'s name for
      `experimental_device_assignment`.
  """

  # pylint: disable=super-init-not-called,non-parent-init-called
  def __init__(self, tpu_cluster_resolver=None,
               experimental_device_assignment=None,
               experimental_spmd_xla_partitioning=False,
               device_assignment=None):
    del experimental_spmd_xla_partitioning
    resolver = host_system.resolver_for(tpu_cluster_resolver)
    assignment = experimental_device_assignment or device_assignment
    tpu_type = resolver.tpu_type
    devices = host_devices.replica_devices(tpu_type,
                                           _ordinals(tpu_type, assignment))
    self._collective_key_base = next(_KEY_BASES)
    distribute_lib.Strategy.__init__(
        self, HostTPUExtended(self, tpu_type, devices, resolver, assignment))

  def __repr__(self) -> str:
    return (f"<HostTPUStrategy {self.extended.tpu_type.name}: "
            f"{self.num_replicas_in_sync} replicas on the CPU>")


def _ordinals(tpu_type: tpu_types.TPUType, assignment) -> List[int]:
  """The devices (ordinals in the type's topology) of the replicas."""
  if assignment is None:
    return list(range(tpu_type.num_replicas))
  if assignment.num_cores_per_replica != 1:
    raise ValueError(
        f"The device assignment gives each replica "
        f"{assignment.num_cores_per_replica} cores: a host TPUStrategy runs "
        "each replica on one device; model parallelism is not emulated.")
  # One host: a replica's core ordinal is its device.
  return [int(assignment.tpu_ordinal(replica=r, logical_core=0))
          for r in range(assignment.num_replicas)]

def is_host_tpu_strategy(strategy: Any) -> bool:
  return isinstance(strategy, HostTPUStrategy)
