"""The optimizers' parameters, exactly as TensorFlow's classes hold them.

`SGD`, `Adagrad`, `AdagradMomentum`, `Adam` and `FTRL` take the arguments
of `tf.tpu.experimental.embedding.SGD` and friends (TensorFlow 2.21), with
the same defaults, validation and error types. They know nothing about
devices; what each one means is its declaration
(`tfemb.optimizers.declarations`, which imports this module and gives each
class its declaration with `declare`).

A learning rate is a float or a callable of no arguments, read at every
step; a `CountingLearningRate` also counts the steps itself.
"""

import abc
from typing import Any, Callable, Dict, Optional, Tuple, Union

import tensorflow as tf

ClipValueType = Union[Tuple[Optional[float], Optional[float]], float]
LearningRate = Union[float, Callable[[], float]]


class CountingLearningRate(abc.ABC):
  """A callable learning rate that counts training steps itself (the Keras
  layer's translation of a Keras optimizer's rate). The engines find them
  (`resolution.counting_learning_rates`) and call `advance()` after each
  update; the Keras layer `bind`s them to a weight of its own."""

  @abc.abstractmethod
  def __call__(self) -> Any:
    """The rate of this step."""

  @abc.abstractmethod
  def advance(self) -> None:
    """One training step done."""

  @abc.abstractmethod
  def bind(self, iterations) -> None:
    """Counts steps in `iterations`, an int64 variable the caller saves."""


# Each class's declaration, by class (`declare`). Importing this module
# imports its package first, whose `__init__` imports `declarations`: every
# class has its declaration before it can be constructed.
_DECLARED: Dict[type, Any] = {}


def declare(cls: type, declaration: Any) -> None:
  """Gives `cls` (tfemb's class or TensorFlow's) its
  `declarations.Declaration` (its slots, its arguments)."""
  _DECLARED[cls] = declaration


def declared(optimizer: Any) -> Optional[Any]:
  """The declaration of `optimizer`'s class or of its nearest declared
  base class; None if there is none."""
  for cls in type(optimizer).__mro__:
    if cls in _DECLARED:
      return _DECLARED[cls]
  return None


def _declaration(optimizer) -> Any:
  declaration = declared(optimizer)
  if declaration is None:
    raise ValueError(f"{type(optimizer)} has no declaration "
                     "(tfemb.optimizers.declarations).")
  return declaration


def _constant(value=0.0):
  return tf.constant_initializer(value, support_partition=True)


class _Optimizer:
  """Parameters every embedding optimizer shares (docs/numerics.md, "The
  update")."""

  def __init__(
      self,
      learning_rate: LearningRate,
      use_gradient_accumulation: bool,
      clip_weight_min: Optional[float],
      clip_weight_max: Optional[float],
      weight_decay_factor: Optional[float],
      multiply_weight_decay_factor_by_learning_rate: Optional[bool],
      clipvalue: Optional[ClipValueType] = None,
      slot_variable_creation_fn: Optional[Callable[..., Any]] = None,
      low_dimensional_packing_status: bool = False,
  ):
    if slot_variable_creation_fn is not None and not callable(
        slot_variable_creation_fn):
      raise ValueError(
          "Argument `slot_variable_creation_fn` must be either None or a "
          f"callable. Received: {slot_variable_creation_fn}")
    self.slot_variable_creation_fn = slot_variable_creation_fn
    self.learning_rate = learning_rate
    self.use_gradient_accumulation = use_gradient_accumulation
    self.clip_weight_min = clip_weight_min
    self.clip_weight_max = clip_weight_max
    if not use_gradient_accumulation and clipvalue is not None:
      raise ValueError(
          "When `use_gradient_accumulation` is False, gradient clipping "
          "cannot be used and `clipvalue` should be left as None. "
          f"Received value {clipvalue} for argument `clipvalue`.")
    if clipvalue is None:
      clipvalue = (None, None)
    elif not isinstance(clipvalue, tuple):
      clipvalue = (-1.0 * clipvalue, clipvalue)
    self.clip_gradient_min, self.clip_gradient_max = clipvalue
    self.weight_decay_factor = weight_decay_factor
    self.multiply_weight_decay_factor_by_learning_rate = (
        multiply_weight_decay_factor_by_learning_rate)
    self.low_dimensional_packing_status = low_dimensional_packing_status

  # Slots, in the form TensorFlow's `_create_slots` expects.
  def _slot_names(self):
    return list(_declaration(self).slots)

  def _slot_initializers(self):
    return [_constant() for _ in self._slot_names()]

  @property
  def clipvalue(self) -> Optional[Tuple[Optional[float], Optional[float]]]:
    if self.clip_gradient_min is None and self.clip_gradient_max is None:
      return None
    return (self.clip_gradient_min, self.clip_gradient_max)

  def _constructor_args(self):
    args = {}
    for name in _declaration(self).arguments:
      args[name] = self.clipvalue if name == "clipvalue" else getattr(
          self, name)
    return args

  def __eq__(self, other: Any) -> bool:
    return type(other) is type(self) and other.__dict__ == self.__dict__

  def __hash__(self) -> int:
    return hash((type(self).__name__, tuple(self.__dict__.items())))

  def __repr__(self) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in self._constructor_args().items())
    return f"{type(self).__name__}({args})"


class SGD(_Optimizer):
  """Stochastic gradient descent: `w -= lr * g`.

  Same arguments as `tf.tpu.experimental.embedding.SGD`. Pass it to
  `tfemb.TPUEmbedding` (global) or a `TableConfig` (per table).

  Args:
    learning_rate: a float, or a zero-argument callable read at every step.
  """

  def __init__(
      self,
      learning_rate: LearningRate = 0.01,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clipvalue: Optional[ClipValueType] = None,
      low_dimensional_packing_status: bool = False,
  ):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate, clipvalue,
                     None, low_dimensional_packing_status)


class Adagrad(_Optimizer):
  """Adagrad: `a += g^2; w -= lr * g / sqrt(a)`; slot `accumulators`.

  Args:
    learning_rate: a float, or a zero-argument callable read at every step.
    initial_accumulator_value: the accumulators' initial value (> 0).
  """

  def __init__(
      self,
      learning_rate: LearningRate = 0.001,
      initial_accumulator_value: float = 0.1,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      slot_variable_creation_fn: Optional[Callable[..., Any]] = None,
      clipvalue: Optional[ClipValueType] = None,
      low_dimensional_packing_status: bool = False,
  ):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate, clipvalue,
                     slot_variable_creation_fn,
                     low_dimensional_packing_status)
    if initial_accumulator_value <= 0:
      raise ValueError(
          "Argument `initial_accumulator_value` must be a positive float. "
          f"Received: {initial_accumulator_value}")
    self.initial_accumulator_value = initial_accumulator_value

  def _slot_initializers(self):
    return [_constant(self.initial_accumulator_value)]


class AdagradMomentum(_Optimizer):
  """Adagrad with momentum; slots `accumulators` and `momenta`.

  `a = a + g^2` (beta2 == 1) or `beta2*a + (1-beta2)*g^2`;
  `p = (a + epsilon)^(-1/exponent)`; `m = momentum*m + g*p`;
  `w -= lr * (momentum*m + g*p if use_nesterov else m)`.

  Args:
    learning_rate: a float, or a zero-argument callable read at every step.
    momentum: the momentum (0 to 1).
    use_nesterov: Nesterov momentum.
    exponent: the preconditioner's exponent (> 0; 2 is Adagrad's root).
    beta2: the accumulator's decay; 1 sums the squares as Adagrad does.
    epsilon: added to the accumulator before the power (> 0).
  """

  def __init__(
      self,
      learning_rate: LearningRate = 0.001,
      momentum: float = 0.0,
      use_nesterov: bool = False,
      exponent: float = 2,
      beta2: float = 1,
      epsilon: float = 1e-10,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      slot_variable_creation_fn: Optional[Callable[..., Any]] = None,
      clipvalue: Optional[ClipValueType] = None,
      low_dimensional_packing_status: bool = False,
  ):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate, clipvalue,
                     slot_variable_creation_fn,
                     low_dimensional_packing_status)
    if epsilon <= 0:
      raise ValueError("Adagrad momentum: epsilon must be positive")
    if exponent <= 0:
      raise ValueError("Adagrad momentum: Precondition exponent must >0")
    self.momentum = momentum
    self.use_nesterov = use_nesterov
    self.exponent = exponent
    self.beta2 = beta2
    self.epsilon = epsilon


class FTRL(_Optimizer):
  """FTRL-Proximal; slots `accumulators` and `linears`.

  TensorFlow's `ResourceApplyFtrl` with `beta / lr` added to the quadratic
  term (the proto's definition), `multiply_linear_by_learning_rate` and
  `allow_zero_accumulator` as in `optimization_parameters.proto`.

  Args:
    learning_rate: a float, or a zero-argument callable read at every step.
    learning_rate_power: the power of the accumulator (<= 0; -0.5 is the
      square root).
    l1_regularization_strength: L1 regularization (>= 0).
    l2_regularization_strength: L2 regularization (>= 0).
    beta: added to the quadratic term, divided by the learning rate.
    initial_accumulator_value: the accumulators' initial value (> 0).
    multiply_linear_by_learning_rate: keeps the linear slot multiplied by
      the learning rate (the proto's option of that name).
    allow_zero_accumulator: lets an accumulator be 0 (the proto's option).
  """

  def __init__(
      self,
      learning_rate: LearningRate = 0.001,
      learning_rate_power: float = -0.5,
      l1_regularization_strength: float = 0.0,
      l2_regularization_strength: float = 0.0,
      beta: float = 0.0,
      initial_accumulator_value: float = 0.1,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      slot_variable_creation_fn: Optional[Callable[..., Any]] = None,
      clipvalue: Optional[ClipValueType] = None,
      multiply_linear_by_learning_rate: bool = False,
      allow_zero_accumulator: bool = False,
      low_dimensional_packing_status: bool = False,
  ):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate, clipvalue,
                     slot_variable_creation_fn,
                     low_dimensional_packing_status)
    if initial_accumulator_value <= 0:
      raise ValueError(
          "Argument `initial_accumulator_value` must be a positive float. "
          f"Received: {initial_accumulator_value}")
    self.initial_accumulator_value = initial_accumulator_value
    self.learning_rate_power = learning_rate_power
    self.l1_regularization_strength = l1_regularization_strength
    self.l2_regularization_strength = l2_regularization_strength
    self.beta = beta
    self.multiply_linear_by_learning_rate = multiply_linear_by_learning_rate
    self.allow_zero_accumulator = allow_zero_accumulator

  def _slot_initializers(self):
    return [_constant(self.initial_accumulator_value), _constant()]


class Adam(_Optimizer):
  """Adam as the TPU runs it: no bias correction, lazy by default.

  `m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2`;
  `w -= lr * m / sqrt(v + eps^2)` (`sum_inside_sqrt`) or
  `w -= lr * m / (sqrt(v) + eps)`. Slots `momenta` and `velocities`.

  Args:
    learning_rate: a float, or a zero-argument callable read at every step.
    beta_1: the first moment's decay (0 <= beta_1 < 1).
    beta_2: the second moment's decay (0 <= beta_2 < 1).
    epsilon: added to the denominator (> 0).
    lazy_adam: True (default): only the rows a step touched are updated.
      False: every row's moments decay every step, as the proto's non-lazy
      Adam (TensorFlow's ops; needs `use_gradient_accumulation`).
    sum_inside_sqrt: `sqrt(v + eps^2)` (default) or `sqrt(v) + eps`.
  """

  def __init__(
      self,
      learning_rate: LearningRate = 0.001,
      beta_1: float = 0.9,
      beta_2: float = 0.999,
      epsilon: float = 1e-07,
      lazy_adam: bool = True,
      sum_inside_sqrt: bool = True,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      slot_variable_creation_fn: Optional[Callable[..., Any]] = None,
      clipvalue: Optional[ClipValueType] = None,
      low_dimensional_packing_status: bool = False,
  ):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate, clipvalue,
                     slot_variable_creation_fn,
                     low_dimensional_packing_status)
    if beta_1 < 0. or beta_1 >= 1.:
      raise ValueError(
          f"Argument `beta_1` must be >= 0 and < 1. Received: {beta_1}.")
    if beta_2 < 0. or beta_2 >= 1.:
      raise ValueError(
          f"Argument `beta_2` must be >= 0 and < 1. Received: {beta_2}.")
    if epsilon <= 0.:
      raise ValueError("epsilon must be positive; got {}.".format(epsilon))
    if not use_gradient_accumulation and not lazy_adam:
      raise ValueError(
          "When disabling lazy Adam (`lazy_adam=False`), "
          "gradient accumulation must be used. "
          "Set `use_gradient_accumulation` to False.")
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.lazy_adam = lazy_adam
    self.sum_inside_sqrt = sum_inside_sqrt


_SHARED_ARGS = """
  Every optimizer also takes:
    use_gradient_accumulation: a TPU performance hint (kept in the TPU
      configuration; no effect on the host). False forbids `clipvalue`.
    clip_weight_min, clip_weight_max: the bounds of every updated weight,
      after the update (None: open).
    weight_decay_factor: decoupled weight decay, `w -= d * w_old` after the
      rule, with `d` this factor.
    multiply_weight_decay_factor_by_learning_rate: `d = factor * lr`.
    clipvalue: gradient clipping before the rule: `c` for `(-c, c)`, or
      `(min, max)` with None for an open side.
    slot_variable_creation_fn (not SGD): `fn(table, slot_names,
      slot_initializers) -> {slot name: variable}`, to create the slots
      yourself.
    low_dimensional_packing_status: a TPU performance hint; no effect on
      the host.

  The update these drive is written out in docs/numerics.md, "The update".
"""

for _cls in (SGD, Adagrad, AdagradMomentum, FTRL, Adam):
  _cls.__doc__ += _SHARED_ARGS
