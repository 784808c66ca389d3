"""A stand-in `TPUStrategy` for tests: no TPU, no TPU op.

`StandInTPUStrategy` is a `tf.distribute.TPUStrategy` subclass whose
constructor skips TensorFlow's (which connects to a TPU) and which answers
only what the TPU embedding engines read at construction: `extended`
(`tpu_hardware_feature`, `num_hosts`, `worker_devices`,
`_device_assignment`) and `num_replicas_in_sync`. `use_strategy` makes it
the current strategy for `tf.distribute.get_strategy()` and for TensorFlow's
engines (which call `distribute_lib.get_strategy()`). `assert_same_fields`
checks the configs and optimizers tfemb hands those engines.
"""

import types

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-direct-tensorflow-import

from tfemb import configs
from tfemb import optimizers
from tfemb import tf_versions

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature


class StandInTPUStrategy(tf.distribute.TPUStrategy):
  """What a TPU slice of `num_hosts` hosts with `num_replicas` cores tells.

  TensorFlow's constructor does not run: it connects to a TPU. The stand-in
  sets only what the engines read at construction (its `extended` and
  `num_replicas_in_sync`, as properties over what it keeps).
  """

  def __init__(self, embedding_feature=EmbeddingFeature.V1, num_replicas=8,
               num_hosts=1, num_cores_per_replica=None):  # pylint: disable=super-init-not-called
    per_host = num_replicas * (num_cores_per_replica or 1) // num_hosts
    devices = [f"/job:worker/replica:0/task:{h}/device:TPU:{c}"
               for h in range(num_hosts) for c in range(per_host)]
    assignment = None
    if num_cores_per_replica:
      assignment = types.SimpleNamespace(
          num_cores_per_replica=num_cores_per_replica)
    self._stand_in_extended = types.SimpleNamespace(
        tpu_hardware_feature=types.SimpleNamespace(
            embedding_feature=embedding_feature,
            num_embedding_devices_per_chip=4),
        num_hosts=num_hosts,
        worker_devices=devices,
        _device_assignment=assignment)
    self._stand_in_replicas = num_replicas

  @property
  def extended(self):
    return self._stand_in_extended

  @property
  def num_replicas_in_sync(self):
    return self._stand_in_replicas

  def __repr__(self):
    return "StandInTPUStrategy()"


def use_strategy(monkeypatch, strategy):
  """Makes `strategy` the current strategy for tfemb and TensorFlow."""
  monkeypatch.setattr(tf.distribute, "get_strategy", lambda: strategy)
  monkeypatch.setattr(distribute_lib, "get_strategy", lambda: strategy)


_TFEMB_CLASSES = (configs.FeatureConfig, configs.TableConfig,
                  configs.QuantizationConfig, optimizers._Optimizer)  # pylint: disable=protected-access


def assert_same_fields(ours, theirs, where):
  """`theirs` is TensorFlow's class of `ours`'s name, with every field equal
  (tfemb objects inside compared the same way)."""
  assert type(theirs).__module__.startswith("tensorflow."), where
  assert type(theirs).__name__ == type(ours).__name__, where
  for field, value in vars(ours).items():
    if f"{type(ours).__name__}.{field}" in tf_versions.missing_here():
      assert field not in vars(theirs), where  # this TensorFlow has none
      continue
    other = vars(theirs)[field]
    if isinstance(value, _TFEMB_CLASSES):
      assert_same_fields(value, other, f"{where}.{field}")
    else:
      assert other is value or other == value, (where, field, value, other)
