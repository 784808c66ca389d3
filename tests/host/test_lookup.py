"""Forward lookups: every input kind, rank, combiner and output shape.

`dequeue` is checked against the numpy reference with TPUEmbedding's output
shapes; `__call__` against TensorFlow's own `TPUEmbeddingForServing`.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

VOCAB, DIM = 12, 3
TABLE = np.random.default_rng(0).normal(size=(VOCAB, DIM))
ROWS = [[1, 2, 2], [], [5], [0, 11, 3, 7]]  # an empty example, duplicates
WEIGHTS = [[0.5, 1.5, 2.0], [], [3.0], [1.0, 0.25, 0.5, 2.0]]


def table(combiner="mean"):
  return tfemb.TableConfig(VOCAB, DIM, combiner=combiner, name="t",
                           initializer=tf.constant_initializer(TABLE))


def seq_expected(length):
  return reference.sequence(TABLE, ROWS, length)


# name: (feature kwargs, features, weights, expected(combiner))
CASES = {
    "dense_rank1": (
        {}, tf.constant([3, 3, 0, 9]), None,
        lambda c: TABLE[[3, 3, 0, 9]]),
    "dense_rank2_last_dim_1": (
        {}, tf.constant([[3], [3], [0], [9]]), None,
        lambda c: TABLE[[3, 3, 0, 9]]),
    "dense_rank3": (
        {}, tf.constant([[[1], [2]], [[3], [4]]]), None,
        lambda c: TABLE[[1, 2, 3, 4]].reshape(2, 2, DIM)),
    "sparse": (
        {}, helpers.sparse(ROWS), None,
        lambda c: reference.combine(TABLE, ROWS, c)),
    "sparse_weighted": (
        {}, helpers.sparse(ROWS), helpers.sparse(ROWS, WEIGHTS, tf.float32),
        lambda c: reference.combine(TABLE, ROWS, c, WEIGHTS)),
    "sparse_int32_ids": (
        {}, helpers.sparse(ROWS, dtype=tf.int32), None,
        lambda c: reference.combine(TABLE, ROWS, c)),
    "sparse_rank3": (
        {},
        tf.SparseTensor([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 1, 0],
                         [1, 1, 2]], tf.constant([1, 4, 4, 7, 7], tf.int64),
                        [2, 2, 3]), None,
        lambda c: reference.combine(TABLE, [[1, 4], [4], [], [7, 7]],
                                    c).reshape(2, 2, DIM)),
    "sparse_output_shape": (
        dict(output_shape=[2, 2]), helpers.sparse(ROWS), None,
        lambda c: reference.combine(TABLE, ROWS, c).reshape(2, 2, DIM)),
    "sparse_sequence": (
        dict(max_sequence_length=2), helpers.sparse(ROWS), None,
        lambda c: seq_expected(2)),
    "sparse_sequence_padded": (
        dict(max_sequence_length=6), helpers.sparse(ROWS), None,
        lambda c: seq_expected(6)),
    "ragged": (
        {}, helpers.ragged(ROWS), None,
        lambda c: reference.combine(TABLE, ROWS, c)),
    "ragged_weighted": (
        {}, helpers.ragged(ROWS), helpers.ragged(WEIGHTS, tf.float32),
        lambda c: reference.combine(TABLE, ROWS, c, WEIGHTS)),
    "ragged_sequence": (
        dict(max_sequence_length=3), helpers.ragged(ROWS), None,
        lambda c: seq_expected(3)),
    "ragged_output_shape_batch": (
        dict(output_shape=[2, 2]), helpers.ragged(ROWS), None,
        lambda c: reference.combine(TABLE, ROWS, c).reshape(2, 2, DIM)),
    "ragged_output_shape_multiple": (
        dict(output_shape=[4, 2]), helpers.ragged(ROWS), None,
        lambda c: seq_expected(2)),
}


def make(name, combiner):
  kwargs, features, weights, expected = CASES[name]
  feature = tfemb.FeatureConfig(table(combiner), **kwargs)
  return feature, features, weights, expected(combiner)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("name", list(CASES))
def test_dequeue_matches_reference(name, combiner, mode, engine_path):
  feature, features, weights, expected = make(name, combiner)
  embedding = tfemb.TPUEmbedding({"f": feature}, tfemb.SGD(0.1))

  def lookup():
    embedding.enqueue({"f": features},
                      None if weights is None else {"f": weights},
                      training=False)
    return embedding.dequeue()["f"]

  got = tf.function(lookup)() if mode == "function" else lookup()
  assert got.shape == expected.shape
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


SERVING_CASES = [n for n in CASES if not n.startswith("dense_rank")]


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("name", SERVING_CASES + ["dense_2d_serving"])
def test_call_matches_tensorflow_serving(name, combiner):
  if name == "dense_2d_serving":
    feature = tfemb.FeatureConfig(table(combiner))
    features, weights = tf.constant([[3, 4, 3], [0, 1, 11]]), None
  else:
    feature, features, weights, _ = make(name, combiner)
  tf_feature = tfemb.to_tensorflow(feature)
  serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      {"f": tf_feature}, None)
  ours = tfemb.TPUEmbedding({"f": feature}, None)
  w = None if weights is None else {"f": weights}
  expected = serving({"f": features}, w)["f"]
  got = ours({"f": features}, w)["f"]
  if name == "sparse_output_shape":
    # TensorFlow's serving lookup ignores output_shape for sparse inputs;
    # tfemb keeps the TPU's shape in both paths.
    expected = tf.reshape(expected, [2, 2, DIM])
  assert got.shape == expected.shape
  np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6,
                             atol=1e-6)


def test_call_accepts_a_subset_and_is_differentiable():
  t = table()
  config = {"a": tfemb.FeatureConfig(t), "b": tfemb.FeatureConfig(t)}
  embedding = tfemb.TPUEmbedding(config, tfemb.SGD(0.1))
  var = embedding.embedding_tables[t]
  with tf.GradientTape() as tape:
    out = embedding({"b": helpers.ragged(ROWS)})
    loss = tf.reduce_sum(out["b"])
  grad = tf.convert_to_tensor(tape.gradient(loss, var))
  pairs = reference.contributions(ROWS, "mean", np.ones((len(ROWS), DIM)))
  expected = reference.dense(reference.row_gradients(pairs), (VOCAB, DIM))
  np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)
  with pytest.raises(ValueError, match="c"):
    embedding({"c": tf.constant([1])})


def test_shared_table_gathers_once_for_all_features(engine_path):
  t = table("sum")
  config = {"a": tfemb.FeatureConfig(t), "b": tfemb.FeatureConfig(t),
            "c": tfemb.FeatureConfig(t, max_sequence_length=2)}
  embedding = tfemb.TPUEmbedding(config, tfemb.SGD(0.1))
  features = {"a": tf.constant([1, 5, 5, 0]), "b": helpers.sparse(ROWS),
              "c": helpers.ragged(ROWS)}

  @tf.function
  def lookup(f):
    embedding.enqueue(f, training=False)
    return embedding.dequeue()

  out = lookup(features)
  np.testing.assert_allclose(out["a"], TABLE[[1, 5, 5, 0]], rtol=1e-6)
  np.testing.assert_allclose(out["b"], reference.combine(TABLE, ROWS, "sum"),
                             rtol=1e-6)
  np.testing.assert_allclose(out["c"], seq_expected(2), rtol=1e-6)
  graph = lookup.get_concrete_function(features).graph
  types = [op.type for op in graph.get_operations()]
  if engine_path != "tensorflow":  # one kernel dedups and gathers all three
    assert types.count("TfembDedupGather") == 1
    assert "Unique" not in types and "ResourceGather" not in types
  else:
    assert types.count("Unique") == 1
    assert types.count("ResourceGather") == 1


def test_quantization_config_quantizes_looked_up_rows(engine_path):
  q = tfemb.QuantizationConfig(num_buckets=5, lower=-0.5, upper=0.5)
  t = tfemb.TableConfig(VOCAB, DIM, combiner="sum", quantization_config=q,
                        initializer=tf.constant_initializer(TABLE), name="q")
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(t)}, tfemb.SGD())
  embedding.enqueue({"f": helpers.ragged(ROWS)}, training=False)
  got = embedding.dequeue()["f"].numpy()
  step = 1.0 / 4
  quantized = np.floor((np.clip(TABLE, -0.5, 0.5) + 0.5) / step + 0.5) * step
  quantized -= 0.5
  np.testing.assert_allclose(got, reference.combine(quantized, ROWS, "sum"),
                             rtol=1e-6, atol=1e-6)


def test_build_with_input_shapes_fixes_output_shapes():
  feature = tfemb.FeatureConfig(table(), max_sequence_length=4)
  embedding = tfemb.TPUEmbedding({"f": feature}, tfemb.SGD())
  embedding.build(per_replica_input_shapes={"f": tf.TensorShape([4, 7])})
  embedding.enqueue({"f": helpers.ragged(ROWS)}, training=False)
  assert embedding.dequeue()["f"].shape == (4, 4, DIM)
  with pytest.raises(ValueError, match="Inconsistent shape"):
    embedding.enqueue({"f": helpers.ragged(ROWS[:2])}, training=False)


def test_build_with_batch_size():
  feature = tfemb.FeatureConfig(table())
  embedding = tfemb.TPUEmbedding([feature], tfemb.SGD())
  embedding.build(per_replica_batch_size=4)
  embedding.enqueue([helpers.sparse(ROWS)], training=False)
  assert embedding.dequeue()[0].shape == (4, DIM)
  with pytest.raises(ValueError, match="Inconsistent shape"):
    embedding.enqueue([helpers.sparse(ROWS + ROWS)], training=False)


BAD_INPUTS = [
    ("rank 0 dense", {}, tf.constant(3), None, ValueError, "rank 1"),
    ("dense last dim not 1", {}, tf.constant([[1, 2], [3, 4]]), None,
     ValueError, "last dimension"),
    ("weights on dense", {}, tf.constant([1, 2]), tf.constant([1.0, 2.0]),
     ValueError, "dense input"),
    ("sparse weights for ragged", {}, helpers.ragged(ROWS),
     helpers.sparse(ROWS, WEIGHTS, tf.float32), ValueError, "does not match"),
    ("rank 1 sparse", {}, tf.sparse.from_dense(tf.constant([1, 2])), None,
     ValueError, "rank 2"),
    ("rank 3 ragged", {}, tf.ragged.constant([[[1]], [[2, 3]]]), None,
     ValueError, "rank 2"),
    ("string ids", {}, helpers.ragged([["1"], ["2"]], tf.string), None,
     tf.errors.UnimplementedError, "feature_x.*Cast string to int64"),
    ("dense sequence", dict(max_sequence_length=2), tf.constant([1, 2]), None,
     ValueError, "sequence feature"),
    ("weights on sequence", dict(max_sequence_length=2), helpers.ragged(ROWS),
     helpers.ragged(WEIGHTS, tf.float32), ValueError, "sequence feature"),
    ("id too large", {}, helpers.ragged([[1], [VOCAB]]), None,
     tf.errors.InvalidArgumentError, r"feature_x.*\[0, 12\)"),
    ("negative id", {}, tf.constant([1, -1]), None,
     tf.errors.InvalidArgumentError, r"feature_x.*\[0, 12\)"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c[0])
def test_bad_inputs_name_the_feature(case):
  _, kwargs, features, weights, error, match = case
  feature = tfemb.FeatureConfig(table(), **kwargs)
  embedding = tfemb.TPUEmbedding({"feature_x": feature}, tfemb.SGD())
  with pytest.raises(error, match=match):
    embedding.enqueue({"feature_x": features},
                      None if weights is None else {"feature_x": weights},
                      training=False)
    embedding.dequeue()


@pytest.mark.parametrize("features,weights", [
    (tf.constant([1.0, 2.0]), None),
    (helpers.ragged([[1.0], [2.0]], tf.float32), None),
    (helpers.sparse(ROWS),
     helpers.sparse(ROWS, [[1] * len(r) for r in ROWS], tf.int32)),
], ids=["float dense ids", "float ragged ids", "integer weights"])
@pytest.mark.parametrize("error", [TypeError, ValueError])
def test_a_wrong_dtype_is_a_type_error_and_a_value_error(features, weights,
                                                         error):
  # A direct lookup refuses what TensorFlow's serving class refuses, which
  # raises TypeError or ValueError by input kind (tests/test_input_dtypes.py
  # has its words): code written for either type catches tfemb's. A
  # training batch is cast instead, as the TPU's enqueue casts it.
  embedding = tfemb.TPUEmbedding({"feature_x": tfemb.FeatureConfig(table())},
                                 tfemb.SGD())
  weights = None if weights is None else {"feature_x": weights}
  with pytest.raises(error, match=r"Feature \W*feature_x\W*[^:]*: "):
    embedding({"feature_x": features}, weights)
  embedding.enqueue({"feature_x": features}, weights, training=False)
  assert embedding.dequeue()["feature_x"].shape[-1] == DIM


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_direct_lookups_take_a_scalar_id_and_a_rank_1_sparse_tensor(combiner):
  """As TensorFlow's serving class: a scalar id gives its row; a rank-1
  SparseTensor gives one activation, its ids combined."""
  init = np.arange(40, dtype=np.float32).reshape(10, 4) / 10
  table = tfemb.TableConfig(10, 4, name="t", combiner=combiner,
                            initializer=tf.constant_initializer(init))
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                 tfemb.SGD(0.1))
  embedding.build()
  scalar = embedding({"f": tf.constant(3)})["f"]
  assert scalar.shape == (4,)
  np.testing.assert_array_equal(scalar.numpy(), init[3])
  ids, weights = [1, 4, 4], np.array([0.5, 2.0, 1.0], np.float32)
  sparse = tf.SparseTensor([[0], [2], [5]], tf.constant(ids, tf.int64), [6])
  sparse_weights = tf.SparseTensor([[0], [2], [5]], weights, [6])
  got = embedding({"f": sparse}, {"f": sparse_weights})["f"]
  expected = reference.combine(init, [ids], combiner, [weights])[0]
  assert got.shape == (4,)
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
  with pytest.raises(ValueError, match="rank 0 dense tensor"):
    embedding.enqueue({"f": tf.constant(3)}, training=True)
