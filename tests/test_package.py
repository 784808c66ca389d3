"""The package's import surface: what `import tfemb` gives a user."""

import configparser
import os
import pathlib
import subprocess
import sys

from tfemb import tf_versions
from tfemb.layers import keras_versions

ROOT = pathlib.Path(__file__).resolve().parent.parent

_SCRIPT = """
import tfemb
assert "tfemb.layers" not in __import__("sys").modules
print(tfemb.layers.TPUEmbedding.__module__, tfemb.migrate.__name__)
try:
  tfemb.no_such_name
except AttributeError as e:
  print(e)
"""


def test_subpackages_load_on_first_use():
  """`import tfemb` then `tfemb.layers.TPUEmbedding` (as the README names it)
  works without `import tfemb.layers`; unknown names stay AttributeErrors."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                ""))
  result = subprocess.run([sys.executable, "-c", _SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-2:] == [
      "tfemb.layers.embedding_layer tfemb.migrate",
      "module 'tfemb' has no attribute 'no_such_name'"]


_WITHOUT_TENSORFLOW = """
import sys

class NoTensorFlow:  # as if no TensorFlow were installed
  def find_spec(self, name, path=None, target=None):
    if name == "tensorflow" or name.startswith("tensorflow."):
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTensorFlow())
try:
  import tfemb
except ImportError as e:
  print(e)
"""


def test_without_tensorflow_the_import_says_what_to_install():
  """tfemb requires no TensorFlow distribution (setup.cfg); without one,
  `import tfemb` names the supported range and the ways to install it."""
  env = dict(os.environ,
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                ""))
  result = subprocess.run([sys.executable, "-c", _WITHOUT_TENSORFLOW],
                          env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == (
      "tfemb needs TensorFlow 2.16 to 2.21, and none is installed: `pip "
      "install 'tfemb[cpu]'` (tensorflow-cpu), `pip install "
      "'tfemb[tensorflow]'` (tensorflow and tf-keras), or your platform's "
      "own build (e.g. tensorflow-tpu on a TPU VM).")


def _setup_cfg():
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")

  def lines(section, key):
    return [line for line in config[section][key].splitlines() if line]
  return lines


def test_setup_cfg_requires_no_tensorflow_build_and_declares_the_range():
  """No TensorFlow distribution (nor tf-keras or tensorflow-recommenders,
  which require `tensorflow`) in install_requires, so installing tfemb
  beside tensorflow-cpu or tensorflow-tpu adds no second TensorFlow; the
  extras and the Keras floor are tfemb.tf_versions' range."""
  lines = _setup_cfg()
  assert lines("options", "install_requires") == [
      f"keras>={keras_versions.KERAS_MIN}"]
  bounds = f">={tf_versions.OLDEST},<2.{int(tf_versions.NEWEST[2:]) + 1}"
  assert lines("options.extras_require", "cpu") == [
      f"tensorflow-cpu{bounds}"]
  assert lines("options.extras_require", "tensorflow") == [
      f"tensorflow{bounds}", f"tf-keras{bounds}"]


def test_the_license_is_an_spdx_expression_without_license_classifiers():
  """setuptools prints a "License classifiers are deprecated" block at every
  install while a `License ::` classifier stands beside the license: the
  license is given once, as an SPDX expression."""
  lines = _setup_cfg()
  assert lines("metadata", "license") == ["Apache-2.0"]
  assert not [c for c in lines("metadata", "classifiers")
              if c.startswith("License ::")]


def test_a_warning_from_tfemb_fails_a_subprocess_of_the_tests_too():
  """setup.cfg's filter (a warning issued from tfemb's modules is an
  error) reaches the tests' subprocesses (tests/conftest.py): a worker that
  warns from any tfemb module fails, as the test itself would."""
  probe = ("import warnings; warnings.warn_explicit('probe', UserWarning, "
           "'engine.py', 1, module={!r})")
  for module, fails in (("tfemb", True), ("tfemb.host.engine", True),
                        ("tfemb.layers.partial", True),
                        ("tfembx", False), ("tensorflow", False)):
    done = subprocess.run([sys.executable, "-c", probe.format(module)],
                          capture_output=True, text=True, timeout=60,
                          check=False)
    assert (done.returncode != 0) == fails, (module, done.stderr)
    assert ("UserWarning: probe" in done.stderr), (module, done.stderr)
