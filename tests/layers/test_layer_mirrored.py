"""model.fit under MirroredStrategy trains the tables as one replica does on
the same global batch (the TPU sums the global batch).

Keras 3 (3.15) cannot fit a distributed dataset with sparse or ragged inputs
at all (its `_maybe_symbolic_build` MEAN-reduces the first batch, which
fails on composite tensors), so under Keras 3 the model takes dense ids
only; under tf_keras it also takes a ragged feature.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
import tfemb.layers
from tfemb.sparsecore import table_stacking

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
GLOBAL_BATCH, EXAMPLES = 8, 32
INIT = np.random.default_rng(0).normal(size=(30, 4))
_STRATEGIES = {}


def mirrored(n):
  if n not in _STRATEGIES:  # own collective keys per size (see strategies/)
    tf.distribute.MirroredStrategy._collective_key_base = 2000 + 100 * n  # pylint: disable=protected-access
    _STRATEGIES[n] = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(n)])
  return _STRATEGIES[n]


def data():
  rng = np.random.default_rng(1)
  x = {"item": rng.integers(0, 30, size=EXAMPLES),
       "user": rng.integers(0, 30, size=EXAMPLES)}
  if LEGACY:
    x["history"] = helpers.ragged(helpers.random_rows(rng, EXAMPLES, 30, 3))
  y = rng.normal(size=(EXAMPLES, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def fit(strategy, make_opt, v2=False):
  """The tables' variables after `fit` (first replica's copy) and the head's
  kernel. `v2`: the layer follows the SparseCore (stacked tables, each
  feature's per-replica `output_shape`); the variables are then unstacked."""
  per_replica = [GLOBAL_BATCH // strategy.num_replicas_in_sync]
  with strategy.scope():
    table = tfemb.TableConfig(30, 4, name="items", combiner="sqrtn",
                              initializer=tf.constant_initializer(INIT))
    shape = dict(output_shape=per_replica) if v2 else {}
    features = {"item": tfemb.FeatureConfig(table, **shape),
                "user": tfemb.FeatureConfig(table, **shape)}
    inputs = {"item": keras.Input(shape=(), dtype="int64", name="item"),
              "user": keras.Input(shape=(), dtype="int64", name="user")}
    if LEGACY:
      features["history"] = tfemb.FeatureConfig(table, **shape)
      inputs["history"] = keras.Input(shape=(None,), dtype="int64",
                                      ragged=True, name="history")
    sparse_core = dict(sparse_core_embedding_config=(
        tfemb.SparseCoreEmbeddingConfig())) if v2 else {}
    layer = tfemb.layers.TPUEmbedding(features, make_opt(), **sparse_core)
    act = layer(inputs)
    x = keras.layers.Concatenate()([act[k] for k in sorted(act)])
    head = keras.layers.Dense(1, kernel_initializer="ones")
    model = keras.Model(inputs, head(x))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  model.fit(data(), epochs=2, verbose=0)
  if not v2:
    variables = layer.embedding_variables[table]
    return ({n: v.numpy() for n, v in variables.items()},
            head.kernel.numpy())
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  (stacked, variables), = engine.variables.items()
  return ({n: table_stacking.to_unstacked(engine._stacking, {  # pylint: disable=protected-access
      stacked: getattr(v, "values", [v])[0].numpy()})["items"]
           for n, v in variables.items()}, head.kernel.numpy())


@pytest.mark.parametrize("case", ["adagrad", "adam"])
def test_fit_under_mirrored_equals_one_replica(case):
  make_opt = lambda: helpers.optimizer(case)
  expected, expected_kernel = fit(tf.distribute.get_strategy(), make_opt)
  got, kernel = fit(mirrored(2), make_opt)
  assert not np.allclose(expected["parameters"], INIT)
  for name in expected:
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  # The dense part, trained by Keras, agrees too: the same global step.
  np.testing.assert_allclose(kernel, expected_kernel, rtol=1e-5, atol=1e-6)


@pytest.mark.requires_tensorflow("2.17")  # the SparseCore host engine
def test_fit_under_mirrored_follows_the_sparsecore_as_one_replica():
  """The layer following the SparseCore: 2 replicas laid out for 2 chips
  (each feature's output_shape the per-replica batch) train as one replica
  on the global batch, laid out for 1 chip."""
  make_opt = lambda: tfemb.Adagrad(0.3)
  expected, expected_kernel = fit(tf.distribute.get_strategy(), make_opt,
                                  v2=True)
  got, kernel = fit(mirrored(2), make_opt, v2=True)
  assert sorted(expected) == ["accumulators", "parameters"]
  assert not np.allclose(expected["parameters"], INIT)
  for name in expected:
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  np.testing.assert_allclose(kernel, expected_kernel, rtol=1e-5, atol=1e-6)


class UnbuiltModel(keras.Model):
  """A subclassed model whose layers are built by `fit`'s first step."""

  def __init__(self, table):
    super().__init__()
    self.embedding = tfemb.layers.TPUEmbedding(
        {"item": tfemb.FeatureConfig(table)}, tfemb.Adagrad(0.3))

  def call(self, x):
    return tf.reduce_sum(self.embedding(x)["item"], axis=-1, keepdims=True)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_model_built_in_its_first_step_trains_like_the_tpu(replicas):
  """tf_keras builds an unbuilt subclassed model inside its first
  `strategy.run`, and Keras 3 by calling it on float placeholders there:
  the tables are created once, across replicas, and train on the global
  batch."""
  strategy = tf.distribute.get_strategy() if replicas == 1 else mirrored(2)
  rng = np.random.default_rng(2)
  ids = rng.integers(0, 30, size=EXAMPLES)
  y = rng.normal(size=(EXAMPLES, 1)).astype(np.float32)
  batches = tf.data.Dataset.from_tensor_slices(({"item": ids}, y)).batch(
      GLOBAL_BATCH)
  with strategy.scope():
    table = tfemb.TableConfig(30, 4, name="items",
                              initializer=tf.constant_initializer(INIT))
    model = UnbuiltModel(table)
    model.compile(optimizer="sgd", loss="mse")
  assert not model.embedding.built
  model.fit(batches, epochs=2, verbose=0)

  expected = reference.Table(INIT, "adagrad", {})
  for _ in range(2):
    for start in range(0, EXAMPLES, GLOBAL_BATCH):
      batch_ids = ids[start:start + GLOBAL_BATCH]
      pred = expected.w[batch_ids].sum(axis=1)
      # d(mean squared error)/d(activation), the same for every column.
      grad = 2 * (pred - y[start:start + GLOBAL_BATCH, 0]) / GLOBAL_BATCH
      pairs = [(i, np.full(4, g)) for i, g in zip(batch_ids, grad)]
      expected.apply(reference.row_gradients(pairs), 0.3)
  variables = model.embedding.embedding_variables[table]
  copies = getattr(variables["parameters"], "values",
                   (variables["parameters"],))
  assert len(copies) == replicas
  for name, want in [("parameters", expected.w),
                     ("accumulators", expected.slots["accumulators"])]:
    for copy in getattr(variables[name], "values", (variables[name],)):
      np.testing.assert_allclose(copy.numpy(), want, rtol=1e-5, atol=1e-6,
                                 err_msg=name)
