"""The Keras layer off the TPU takes what tensorflow-recommenders' layer
takes there.

tfrs' layer off the TPU looks up with TensorFlow's `TPUEmbeddingForServing`,
which also takes a scalar id, dense ids whose last dimension is not 1 (one
activation per id) and a rank-1 SparseTensor (all its ids combined into one
activation). tfemb's layer takes them with those shapes, and trains through
them with the embedding optimizer; every other input keeps the TPU's rules.
Numbers from the numpy oracle (tests/reference.py), eagerly and in a Keras
model, under Keras 3 and tf_keras.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
import tfemb.layers

keras = tf.keras
VOCAB, DIM, LR = 10, 3, 0.5
INIT = np.random.default_rng(5).normal(size=(VOCAB, DIM))


def sparse_rank1(ids, values, width=6, dtype=tf.int64):
  return tf.SparseTensor(np.asarray(ids, np.int64).reshape(-1, 1),
                         tf.constant(values, dtype), [width])


# name: (ids, weights, the oracle's examples (rows, weights), output shape
# without dim, a Keras Input for the ids or None (no batch dimension)).
CASES = {
    "scalar_id": (tf.constant(3, tf.int64), None, [[3]], None, (), None),
    "dense_rank1": (tf.constant([1, 2, 2], tf.int64), None,
                    [[1], [2], [2]], None, (3,), dict(shape=())),
    "dense_two_ids_per_example": (
        tf.constant([[1, 7], [2, 1]], tf.int64), None,
        [[1], [7], [2], [1]], None, (2, 2), dict(shape=(2,))),
    "sparse_rank1": (sparse_rank1([0, 2, 3], [1, 4, 1]), None, [[1, 4, 1]],
                     None, (), None),
    "sparse_rank1_weighted": (
        sparse_rank1([0, 2, 3], [1, 4, 1]),
        sparse_rank1([0, 2, 3], [0.5, 2.0, 1.5], dtype=tf.float32),
        [[1, 4, 1]], [[0.5, 2.0, 1.5]], (), None),
    "sparse_rank2_weighted": (
        helpers.sparse([[1, 4], [], [5]]),
        helpers.sparse([[1, 4], [], [5]], [[0.5, 2.0], [], [3.0]],
                       tf.float32),
        [[1, 4], [], [5]], [[0.5, 2.0], [], [3.0]], (3,),
        dict(shape=(None,), sparse=True)),
    "ragged": (helpers.ragged([[1, 4, 4], [], [5]]), None,
               [[1, 4, 4], [], [5]], None, (3,),
               dict(shape=(None,), ragged=True)),
    "ragged_weighted": (
        helpers.ragged([[1, 4], [], [5]]),
        helpers.ragged([[0.5, 2.0], [], [3.0]], tf.float32),
        [[1, 4], [], [5]], [[0.5, 2.0], [], [3.0]], (3,),
        dict(shape=(None,), ragged=True)),
}
COMBINERS = ["sum", "mean", "sqrtn"]


def make_layer(combiner):
  table = tfemb.TableConfig(VOCAB, DIM, name="t", combiner=combiner,
                            initializer=tf.constant_initializer(INIT))
  layer = tfemb.layers.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                    tfemb.SGD(LR))
  return layer, table


def expected(name, combiner, table=INIT):
  _, _, rows, weights, shape, _ = CASES[name]
  return reference.combine(table, rows, combiner, weights).reshape(
      shape + (DIM,))


def expected_table(name, combiner, grad):
  """One SGD step of the oracle, given the activations' gradient."""
  _, _, rows, weights, _, _ = CASES[name]
  pairs = reference.contributions(rows, combiner, grad.reshape(-1, DIM),
                                  weights)
  table = reference.Table(INIT, "sgd", {})
  table.apply(reference.row_gradients(pairs), LR)
  return table.w


def call(layer, name, model=None):
  ids, weights = CASES[name][:2]
  if model is not None:
    return model(ids if weights is None else [ids, weights])
  return layer({"f": ids}, None if weights is None else {"f": weights})["f"]


def keras_model(layer, name):
  """A functional model around the layer, for the inputs a Keras Input can
  describe (all but those without a batch dimension)."""
  ids, weights, _, _, _, spec = CASES[name]
  assert spec is not None, "a Keras Input always has a batch dimension"
  ids_in = keras.Input(dtype="int64", name="ids", **spec)
  if weights is None:
    return keras.Model(ids_in, layer({"f": ids_in})["f"])
  weights_in = keras.Input(dtype="float32", name="weights", **spec)
  return keras.Model([ids_in, weights_in],
                     layer({"f": ids_in}, {"f": weights_in})["f"])


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize(
    "name,in_model",
    [(n, m) for n in CASES for m in (False, True)
     if not m or CASES[n][5] is not None],  # a Keras Input has a batch dim
    ids=lambda x: x if isinstance(x, str) else ("model" if x else "eager"))
def test_lookup_and_one_training_step(name, in_model, combiner):
  layer, table = make_layer(combiner)
  model = keras_model(layer, name) if in_model else None
  grad = np.random.default_rng(1).normal(
      size=expected(name, combiner).shape).astype(np.float32)
  with tf.GradientTape() as tape:
    out = call(layer, name, model)
    loss = tf.reduce_sum(out * grad)
  assert tuple(out.shape) == CASES[name][4] + (DIM,)
  np.testing.assert_allclose(out.numpy(), expected(name, combiner),
                             rtol=1e-5, atol=1e-6)
  variables = layer.trainable_variables
  tape.gradient(loss, variables)  # the embedding optimizer's step
  np.testing.assert_allclose(layer.embedding_tables[table].numpy(),
                             expected_table(name, combiner, grad),
                             rtol=1e-5, atol=1e-6)


def test_model_fit_with_two_ids_per_example():
  """`Input(shape=(2,))` ids: `[batch, 2, dim]` activations, trained by
  `fit` with the embedding optimizer."""
  name = "dense_two_ids_per_example"
  layer, table = make_layer("sum")
  model = keras_model(layer, name)
  grad = np.random.default_rng(2).normal(size=(2, 2, DIM)).astype(np.float32)
  out = keras.layers.Lambda(lambda a: tf.reduce_sum(a * grad, [1, 2]))(
      model.output)
  model = keras.Model(model.input, out)
  model.compile(optimizer="sgd", loss=lambda y, p: tf.reduce_sum(p))
  # Unshuffled: the gradient above is per example, in the input's order.
  model.fit(CASES[name][0], np.zeros((2,), np.float32), batch_size=2,
            epochs=1, shuffle=False, verbose=0)
  np.testing.assert_allclose(layer.embedding_tables[table].numpy(),
                             expected_table(name, "sum", grad),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_shapes_are_those_of_tfrs_layer_off_the_tpu(name):
  """tfrs' layer off the TPU returns `TPUEmbeddingForServing`'s lookup."""
  api = tf.tpu.experimental.embedding
  table = api.TableConfig(VOCAB, DIM, name="t")
  serving = api.TPUEmbeddingForServing({"f": api.FeatureConfig(table)},
                                       api.SGD(LR))
  ids, weights = CASES[name][:2]
  theirs = serving({"f": ids}, None if weights is None else {"f": weights})
  layer, _ = make_layer("mean")
  assert call(layer, name).shape == theirs["f"].shape


@pytest.mark.parametrize("name", ["scalar_id", "sparse_rank1",
                                  "dense_two_ids_per_example"])
def test_inside_a_tf_function(name):
  layer, _ = make_layer("mean")
  out = tf.function(lambda: call(layer, name))()
  np.testing.assert_allclose(out.numpy(), expected(name, "mean"),
                             rtol=1e-5, atol=1e-6)


def test_dense_ids_of_width_one_keep_the_tpus_shape():
  """`[batch, 1]` ids: `[batch, dim]`, as on a TPU (tfrs' CPU layer gives
  `[batch, 1, dim]`); the same model runs on both."""
  layer, _ = make_layer("sum")
  out = layer({"f": tf.constant([[1], [2]], tf.int64)})["f"]
  np.testing.assert_allclose(out.numpy(), INIT[[1, 2]], rtol=1e-6)


ERRORS = {
    "weights_for_dense_ids": (
        dict(), tf.constant([1, 2], tf.int64), tf.constant([1.0, 2.0]),
        "Weight specified for dense input f"),
    "scalar_id_of_a_sequence_feature": (
        dict(max_sequence_length=2), tf.constant(1, tf.int64), None,
        "Feature f is a sequence feature but a dense tensor"),
    "weighted_rank1_sparse_of_a_sequence_feature": (
        dict(max_sequence_length=2), sparse_rank1([0, 1], [1, 2]),
        sparse_rank1([0, 1], [1.0, 2.0], dtype=tf.float32),
        "Weight specified for f, but this is a sequence feature"),
    "rank3_ragged": (
        dict(), tf.ragged.constant([[[1, 2]], [[3]]], tf.int64), None,
        "Only rank 2 ragged tensor is supported, find rank 3 ragged tensor "
        "for input f"),
    "id_out_of_range": (
        dict(), tf.constant(VOCAB, tf.int64), None,
        r"Feature \W*f\W*[^:]*: ids must be in \[0, 10\)"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_what_neither_takes_is_refused_naming_the_feature(name):
  kwargs, ids, weights, pattern = ERRORS[name]
  table = tfemb.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(INIT))
  layer = tfemb.layers.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, **kwargs)}, tfemb.SGD(LR))
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match=pattern):
    layer({"f": ids}, None if weights is None else {"f": weights})
