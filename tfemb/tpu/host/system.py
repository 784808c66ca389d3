"""What a TPU program calls before it has a strategy, answered on the host
(docs/tpu.md, "TPU programs on the CPU").

While a TPU type is emulated (`tfemb.patch(tpu=TYPE)`), TensorFlow's own
objects route here (`tfemb.tpu.host.routes`, by the object: every import
path reaches them):

| TensorFlow | on the host |
|---|---|
| `TPUClusterResolver(tpu, ...)` (any `tpu`: `''`, `'local'`, a name), `.connect()` | `HostTPUClusterResolver`: no network |
| `tf.config.experimental_connect_to_cluster(resolver)` | nothing to connect for a TPU resolver; other clusters as TensorFlow |
| `initialize_tpu_system(resolver)` (every path to it) | the type's `tf.tpu.experimental.Topology` |
| `shutdown_tpu_system(resolver)` | nothing to shut down |
| `TPUStrategy(resolver)`, `tf.distribute.experimental.TPUStrategy` | `tfemb.tpu.host.strategy.HostTPUStrategy` |

One process emulates one TPU type at a time.
"""

import threading
from typing import Any, List, Optional

import tensorflow as tf

from tfemb.tpu.host import tf_internals
from tfemb.tpu.host import tpu_types

TFClusterResolver = tf_internals.TPUClusterResolver  # TensorFlow's

_LOCK = threading.Lock()
_active: List[tpu_types.TPUType] = []  # the emulated type, while patched
# Whether a TPUEmbedding (embedding hardware V1) has configured the TPU's
# embedding engine since the TPU system was last initialized: one may.
_embedding_configured: List[bool] = [False]


def active_type() -> Optional[tpu_types.TPUType]:
  """The TPU type being emulated, or None."""
  return _active[0] if _active else None


def activate(tpu_type: tpu_types.TPUType) -> None:
  with _LOCK:
    _active[:] = [tpu_type]


def deactivate() -> None:
  with _LOCK:
    _active.clear()
    _embedding_configured[0] = False


def check_embedding_engine_free() -> None:
  """Refuses, as TensorFlow's `build` does, a second `TPUEmbedding` until
  the TPU system is initialized again."""
  if _embedding_configured[0]:
    raise RuntimeError(
        "TPU is already initialized for embeddings. This may be caused by "
        "using multiple TPUEmbedding instances in a TPU scope which is "
        "unsupported")


def configure_embedding_engine() -> None:
  """Claims the TPU's embedding engine for a `TPUEmbedding` being built."""
  with _LOCK:
    check_embedding_engine_free()
    _embedding_configured[0] = True


def _clear_embedding_engine() -> None:
  with _LOCK:
    _embedding_configured[0] = False


def _require_type() -> tpu_types.TPUType:
  tpu_type = active_type()
  if tpu_type is None:
    raise RuntimeError(
        "No TPU type is being emulated: apply tfemb.patch(tpu=TYPE) (or "
        f"set {tpu_types.ENVIRONMENT}=TYPE) first; types: "
        f"{', '.join(tpu_types.TYPES)}.")
  return tpu_type


class HostCloudTpuClient:
  """What a resolver's `_cloud_tpu_client` answers for the emulated type,
  with no Cloud TPU API: the TPU is ready and healthy, and there is
  nothing to configure or wait for (TensorFlow's `Client` has the same
  methods; its own tests call `configure_tpu_version`)."""

  def __init__(self, tpu_type: tpu_types.TPUType, name: str):
    self._tpu_type = tpu_type
    self._name = name

  def api_available(self) -> bool:
    return False  # as a directly attached TPU's

  def name(self) -> str:
    return self._name

  def accelerator_type(self) -> str:
    return self._tpu_type.name

  def state(self) -> str:
    return "READY"

  def health(self) -> str:
    return "HEALTHY"

  def recoverable(self) -> bool:
    return True

  def symptoms(self) -> list:
    return []

  def runtime_version(self) -> str:
    return tf.__version__

  def network_endpoints(self) -> list:
    return []

  def get_local_ip(self) -> str:
    return "127.0.0.1"

  def wait_for_healthy(self, timeout_s=1200, interval=30) -> None:
    del timeout_s, interval  # healthy already

  def configure_tpu_version(self, version, restart_type="always") -> None:
    del version, restart_type  # the host's TensorFlow is the runtime

  def enter(self) -> None:
    pass

  def exit(self, type_, value, traceback) -> None:
    del type_, value, traceback


class HostTPUClusterResolver(TFClusterResolver):
  """`TPUClusterResolver` for the emulated type: the TPU is this process,
  whatever `tpu` names. The arguments are TensorFlow's; the ones that
  locate a Cloud TPU are kept, unused.

  TensorFlow's `__init__` runs as for a directly attached TPU
  (`tpu="local"`: no Cloud TPU API, no network, no coordinator server);
  then the TPU's name is the one given and `_cloud_tpu_client` answers for
  the emulated type (`HostCloudTpuClient`).
  """

  # pylint: disable=unused-argument
  def __init__(self, tpu=None, zone=None, project=None, job_name="worker",
               coordinator_name=None, coordinator_address=None,
               credentials="default", service=None, discovery_url=None):
    tpu_type = _require_type()
    super().__init__(tpu="local", job_name=job_name)
    self.tpu_type = tpu_type
    self._tpu = "local" if tpu in (None, "", "local") else tpu
    self._cloud_tpu_client = HostCloudTpuClient(tpu_type, self._tpu)

  @staticmethod
  def connect(tpu=None, zone=None, project=None):
    """As TensorFlow's: a resolver, its system initialised."""
    resolver = HostTPUClusterResolver(tpu, zone, project)
    initialize_tpu_system(resolver)
    return resolver

  def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
    return ""  # the local process, as a directly attached TPU

  def cluster_spec(self):
    return tf.train.ClusterSpec({})

  def num_accelerators(self, task_type=None, task_id=None,
                       config_proto=None):
    return {"TPU": self.tpu_type.num_replicas}

  def get_tpu_system_metadata(self):
    n = self.tpu_type.num_replicas
    devices = [tf_internals.device_attributes(d.name, d.device_type)
               for d in tf.config.list_logical_devices("CPU")[:n]]
    return tf_internals.TPUSystemMetadata(
        num_cores=n, num_hosts=self.tpu_type.num_hosts,
        num_of_cores_per_host=n // self.tpu_type.num_hosts,
        topology=topology(self.tpu_type), devices=devices)

  @property
  def environment(self) -> str:
    return ""

  def __repr__(self) -> str:
    return f"<HostTPUClusterResolver {self._tpu!r} as a {self.tpu_type.name}>"


def is_host_resolver(resolver: Any) -> bool:
  """Whether `resolver` gets the host's TPU system: a host resolver, or,
  while a type is emulated, None or any TPU resolver (one made before the
  patch)."""
  if isinstance(resolver, HostTPUClusterResolver):
    return True
  return active_type() is not None and (
      resolver is None or isinstance(resolver, TFClusterResolver))


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


def initialize_tpu_system(cluster_resolver=None, tpu_cluster_resolver_cls=None):
  """`initialize_tpu_system` on the host: the type's topology (also kept
  by the resolver, as TensorFlow does). Inside a `tf.function`, as
  TensorFlow there, the serialized topology."""
  del tpu_cluster_resolver_cls  # TensorFlow's implementation's argument
  resolver = resolver_for(cluster_resolver)
  _clear_embedding_engine()
  result = topology(resolver.tpu_type)
  resolver.set_tpu_topology(result.serialized())
  if cluster_resolver is not None and cluster_resolver is not resolver:
    cluster_resolver.set_tpu_topology(result.serialized())
  if not tf.inside_function():
    return result
  return tf.constant(result.serialized())


def shutdown_tpu_system(cluster_resolver=None, tpu_cluster_resolver_cls=None):
  """`shutdown_tpu_system` on the host: the embedding engine released."""
  del tpu_cluster_resolver_cls
  resolver_for(cluster_resolver)
  _clear_embedding_engine()


def no_connection(cluster_spec_or_resolver, *args, **kwargs) -> None:
  """`experimental_connect_to_cluster` of a host TPU's resolver: its
  cluster is this process."""
  del cluster_spec_or_resolver, args, kwargs


class TPUDeviceNamesError(RuntimeError):
  """A program asked for TPU devices, which a host TPU strategy has not."""


def _no_tpu_devices(what: str) -> TPUDeviceNamesError:
  tpu_type = active_type()
  name = tpu_type.name if tpu_type else "TPU"
  return TPUDeviceNamesError(
      f"{what}: the host {name} has no TPU devices; its replicas are "
      "logical CPU devices. Place work with the strategy (strategy.run, "
      "strategy.scope()) or read strategy.extended.worker_devices, not TPU "
      "device names.")


def _is_tpu_type(device_type: Optional[str]) -> bool:
  return isinstance(device_type, str) and device_type.upper() in (
      "TPU", "TPU_SYSTEM")


def refuse_tpu_device_type(function_name: str):
  """The refusal of `tf.config.<function_name>(device_type)` for a TPU
  device type (a route: None for any other type)."""

  def route(device_type=None):
    if not _is_tpu_type(device_type):
      return None

    def refuse(device_type=None):
      raise _no_tpu_devices(f"tf.config.{function_name}({device_type!r})")

    return refuse

  return route


def refuse_tpu_device(device_name=None):
  """The refusal of `tf.device(name)` for a TPU device (a route: None for
  any other name)."""
  if not (isinstance(device_name, str) and device_name and _is_tpu_type(
      tf.DeviceSpec.from_string(device_name).device_type)):
    return None

  def refuse(device_name):
    raise _no_tpu_devices(f"tf.device({device_name!r})")

  return refuse
