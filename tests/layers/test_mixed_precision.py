"""Under Keras' mixed precision the tables train on the unscaled gradient.

`mixed_float16` wraps the model's optimizer in a `LossScaleOptimizer`, which
scales the loss before the gradients are taken: the layer's gradient trap
divides the embedding gradients by the same scale (docs/keras_layer.md,
"Mixed precision"), skips a step whose scaled gradients are not finite, as
Keras skips it, and keeps the tables and slots float32. `mixed_bfloat16`
scales nothing. Runs under Keras 3 and tf_keras, whichever `tf.keras` is.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
import tfemb.layers
from tfemb.sparsecore import table_stacking

keras = tf.keras
BATCH, STEPS, VOCAB, DIM = 8, 4, 12, 3
SCALE = 1024.0  # not Keras' default, so the test sees the scale is read
RNG = np.random.default_rng(5)
INIT = RNG.normal(size=(VOCAB, DIM))
IDS = RNG.integers(0, VOCAB, size=(BATCH * STEPS, 1))
TARGET = RNG.normal(size=(BATCH * STEPS, DIM)).astype(np.float32)
CASES = ("sgd", "adagrad")  # of tests/helpers.py's OPTIMIZERS
ENGINES = {"v1": {},
           "v2": {"embedding_feature": tf.tpu.experimental.HardwareFeature
                  .EmbeddingFeature.V2}}
# The SparseCore host engine needs TensorFlow 2.17.
ENGINE_PARAMS = [
    pytest.param("v1"),
    pytest.param("v2", marks=pytest.mark.requires_tensorflow("2.17"))]


@contextlib.contextmanager
def policy(name):
  keras.mixed_precision.set_global_policy(name)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy("float32")


def product_loss(y_true, y_pred):
  """Per example, sum(activation * y_true): the activations' gradient is
  y_true / batch (Keras averages over the batch)."""
  return tf.reduce_sum(tf.cast(y_pred, tf.float32) * y_true, axis=-1)


def train(kind, engine, policy_name, scale=SCALE, target=TARGET):
  """Fits a model whose output is the embedding activations; returns the
  layer and the model."""
  with policy(policy_name):
    table = tfemb.TableConfig(VOCAB, DIM, name="t",
                              initializer=tf.constant_initializer(INIT))
    feature = tfemb.FeatureConfig(
        table, name="f", output_shape=[BATCH] if engine == "v2" else None)
    layer = tfemb.layers.TPUEmbedding(
        {"f": feature}, helpers.optimizer(kind), **ENGINES[engine])
    ids = keras.Input(shape=(1,), batch_size=BATCH, dtype=tf.int32, name="f")
    # The trap weight is the model's only weight: Keras sees the tables'
    # gradients through it alone.
    model = keras.Model({"f": ids}, layer({"f": ids})["f"])
    optimizer = keras.optimizers.SGD(0.1)
    if scale is not None:
      optimizer = keras.mixed_precision.LossScaleOptimizer(
          optimizer, initial_scale=scale)
    model.compile(optimizer, product_loss)
    model.fit({"f": IDS}, target, batch_size=BATCH, epochs=1, shuffle=False,
              verbose=0)
  return layer, model


def expected_table(kind):
  ref = reference.Table(INIT, *helpers.reference_optimizer(kind))
  for s in range(STEPS):
    rows = IDS[s * BATCH:(s + 1) * BATCH]
    grad = TARGET[s * BATCH:(s + 1) * BATCH] / BATCH
    ref.apply(reference.row_gradients(reference.contributions(
        rows, "mean", grad)), ref.params["learning_rate"])
  return ref


def table_of(layer):
  """The table and its slots as float32 arrays (unstacked from a
  SparseCore's stacked variables)."""
  (variables,) = layer.embedding_variables.values()
  assert {v.dtype for v in variables.values()} == {tf.float32}
  arrays = {k: v.numpy() for k, v in variables.items()}
  if not isinstance(layer._tpu_embedding, tfemb.TPUEmbeddingV2):  # pylint: disable=protected-access
    return arrays
  stacking = layer._tpu_embedding._stacking  # pylint: disable=protected-access
  return {k: table_stacking.to_unstacked(stacking, {name: v})["t"]
          for (name,) in [list(layer.embedding_variables)]
          for k, v in arrays.items()}


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
@pytest.mark.parametrize("kind", CASES)
def test_mixed_float16_trains_the_tables_on_the_unscaled_gradient(kind,
                                                                  engine):
  layer, model = train(kind, engine, "mixed_float16")
  assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
  variables = table_of(layer)
  ref = expected_table(kind)
  np.testing.assert_allclose(variables["parameters"], ref.w,
                             rtol=1e-5, atol=1e-6)
  for name, value in ref.slots.items():
    np.testing.assert_allclose(variables[name], value, rtol=1e-5)


@pytest.mark.parametrize("policy_name", ["float32", "mixed_bfloat16"])
def test_unscaled_policies_train_the_same_numbers(policy_name):
  layer, _ = train("adagrad", "v1", policy_name, scale=None)
  variables = table_of(layer)
  ref = expected_table("adagrad")
  np.testing.assert_allclose(variables["parameters"], ref.w,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_a_step_with_non_finite_scaled_gradients_is_skipped_as_keras_skips_it(
    engine):
  # 1e37 x the scale overflows float32 in the first step's gradients only.
  target = TARGET.copy()
  target[:BATCH] *= 1e37
  layer, model = train("adagrad", engine, "mixed_float16", target=target)
  # Keras skipped its step and halved the scale; the tables skipped theirs
  # and took the other steps.
  scale = model.optimizer.dynamic_scale if hasattr(
      model.optimizer, "dynamic_scale") else model.optimizer.loss_scale
  assert float(tf.convert_to_tensor(scale)) == SCALE / 2
  ref = reference.Table(INIT, *helpers.reference_optimizer("adagrad"))
  for s in range(1, STEPS):
    rows = IDS[s * BATCH:(s + 1) * BATCH]
    grad = TARGET[s * BATCH:(s + 1) * BATCH] / BATCH
    ref.apply(reference.row_gradients(reference.contributions(
        rows, "mean", grad)), ref.params["learning_rate"])
  variables = table_of(layer)
  np.testing.assert_allclose(variables["parameters"], ref.w,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(variables["accumulators"],
                             ref.slots["accumulators"], rtol=1e-5)
  assert layer.skipped_steps == 0  # Keras' skip, not the policy's
