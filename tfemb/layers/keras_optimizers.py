"""Keras optimizers -> embedding optimizers with the same numbers.

`translate_keras_optimizer` maps Keras 3, tf_keras and tf_keras legacy SGD,
Adagrad, Adam and Ftrl to tfemb's optimizers where the TPU engine can follow
them exactly, and raises a ValueError naming the argument otherwise.

A learning rate given as a number is read once, at translation (as tfrs
does). A `LearningRateSchedule` or callable, the legacy optimizers'
time-based `decay`, and Adam's bias correction, which the TPU engine leaves
to the learning rate (optimization_parameters.proto:
`lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`), make it a `KerasLearningRate`:
a dynamic learning rate (a zero-argument callable, as the TPU engine takes)
whose step is the Keras optimizer's `iterations`, as tensorflow-recommenders
reads it (`schedule(optimizer.iterations)`), or its own count of training
steps where that is larger (an optimizer the model never applies): a
checkpoint of tfrs' layer, or of tfemb's, resumes the schedule where it
stopped.
"""

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tfemb import optimizers
from tfemb import tf_internals

_SUPPORTED = ("SGD", "Adagrad", "Adam", "Ftrl")

# Relative change of an Adagrad step that Keras' epsilon may cause and still
# count as "the same numbers" (float32 resolves about 1.2e-7).
_ADAGRAD_EPSILON_TOLERANCE = 1e-6


class KerasLearningRate(optimizers.CountingLearningRate):
  """A dynamic learning rate that follows a Keras optimizer's, counting
  the steps the embedding tables train (`advance`).

  Args:
    base: a float, a zero-argument callable, or a Keras
      `LearningRateSchedule` (called with the 0-based step).
    decay: tf_keras legacy time-based decay: `lr / (1 + decay * step)`.
    adam_betas: `(beta_1, beta_2)` to fold Adam's bias correction in.
    optimizer: the Keras optimizer whose `iterations` the step follows.
  """

  def __init__(self, base, decay: float = 0.0, adam_betas=None,
               optimizer=None):
    self.base = base
    self.decay = decay
    self.adam_betas = adam_betas
    self.optimizer = optimizer
    self.iterations = None

  def bind(self, iterations):
    """Counts steps in `iterations` (an int64 variable) from now on."""
    self.iterations = iterations

  def _count(self):
    if self.iterations is None:
      with tf.init_scope():
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="embedding_iterations")
    return tf.convert_to_tensor(self.iterations)

  def _step(self):
    """The larger of the optimizer's `iterations` and the steps counted."""
    step = self._count()
    theirs = None
    if self.optimizer is not None:
      # tf_keras' legacy optimizers create `iterations` on first use: out
      # here, not inside a replica's step of a tf.function.
      with tf.init_scope():
        theirs = getattr(self.optimizer, "iterations", None)
    if theirs is not None:
      step = tf.maximum(step, tf.cast(tf.convert_to_tensor(theirs), tf.int64))
    return step

  def __call__(self):
    step = self._step()
    base = self.base
    if _is_schedule(base):
      lr = base(step)
    elif callable(base) and not hasattr(base, "dtype"):
      lr = base()
    else:
      lr = base
    lr = tf.cast(tf.convert_to_tensor(lr), tf.float32)
    t = tf.cast(step, tf.float32)
    if self.decay:
      lr = lr / (1.0 + self.decay * t)
    if self.adam_betas is not None:
      b1, b2 = self.adam_betas
      t = t + 1.0
      lr = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
    return lr

  def advance(self):
    """One training step done (called by the engine after each update)."""
    self._count()
    self.iterations.assign_add(1)

  def __repr__(self):
    return (f"KerasLearningRate(base={self.base!r}, decay={self.decay!r}, "
            f"adam_betas={self.adam_betas!r})")


def _is_schedule(obj) -> bool:
  return any(
      cls.__name__ == "LearningRateSchedule" for cls in type(obj).__mro__)


def _family(opt) -> str:
  module = type(opt).__module__
  if module.startswith("keras."):
    return "keras"
  if module.startswith("tf_keras.") and ".legacy." in module:
    return "legacy"
  if module.startswith("tf_keras."):
    return "tf_keras"
  raise ValueError(
      f"{type(opt).__name__} from {module} is not a Keras optimizer. Pass a "
      "Keras 3, tf_keras or tf_keras legacy SGD, Adagrad, Adam or Ftrl.")


def _raw_learning_rate(opt, family):
  """The optimizer's learning rate as given: schedule, callable or value."""
  lr = tf_internals.keras_learning_rate(opt, legacy=family == "legacy")
  if _is_schedule(lr) or (callable(lr) and not hasattr(lr, "dtype")):
    return lr
  # A number (Keras keeps it in a variable) is read once, as tfrs does; pass
  # a schedule for a learning rate that changes during training.
  return float(np.asarray(lr))


def _refuse(opt, name, value, instead):
  raise ValueError(
      f"Keras {type(opt).__name__} argument {name}={value!r} cannot be "
      f"expressed by the TPU embedding engine. {instead}")


def _config(opt):
  config = dict(opt.get_config())
  if "clipvalue" not in config:  # tf_keras legacy keeps them as attributes
    for name in ("clipvalue", "clipnorm", "global_clipnorm"):
      config[name] = getattr(opt, name, None)
  return config


def _check_common(opt, config):
  unsupported = {
      "clipnorm": "Use clipvalue (the TPU clips each row's summed gradient "
                  "element-wise), or clip the dense part only.",
      "global_clipnorm": "Use clipvalue, or clip the dense part only.",
      "use_ema": "Keep the moving average for the dense part only.",
      "gradient_accumulation_steps": "Use a larger batch instead.",
      "loss_scale_factor": "Leave loss scaling to the dense part's optimizer.",
  }
  for name, instead in unsupported.items():
    if config.get(name):
      _refuse(opt, name, config[name], instead)


def _learning_rate(opt, family, config, adam_betas=None):
  decay = float(config.get("decay") or 0.0)
  base = _raw_learning_rate(opt, family)
  if not decay and adam_betas is None and isinstance(base, float):
    return base
  return KerasLearningRate(base, decay=decay, adam_betas=adam_betas,
                           optimizer=opt)


def _weight_decay(opt, config, lr, constant_lr: Optional[float]):
  """Keras decays by `lr * weight_decay * w` before the update."""
  wd = config.get("weight_decay")
  if not wd:
    return {}
  if isinstance(lr, KerasLearningRate) and lr.adam_betas is not None:
    if constant_lr is None:
      _refuse(opt, "weight_decay", wd,
              "With Adam, weight decay is exact only for a constant float "
              "learning rate (the engine's learning rate carries the bias "
              "correction); use a float learning_rate or no weight_decay.")
    return dict(weight_decay_factor=constant_lr * wd,
                multiply_weight_decay_factor_by_learning_rate=False)
  return dict(weight_decay_factor=wd,
              multiply_weight_decay_factor_by_learning_rate=True)


def translate_keras_optimizer(opt: Any, lazy_adam: bool = True):
  """Returns the tfemb optimizer that trains tables as `opt` would.

  Args:
    opt: a Keras 3 (`keras.optimizers`), tf_keras (`tf_keras.optimizers`) or
      tf_keras legacy (`tf_keras.optimizers.legacy`) SGD, Adagrad, Adam or
      Ftrl.
    lazy_adam: Keras' Adam updates every row every step; the TPU's default
      (True) updates only the rows in the batch, which is the same whenever
      a row's gradient is not zero. False gives Keras' dense behaviour.

  Returns:
    A `tfemb.SGD`, `tfemb.Adagrad`, `tfemb.Adam` or `tfemb.FTRL`. A schedule
    or callable learning rate, legacy `decay` and Adam's bias correction
    make its `learning_rate` a `KerasLearningRate`.

  Raises:
    ValueError: for an optimizer or argument the TPU engine cannot follow
      exactly (SGD momentum/nesterov, clipnorm, global_clipnorm, use_ema,
      gradient_accumulation_steps, loss_scale_factor, amsgrad, Ftrl's
      l2_shrinkage_regularization_strength, an Adagrad epsilon that changes
      the result, Adam or Ftrl weight decay that cannot be matched); the
      message names the argument and what to use instead.
  """
  family = _family(opt)
  name = type(opt).__name__
  if name not in _SUPPORTED:
    raise ValueError(
        f"Keras optimizer {name} is unsupported for TPU embeddings: use SGD, "
        "Adagrad, Adam or Ftrl, or one of tfemb's optimizers (SGD, Adagrad, "
        "AdagradMomentum, Adam, FTRL).")
  config = _config(opt)
  _check_common(opt, config)
  clip = config.get("clipvalue")
  common = dict(clipvalue=None if clip is None else float(clip))
  if name == "SGD":
    if config.get("momentum"):
      _refuse(opt, "momentum", config["momentum"],
              "Use momentum=0, or tfemb.AdagradMomentum for momentum.")
    if config.get("nesterov"):
      _refuse(opt, "nesterov", True, "Use nesterov=False.")
    lr = _learning_rate(opt, family, config)
    return optimizers.SGD(lr, **common, **_weight_decay(opt, config, lr, None))
  if name == "Adagrad":
    init = config["initial_accumulator_value"]
    eps = config.get("epsilon") or 0.0
    if init <= 0 or eps > _ADAGRAD_EPSILON_TOLERANCE * init:
      _refuse(opt, "epsilon", eps,
              "The TPU's Adagrad has no epsilon; use epsilon <= "
              f"{_ADAGRAD_EPSILON_TOLERANCE} * initial_accumulator_value "
              "(a relative change below 1e-6) or a larger "
              "initial_accumulator_value.")
    lr = _learning_rate(opt, family, config)
    return optimizers.Adagrad(lr, initial_accumulator_value=init, **common,
                              **_weight_decay(opt, config, lr, None))
  if name == "Adam":
    if config.get("amsgrad"):
      _refuse(opt, "amsgrad", True, "Use amsgrad=False.")
    betas = (float(config["beta_1"]), float(config["beta_2"]))
    lr = _learning_rate(opt, family, config, adam_betas=betas)
    base = lr.base
    constant = base if isinstance(base, float) and not lr.decay else None
    return optimizers.Adam(lr, beta_1=betas[0], beta_2=betas[1],
                           epsilon=float(config["epsilon"]),
                           lazy_adam=lazy_adam, sum_inside_sqrt=False,
                           **common,
                           **_weight_decay(opt, config, lr, constant))
  # Ftrl
  if config.get("l2_shrinkage_regularization_strength"):
    _refuse(opt, "l2_shrinkage_regularization_strength",
            config["l2_shrinkage_regularization_strength"],
            "Use l2_regularization_strength instead.")
  if config.get("weight_decay"):
    _refuse(opt, "weight_decay", config["weight_decay"],
            "Keras decays Ftrl's weights before its update, the TPU after; "
            "use l2_regularization_strength instead.")
  lr = _learning_rate(opt, family, config)
  return optimizers.FTRL(
      lr,
      learning_rate_power=config["learning_rate_power"],
      l1_regularization_strength=config["l1_regularization_strength"],
      l2_regularization_strength=config["l2_regularization_strength"],
      beta=config.get("beta", 0.0),
      initial_accumulator_value=config["initial_accumulator_value"],
      **common)
