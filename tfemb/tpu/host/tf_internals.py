"""The private names of TensorFlow the host TPU relies on, in one place.

Each was read from TensorFlow 2.21's sources and is used as it is in 2.16
too (CI runs the oldest supported release, tfemb/tf_versions.py). Where a
release moves one, this module is what changes.

* TensorFlow's TPU system, which `tfemb.patch(tpu=TYPE)` hooks by the
  object (`tfemb.tpu.host.routes`): the resolver class, the functions every
  `initialize_tpu_system` / `shutdown_tpu_system` path calls (the public
  ones, `TPUClusterResolver.connect`, `tpu_strategy_util`'s), the strategy
  classes, the public device functions (a TPU device is refused), the
  per-device datasets of a multi-device iterator and a distributed
  iterator's `get_next` (what it fetched to the replicas' devices);
* what a host resolver and strategy build on: the TPU system metadata, a
  device's attributes, `MirroredExtended`, `Strategy.__init__`, and the
  distributed dataset and iterator classes `tfemb.tpu.host.datasets`
  derives from;
* whether TensorFlow has set up its devices (the CPU can be split into
  logical devices only before).
"""

from typing import Any, Callable

# pylint: disable=g-direct-tensorflow-import,protected-access
from tensorflow.python.client import session as session_lib
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import input_lib
from tensorflow.python.distribute import mirrored_strategy
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver
from tensorflow.python.eager import context
from tensorflow.python.eager import remote
from tensorflow.python.framework import composite_tensor
from tensorflow.python.framework import config
from tensorflow.python.framework import ops
from tensorflow.python.framework import type_spec
from tensorflow.python.tpu import tpu_hardware_feature
from tensorflow.python.tpu import tpu_strategy_util
from tensorflow.python.tpu import tpu_system_metadata

# --- TensorFlow's TPU system, hooked by tfemb.tpu.host.routes ----------------

# `tf.distribute.cluster_resolver.TPUClusterResolver`.
TPUClusterResolver = tpu_cluster_resolver.TPUClusterResolver
# `tf.distribute.TPUStrategy` and `tf.distribute.experimental.TPUStrategy`.
TPUStrategyV2 = tpu_strategy.TPUStrategyV2
TPUStrategyV1Class = tpu_strategy.TPUStrategy
# What every path to `initialize_tpu_system` / `shutdown_tpu_system` calls
# with `(cluster_resolver, tpu_cluster_resolver_cls)`: the public functions
# (tpu_cluster_resolver.py) and `TPUClusterResolver.connect`.
initialize_tpu_system_impl = tpu_strategy_util.initialize_tpu_system_impl
shutdown_tpu_system_impl = tpu_strategy_util.shutdown_tpu_system_impl
# `tf.config.experimental_connect_to_cluster`.
connect_to_cluster = remote.connect_to_cluster
# `tf.config.list_logical_devices`, `list_physical_devices`, `tf.device`.
list_logical_devices = config.list_logical_devices
list_physical_devices = config.list_physical_devices
device_v2 = ops.device_v2

# What every multi-device iterator (a distributed dataset's, one iterator per
# replica device) builds each device's dataset with.
create_device_dataset = multi_device_iterator_ops._create_device_dataset
# A distributed dataset's iterator's `next` (every `next(iterator)`), and
# what it was made with: `_strategy`, `_options` (InputOptions or None).
distributed_iterator_get_next = input_lib.DistributedIterator.get_next

# --- what the host's resolver and strategy build on -------------------------

TPUSystemMetadata = tpu_system_metadata.TPUSystemMetadata
HardwareFeature = tpu_hardware_feature.HardwareFeature
MirroredExtended = mirrored_strategy.MirroredExtended

# A distributed dataset and its iterators (`input_lib`), which
# `tfemb.tpu.host.datasets` subclasses to read each replica's batch from one
# host iterator, and the base classes of its own iterator type.
DistributedDataset = input_lib.DistributedDataset
DistributedDatasetsFromFunction = input_lib.DistributedDatasetsFromFunction
DistributedDatasetSpec = input_lib.DistributedDatasetSpec
DistributedDatasetsFromFunctionSpec = (
    input_lib.DistributedDatasetsFromFunctionSpec)
DistributedIterator = input_lib.DistributedIterator
DistributedIteratorSpec = input_lib.DistributedIteratorSpec
SingleWorkerOwnedDatasetIterator = input_lib._SingleWorkerOwnedDatasetIterator
SingleWorkerDatasetIteratorSpec = input_lib._SingleWorkerDatasetIteratorSpec
PER_REPLICA = distribute_lib.InputReplicationMode.PER_REPLICA
CompositeTensor = composite_tensor.CompositeTensor
TypeSpec = type_spec.TypeSpec
IteratorSpec = iterator_ops.IteratorSpec


def device_attributes(name: str, device_type: str) -> Any:
  """A device's attributes as `TPUSystemMetadata.devices` lists them."""
  return session_lib._DeviceAttributes(name, device_type, 0, 0)


def init_strategy_base(strategy, extended) -> None:
  """`tf.distribute.Strategy.__init__`: what every strategy's constructor
  ends with, without the TPU strategies' own (which connect to a TPU)."""
  distribute_lib.Strategy.__init__(strategy, extended)


def call_for_each_replica(extended, fn: Callable[..., Any], args, kwargs):
  """`MirroredExtended`'s replica loop: `fn` on every replica."""
  return extended._call_for_each_replica(fn, args, kwargs)


def mirrored_datasets_from_function(extended, dataset_fn, options) -> Any:
  """`MirroredExtended`'s `distribute_datasets_from_function`."""
  return mirrored_strategy.MirroredExtended._distribute_datasets_from_function(
      extended, dataset_fn, options)


def devices_set_up() -> bool:
  """Whether TensorFlow has set up its devices (they cannot change now)."""
  return context.context()._context_handle is not None
