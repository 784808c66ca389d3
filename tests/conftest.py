"""Test setup: shared helpers on the path, and 4 logical CPU devices.

The logical devices let `MirroredStrategy` run 2 or 4 replicas on one CPU;
they must be configured before TensorFlow initializes its devices.
"""

import os
import sys

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_LOGICAL_CPUS = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


@pytest.fixture(params=["fused", "tensorflow"])
def engine_path(request, monkeypatch):
  """Runs a test on both host paths: the fused CPU kernels (which must build
  here: the machine has a C++ compiler) and TensorFlow's own ops."""
  from tfemb.kernels import build, ops  # pylint: disable=g-import-not-at-top
  if request.param == "fused":
    assert build.load() is not None, "the fused kernels did not build"
  else:
    monkeypatch.setattr(ops, "usable", lambda *args: False)
  return request.param
