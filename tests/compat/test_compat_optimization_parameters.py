"""tfemb.compat.v1's optimization parameters: TF 2.15's signatures and
validation, and the conversion to tfemb optimizers."""

import inspect

import pytest

import tfemb
from tfemb.compat import v1

_COMMON = [("use_gradient_accumulation", True), ("clip_weight_min", None),
           ("clip_weight_max", None), ("weight_decay_factor", None),
           ("multiply_weight_decay_factor_by_learning_rate", None)]
_CLIP = [("clip_gradient_min", None), ("clip_gradient_max", None)]
_REQUIRED = inspect.Parameter.empty

# TensorFlow 2.15, tensorflow/python/tpu/tpu_embedding.py, in order.
TF_2_15_SIGNATURES = {
    "StochasticGradientDescentParameters":
        [("learning_rate", _REQUIRED)] + _COMMON + _CLIP,
    "AdagradParameters":
        [("learning_rate", _REQUIRED), ("initial_accumulator", 0.1)] +
        _COMMON + _CLIP,
    "AdamParameters":
        [("learning_rate", _REQUIRED), ("beta1", 0.9), ("beta2", 0.999),
         ("epsilon", 1e-08), ("lazy_adam", True), ("sum_inside_sqrt", True)] +
        _COMMON + _CLIP,
    "FtrlParameters":
        [("learning_rate", _REQUIRED), ("learning_rate_power", -0.5),
         ("initial_accumulator_value", 0.1),
         ("l1_regularization_strength", 0.0),
         ("l2_regularization_strength", 0.0)] + _COMMON +
        [("multiply_linear_by_learning_rate", False), ("beta", 0),
         ("allow_zero_accumulator", False)] + _CLIP,
}


@pytest.mark.parametrize("name", list(TF_2_15_SIGNATURES))
def test_signature_is_tensorflow_2_15s(name):
  params = list(inspect.signature(getattr(v1, name)).parameters.values())
  assert [(p.name, p.default) for p in params] == TF_2_15_SIGNATURES[name]


@pytest.mark.parametrize("cls, kwargs, message", [
    (v1.AdagradParameters, dict(initial_accumulator=0.0),
     "Adagrad initial_accumulator must be positive"),
    (v1.AdamParameters, dict(beta1=1.0), "beta1 must be between 0. and 1"),
    (v1.AdamParameters, dict(beta2=-0.1), "beta2 must be between 0. and 1"),
    (v1.AdamParameters, dict(epsilon=0.0), "epsilon must be positive"),
    (v1.AdamParameters, dict(lazy_adam=False, use_gradient_accumulation=False),
     "When disabling Lazy Adam, gradient accumulation must be used"),
    (v1.FtrlParameters, dict(learning_rate_power=0.1),
     "learning_rate_power must be less than or equal to 0"),
    (v1.FtrlParameters, dict(initial_accumulator_value=-1.0),
     "initial_accumulator_value must be greater than or equal to 0"),
    (v1.FtrlParameters, dict(l1_regularization_strength=-1.0),
     "l1_regularization_strength must be greater than or equal to 0"),
    (v1.FtrlParameters, dict(l2_regularization_strength=-1.0),
     "l2_regularization_strength must be greater than or equal to 0"),
])
def test_validation_is_tensorflows(cls, kwargs, message):
  with pytest.raises(ValueError, match=message):
    cls(0.1, **kwargs)


def test_valid_edge_values_construct():
  # TensorFlow accepted these; so does tfemb.compat.v1.
  v1.FtrlParameters(0.1, initial_accumulator_value=0.0,
                    learning_rate_power=0.0)
  v1.AdamParameters(0.1, beta1=0.0, beta2=0.0)


def test_equality_and_repr():
  a = v1.FtrlParameters(0.1, beta=0.5, clip_gradient_min=-1.0)
  assert a == v1.FtrlParameters(0.1, beta=0.5, clip_gradient_min=-1.0)
  assert a != v1.FtrlParameters(0.1, beta=0.4, clip_gradient_min=-1.0)
  assert a != v1.AdagradParameters(0.1)
  assert hash(a) == hash(v1.FtrlParameters(0.1, beta=0.5,
                                           clip_gradient_min=-1.0))
  assert eval(repr(a), vars(v1)) == a  # pylint: disable=eval-used
  assert repr(v1.StochasticGradientDescentParameters(0.5)).startswith(
      "StochasticGradientDescentParameters(learning_rate=0.5, "
      "use_gradient_accumulation=True,")


CONVERSIONS = [
    (v1.StochasticGradientDescentParameters(
        0.3, clip_weight_min=-1.0, clip_weight_max=2.0,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_gradient_min=-0.5, clip_gradient_max=0.25),
     tfemb.SGD(0.3, clip_weight_min=-1.0, clip_weight_max=2.0,
               weight_decay_factor=0.1,
               multiply_weight_decay_factor_by_learning_rate=True,
               clipvalue=(-0.5, 0.25))),
    (v1.StochasticGradientDescentParameters(0.3, clip_gradient_max=0.25),
     tfemb.SGD(0.3, clipvalue=(None, 0.25))),
    (v1.AdagradParameters(0.2, initial_accumulator=0.7,
                          use_gradient_accumulation=False),
     tfemb.Adagrad(0.2, initial_accumulator_value=0.7,
                   use_gradient_accumulation=False)),
    (v1.AdamParameters(0.05, beta1=0.8, beta2=0.9, epsilon=1e-3,
                       lazy_adam=False, sum_inside_sqrt=False,
                       clip_gradient_min=-2.0),
     tfemb.Adam(0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-3, lazy_adam=False,
                sum_inside_sqrt=False, clipvalue=(-2.0, None))),
    # The old Adam default epsilon (1e-8) is carried over, not tfemb's 1e-7.
    (v1.AdamParameters(0.05), tfemb.Adam(0.05, epsilon=1e-8)),
    (v1.FtrlParameters(0.2, learning_rate_power=-0.3,
                       initial_accumulator_value=0.5,
                       l1_regularization_strength=0.01,
                       l2_regularization_strength=0.02, weight_decay_factor=0.1,
                       multiply_linear_by_learning_rate=True, beta=0.3,
                       allow_zero_accumulator=True),
     tfemb.FTRL(0.2, learning_rate_power=-0.3, initial_accumulator_value=0.5,
                l1_regularization_strength=0.01,
                l2_regularization_strength=0.02, weight_decay_factor=0.1,
                multiply_linear_by_learning_rate=True, beta=0.3,
                allow_zero_accumulator=True)),
]


@pytest.mark.parametrize("params, expected", CONVERSIONS,
                         ids=[type(p).__name__ for p, _ in CONVERSIONS])
def test_conversion_carries_every_field(params, expected):
  converted = v1.convert_optimization_parameters(params)
  assert converted == expected, (converted, expected)


def test_clipping_without_accumulation_constructs_but_does_not_convert():
  # TensorFlow 2.15 built this ValueError without raising it.
  params = v1.AdagradParameters(0.1, use_gradient_accumulation=False,
                                clip_gradient_max=1.0)
  with pytest.raises(ValueError, match="use_gradient_accumulation=True"):
    v1.convert_optimization_parameters(params)


def test_zero_ftrl_accumulator_has_no_equivalent():
  params = v1.FtrlParameters(0.1, initial_accumulator_value=0.0,
                             allow_zero_accumulator=True)
  with pytest.raises(ValueError, match="initial_accumulator_value=0.0"):
    v1.convert_optimization_parameters(params)


def test_other_objects_are_refused():
  with pytest.raises(TypeError, match="got SGD"):
    v1.convert_optimization_parameters(tfemb.SGD(0.1))
