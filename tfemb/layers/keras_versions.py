"""The Keras versions tfemb's layer supports: the Keras side of
`tfemb.tf_versions`, kept with the layer (configs and engines import no
Keras).

Keras 3 from `KERAS_MIN` on, or tf_keras (`TF_USE_LEGACY_KERAS=1`, which
comes in its TensorFlow's version). An older Keras 3 lacks
`keras.Input(ragged=True)` and, under `MirroredStrategy`, trains the layer
to wrong numbers, so the layer refuses it.
"""

import tensorflow as tf

from tfemb import tf_versions

# The oldest Keras 3 under which the layer tests, tests/test_mirrored.py and
# the quickstart pass with the oldest supported TensorFlow.
KERAS_MIN = "3.6.0"


def keras_3() -> bool:
  """Whether `tf.keras` is Keras 3 (else tf_keras, TF_USE_LEGACY_KERAS=1)."""
  return tf.keras.layers.Layer.__module__.startswith("keras.")


def check_keras() -> None:
  """Refuses a Keras 3 older than `KERAS_MIN`: tfemb's layer would fail or,
  under `MirroredStrategy`, train to wrong numbers. (tf_keras comes in the
  version of its TensorFlow.)"""
  if not keras_3():
    return
  import keras  # pylint: disable=g-import-not-at-top
  if (tf_versions.version_tuple(keras.__version__) <
      tf_versions.version_tuple(KERAS_MIN)):
    raise RuntimeError(
        f"tfemb's Keras layer needs Keras {KERAS_MIN} or newer; the "
        f"installed Keras is {keras.__version__}. Run `pip install "
        f"'keras>={KERAS_MIN}'`, or use tf_keras (TF_USE_LEGACY_KERAS=1).")


def in_keras_symbolic_scope() -> bool:
  """True while Keras 3 runs a layer on placeholders to learn its output
  shapes (`keras.ops`' `compute_output_spec`), never on data."""
  if not keras_3():
    return False
  from keras.src.backend.common import symbolic_scope  # pylint: disable=g-import-not-at-top
  return symbolic_scope.in_symbolic_scope()
