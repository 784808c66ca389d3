"""TensorFlow's TPU system, routed to the host by the object
(`tfemb.object_hooks`): while a TPU type is emulated, TensorFlow's own
classes and functions hand a TPU program's set-up to
`tfemb.tpu.host.system` and `tfemb.tpu.host.strategy`, whatever name the
program reached them by (`tf.distribute...`, `tensorflow.python...`, an
alias, a reference kept before the patch). No name in TensorFlow's modules
changes, and what is not a host TPU's goes to TensorFlow's own code:

| TensorFlow's object | routed to the host when |
|---|---|
| `TPUClusterResolver` (the class itself) | a type is emulated |
| `TPUStrategy`, `tf.distribute.experimental.TPUStrategy` (the classes themselves) | its resolver is a host one, or None or any TPU resolver while a type is emulated |
| `initialize_tpu_system_impl`, `shutdown_tpu_system_impl` (every `initialize_tpu_system` / `shutdown_tpu_system`, `TPUClusterResolver.connect`) | the same |
| `tf.config.experimental_connect_to_cluster` | it is given such a resolver |
| `tf.config.list_logical_devices`, `list_physical_devices`, `tf.device` | it is asked for a TPU device: refused, the replicas are CPU devices |
| a multi-device iterator's per-device dataset | a type is emulated: without tf.data's autotuning (`tfemb.tpu.host.strategy`) |
| a distributed iterator's `get_next` (`next(iterator)`) | its strategy is a host TPU's of embedding hardware V1 and it fetches to the replicas' devices: its batch is recorded as on the TPU's devices (`tfemb.tpu.host.tpu_rules`) |
"""

from typing import List, Union

from tfemb import object_hooks
from tfemb.tpu.host import strategy as host_strategy
from tfemb.tpu.host import system
from tfemb.tpu.host import tf_internals
from tfemb.tpu.host import tpu_rules

Hook = Union[object_hooks.ClassHook, object_hooks.FunctionHook]


def _resolver(*args, **kwargs):
  del args, kwargs
  return system.HostTPUClusterResolver if system.active_type() else None


def _strategy(tpu_cluster_resolver=None, *args, **kwargs):
  del args, kwargs
  if system.is_host_resolver(tpu_cluster_resolver):
    return host_strategy.HostTPUStrategy
  return None


def _tpu_system(function):
  def route(cluster_resolver=None, *args, **kwargs):
    del args, kwargs
    return function if system.is_host_resolver(cluster_resolver) else None
  return route


def _connect(cluster_spec_or_resolver=None, *args, **kwargs):
  del args, kwargs
  if cluster_spec_or_resolver is not None and system.is_host_resolver(
      cluster_spec_or_resolver):
    return system.no_connection
  return None


def _device_datasets() -> object_hooks.FunctionHook:
  """Each replica device's dataset of a distributed dataset's iterator,
  without autotuning while a type is emulated."""
  hook = None

  def without_autotuning(*args, **kwargs):
    return host_strategy.without_autotuning(hook.original(*args, **kwargs))

  def route(*args, **kwargs):
    del args, kwargs
    return without_autotuning if system.active_type() else None

  hook = object_hooks.FunctionHook(tf_internals.create_device_dataset, route)
  return hook


def _fetched_batches() -> object_hooks.FunctionHook:
  """A host V1 TPU's batches fetched to its replicas' devices, recorded:
  `TPUEmbedding.enqueue` refuses them as TensorFlow's does on a TPU."""
  hook = None

  def recording(*args, **kwargs):
    values = hook.original(*args, **kwargs)
    tpu_rules.record_fetched_to_device(values)
    return values

  def route(iterator=None, *args, **kwargs):
    del args, kwargs
    strategy = getattr(iterator, "_strategy", None)
    if (host_strategy.is_host_tpu_strategy(strategy) and
        strategy.extended.tpu_hardware_feature.embedding_feature ==
        tf_internals.HardwareFeature.EmbeddingFeature.V1 and
        tpu_rules.fetches_to_device(getattr(iterator, "_options", None))):
      return recording
    return None

  hook = object_hooks.FunctionHook(tf_internals.distributed_iterator_get_next,
                                   route)
  return hook


def hooks() -> List[Hook]:
  """The hooks, not installed: `tfemb.patching` installs them while a TPU
  type is emulated."""
  return [
      object_hooks.ClassHook(tf_internals.TPUClusterResolver, _resolver,
                             route_bare_calls=True),
      object_hooks.ClassHook(tf_internals.TPUStrategyV2, _strategy,
                             route_bare_calls=True),
      object_hooks.ClassHook(tf_internals.TPUStrategyV1Class, _strategy,
                             route_bare_calls=True),
      object_hooks.FunctionHook(
          tf_internals.initialize_tpu_system_impl,
          _tpu_system(system.initialize_tpu_system)),
      object_hooks.FunctionHook(
          tf_internals.shutdown_tpu_system_impl,
          _tpu_system(system.shutdown_tpu_system)),
      object_hooks.FunctionHook(tf_internals.connect_to_cluster, _connect),
      object_hooks.FunctionHook(
          tf_internals.list_logical_devices,
          system.refuse_tpu_device_type("list_logical_devices")),
      object_hooks.FunctionHook(
          tf_internals.list_physical_devices,
          system.refuse_tpu_device_type("list_physical_devices")),
      object_hooks.FunctionHook(tf_internals.device_v2,
                                system.refuse_tpu_device),
      _device_datasets(),
      _fetched_batches(),
  ]
