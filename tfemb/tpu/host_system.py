"""What a TPU program calls before it has a strategy, answered on the host
(docs/tpu.md, "TPU programs on the CPU").

Under `tfemb.patch(tpu=TYPE)` (`tfemb.patching`), TensorFlow's public names
for these are routed here:

| TensorFlow | on the host |
|---|---|
| `tf.distribute.cluster_resolver.TPUClusterResolver(tpu)` | `HostTPUClusterResolver`: any `tpu` (`''`, `'local'`, a name), no network |
| `tf.config.experimental_connect_to_cluster(resolver)` | nothing to connect for a TPU resolver; other clusters as TensorFlow |
| `tf.tpu.experimental.initialize_tpu_system` | the type's `tf.tpu.experimental.Topology` |
| `tf.tpu.experimental.shutdown_tpu_system` | nothing to shut down |
| `tf.distribute.TPUStrategy`, `tf.distribute.experimental.TPUStrategy` | `tfemb.tpu.host_strategy.HostTPUStrategy` |
| `tf.config.list_logical_devices('TPU')`, `list_physical_devices('TPU')`, `tf.device('/TPU:0')` | an error: the replicas are CPU devices |

(`tfemb.patching` installs these.) One process emulates one TPU type at a
time.
"""

import threading
from typing import Any, List, Optional

import tensorflow as tf
from tensorflow.python.client import session as session_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver as tpu_resolver_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_system_metadata  # pylint: disable=g-direct-tensorflow-import

from tfemb.tpu import tpu_types

TFClusterResolver = tpu_resolver_lib.TPUClusterResolver  # TensorFlow's


_LOCK = threading.Lock()
_active: List[tpu_types.TPUType] = []  # the emulated type, while patched


class TPUDeviceNamesError(RuntimeError):
  """A program asked for TPU devices, which a host TPU strategy has not."""


def active_type() -> Optional[tpu_types.TPUType]:
  """The TPU type being emulated, or None."""
  return _active[0] if _active else None


def activate(tpu_type: tpu_types.TPUType) -> None:
  with _LOCK:
    _active[:] = [tpu_type]


def deactivate() -> None:
  with _LOCK:
    _active.clear()


def _require_type() -> tpu_types.TPUType:
  tpu_type = active_type()
  if tpu_type is None:
    raise RuntimeError(
        "No TPU type is being emulated: apply tfemb.patch(tpu=TYPE) (or "
        f"set {tpu_types.ENVIRONMENT}=TYPE) first; types: "
        f"{', '.join(tpu_types.TYPES)}.")
  return tpu_type


class HostTPUClusterResolver(TFClusterResolver):
  """`TPUClusterResolver` for the emulated type: the TPU is "local" (no
  Cloud TPU API, no network), whatever `tpu` names. The arguments are
  TensorFlow's; the ones that locate a Cloud TPU are kept, unused."""

  # pylint: disable=super-init-not-called,unused-argument
  def __init__(self, tpu=None, zone=None, project=None, job_name="worker",
               coordinator_name=None, coordinator_address=None,
               credentials="default", service=None, discovery_url=None):
    self.tpu_type = _require_type()
    self._cloud_tpu_client = tpu_resolver_lib._LocalCloudTpuClient()  # pylint: disable=protected-access
    self._tpu = "local" if tpu in (None, "", "local") else tpu
    self.task_type = job_name
    self.task_id = 0
    self._coordinator_name = None
    self._coordinator_address = None
    self._tpu_topology = None

  @staticmethod
  def connect(tpu=None, zone=None, project=None):
    """As TensorFlow's: a resolver, its system initialised."""
    resolver = HostTPUClusterResolver(tpu, zone, project)
    initialize_tpu_system(resolver)
    return resolver

  def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
    return ""  # the local process, as a directly attached TPU

  def get_master(self) -> str:
    return ""

  def cluster_spec(self):
    return tf.train.ClusterSpec({})

  def num_accelerators(self, task_type=None, task_id=None,
                       config_proto=None):
    return {"TPU": self.tpu_type.num_replicas}

  def get_tpu_system_metadata(self):
    n = self.tpu_type.num_replicas
    devices = [session_lib._DeviceAttributes(d.name, d.device_type, 0, 0)  # pylint: disable=protected-access
               for d in tf.config.list_logical_devices("CPU")[:n]]
    return tpu_system_metadata.TPUSystemMetadata(
        num_cores=n, num_hosts=self.tpu_type.num_hosts,
        num_of_cores_per_host=n // self.tpu_type.num_hosts,
        topology=topology(self.tpu_type), devices=devices)

  @property
  def environment(self) -> str:
    return ""

  def __repr__(self) -> str:
    return f"<HostTPUClusterResolver {self._tpu!r} as a {self.tpu_type.name}>"


def resolver_for(resolver: Optional[Any]) -> HostTPUClusterResolver:
  """`resolver` if it is a host resolver, else one for the same TPU name."""
  if isinstance(resolver, HostTPUClusterResolver):
    return resolver
  if resolver is None:
    return HostTPUClusterResolver()
  if isinstance(resolver, TFClusterResolver):
    return HostTPUClusterResolver(getattr(resolver, "_tpu", None))
  raise TypeError(
      f"A TPUStrategy needs a TPUClusterResolver, got "
      f"{type(resolver).__name__}.")


def topology(tpu_type: tpu_types.TPUType):
  """The type's `tf.tpu.experimental.Topology`."""
  return tf.tpu.experimental.Topology(
      serialized=tpu_type.topology_proto().SerializeToString())


def initialize_tpu_system(cluster_resolver=None):
  """`tf.tpu.experimental.initialize_tpu_system` on the host: the type's
  topology (also kept by the resolver, as TensorFlow does)."""
  resolver = resolver_for(cluster_resolver)
  result = topology(resolver.tpu_type)
  resolver.set_tpu_topology(result.serialized())
  if cluster_resolver is not None and cluster_resolver is not resolver:
    cluster_resolver.set_tpu_topology(result.serialized())
  return result


def shutdown_tpu_system(cluster_resolver=None):
  """`tf.tpu.experimental.shutdown_tpu_system`: nothing to shut down."""
  resolver_for(cluster_resolver)


def connect_to_cluster(original):
  """`tf.config.experimental_connect_to_cluster`: a TPU resolver's cluster
  is this process; anything else goes to TensorFlow's."""

  def experimental_connect_to_cluster(cluster_spec_or_resolver, *args,
                                      **kwargs):
    if isinstance(cluster_spec_or_resolver, TFClusterResolver):
      return None
    return original(cluster_spec_or_resolver, *args, **kwargs)

  experimental_connect_to_cluster.__doc__ = original.__doc__
  return experimental_connect_to_cluster


def _no_tpu_devices(what: str) -> TPUDeviceNamesError:
  tpu_type = active_type()
  name = tpu_type.name if tpu_type else "TPU"
  return TPUDeviceNamesError(
      f"{what}: the host {name} has no TPU devices; its replicas are "
      "logical CPU devices. Place work with the strategy (strategy.run, "
      "strategy.scope()) or read strategy.extended.worker_devices, not TPU "
      "device names.")


def _is_tpu_type(device_type: Optional[str]) -> bool:
  return bool(device_type) and device_type.upper() in ("TPU", "TPU_SYSTEM")


def guarded_device_lists(original):
  """`tf.config.list_logical_devices` / `list_physical_devices`: asking for
  TPU devices is an error."""

  def list_devices(device_type=None):
    if _is_tpu_type(device_type):
      raise _no_tpu_devices(
          f"tf.config.{original.__name__}({device_type!r})")
    return original(device_type)

  list_devices.__name__ = original.__name__
  list_devices.__doc__ = original.__doc__
  return list_devices


def guarded_device(original):
  """`tf.device`: a TPU device is an error."""

  def device(device_name):
    if isinstance(device_name, str) and device_name:
      spec = tf.DeviceSpec.from_string(device_name)
      if _is_tpu_type(spec.device_type):
        raise _no_tpu_devices(f"tf.device({device_name!r})")
    return original(device_name)

  device.__doc__ = original.__doc__
  return device
