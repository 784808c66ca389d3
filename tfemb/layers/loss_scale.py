"""Keras' loss scaling, as the layer's gradient trap sees it.

Under the `mixed_float16` policy Keras wraps the model's optimizer in a
`LossScaleOptimizer`, multiplies the loss by its scale before the gradients
are taken, and divides the gradients of its weights by the scale before it
applies them, skipping a step whose gradients are not finite (and lowering
the scale). The embedding tables are trained inside the backward pass, at
the layer's gradient trap, so the gradients reaching them are the scaled
ones: the trap must divide them by the same scale, and skip a step whose
scaled gradients are not finite, as Keras does (docs/keras_layer.md, "Mixed
precision").

Keras calls no method of a layer to say what the scale is. What it calls is
the optimizer's: `scale_loss` (Keras 3's `train_step`) or `get_scaled_loss`
(tf_keras' `minimize`, and a custom loop that follows its documentation).
`install()` wraps those methods of the Keras in use (`tf.keras`: Keras 3,
or tf_keras with `TF_USE_LEGACY_KERAS=1`): each call records the scale it
multiplied by, for the graph and thread it was traced in (the gradients are
taken later in the same graph and thread, replicas included). `current()`
is that scale, or None where no loss was scaled (float32, `mixed_bfloat16`,
a custom loop without loss scaling). Installing twice changes nothing; the
wrappers return what Keras returns.
"""

import functools
import threading
import weakref

import tensorflow as tf

from tfemb.layers import keras_versions

_HOOKED = "_tfemb_loss_scale_hook"  # marks a wrapper (installed once)


class _Recorded(threading.local):
  """Per thread: `{graph or _EAGER: scale}`."""

  def __init__(self):
    super().__init__()
    self.scales = weakref.WeakKeyDictionary()


_recorded = _Recorded()


def _scales() -> "weakref.WeakKeyDictionary":
  return _recorded.scales


class _Eager:  # a weakly referenced key for the eager context
  pass


_EAGER = _Eager()


def _graph():
  return _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def current():
  """The loss scale of the loss whose gradients are being taken here, as a
  float32 tensor, or None where the loss was not scaled."""
  scales = _scales()
  graph = _graph()
  while graph is not None:  # a nested function: its outer graph's loss
    if graph in scales:
      return scales[graph]
    graph = getattr(graph, "outer_graph", None)
  return None


def unscaled(gradients, scale):
  """`gradients` divided by `scale` (None kept), as Keras unscales its own
  weights' gradients."""
  return [None if g is None else tf.cast(g, tf.float32) / scale
          for g in gradients]


def all_finite(gradients) -> tf.Tensor:
  """Whether every gradient (None: zero) is finite."""
  flags = [tf.reduce_all(tf.math.is_finite(g)) for g in gradients
           if g is not None]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def _hooked(method):

  @functools.wraps(method)
  def wrapper(self, loss, *args, **kwargs):
    # The scale itself: the method applied to 1.0 (multiplying by one is
    # exact), whatever state the optimizer keeps it in.
    scale = method(self, tf.constant(1.0, tf.float32), *args, **kwargs)
    _scales()[_graph()] = tf.cast(scale, tf.float32)
    return method(self, loss, *args, **kwargs)

  setattr(wrapper, _HOOKED, True)
  return wrapper


def _hooked_methods():
  """(class, method name) of the Keras in use that scale a loss."""
  if keras_versions.keras_3():
    from keras.src.optimizers import loss_scale_optimizer  # pylint: disable=g-import-not-at-top
    return [(loss_scale_optimizer.LossScaleOptimizer, "scale_loss")]
  from tf_keras.src.mixed_precision import loss_scale_optimizer  # pylint: disable=g-import-not-at-top
  return [(loss_scale_optimizer.LossScaleOptimizer, "get_scaled_loss"),
          (loss_scale_optimizer.LossScaleOptimizerV3, "get_scaled_loss")]


def install() -> None:
  """Wraps the loss-scaling methods of `tf.keras`'s `LossScaleOptimizer`
  (once)."""
  for cls, name in _hooked_methods():
    method = cls.__dict__[name]
    if not getattr(method, _HOOKED, False):
      setattr(cls, name, _hooked(method))
