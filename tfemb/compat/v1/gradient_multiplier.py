"""`experimental_gradient_multiplier_fn`: TPUEstimator's gradient scaling.

TPUEstimator multiplied every activation gradient by
`experimental_gradient_multiplier_fn(global_step)` before sending it to the
TPU embedding engine (so before gradient clipping). `scale_gradients`
gives an engine (the host engine, or TensorFlow's own under a
`TPUStrategy`) an `apply_gradients` that does the same. The engine itself
is unchanged otherwise: no variables are added, so its checkpoints are
those of `tfemb.TPUEmbedding`.
"""

from typing import Any, Callable

import tensorflow as tf


def scale_gradients(embedding: Any, multiplier_fn: Callable[[Any], Any],
                    global_step: Any) -> Any:
  """Returns `embedding`, whose `apply_gradients` now first multiplies every
  gradient by `multiplier_fn(global_step)` (read at each call)."""
  apply_gradients = embedding.apply_gradients

  def scaled_apply_gradients(gradients, *args, **kwargs):
    multiplier = tf.cast(multiplier_fn(global_step), tf.float32)
    scaled = tf.nest.map_structure(
        lambda g: None if g is None else g * tf.cast(multiplier, g.dtype),
        gradients)
    return apply_gradients(scaled, *args, **kwargs)

  # An attribute of this object only: its class, its other methods and its
  # checkpoint are untouched.
  embedding.apply_gradients = scaled_apply_gradients
  return embedding
