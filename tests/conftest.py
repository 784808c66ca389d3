"""Test setup: shared helpers on the path, and 4 logical CPU devices.

The logical devices let `MirroredStrategy` run 2 or 4 replicas on one CPU;
they must be configured before TensorFlow initializes its devices.
"""

import os
import sys

import pytest
import tensorflow as tf

from tfemb import tf_versions

# tests/ itself: the test modules, in folders that mirror tfemb/, import the
# helper modules (reference, helpers, ...) and the workers package from
# here. The folders have no __init__.py, so each test module's name is its
# file's: they must stay distinct across folders.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_LOGICAL_CPUS = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)



def _tfemb_modules():
  """Every module of tfemb by name, read from its files."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  names = []
  for folder, _, files in os.walk(os.path.join(root, "tfemb")):
    package = os.path.relpath(folder, root).replace(os.sep, ".")
    names += [package if f == "__init__.py" else f"{package}.{f[:-3]}"
              for f in files if f.endswith(".py")]
  return sorted(names)


# setup.cfg's `error:::tfemb(\.|$)` (a warning from tfemb's modules fails the
# test) holds in pytest's process only: the tests' subprocesses (workers,
# scripts, CLIs) get it from PYTHONWARNINGS, where a filter's module is a
# full name, so every module is named.
os.environ["PYTHONWARNINGS"] = ",".join(
    [v for v in [os.environ.get("PYTHONWARNINGS")] if v] +
    [f"error:::{name}" for name in _tfemb_modules()])


# Reads TensorFlow's SparseCore internals at import (2.17 on).
collect_ignore = ([] if tf_versions.at_least(tf_versions.STACKER_ADDED_IN)
                  else ["sparsecore/test_sparsecore_layout.py"])


# ci/passes.sh runs the suite twice: under Keras 3 and under tf_keras.
PASS_FLAVOUR = ("tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS", "0")
                .lower() in ("1", "true") else "keras3")


def pytest_collection_modifyitems(config, items):
  """`@pytest.mark.requires_tensorflow("2.17")`: a test of what TensorFlow
  added in that version (the SparseCore host engine needs its stacker) does
  not apply to an older one, where tfemb refuses the feature with a version
  error (tests/test_tf_versions.py checks each).

  `@pytest.mark.runs_under("tf_keras")` (or "keras3"), on a test or a
  parameter: the test's processes run under that Keras flavour whatever
  the pass's, so it does the same work in both passes; it is kept in that
  flavour's pass and deselected in the other, and runs once.

  `TFEMB_KERAS_FREE_ONCE` (ci/test.sh sets it for the oldest TensorFlow's
  core tests): test files and folders, separated by spaces, that use no
  Keras; the tf_keras pass leaves them to the Keras 3 pass."""
  once = os.environ.get("TFEMB_KERAS_FREE_ONCE", "").split()
  kept = [item for item in items
          if all(mark.args[0] == PASS_FLAVOUR
                 for mark in item.iter_markers("runs_under")) and not (
                     PASS_FLAVOUR == "tf_keras" and
                     item.nodeid.split("::")[0].startswith(tuple(once)))]
  if len(kept) < len(items):
    config.hook.pytest_deselected(items=[i for i in items if i not in kept])
    items[:] = kept
  for item in items:
    for mark in item.iter_markers("requires_tensorflow"):
      if not tf_versions.at_least(mark.args[0]):
        why = mark.kwargs.get("why")
        item.add_marker(pytest.mark.skip(
            reason=f"needs TensorFlow {mark.args[0]}"
            f"{f' ({why})' if why else ''}; this is {tf.__version__}"))


def pytest_sessionfinish(session, exitstatus):
  session.config.tfemb_exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """Leaves without tearing TensorFlow down, once pytest has reported: at
  interpreter exit a tf.data iterator left by a Keras `fit` can wait forever
  for its own worker thread (the destructor of `RootDataset::Iterator`
  blocks in a `Notification`). The exit status stays pytest's (5 when no
  tests ran)."""
  status = getattr(config, "tfemb_exit_status", None)
  if status is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access


@pytest.fixture(params=["fused", "interleaved", "tensorflow"])
def engine_path(request):
  """Runs a test on every host path: the fused CPU kernels (which must build
  here: the machine has a C++ compiler), the same with each table's slots
  beside its parameters (`tfemb.interleaved_tables`), and TensorFlow's own
  ops, chosen with `tfemb.options` for the engines the test creates."""
  from tfemb import options  # pylint: disable=g-import-not-at-top
  from tfemb.kernels import build  # pylint: disable=g-import-not-at-top
  if request.param != "tensorflow":
    assert build.load() is not None, "the fused kernels did not build"
  with options.use(fused_kernels=request.param != "tensorflow",
                   interleaved_slots=request.param == "interleaved"):
    yield request.param


@pytest.fixture(params=["separate", "interleaved"])
def table_layout(request):
  """Runs a test with each table's slots in variables of their own, and
  beside its parameters in one variable (`tfemb.interleaved_tables`)."""
  from tfemb import options  # pylint: disable=g-import-not-at-top
  with options.use(interleaved_slots=request.param == "interleaved"):
    yield request.param
