"""TensorFlow 2.21's `TPUEmbeddingV2` input rules on the host
(docs/sparsecore.md, "Inputs"): a dense input is one id per sample, any
shape of `output_shape`'s size, with weights of its own; everything else
TensorFlow refuses is refused with its message, naming the feature, and
nothing is written.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

# The SparseCore host engine needs TensorFlow's stacker (2.17 on).
pytestmark = pytest.mark.requires_tensorflow("2.17")

VOCAB, DIM, BATCH = 10, 4, 4
INIT = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 10


def make(combiner="sum", output_shape=(BATCH,)):
  table = tfemb.TableConfig(VOCAB, DIM, name="t", combiner=combiner,
                            initializer=tf.constant_initializer(INIT))
  return tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=list(output_shape))},
      tfemb.SGD(0.5))


def table_of(embedding):
  proto = embedding.embedding_layouts["t"]
  i = np.arange(VOCAB)
  n = proto.num_sparse_cores
  rows = (((i % n + proto.sparse_core_shard_rotation) % n) *
          proto.total_rows_per_sparse_core_shard +
          proto.sparse_core_shard_row_offset + i // n)
  return embedding.embedding_tables["t"].numpy()[rows, :DIM]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_ids_with_weights_one_sample_each(combiner, in_function):
  """Each id is its own sample, its gain w (sum), w / w (mean) or
  w / |w| (sqrtn); the row's gradient is the gain times the sample's."""
  embedding = make(combiner)
  ids = np.array([3, 1, 3, 7])
  weights = np.array([0.5, -2.0, 1.5, 3.0], np.float32)
  grads = np.random.default_rng(0).normal(size=(BATCH, DIM)).astype(
      np.float32)

  def step(ids, weights, grads):
    activations, preserved = embedding({"f": ids}, {"f": weights})
    embedding.apply_gradients({"f": grads}, preserved)
    return activations["f"]

  run = tf.function(step) if in_function else step
  got = run(tf.constant(ids), tf.constant(weights), tf.constant(grads))
  rows, row_weights = [[i] for i in ids], [[w] for w in weights]
  np.testing.assert_allclose(
      got.numpy(), reference.combine(INIT, rows, combiner, row_weights),
      rtol=1e-6)
  oracle = reference.Table(INIT, "sgd", {})
  oracle.apply(reference.row_gradients(reference.contributions(
      rows, combiner, grads, row_weights)), 0.5)
  np.testing.assert_allclose(table_of(embedding), oracle.w, rtol=1e-6,
                             atol=1e-6)


def test_a_dense_input_of_any_shape_of_the_sample_count():
  embedding = make(output_shape=(2, 2))
  ids = np.array([[3, 1], [0, 9]])
  activations, _ = embedding({"f": tf.constant(ids)})
  assert activations["f"].shape == (2, 2, DIM)
  np.testing.assert_array_equal(activations["f"].numpy(), INIT[ids])
  flat, _ = make(output_shape=(4,))({"f": tf.constant(ids)})
  np.testing.assert_array_equal(flat["f"].numpy(), INIT[ids.reshape(-1)])


SPARSE = tf.sparse.from_dense(tf.constant([[1, 0], [2, 3], [4, 0], [5, 0]]))
RAGGED = tf.ragged.constant([[1], [2, 3], [4], [5]])
DENSE = tf.constant([1, 2, 3, 4])


@pytest.mark.parametrize("ids,weights,message", [
    (DENSE, SPARSE, "Expect weight to be Tensor type but got .*SparseTensor"),
    (SPARSE, tf.ones([4]), "Expect weight to be SparseTensor type"),
    (RAGGED, tf.ones([4]), "Expect weight to be RaggedTensor type"),
    (np.array([1, 2, 3, 4]), None, "Input of unknown type .*numpy.ndarray"),
    (tf.constant([[1, 2], [3, 4], [1, 1], [2, 2]]), None,
     "Dense tensor input should have values elements number the same as "
     "the sample count. But got 8 elements for values and 4 samples"),
    (DENSE, tf.ones([3]), "Values and weights should have same elements. "
     "But got 4 elements for values and 3 elements for weights"),
], ids=["dense+sparse", "sparse+dense", "ragged+dense", "numpy", "size",
        "weights"])
def test_what_tensorflow_refuses_is_refused_naming_the_feature(
    ids, weights, message):
  embedding = make()
  before = table_of(embedding)
  with pytest.raises(ValueError, match=r"Feature \W*f\W*: " + message):
    embedding({"f": ids}, None if weights is None else {"f": weights})
  np.testing.assert_array_equal(table_of(embedding), before)


def test_a_dense_size_known_only_at_run_time_is_checked():
  embedding = make()

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
  def lookup(ids):
    return embedding({"f": ids})[0]["f"]

  np.testing.assert_array_equal(lookup(tf.constant([1, 2, 3, 4])).numpy(),
                                INIT[[1, 2, 3, 4]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Feature \W*f\W*: Dense tensor input"):
    lookup(tf.constant([1, 2, 3]))


def test_enqueue_takes_a_tpu_device_and_refuses_another():
  embedding = make()
  preserved = embedding.enqueue({"f": DENSE},
                                device="/job:worker/task:0/device:TPU:0")
  activations, _ = embedding.dequeue(preserved)
  np.testing.assert_array_equal(activations["f"].numpy(), INIT[[1, 2, 3, 4]])
  with pytest.raises(ValueError,
                     match="Non-TPU device /device:CPU:0 passed to enqueue"):
    embedding.enqueue({"f": DENSE}, device="/device:CPU:0")


def test_a_custom_combiner_feature_refuses_indices_outside_the_dense_shape():
  def total(valency, vectors):
    del valency
    return tf.reduce_sum(vectors, axis=0)

  combiner = tfemb.CustomCombiner(total, max_valency=2)
  table = tfemb.TableConfig(VOCAB, DIM, name="t", combiner=combiner)
  embedding = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[2])}, tfemb.SGD(0.5))
  bad = tf.SparseTensor([[0, 0], [3, 0]], [1, 2], [2, 2])
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match=r"Feature \W*f\W* \(table"):
    embedding({"f": bad})


def _total(valency, vectors):
  del valency
  return tf.reduce_sum(vectors, axis=0)


def _twice_as_wide(valency, vectors):
  del valency
  return tf.concat([tf.reduce_sum(vectors, axis=0)] * 2, axis=0)


SUM = tfemb.CustomCombiner(_total, max_valency=2)
WIDE = tfemb.CustomCombiner(_twice_as_wide, max_valency=2)
THREE_ROWS = [[1], [2, 3], [4]]
FIVE_ROWS = [[1], [2, 3], [4], [5], [6]]

# name: (combiner, ids, expected message, whether it names the table). Each
# names the feature; TensorFlow's own message (prefixed with the feature)
# names no table.
REFUSED = {
    "ragged_of_another_row_count": (
        "sum", tf.ragged.constant(THREE_ROWS),
        "should be the factor of the input data batch size|must have 4 rows",
        False),
    "sparse_of_another_row_count": (
        "sum", helpers.sparse(THREE_ROWS), r"must have 4 rows \(output_shape",
        True),
    "custom_combiner_fewer_rows": (
        SUM, tf.ragged.constant(THREE_ROWS), r"must have 4 rows", True),
    "custom_combiner_more_rows": (
        SUM, helpers.sparse(FIVE_ROWS), r"must have 4 rows", True),
    "custom_combiner_another_width": (
        WIDE, tf.ragged.constant([[1], [2, 3], [4], [5]]),
        r"combiner_computation of its CustomCombiner must return one vector "
        "of 4", True),
    "id_outside_the_table": (
        "sum", tf.ragged.constant([[1], [2, 3], [4], [VOCAB]]),
        r"ids must be in \[0, 10\)", True),
    "dense_of_another_size": (
        "sum", tf.constant([1, 2, 3]), "Dense tensor input should have", False),
}


def _any_batch(x):
  """The spec of `x`'s kind with the batch size unknown."""
  if isinstance(x, tf.RaggedTensor):
    return tf.RaggedTensorSpec([None, None], x.dtype, 1, x.row_splits.dtype)
  if isinstance(x, tf.SparseTensor):
    return tf.SparseTensorSpec([None, None], x.dtype)
  return tf.TensorSpec([None], x.dtype)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
@pytest.mark.parametrize("name", list(REFUSED))
def test_a_refused_batch_names_its_feature_and_table(name, in_function,
                                                     engine_path):
  """In a whole step, eagerly and in a tf.function whose batch size is
  known only when it runs; nothing is written."""
  del engine_path  # the fused kernels and TensorFlow's ops alike
  combiner, ids, pattern, names_table = REFUSED[name]
  embedding = make(combiner)
  embedding.build()
  before = table_of(embedding)

  def step(ids):
    activations, preserved = embedding({"f": ids})
    embedding.apply_gradients({"f": 2.0 * activations["f"]}, preserved)

  run = (tf.function(step, input_signature=[_any_batch(ids)])
         if in_function else step)
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match=pattern) as raised:
    run(ids)
  helpers.assert_names(str(raised.value), "f", "t" if names_table else None)
  np.testing.assert_array_equal(table_of(embedding), before)
