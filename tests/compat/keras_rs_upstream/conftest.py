"""keras-rs' own TensorFlow tests, run on a host TPU (tfemb's).

The test modules here are keras-rs' (README.md says which release), kept as
they are. The published package leaves out `keras_rs.src.testing`, their
base class: it is registered here from `testing/`. keras-rs' tests take
their TPU path where `TPU_NAME` is set; `tests/compat/test_keras_rs_upstream.py`
runs them under `python -m tfemb.run --tpu v5p-8 -m pytest` with it set.
"""

import importlib.util
import os
import sys

import keras_rs.src

_HERE = os.path.dirname(os.path.abspath(__file__))


def _register(name, path):
  spec = importlib.util.spec_from_file_location(
      name, path, submodule_search_locations=(
          [os.path.dirname(path)] if path.endswith("__init__.py") else None))
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


if "keras_rs.src.testing" not in sys.modules:
  _register("keras_rs.src.testing.test_case",
            os.path.join(_HERE, "testing", "test_case.py"))
  keras_rs.src.testing = _register(
      "keras_rs.src.testing", os.path.join(_HERE, "testing", "__init__.py"))
