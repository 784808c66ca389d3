"""The Cloud TPU types a host `TPUStrategy` runs as (docs/tpu.md, "TPU
programs on the CPU").

A type fixes what a TPU program can see of its machine: the replicas
(`num_replicas_in_sync`: TensorCores, one per chip where the chip's two
cores act as one "megacore" device), the hosts, the topology's shape and
the embedding hardware (`tpu_hardware_feature`). The numbers are Cloud
TPU's: v2 and v3 chips have two TensorCores each seen as two devices;
v4 and v5p chips show one megacore device; v5e (v5litepod) and v6e chips
one core. v4 and older train embeddings on the first generation's
hardware (`V1`), v5p and v6e on SparseCores (`V2`: 4 per v5p chip, 2 per
v6e chip, as `TPUEmbeddingV2` reads them from
`num_embedding_devices_per_chip`), v5e has none (`UNSUPPORTED`).
"""

import dataclasses
import os
from typing import Optional, Tuple

import tensorflow as tf
from tensorflow.core.protobuf.tpu import topology_pb2  # pylint: disable=g-direct-tensorflow-import

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
_PROTO_FEATURE = {
    EmbeddingFeature.V1: topology_pb2.TPUHardwareFeature.EmbeddingFeature.V1,
    EmbeddingFeature.V2: topology_pb2.TPUHardwareFeature.EmbeddingFeature.V2,
    EmbeddingFeature.UNSUPPORTED:
        topology_pb2.TPUHardwareFeature.EmbeddingFeature.UNSUPPORTED,
}

ENVIRONMENT = "TFEMB_TPU"  # the type `tfemb.patch()` emulates when set


@dataclasses.dataclass(frozen=True)
class TPUType:
  """One Cloud TPU type as a TPU program sees it.

  `chips_shape` is the chips' mesh (x, y, z); `cores_per_chip` the devices
  each chip shows (2 on v2/v3, else 1); `sparse_cores_per_chip` the
  SparseCores `TPUEmbeddingV2` shards over (0 without them).
  """
  name: str
  chips_shape: Tuple[int, int, int]
  cores_per_chip: int
  embedding_feature: EmbeddingFeature
  sparse_cores_per_chip: int = 0
  num_hosts: int = 1

  @property
  def chips(self) -> int:
    x, y, z = self.chips_shape
    return x * y * z

  @property
  def num_replicas(self) -> int:
    """TensorCores (devices) of the slice: `num_replicas_in_sync`."""
    return self.chips * self.cores_per_chip

  @property
  def mesh_shape(self) -> Tuple[int, int, int, int]:
    """The topology's mesh: chips x, y, z and cores per chip."""
    return self.chips_shape + (self.cores_per_chip,)

  def hardware_feature_proto(self) -> topology_pb2.TPUHardwareFeature:
    return topology_pb2.TPUHardwareFeature(
        embedding_feature=_PROTO_FEATURE[self.embedding_feature],
        num_embedding_devices_per_chip=self.sparse_cores_per_chip)

  def topology_proto(self) -> topology_pb2.TopologyProto:
    """The topology `initialize_tpu_system` returns on such a slice: one
    task holding every device, devices in x-major order of their chip,
    then by core."""
    x, y, z = self.chips_shape
    coordinates = []
    for k in range(z):
      for j in range(y):
        for i in range(x):
          for core in range(self.cores_per_chip):
            coordinates += [i, j, k, core]
    return topology_pb2.TopologyProto(
        mesh_shape=list(self.mesh_shape),
        num_tasks=self.num_hosts,
        num_tpu_devices_per_task=self.num_replicas // self.num_hosts,
        device_coordinates=coordinates,
        tpu_hardware_feature=self.hardware_feature_proto())


_V1, _V2 = EmbeddingFeature.V1, EmbeddingFeature.V2
_NONE = EmbeddingFeature.UNSUPPORTED

TYPES = {t.name: t for t in (
    TPUType("v2-8", (2, 2, 1), 2, _V1),
    TPUType("v3-8", (2, 2, 1), 2, _V1),
    TPUType("v4-8", (2, 2, 1), 1, _V1),
    TPUType("v5litepod-1", (1, 1, 1), 1, _NONE),
    TPUType("v5litepod-4", (2, 2, 1), 1, _NONE),
    TPUType("v5litepod-8", (2, 4, 1), 1, _NONE),
    TPUType("v5p-8", (2, 2, 1), 1, _V2, sparse_cores_per_chip=4),
    TPUType("v6e-1", (1, 1, 1), 1, _V2, sparse_cores_per_chip=2),
    TPUType("v6e-4", (2, 2, 1), 1, _V2, sparse_cores_per_chip=2),
    TPUType("v6e-8", (2, 4, 1), 1, _V2, sparse_cores_per_chip=2),
)}


class UnknownTPUTypeError(ValueError):
  """A TPU type tfemb does not emulate."""


def lookup(name: str) -> TPUType:
  """The type called `name` (as Cloud TPU names it, e.g. "v5p-8"; "v5e-8"
  is read as "v5litepod-8")."""
  key = str(name).strip().lower()
  if key.startswith("v5e-"):
    key = "v5litepod-" + key[len("v5e-"):]
  try:
    return TYPES[key]
  except KeyError:
    raise UnknownTPUTypeError(
        f"Unknown TPU type {name!r}: tfemb runs a TPU program on the CPU as "
        f"one of {', '.join(TYPES)}.") from None


def from_environment() -> Optional[TPUType]:
  """The type `TFEMB_TPU` names, or None when it is unset or empty."""
  name = os.environ.get(ENVIRONMENT, "").strip()
  return lookup(name) if name else None
