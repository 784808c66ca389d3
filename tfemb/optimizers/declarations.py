"""One declaration per optimizer: all that tfemb needs to know about it.

`identify(optimizer)` finds the declaration of a tfemb or TensorFlow
optimizer object. Each declaration is also given to its class
(`parameters.declare`), whose slots and arguments it names. What adding an
optimizer takes is listed in `tfemb.update_rules`.
"""

import dataclasses
import inspect
from typing import Any, Callable, Dict, Mapping, Tuple, Union

import tensorflow as tf

from tfemb import update_rules
from tfemb.optimizers import parameters

ProtoField = Union[str, Callable[[Any], Any]]


@dataclasses.dataclass(frozen=True)
class Declaration:
  """Everything tfemb needs to know about one optimizer.

  Attributes:
    name: tfemb's class name, and the fused kernels' name for its rule.
    cls: tfemb's class.
    tf_name: TensorFlow's class, `tf.tpu.experimental.embedding.<tf_name>`.
    slots: the slot variables' names, in TensorFlow's order.
    rule: its update (`tfemb.update_rules`).
    kernel_constants: `optimizer -> {name: value}`, the constants its C++
      row rule (`RuleRow<Name>`, tfemb/kernels/src/update_rules.h) reads,
      in order; the build names them in C++ (`kBeta1` for "beta_1").
    proto_message: its message in TensorFlow's `OptimizationParameters`.
    proto_fields: that message's fields, each from an attribute of the
      optimizer (its name) or a function of the optimizer.
    lazy: `optimizer -> bool`: whether a step updates only the rows it
      touched (all but non-lazy Adam, which updates every row, as on the
      TPU: TensorFlow's ops then, never the fused kernels).
    divides_by_learning_rate: `optimizer -> bool`: whether the rule
      divides by the learning rate (FTRL without
      `multiply_linear_by_learning_rate`), which must then be > 0.
  """
  name: str
  cls: type
  tf_name: str
  slots: Tuple[str, ...]
  rule: update_rules.Rule
  kernel_constants: Callable[[Any], Dict[str, float]]
  proto_message: str
  proto_fields: Mapping[str, ProtoField]
  lazy: Callable[[Any], bool] = lambda optimizer: True
  divides_by_learning_rate: Callable[[Any], bool] = lambda optimizer: False

  def __post_init__(self):
    parameters.declare(self.cls, self)
    parameters.declare(self.tf_class, self)

  @property
  def tf_class(self) -> type:
    return getattr(tf.tpu.experimental.embedding, self.tf_name)

  @property
  def arguments(self) -> Tuple[str, ...]:
    """tfemb's constructor arguments, in order (TensorFlow's are the same)."""
    return tuple(inspect.signature(self.cls.__init__).parameters)[1:]


DECLARATIONS: Tuple[Declaration, ...] = (
    Declaration(
        name="SGD", cls=parameters.SGD, tf_name="SGD", slots=(),
        rule=update_rules.sgd, kernel_constants=update_rules.no_constants,
        proto_message="stochastic_gradient_descent", proto_fields={}),
    Declaration(
        name="Adagrad", cls=parameters.Adagrad, tf_name="Adagrad",
        slots=("accumulators",), rule=update_rules.adagrad,
        kernel_constants=update_rules.no_constants, proto_message="adagrad",
        proto_fields={}),
    Declaration(
        name="AdagradMomentum", cls=parameters.AdagradMomentum,
        tf_name="AdagradMomentum", slots=("accumulators", "momenta"),
        rule=update_rules.adagrad_momentum,
        kernel_constants=update_rules.adagrad_momentum_constants,
        proto_message="adagrad_momentum",
        proto_fields={"momentum": "momentum", "use_nesterov": "use_nesterov",
                      "exponent": "exponent", "beta2": "beta2",
                      "epsilon": "epsilon"}),
    Declaration(
        name="Adam", cls=parameters.Adam, tf_name="Adam",
        slots=("momenta", "velocities"), rule=update_rules.adam,
        kernel_constants=update_rules.adam_constants, proto_message="adam",
        proto_fields={"beta1": "beta_1", "beta2": "beta_2",
                      "epsilon": "epsilon",
                      "use_non_lazy_adam": lambda opt: not opt.lazy_adam,
                      "use_sum_inside_sqrt": "sum_inside_sqrt"},
        lazy=lambda opt: opt.lazy_adam),
    Declaration(
        name="FTRL", cls=parameters.FTRL, tf_name="FTRL",
        slots=("accumulators", "linears"), rule=update_rules.ftrl,
        kernel_constants=update_rules.ftrl_constants, proto_message="ftrl",
        proto_fields={"l1": "l1_regularization_strength",
                      "l2": "l2_regularization_strength",
                      "lr_power": "learning_rate_power", "beta": "beta",
                      "multiply_linear_by_lr":
                          "multiply_linear_by_learning_rate",
                      "allow_zero_accumulator": "allow_zero_accumulator"},
        divides_by_learning_rate=(
            lambda opt: not opt.multiply_linear_by_learning_rate)),
)


def identify(optimizer: Any) -> Declaration:
  """The declaration of `optimizer`, an instance of one of tfemb's optimizer
  classes or of TensorFlow's (`tf.tpu.experimental.embedding`), or of a
  subclass of one.

  Raises:
    ValueError: for any other object, naming the supported classes.
  """
  declaration = parameters.declared(optimizer)
  if declaration is not None:
    return declaration
  names = ", ".join(d.name for d in DECLARATIONS)
  raise ValueError(
      f"{type(optimizer)} is an unsupported optimizer class. Please pass an "
      "instance of one of the optimizer classes under tfemb or "
      f"tf.tpu.experimental.embedding: {names}.")


def is_optimizer(optimizer: Any) -> bool:
  """Whether `identify(optimizer)` knows it."""
  return parameters.declared(optimizer) is not None


def is_lazy(optimizer: Any) -> bool:
  """Whether a step updates only the rows it touched (`Declaration.lazy`);
  True for None and for a `CustomOptimizer` (its rows only)."""
  declaration = parameters.declared(optimizer)
  return declaration is None or declaration.lazy(optimizer)


def divides_by_learning_rate(optimizer: Any) -> bool:
  """Whether the optimizer's rule divides by its learning rate
  (`Declaration.divides_by_learning_rate`); False for None and for a
  `CustomOptimizer`."""
  declaration = parameters.declared(optimizer)
  return (declaration is not None and
          declaration.divides_by_learning_rate(optimizer))
