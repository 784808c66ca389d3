"""The TPU embedding engine's update, as pure functions over rows.

Every optimizer runs the same pipeline (docs/numerics.md, "The update"), on
the rows a step touched (or, for non-lazy Adam, on the whole table):

  1. clip the gradient            `clip_gradient`
  2. the optimizer's rule         `identify(opt).rule`
  3. decoupled weight decay       `decay_weights`
  4. clip the weights             `clip_weights`

A rule is `rule(opt, w, g, slots, lr) -> (new_w, new_slots)`, where `w` and
`g` are `[rows, dim]` float32 tensors, `slots` a dict of tensors of the same
shape keyed by slot name, and `lr` a float32 scalar. Beside each rule, the
constants the fused kernels' C++ row rule reads, computed as the rule
computes them (in double, rounded once to float32 as the attribute the
kernel gets, as the rule's tensors round them).

A rule and its C++ row rule do the same float32 operations in the same
order, so TensorFlow's ops give the kernels' bits (docs/numerics.md,
'Precision'): `1 / sqrt(x)` is `_reciprocal_sqrt` (not the approximate
`tf.math.rsqrt`), a division is `_divide`, `x^p` is `_pow`, and `apply`
keeps TensorFlow's graph optimizer from reordering the operations.

Adding an optimizer takes:

  1. its declaration: the parameter class (`tfemb/optimizers/parameters.py`,
     TensorFlow's constructor, imported into `tfemb.optimizers`), its rule
     and kernel constants here, and its `Declaration` in
     `tfemb/optimizers/declarations.py` (name, TensorFlow's class, slot
     names, rule, constants, proto fields). tfemb exports every declared
     class, `identify` finds it, the TPU proto and the Keras layer's config
     read it, and the kernels' build generates the C++ rule table from it;
  2. its C++ row rule, `RuleRow<Name>` in tfemb/kernels/src/update_rules.h;
  3. its numpy reference, in tests/reference.py;
  4. its tests: a case in tests/helpers.py's `OPTIMIZERS`, the tests' one
     table of optimizers, which the training, kernel, width and layout
     tests run.
"""

import contextlib
import math
from typing import Callable, Dict, Iterator, List, Tuple

import numpy as np
import tensorflow as tf

from tfemb import tf_internals
from tfemb import validation

Slots = Dict[str, tf.Tensor]
Rule = Callable[..., Tuple[tf.Tensor, Slots]]


def _float32(x: float) -> float:
  """`x` rounded to float32, as the kernels' attribute holds it."""
  return float(np.float32(x))


def _divide(x, y):
  """`x / y`, correctly rounded, also inside a `tf.function`, where
  Grappler (TensorFlow's graph optimizer) turns `x / c` for a constant `c`
  into `x * (1 / c)` and `1 / y` into the approximate `tf.math.reciprocal`,
  but leaves `divide_no_nan` alone. Its 0 for `y == 0` is never used: the
  rules divide by a learning rate checked > 0
  (`Declaration.divides_by_learning_rate`)
  or guard a zero themselves."""
  return tf.math.divide_no_nan(x, y)


def _reciprocal_sqrt(x):
  """`1 / sqrt(x)` as the kernels' `1.0f / std::sqrt(x)`: two correctly
  rounded operations (`+inf` for `x == 0`)."""
  root = tf.sqrt(x)
  return tf.where(root == 0, math.inf, _divide(1.0, root))


def _pow(x, p: float):
  """`x^p` for the kernels' `std::pow(x, p)` (glibc's `powf`), `p` rounded
  to float32 as their attribute: in float64, rounded once to float32, so
  about 1 power in 1600 is 1 ulp away from `powf`, which is not correctly
  rounded (docs/numerics.md, 'Precision'). An integer `p` takes `tf.pow`,
  exact where `x^p` is halfway between two floats, as `powf`; any other
  `exp(p * log(x))`, faster and as close (or `rsqrt`, faster still)."""
  p = _float32(p)
  x = tf.cast(x, tf.float64)
  if p == -0.5:  # AdagradMomentum's default exponent, 2
    power = tf.math.rsqrt(x)
  elif p == int(p):
    power = tf.pow(x, p)
  else:
    power = tf.exp(p * tf.math.log(x))
  return tf.cast(power, tf.float32)


@contextlib.contextmanager
def _as_written() -> Iterator[None]:
  """Inside a `tf.function`, the ops made here run as written: Grappler
  reorders sums and products whose operands have different shapes
  (`(x + c1) + c2` into `x + (c1 + c2)`, `c * (x * y)` into
  `(c * x) * y`) and turns `a / sqrt(b)` into `a * rsqrt(b)`, but not in
  the nodes it must preserve (the `_grappler_do_not_remove` attribute).
  It still adds `tf.square(x)` beside a kept `x * x`: the rules write
  the square."""
  if tf.executing_eagerly():
    yield
    return
  with tf_internals.kept_by_grappler(tf.compat.v1.get_default_graph()):
    yield


def _clip(x, lower, upper):
  if lower is not None:
    x = tf.maximum(x, tf.cast(lower, x.dtype))
  if upper is not None:
    x = tf.minimum(x, tf.cast(upper, x.dtype))
  return x


def clip_gradient(opt, g):
  return _clip(g, opt.clip_gradient_min, opt.clip_gradient_max)


def clip_weights(opt, w):
  return _clip(w, opt.clip_weight_min, opt.clip_weight_max)


def decay_weights(opt, new_w, old_w, lr):
  """`w -= d * w_old`, `d` multiplied by `lr` if the optimizer asks for it."""
  if not _float32(opt.weight_decay_factor or 0.0):
    return new_w
  d = tf.constant(opt.weight_decay_factor, tf.float32)
  if opt.multiply_weight_decay_factor_by_learning_rate:
    d = d * lr
  return new_w - d * old_w


def no_constants(opt) -> Dict[str, float]:
  del opt
  return {}


def sgd(opt, w, g, slots, lr):
  del opt, slots
  return w - lr * g, {}


def adagrad(opt, w, g, slots, lr):
  del opt
  a = slots["accumulators"] + tf.square(g)
  return w - lr * g * _reciprocal_sqrt(a), {"accumulators": a}


def adagrad_momentum(opt, w, g, slots, lr):
  a = slots["accumulators"]
  if _float32(opt.beta2) == 1:
    a = a + tf.square(g)
  else:
    a = opt.beta2 * a + (1 - opt.beta2) * g * g
  scaled = g * _pow(a + opt.epsilon, -1.0 / opt.exponent)
  m = opt.momentum * slots["momenta"] + scaled
  step = opt.momentum * m + scaled if opt.use_nesterov else m
  return w - lr * step, {"accumulators": a, "momenta": m}


def adagrad_momentum_constants(opt) -> Dict[str, float]:
  return {"momentum": opt.momentum, "beta2": opt.beta2,
          "one_minus_beta2": 1 - opt.beta2, "epsilon": opt.epsilon,
          "power": -1.0 / opt.exponent,
          "use_nesterov": float(opt.use_nesterov)}


def adam(opt, w, g, slots, lr):
  b1, b2, eps = opt.beta_1, opt.beta_2, opt.epsilon
  m = b1 * slots["momenta"] + (1 - b1) * g
  v = b2 * slots["velocities"] + (1 - b2) * g * g
  if opt.sum_inside_sqrt:
    step = m * _reciprocal_sqrt(v + eps * eps)
  else:
    step = m / (tf.sqrt(v) + eps)
  return w - lr * step, {"momenta": m, "velocities": v}


def adam_constants(opt) -> Dict[str, float]:
  return {"beta_1": opt.beta_1, "one_minus_beta_1": 1 - opt.beta_1,
          "beta_2": opt.beta_2, "one_minus_beta_2": 1 - opt.beta_2,
          "epsilon": opt.epsilon, "epsilon_squared": opt.epsilon * opt.epsilon,
          "sum_inside_sqrt": float(opt.sum_inside_sqrt)}


def ftrl(opt, w, g, slots, lr):
  """TensorFlow's ApplyFtrl, with `beta` in the quadratic term (the proto)."""
  power = -opt.learning_rate_power
  l1 = opt.l1_regularization_strength
  l2 = opt.l2_regularization_strength
  accum = slots["accumulators"]
  new_accum = accum + tf.square(g)
  if _float32(power) == 0.5:
    new_accum_pow = tf.sqrt(new_accum)
    sigma = new_accum_pow - tf.sqrt(accum)
  else:
    new_accum_pow = _pow(new_accum, power)
    sigma = new_accum_pow - _pow(accum, power)
  if opt.multiply_linear_by_learning_rate:
    linear = slots["linears"] + g * lr - sigma * w
    l1_limit = l1 * lr
    quadratic = new_accum_pow + 2 * l2 * lr + opt.beta
  else:
    linear = slots["linears"] + g - _divide(sigma, lr) * w
    l1_limit = l1
    quadratic = _divide(new_accum_pow, lr) + 2 * l2 + _divide(opt.beta, lr)
  shrunk = _clip(linear, -l1_limit, l1_limit) - linear
  new_w = tf.where(tf.abs(linear) > l1_limit,
                   shrunk / tf.where(quadratic == 0, 1.0, quadratic),
                   tf.zeros_like(w))
  return new_w, {"accumulators": new_accum, "linears": linear}


def ftrl_constants(opt) -> Dict[str, float]:
  return {"power": -opt.learning_rate_power,
          "l1": opt.l1_regularization_strength,
          "two_l2": 2 * opt.l2_regularization_strength, "beta": opt.beta,
          "multiply_linear_by_learning_rate": float(
              opt.multiply_linear_by_learning_rate)}


def checked_rate(rate, what: str, positive: bool = False
                 ) -> Tuple[tf.Tensor, List[tf.Operation]]:
  """`rate` (a number, a tensor, or a callable, called here) for this step,
  a float32 scalar, and the checks it must pass before any write: finite,
  and > 0 if `positive`; `what` names it in the error."""
  value = rate() if callable(rate) else rate
  lr = tf.cast(value, tf.float32)
  kind = "finite and > 0" if positive else "finite"
  message = f"{what} must be a {kind} float scalar"
  if lr.shape.rank is not None and lr.shape.num_elements() != 1:
    raise ValueError(f"{message}, got shape {lr.shape}.")
  if isinstance(rate, (int, float, np.number)):  # no op/step
    number = float(np.float32(rate))  # as the step uses it
    if not np.isfinite(number) or (positive and number <= 0):
      raise ValueError(f"{message}, got {number}.")
    return tf.reshape(lr, []), []
  checks = []
  if lr.shape.rank is None:
    checks += validation.assertion(tf.equal(tf.size(lr), 1), message + ".")
  lr = tf.reshape(lr, [])
  ok = tf.math.is_finite(lr)
  if positive:
    ok = tf.logical_and(ok, lr > 0)
  checks += validation.assertion(ok, message + ".")
  return lr, checks


def apply(rule: Rule, opt, w, g, slots: Slots,
          lr) -> Tuple[tf.Tensor, Slots]:
  """Runs the whole pipeline around `rule`, the optimizer's
  (`tfemb.optimizers.identify(opt).rule`): clip g, rule, decay, clip w.
  The same operations as the fused kernels, in the same order, also in a
  `tf.function` (`_as_written`)."""
  with _as_written():
    g = clip_gradient(opt, g)
    new_w, new_slots = rule(opt, w, g, slots, lr)
    new_w = decay_weights(opt, new_w, w, lr)
    return clip_weights(opt, new_w), new_slots
