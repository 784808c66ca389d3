"""Optimizers converted from TPUEstimator's parameters train to the numpy
reference's numbers, through tfemb.TPUEmbedding's enqueue / dequeue /
apply_gradients.

The reference is told the OLD semantics: its parameters are read off the
TPUEstimator objects here, independently of the conversion under test.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.compat import v1

VOCAB, DIM, BATCH, STEPS = 12, 3, 4, 3
TOUCHABLE = 9

CASES = {
    "sgd_clipped_decayed": v1.StochasticGradientDescentParameters(
        0.4, clip_weight_min=-0.3, clip_weight_max=0.35,
        weight_decay_factor=0.2,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_gradient_min=-0.05, clip_gradient_max=0.1),
    "sgd_no_accumulation": v1.StochasticGradientDescentParameters(
        0.4, use_gradient_accumulation=False),
    "adagrad": v1.AdagradParameters(0.3, initial_accumulator=0.4,
                                    clip_gradient_max=0.08),
    "adam_lazy": v1.AdamParameters(0.05, clip_gradient_min=-0.1),
    "adam_dense_eps_outside": v1.AdamParameters(
        0.05, beta1=0.7, beta2=0.8, epsilon=1e-3, lazy_adam=False,
        sum_inside_sqrt=False, weight_decay_factor=0.05),
    "ftrl": v1.FtrlParameters(
        0.2, learning_rate_power=-0.4, initial_accumulator_value=0.3,
        l1_regularization_strength=0.002, l2_regularization_strength=0.01,
        beta=0.2, clip_gradient_min=-0.5, clip_gradient_max=0.5),
    "ftrl_linear_by_lr": v1.FtrlParameters(
        0.2, multiply_linear_by_learning_rate=True,
        l1_regularization_strength=0.001),
}


def reference_kind_and_params(p):
  """The old parameters, in tests/reference.py's vocabulary."""
  params = dict(
      clip_weight_min=p.clip_weight_min, clip_weight_max=p.clip_weight_max,
      weight_decay_factor=p.weight_decay_factor,
      multiply_weight_decay_factor_by_learning_rate=(
          p.multiply_weight_decay_factor_by_learning_rate),
      clip_gradient=(p.clip_gradient_min, p.clip_gradient_max))
  if isinstance(p, v1.StochasticGradientDescentParameters):
    return "sgd", params
  if isinstance(p, v1.AdagradParameters):
    params["initial_accumulator_value"] = p.initial_accumulator
    return "adagrad", params
  if isinstance(p, v1.AdamParameters):
    params.update(beta_1=p.beta1, beta_2=p.beta2, epsilon=p.epsilon,
                  lazy_adam=p.lazy_adam, sum_inside_sqrt=p.sum_inside_sqrt)
    return "adam", params
  params.update(
      learning_rate_power=p.learning_rate_power,
      initial_accumulator_value=p.initial_accumulator_value,
      l1_regularization_strength=p.l1_regularization_strength,
      l2_regularization_strength=p.l2_regularization_strength,
      beta=p.beta,
      multiply_linear_by_learning_rate=p.multiply_linear_by_learning_rate)
  return "ftrl", params


def batches(rng):
  out = []
  for _ in range(STEPS):
    rows = helpers.random_rows(rng, BATCH, TOUCHABLE, 4)
    out.append(dict(ids=rows, w=helpers.random_weights(rng, rows),
                    seq=helpers.random_rows(rng, BATCH, TOUCHABLE, 3)))
  return out


@pytest.mark.parametrize("case", list(CASES))
def test_converted_optimizer_trains_like_the_reference(case):
  old = CASES[case]
  rng = np.random.default_rng(3)
  init = rng.normal(size=(VOCAB, DIM)) * 0.3
  target = rng.normal(size=(BATCH, DIM))
  seq_target = rng.normal(size=(BATCH, 2, DIM))
  table = tfemb.TableConfig(VOCAB, DIM, tf.constant_initializer(init),
                            combiner="sqrtn", name="t")
  embedding = tfemb.TPUEmbedding(
      {"bag": tfemb.FeatureConfig(table),
       "seq": tfemb.FeatureConfig(table, max_sequence_length=2)},
      v1.convert_optimization_parameters(old))
  kind, params = reference_kind_and_params(old)
  ref = reference.Table(init, kind, params)

  @tf.function
  def step(features, weights):
    embedding.enqueue(features, weights, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      loss = 0.5 * (tf.reduce_sum((act["bag"] - target) ** 2) +
                    tf.reduce_sum((act["seq"] - seq_target) ** 2))
    embedding.apply_gradients(tape.gradient(loss, act))

  for b in batches(rng):
    step({"bag": helpers.sparse(b["ids"]), "seq": helpers.ragged(b["seq"])},
         {"bag": helpers.sparse(b["ids"], b["w"], tf.float32), "seq": None})
    bag = reference.combine(ref.w, b["ids"], "sqrtn", b["w"])
    seq = reference.sequence(ref.w, b["seq"], 2)
    pairs = (reference.contributions(b["ids"], "sqrtn", bag - target, b["w"])
             + reference.contributions(b["seq"], "sqrtn", seq - seq_target,
                                       length=2))
    ref.apply(reference.row_gradients(pairs), old.learning_rate)
    got = embedding.variables[table]
    np.testing.assert_allclose(got["parameters"].numpy(), ref.w, rtol=1e-5,
                               atol=1e-6)
    for name, value in ref.slots.items():
      np.testing.assert_allclose(got[name].numpy(), value, rtol=1e-5,
                                 atol=1e-6, err_msg=name)
  # The steps did move the table (a test that cannot pass vacuously).
  assert not np.allclose(ref.w, init)
