"""tensorflow-recommenders' `TPUEmbedding` layer takes its TPU branch on a
host v4-8: its own class (which makes TensorFlow's `TPUEmbedding`, routed
to tfemb's host engine) and the name the patch routes to tfemb's layer.
A TPU training loop over 4 replicas equals tests/reference.py on the
global batch. tfrs needs tf_keras."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

pytestmark = [pytest.mark.runs_under("tf_keras")]


def _tfrs():
  """tensorflow-recommenders (it imports under tf_keras only), and its own
  layer class, unpatched."""
  import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top
  return tfrs, tfrs.layers.embedding.TPUEmbedding  # no patch is active

VOCAB, DIM, GLOBAL_BATCH, STEPS = 24, 4, 16, 3


@pytest.mark.parametrize("which", ["tfrs_class", "routed_name"])
def test_tfrs_layer_on_a_host_tpu_trains_as_the_reference(which):
  tfrs, tfrs_layer = _tfrs()
  rng = np.random.default_rng(4)
  init = rng.uniform(-0.5, 0.5, (VOCAB, DIM))
  rows = [helpers.random_rows(rng, GLOBAL_BATCH, VOCAB, 3, min_len=1)
          for _ in range(STEPS)]
  coef = rng.uniform(-1, 1, (STEPS, GLOBAL_BATCH, DIM)).astype(np.float32)
  with tfemb.patch(tpu="v4-8"):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    layer_class = (tfrs_layer if which == "tfrs_class" else
                   tfrs.layers.embedding.TPUEmbedding)
    api = tf.tpu.experimental.embedding
    with strategy.scope():
      table = api.TableConfig(VOCAB, DIM, name="t", combiner="sum",
                              initializer=tf.constant_initializer(init))
      layer = layer_class({"f": api.FeatureConfig(table)},
                          api.Adagrad(0.2, initial_accumulator_value=0.1),
                          batch_size=GLOBAL_BATCH // 4)
    assert type(layer._tpu_embedding) is tfemb.TPUEmbedding  # pylint: disable=protected-access

    def replica_step(ids, c):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids)["f"] * c)
      # The gradient trap: the tables train as the gradient flows back.
      tape.gradient(loss, layer.trainable_variables)

    data = tf.data.Dataset.from_tensor_slices(
        ({"f": tf.ragged.constant(sum(rows, []), dtype=tf.int64)},
         coef.reshape(-1, DIM))).batch(GLOBAL_BATCH)
    iterator = iter(strategy.experimental_distribute_dataset(
        data, tf.distribute.InputOptions(experimental_fetch_to_device=False)))

    @tf.function
    def step():
      strategy.run(replica_step, args=next(iterator))

    for _ in range(STEPS):
      step()
    (got,) = layer.embedding_tables.values()

  expected = reference.Table(init, "adagrad", {})
  for step_rows, step_coef in zip(rows, coef):
    expected.apply(reference.row_gradients(
        reference.contributions(step_rows, "sum", step_coef)), 0.2)
  np.testing.assert_allclose(got.numpy(), expected.w, rtol=2e-5, atol=2e-6)
