"""The logical CPU devices a host `TPUStrategy`'s replicas run on.

TensorFlow splits the CPU into logical devices only before it initialises
its devices (the first tensor, variable or device query does). So
`tfemb.patch(tpu=TYPE)` splits it at once, into as many devices as the type
has replicas (more if a configuration already asked for more), and refuses
with what to do where TensorFlow has already set up fewer.
"""

from typing import List, Sequence

import tensorflow as tf

from tfemb.tpu.host import tf_internals
from tfemb.tpu.host import tpu_types


class DevicesAlreadySetUpError(RuntimeError):
  """TensorFlow set up its devices before the TPU type could split the
  CPU into its replicas."""


def _logical_cpus() -> int:
  return len(tf.config.list_logical_devices("CPU"))


def configure(tpu_type: tpu_types.TPUType) -> None:
  """Splits the CPU into `tpu_type.num_replicas` logical devices, or checks
  that TensorFlow already has that many."""
  wanted = tpu_type.num_replicas
  if tf_internals.devices_set_up():
    have = _logical_cpus()
    if have < wanted:
      raise DevicesAlreadySetUpError(
          f"A {tpu_type.name} has {wanted} replicas, each a logical CPU "
          f"device here, but TensorFlow has already set up its devices "
          f"({have} logical CPU device{'s' if have != 1 else ''}) and cannot "
          "split the CPU any more. Apply tfemb.patch(tpu="
          f"{tpu_type.name!r}) before the program creates any tensor or "
          f"variable, or set {tpu_types.ENVIRONMENT}={tpu_type.name} and "
          "import tfemb first, or run the program with `python -m tfemb.run "
          f"--tpu {tpu_type.name} script.py`.")
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu) or []
  if len(existing) >= wanted:
    return
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)


def replica_devices(tpu_type: tpu_types.TPUType,
                    ordinals: Sequence[int]) -> List[str]:
  """The logical CPU device of each replica (the device of core `ordinal`
  of the type's topology)."""
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
  if max(ordinals, default=-1) >= len(cpus):
    raise DevicesAlreadySetUpError(
        f"A {tpu_type.name}'s replicas need {tpu_type.num_replicas} logical "
        f"CPU devices; TensorFlow has {len(cpus)}. Apply "
        f"tfemb.patch(tpu={tpu_type.name!r}) (or set "
        f"{tpu_types.ENVIRONMENT}) before the program creates any tensor.")
  return [cpus[k] for k in ordinals]
