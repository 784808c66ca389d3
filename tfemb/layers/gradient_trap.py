"""The layer's gradient trap: where the tables train in the backward pass.

As on a TPU (tensorflow-recommenders' layer), the layer's only trainable
weight is a one-element trap; the gradient that reaches it carries the
activations' gradients to the embedding optimizer, which updates the touched
rows, and the trap weight itself gets a zero gradient. Under Keras' loss
scaling the trap divides the gradients by the scale first, and tells Keras
about a step whose gradients are not finite (`tfemb.layers.loss_scale`).
"""

import tensorflow as tf

from tfemb.layers import loss_scale


def trap(feature_config, dummy, look_up, *inputs):
  """The activations of `look_up`, behind the layer's gradient trap: the
  gradient reaching `dummy` (the trap weight) hands the activations'
  gradients to the embedding optimizer, in place of a gradient for `dummy`.

  Args:
    feature_config: the activations' structure.
    dummy: the trap weight.
    look_up: called inside the trap as `look_up(*inputs)`; returns the
      activations and the function that takes their gradients (in the
      structure of `feature_config`) and whether they are those of a loss
      Keras scaled, already unscaled (`tfemb.layers.loss_scale`). TensorFlow's TPU engines look up
      here, as tensorflow-recommenders does; the host engines look up
      before the trap (`tf.custom_gradient` refuses a function that reads
      variables) and pass the activations through as `inputs`.
    *inputs: tensors handed into the trap (their gradient is None).
  """

  @tf.custom_gradient
  def gradient_trap(dummy, *inputs):
    activations, apply_gradients = look_up(*inputs)

    def grad(*output_grads):
      grads, scale = list(output_grads), loss_scale.current()
      if scale is not None:
        grads = loss_scale.unscaled(grads, scale)
      apply_gradients(tf.nest.pack_sequence_as(feature_config, grads),
                      scale is not None)
      trap = tf.zeros_like(dummy)
      if scale is not None:
        # Keras skips a step whose gradients are not finite, and lowers its
        # scale: the trap weight's gradient tells it about the tables'.
        trap = tf.where(loss_scale.all_finite(grads), trap,
                        tf.fill(tf.shape(dummy),
                                tf.constant(float("nan"), dummy.dtype)))
      return [trap] + [None] * len(inputs)

    return tf.nest.flatten(activations), grad

  trapped = gradient_trap(tf.convert_to_tensor(dummy), *inputs)
  return tf.nest.pack_sequence_as(feature_config, list(trapped))
