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

Adding an optimizer takes:

  1. its declaration: the parameter class (`tfemb/optimizers/parameters.py`,
     TensorFlow's constructor, imported into `tfemb.optimizers`), its rule
     and kernel constants here, and its `Declaration` in
     `tfemb/optimizers/declarations.py` (name, TensorFlow's class, slot
     names, rule, constants, proto fields). tfemb exports every declared
     class, `identify` finds it, the TPU proto and the Keras layer's config
     read it, and the kernels' build generates the C++ rule table from it;
  2. its C++ row rule, `RuleRow<Name>` in tfemb/kernels/embedding_kernels.cc;
  3. its numpy reference, in tests/reference.py;
  4. its tests: a case in tests/test_training.py's `OPTIMIZERS`, which the
     training, kernel, width, layout and mirrored tests run.
"""

from typing import Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from tfemb import validation

Slots = Dict[str, tf.Tensor]
Rule = Callable[..., Tuple[tf.Tensor, Slots]]


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
  if not opt.weight_decay_factor:
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
  a = slots["accumulators"] + g * g
  return w - lr * g * tf.math.rsqrt(a), {"accumulators": a}


def adagrad_momentum(opt, w, g, slots, lr):
  a = slots["accumulators"]
  if opt.beta2 == 1:
    a = a + g * g
  else:
    a = opt.beta2 * a + (1 - opt.beta2) * g * g
  scaled = g * tf.pow(a + opt.epsilon, -1.0 / opt.exponent)
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
    step = m * tf.math.rsqrt(v + eps * eps)
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
  new_accum = accum + g * g
  if power == 0.5:
    sigma = tf.sqrt(new_accum) - tf.sqrt(accum)
    new_accum_pow = tf.sqrt(new_accum)
  else:
    new_accum_pow = tf.pow(new_accum, power)
    sigma = new_accum_pow - tf.pow(accum, power)
  if opt.multiply_linear_by_learning_rate:
    linear = slots["linears"] + g * lr - sigma * w
    l1_limit = l1 * lr
    quadratic = new_accum_pow + 2 * l2 * lr + opt.beta
  else:
    linear = slots["linears"] + g - sigma / lr * w
    l1_limit = l1
    quadratic = new_accum_pow / lr + 2 * l2 + opt.beta / lr
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


def divides_by_learning_rate(opt) -> bool:
  """Whether the rule divides by `lr` (FTRL without
  `multiply_linear_by_learning_rate`): its rate must then be > 0."""
  return (getattr(opt, "learning_rate_power", None) is not None and
          not getattr(opt, "multiply_linear_by_learning_rate", False))


def checked_learning_rate(table) -> Tuple[tf.Tensor, List[tf.Operation]]:
  """`table`'s learning rate for this step, a float32 scalar, and the
  checks it must pass before any write: finite, and > 0 where the rule
  divides by it. A rate whose shape is known not to be a scalar, or a
  Python number that fails them, raises a ValueError here."""
  opt = table.optimizer
  return checked_rate(opt.learning_rate,
                      f"{validation.table(table.name)}: the learning rate",
                      divides_by_learning_rate(opt))


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
  (`tfemb.optimizers.identify(opt).rule`): clip g, rule, decay, clip w."""
  g = clip_gradient(opt, g)
  new_w, new_slots = rule(opt, w, g, slots, lr)
  new_w = decay_weights(opt, new_w, w, lr)
  return clip_weights(opt, new_w), new_slots
