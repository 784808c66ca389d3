"""Ids and weights of other dtypes (docs/numerics.md, "Input dtypes"), as
TensorFlow's engine of each generation takes them.

Training batches are cast: the first generation's enqueue casts ids to
int64, the SparseCore's lookup to int32, both weights to float32. The
activations and the tables after a step are tests/reference.py's on the
cast ids (`reference.cast_ids`); an id out of its table once cast is
refused naming the feature, and no table changes; strings, which no cast
takes, are refused with TensorFlow's Cast words. Direct lookups cast
nothing and refuse what TensorFlow's serving class and `TPUEmbeddingV0`
refuse, in the words TensorFlow's own code raises on the same input (run
here beside tfemb's).
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_for_serving  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v1  # pylint: disable=g-direct-tensorflow-import

import helpers
import reference
import tfemb
from tfemb.sparsecore import table_stacking

# No Keras: the same work in both passes, so it runs in one.
pytestmark = pytest.mark.runs_under("keras3")

VOCAB, DIM, BATCH, LR = 10, 3, 4, 0.5
INIT = np.random.default_rng(4).uniform(-1, 1, (VOCAB, DIM))
BITS = {"V1": 64, "V2": 32}
# The host TPUEmbeddingV2 needs TensorFlow's SparseCore stacker (2.17 on).
SPARSECORE = pytest.mark.requires_tensorflow("2.17")
GENERATIONS = ["V1", pytest.param("V2", marks=SPARSECORE)]
# Per example: ids (floats, truncated by the cast) and integer weights.
ROWS = [[1.7, 3.2], [0.4], [9.99, 2.0, 5.5], [4.0]]
WEIGHTS = [[2, 1], [3], [1, 1, 2], [5]]


def _engine(generation, module=tfemb):
  table = module.TableConfig(VOCAB, DIM, name="t", combiner="mean",
                             initializer=tf.constant_initializer(INIT))
  if generation == "V1":
    return tfemb.TPUEmbedding({"x": module.FeatureConfig(table)},
                              tfemb.SGD(LR))
  return tfemb.TPUEmbeddingV2(
      {"x": module.FeatureConfig(table, output_shape=[BATCH])}, tfemb.SGD(LR))


def _step(embedding, generation, features, weights, grads=None):
  """One training step; the activations."""
  grads = {"x": tf.ones([BATCH, DIM]) if grads is None else grads}
  if generation == "V1":
    embedding.enqueue(features, weights, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients(grads)
    return activations["x"]
  activations, preserved = embedding(features, weights)
  embedding.apply_gradients(grads, preserved)
  return activations["x"]


def _table(embedding, generation):
  if generation == "V1":
    return embedding.embedding_tables["t"].numpy()
  return table_stacking.to_unstacked(
      embedding._stacking,  # pylint: disable=protected-access
      {"t": embedding.embedding_tables["t"].numpy()})["t"]


def _inputs(kind, rows, weights, dtype=tf.float32):
  if kind == "dense":
    return tf.constant([r[0] for r in rows], dtype), (
        None if weights is None else
        tf.constant([w[0] for w in weights], tf.int32))
  make = helpers.sparse if kind == "sparse" else helpers.ragged
  return make(rows, dtype=dtype), (None if weights is None else
                                   make(weights, dtype=tf.int32))


@pytest.mark.parametrize("kind", ["dense", "sparse", "ragged"])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_training_batch_is_cast_as_tensorflow_casts_it(generation, kind):
  """Float ids and integer weights (a dense input has weights on the
  SparseCore only)."""
  rows = [r[:1] for r in ROWS] if kind == "dense" else ROWS
  weights = None if (kind, generation) == ("dense", "V1") else WEIGHTS
  weights = weights and [w[:len(r)] for w, r in zip(weights, rows)]
  ids, w = _inputs(kind, rows, weights)
  embedding = _engine(generation)
  grad = np.random.default_rng(1).normal(size=(BATCH, DIM))
  got = _step(embedding, generation, {"x": ids}, {"x": w},
              tf.constant(grad, tf.float32))
  cast = [reference.cast_ids(r, BITS[generation]) for r in rows]
  np.testing.assert_allclose(
      got.numpy(), reference.combine(INIT, cast, "mean", weights), rtol=1e-5)
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(
      reference.contributions(cast, "mean", grad, weights)), LR)
  np.testing.assert_allclose(_table(embedding, generation), want.w,
                             rtol=1e-5, atol=1e-6)


@SPARSECORE
def test_the_sparsecore_keeps_the_low_32_bits_of_an_int64_id():
  """2^32 + 3 is id 3 on a SparseCore; the first generation refuses it."""
  rows = [[2**32 + 3], [2**33 + 1], [7 - 2**32], [5]]
  ids = tf.constant([r[0] for r in rows], tf.int64)
  embedding = _engine("V2")
  got = _step(embedding, "V2", {"x": ids}, None)
  cast = [reference.cast_ids(r, 32) for r in rows]
  assert cast == [[3], [1], [7], [5]]
  np.testing.assert_allclose(got.numpy(),
                             reference.combine(INIT, cast, "mean"), rtol=1e-6)
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(
      reference.contributions(cast, "mean", np.ones((BATCH, DIM)))), LR)
  np.testing.assert_allclose(_table(embedding, "V2"), want.w, rtol=1e-6)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Feature `x` \(table `t`\): ids must be in "):
    _step(_engine("V1"), "V1", {"x": ids}, None)


@pytest.mark.parametrize("generation,value", [
    ("V1", 10.5), ("V1", float("nan")), ("V1", 2.0**40),
    pytest.param("V2", 10.5, marks=SPARSECORE),
    pytest.param("V2", 2.0**40, marks=SPARSECORE),
    pytest.param("V2", 2**31, marks=SPARSECORE),
], ids=["V1-10.5", "V1-nan", "V1-2^40", "V2-10.5", "V2-2^40", "V2-2^31"])
def test_an_id_out_of_its_table_once_cast_changes_nothing(generation, value):
  """10.5 is 10; NaN and a float beyond the integer's range are its
  minimum; 2^31 in int32 is -2^31: each outside [0, 10)."""
  embedding = _engine(generation)
  dtype = tf.int64 if isinstance(value, int) else tf.float32
  good = {"x": tf.constant([1, 2, 3, 4], dtype)}
  _step(embedding, generation, good, None)
  before = _table(embedding, generation)
  bad = {"x": tf.constant([1, 2, 3, value], dtype)}
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    tf.function(lambda: _step(embedding, generation, bad, None))()
  helpers.assert_names(str(raised.value), "x", "t")
  assert "ids must be in [0, 10)" in str(raised.value)
  np.testing.assert_array_equal(_table(embedding, generation), before)


@pytest.mark.parametrize("what", ["ids", "weights"])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_strings_are_refused_with_tensorflows_cast_words(generation, what):
  ids, weights = _inputs("ragged", [[1, 2]] * BATCH, None, tf.int64)
  if what == "ids":
    ids = helpers.ragged([["1", "2"]] * BATCH, tf.string)
    to = "int64" if generation == "V1" else "int32"
  else:
    weights = helpers.ragged([["1", "2"]] * BATCH, tf.string)
    to = "float"
  embedding = _engine(generation)
  with pytest.raises(tf.errors.UnimplementedError,
                     match=rf"^Feature `x` \(table `t`\): Cast string to "
                     rf"{to} is not supported$"):
    _step(embedding, generation, {"x": ids},
          None if weights is None else {"x": weights})
  assert not embedding.built or np.array_equal(
      _table(embedding, generation), INIT.astype(np.float32))


# --- direct lookups: TensorFlow's refusals ------------------------------------

REFUSED = {  # kind, ids dtype, weights dtype
    "float_dense_ids": ("dense", tf.float32, None),
    "int16_dense_ids": ("dense", tf.int16, None),
    "float_sparse_ids": ("sparse", tf.float32, None),
    "float_ragged_ids": ("ragged", tf.float32, None),
    "uint8_ragged_ids": ("ragged", tf.uint8, None),
    "int_sparse_weights": ("sparse", tf.int64, tf.int32),
    "float64_ragged_weights": ("ragged", tf.int64, tf.float64),
    "float64_sparse_weights": ("sparse", tf.int64, tf.float64),
}


def _refused_inputs(case):
  kind, id_dtype, weight_dtype = REFUSED[case]
  rows = [[1], [2], [3], [4]] if kind == "dense" else [[1, 2], [3], [], [4]]
  if kind == "dense":
    return {"x": tf.constant([r[0] for r in rows], id_dtype)}, None
  make = helpers.sparse if kind == "sparse" else helpers.ragged
  weights = None if weight_dtype is None else {
      "x": make([[1] * len(r) for r in rows], dtype=weight_dtype)}
  return {"x": make(rows, dtype=id_dtype)}, weights


def _tensorflows_error(lookup, features, weights):
  """What TensorFlow's `lookup` raises on these inputs, traced in a
  function as a TPU step or a serving signature traces it."""
  with pytest.raises(Exception) as raised:
    tf.function(lambda: lookup(features, weights)).get_concrete_function()
  return raised.value


def _assert_refused_as(ours, theirs):
  assert isinstance(ours, type(theirs)), (ours, theirs)
  prefix = "Feature `x` (table `t`): "
  assert str(ours).startswith(prefix), ours
  assert str(ours)[len(prefix):] in str(theirs), (ours, theirs)


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_direct_lookup_refuses_as_tensorflows_serving_class(case):
  features, weights = _refused_inputs(case)
  tf_api = tf.tpu.experimental.embedding
  serving = tpu_embedding_for_serving.TPUEmbeddingForServing(
      {"x": tf_api.FeatureConfig(tf_api.TableConfig(VOCAB, DIM, name="t"))},
      tf_api.SGD(LR))
  serving.build()
  theirs = _tensorflows_error(serving, features, weights)
  embedding = _engine("V1")
  with pytest.raises(Exception) as ours:
    embedding(features, weights)
  _assert_refused_as(ours.value, theirs)


@pytest.mark.parametrize("case", [
    "float_dense_ids", "float_sparse_ids", "float_ragged_ids",
    "int_sparse_weights", "float64_ragged_weights"])
def test_a_v0_lookup_refuses_as_tensorflows_v0(case):
  """TensorFlow's `TPUEmbeddingV0.embedding_lookup` (which needs a TPU to
  be created) on a table of its own: its lookup code as it is."""
  features, weights = _refused_inputs(case)
  tf_api = tf.tpu.experimental.embedding
  table = tf_api.TableConfig(VOCAB, DIM, name="t")
  theirs_v0 = object.__new__(tpu_embedding_v1.TPUEmbeddingV0)
  theirs_v0._built = True  # pylint: disable=protected-access
  theirs_v0._feature_config = {"x": tf_api.FeatureConfig(table)}  # pylint: disable=protected-access
  theirs_v0._table_config = [table]  # pylint: disable=protected-access
  theirs_v0._variables = {"t": {"parameters": tf.Variable(INIT, dtype=tf.float32)}}  # pylint: disable=protected-access
  theirs = _tensorflows_error(
      lambda f, w: tpu_embedding_v1.TPUEmbeddingV0.embedding_lookup(
          theirs_v0, f, w), features, weights)
  embedding = tfemb.TPUEmbeddingV0(
      {"x": tfemb.FeatureConfig(tfemb.TableConfig(VOCAB, DIM, name="t"))},
      None)
  with pytest.raises(Exception) as ours:
    embedding(features, weights)
  _assert_refused_as(ours.value, theirs)
