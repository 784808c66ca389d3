"""A `TPUStrategy` whose replicas are logical CPU devices: a TPU program's
strategy on the CPU (docs/tpu.md, "TPU programs on the CPU").

`HostTPUStrategy` is an instance of `tf.distribute.TPUStrategy` and of
`tf.distribute.experimental.TPUStrategy`, so every branch that asks
`isinstance(strategy, TPUStrategy)` (tensorflow-recommenders, keras-rs,
Keras' `fit`, Model Garden, the user's own code) takes its TPU path, and
`extended.tpu_hardware_feature` and `num_hosts` are the emulated type's
(`tfemb.tpu.host.tpu_types`). What a replica computes runs as
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
import threading
import weakref
from typing import Any, FrozenSet, List, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tfemb.tpu.host import datasets as host_datasets
from tfemb.tpu.host import devices as host_devices
from tfemb.tpu.host import system as host_system
from tfemb.tpu.host import tf_internals
from tfemb.tpu.host import tpu_types

# Each strategy's collectives get keys of their own, as two MirroredStrategy
# objects in one process need.
_KEY_BASES = itertools.count(start=1 << 20, step=1 << 16)


class ReplicaCall(NamedTuple):
  """The replica function `run` is tracing in this thread: the graph it
  traces into (a TPU's `TPUReplicateContext`'s) and its inputs, the
  component tensors of its arguments (the TPU's replicated inputs)."""
  graph: Any
  inputs: FrozenSet[int]  # id() of each tensor


_replica_calls = threading.local()


def replica_call() -> Optional[ReplicaCall]:
  """The replica function a host TPUStrategy's `run` is tracing in this
  thread (a replica's), or None outside one."""
  return getattr(_replica_calls, "current", None)


def _recording_replica_calls(fn):
  """`fn`, recording its `ReplicaCall` while it runs."""

  def replica_fn(*args, **kwargs):
    before = replica_call()
    _replica_calls.current = ReplicaCall(
        tf.compat.v1.get_default_graph(),
        frozenset(id(t) for t in tf.nest.flatten((args, kwargs),
                                                 expand_composites=True)
                  if isinstance(t, tf.Tensor)))
    try:
      return fn(*args, **kwargs)
    finally:
      _replica_calls.current = before

  return replica_fn


class HostTPUExtended(tf_internals.MirroredExtended):
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
    return tf_internals.HardwareFeature(
        self._tpu_type.hardware_feature_proto())

  @property
  def num_hosts(self) -> int:
    return self._tpu_type.num_hosts

  @property
  def _tpu_devices(self):
    """`TPUExtended`'s replicas x their cores' devices (one core each here),
    which TensorFlow's SparseCore utilities read."""
    return np.array([[d] for d in self.worker_devices], dtype=object)

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
    replica_fn = _recording_replica_calls(fn)
    if not tf.executing_eagerly():
      return tf_internals.call_for_each_replica(self, replica_fn, args,
                                                kwargs or {})
    function = self._tpu_function_cache.get(fn)
    if function is None:
      function = tf.function(
          lambda a, k: tf_internals.call_for_each_replica(
              self, replica_fn, a, k or {}), autograph=False)
      self._tpu_function_cache[fn] = function
    return function(args, kwargs)

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

  # A distributed dataset's iterator is an iterator of the dataset and one
  # per replica device (TensorFlow's multi-device iterator), each with
  # tf.data's autotuning thread. Freeing such an iterator (when the
  # garbage collector reaches it) waits, holding the GIL, for each of those
  # threads to end its wait between optimizations, up to a minute each:
  # with a TPU type's many replicas on the host, the program stops for
  # minutes, with no CPU in use. The host TPU's datasets, and the per-device
  # ones (`tfemb.tpu.host.routes`), run without autotuning (their
  # parallelism is what the program set, or the host's cores).
  #
  # And each replica's batch of a distributed dataset (of either kind,
  # iterated eagerly or in a `tf.function`) comes from one host iterator
  # (`tfemb.tpu.host.datasets`): no `MultiDeviceIterator`, whose functions
  # Keras' `fit` would trace again at every epoch, and whose blocking reads
  # in a `tf.function` need an inter-op thread per replica.
  def _experimental_distribute_dataset(self, dataset, options):
    return host_datasets.distribute(self, without_autotuning(dataset),
                                    options)

  def _distribute_datasets_from_function(self, dataset_fn, options):
    return host_datasets.distribute_from_function(
        self, lambda context: without_autotuning(dataset_fn(context)),
        options)

  def _in_multi_worker_mode(self) -> bool:
    return False


class HostTPUStrategy(tf_internals.TPUStrategyV2,
                      tf_internals.TPUStrategyV1Class):
  """`tf.distribute.TPUStrategy` on the host's logical CPU devices, for the
  TPU type of `tpu_cluster_resolver` (a host resolver from
  `tfemb.patch(tpu=TYPE)`), or of the active patch when None.

  TensorFlow's TPU strategy constructors are not run: they build a
  `TPUExtended`, which connects to the TPU system and compiles for it.
  What they end with, `tf.distribute.Strategy.__init__`, runs instead,
  with a `HostTPUExtended`. (The one attribute `TPUStrategyV2`'s adds,
  `_enable_packed_variable_in_eager_mode`, only `TPUExtended` reads; the
  usage gauges it sets are TensorFlow's telemetry.)

  Args:
    tpu_cluster_resolver: the resolver (`tfemb.tpu.host.system`), or None.
    experimental_device_assignment: a `tf.tpu.experimental.DeviceAssignment`
      over the type's topology: its replicas (one core each) become the
      strategy's, on the devices of their cores.
    experimental_spmd_xla_partitioning: an XLA setting; no effect here.
    device_assignment: `tf.distribute.experimental.TPUStrategy`'s name for
      `experimental_device_assignment`.
  """

  # pylint: disable=super-init-not-called
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
    tf_internals.init_strategy_base(
        self, HostTPUExtended(self, tpu_type, devices, resolver, assignment))

  def __repr__(self) -> str:
    return (f"<HostTPUStrategy {self.extended.tpu_type.name}: "
            f"{self.num_replicas_in_sync} replicas on the CPU>")


def without_autotuning(dataset):
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


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
