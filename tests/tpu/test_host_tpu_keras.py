"""Keras' `fit`, `evaluate` and `predict` on a host TPU: their TPU branches
(`steps_per_execution`, the TPU's output reduction) with tfemb's layer on
the type's engine, 4 replicas training as one on the global batch
(tests/reference.py)."""

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
import tfemb.layers

keras = tf.keras
VOCAB, DIM, GLOBAL_BATCH, EXAMPLES = 30, 4, 16, 64
INIT = np.random.default_rng(0).normal(size=(VOCAB, DIM))


@pytest.fixture(name="tpu")
def fixture_tpu(request):
  patch = tfemb.patch(tpu=request.param)
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    yield tf.distribute.TPUStrategy(resolver)
  finally:
    patch.undo()


def _data():
  rng = np.random.default_rng(3)
  ids = rng.integers(0, VOCAB, size=EXAMPLES)
  y = rng.normal(size=(EXAMPLES, 1)).astype(np.float32)
  return ids, y


def _reference(ids, y, epochs, lr):
  """The tables after `epochs` of Adagrad on `pred = sum(row)`, MSE, and
  each step's loss."""
  table = reference.Table(INIT, "adagrad", {})
  losses = []
  for _ in range(epochs):
    for start in range(0, EXAMPLES, GLOBAL_BATCH):
      batch, labels = ids[start:start + GLOBAL_BATCH], y[start:start +
                                                           GLOBAL_BATCH, 0]
      pred = table.w[batch].sum(axis=1)
      losses.append(reference.mean_squared_error(labels, pred))
      grad = 2 * (pred - labels) / GLOBAL_BATCH
      table.apply(reference.row_gradients(
          [(i, np.full(DIM, g)) for i, g in zip(batch, grad)]), lr)
  return table, losses


def _unstacked(stacked, tpu):
  """A one-table stack's rows in id order (docs/sparsecore.md)."""
  shards = (tpu.num_replicas_in_sync *
            tpu.extended.tpu_hardware_feature.num_embedding_devices_per_chip)
  rows = reference.stacked_rows(VOCAB, shards, 0, stacked.shape[0] // shards,
                                0)
  return stacked[rows, :DIM]


class SumOfRows(keras.Model):
  """The sum of each example's row. Subclassed, as tensorflow-recommenders
  shows TPU models: built on its first batch (a functional tf_keras model
  would build the layer on a batch of 1, which a TPU's fixed shapes
  refuse)."""

  def __init__(self, embedding):
    super().__init__()
    self.embedding = embedding

  def call(self, x):
    return tf.reduce_sum(self.embedding(x)["item"], axis=-1, keepdims=True)


@pytest.mark.parametrize("tpu", [
    "v4-8",
    # The SparseCore host engine needs TensorFlow 2.17's stacker.
    pytest.param("v5p-8", marks=pytest.mark.requires_tensorflow("2.17"))],
                         indirect=True)
def test_fit_evaluate_predict_on_a_host_tpu(tpu):
  ids, y = _data()
  v2 = tpu.extended.tpu_hardware_feature.num_embedding_devices_per_chip > 0
  per_replica = GLOBAL_BATCH // tpu.num_replicas_in_sync
  with tpu.scope():
    table = tfemb.TableConfig(VOCAB, DIM, name="items",
                              initializer=tf.constant_initializer(INIT))
    shape = dict(output_shape=[per_replica]) if v2 else {}
    model = SumOfRows(tfemb.layers.TPUEmbedding(
        {"item": tfemb.FeatureConfig(table, **shape)}, tfemb.Adagrad(0.3)))
    layer = model.embedding
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
  data = tf.data.Dataset.from_tensor_slices(({"item": ids[:, None]}, y)).batch(
      GLOBAL_BATCH, drop_remainder=True)
  history = model.fit(data, epochs=2, verbose=0)

  expected, losses = _reference(ids, y, 2, 0.3)
  steps = EXAMPLES // GLOBAL_BATCH
  np.testing.assert_allclose(
      history.history["loss"],
      [np.mean(losses[:steps]), np.mean(losses[steps:])], rtol=1e-5)
  assert history.history["loss"][1] < history.history["loss"][0]
  tables = layer.embedding_tables
  if v2:
    (stacked,) = tables.values()
    got = _unstacked(stacked.numpy(), tpu)
  else:
    got = tables[table].numpy()
  np.testing.assert_allclose(got, expected.w, rtol=1e-5, atol=1e-6)

  want = expected.w[ids].sum(axis=1)
  np.testing.assert_allclose(model.predict(data, verbose=0)[:, 0], want,
                             rtol=1e-5, atol=1e-5)
  loss = model.evaluate(data, verbose=0)
  np.testing.assert_allclose(
      loss, reference.mean_squared_error(y[:, 0], want), rtol=1e-5)
