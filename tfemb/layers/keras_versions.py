"""The Keras versions tfemb's layer supports: the Keras side of
`tfemb.tf_versions`, kept with the layer (configs and engines import no
Keras).

Keras 3 from `KERAS_MIN` on, or tf_keras (`TF_USE_LEGACY_KERAS=1`, which
comes in its TensorFlow's version). With an older Keras 3 the layer fails
or gives wrong numbers, so it refuses one. Seen with TensorFlow 2.16: Keras
3.5 has no `keras.Input(ragged=True)` and trains Adagrad and Adam to wrong
values in `fit` under `MirroredStrategy`; 3.9.2's `model.export` cannot
serve a dict of inputs; 3.12.4 fails to call the layer with `weights` given
as a structure of None; 3.13.0 passes the layer tests,
tests/strategies/test_mirrored.py and the quickstart.
"""

import tensorflow as tf

from tfemb import tf_versions

KERAS_MIN = "3.13.0"


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
