"""Loaded into a suite's pytest (`-p conformance.pytest_plugin`), under
`python -m tfemb.run --tpu TYPE`: what a project's test tree needs that
its own build system gives it, so its files run as they are.

* TensorFlow's tests import their helpers as
  `tensorflow.python.tpu.tests...`, which the installed TensorFlow does not
  hold: the tree's `tensorflow/python/tpu` joins that package's path.
* They read absl flags (`--tpu`, `--model_dir`), which their own `main`
  parses: parsed here once the test modules (which define them) are
  imported, with a fresh `--model_dir` and `--test_tmpdir`.
* keras-rs' tests run from their tree, whose `keras_rs` pytest puts first
  on the path (its test base class is not in the published package).
"""

import os
import sys
import tempfile

TENSORFLOW_TREE = "TFEMB_CONFORMANCE_TENSORFLOW"


def pytest_configure(config):
  del config
  tree = os.environ.get(TENSORFLOW_TREE)
  if tree:
    import tensorflow.python.tpu as tpu_package  # pylint: disable=g-import-not-at-top
    tpu_package.__path__.append(os.path.join(tree, "tensorflow", "python",
                                             "tpu"))


def pytest_collection_finish(session):
  del session
  if "absl.flags" not in sys.modules:
    return
  from absl import flags  # pylint: disable=g-import-not-at-top
  if flags.FLAGS.is_parsed():
    return
  scratch = tempfile.mkdtemp(prefix="tfemb_conformance_")
  argv = ["conformance"]
  for name, value in (("model_dir", os.path.join(scratch, "model")),
                      ("test_tmpdir", os.path.join(scratch, "tmp"))):
    if name in flags.FLAGS:
      os.makedirs(value, exist_ok=True)
      argv.append(f"--{name}={value}")
  flags.FLAGS(argv)
