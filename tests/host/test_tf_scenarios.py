"""Scenarios from TensorFlow's own TPU embedding tests
(tensorflow/python/tpu/tests/tpu_embedding_v2_*_test.py and
tpu_embedding_for_serving_test.py) that the host engine runs as TensorFlow
does, with the numbers checked against the numpy reference."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

INIT = np.arange(32, dtype=np.float64).reshape(8, 4)


def embedding(optimizer=None, **feature_kwargs):
  table = tfemb.TableConfig(8, 4, name="video", combiner="sum",
                            initializer=tf.constant_initializer(INIT))
  return tfemb.TPUEmbedding({"watched": tfemb.FeatureConfig(
      table, **feature_kwargs)}, optimizer or tfemb.SGD(0.1))


def test_the_tpu_copy_hooks_are_no_ops_on_the_host():
  """TF's correctness tests call `_retrieve_variables()` before reading the
  tables and `_load_variables()` after writing them."""
  emb = embedding()
  ids = np.array([1, 3, 1])
  emb.enqueue({"watched": tf.constant(ids)})
  with tf.GradientTape() as tape:
    act = emb.dequeue()
    tape.watch(act)
    loss = tf.reduce_sum(act["watched"])
  emb.apply_gradients(tape.gradient(loss, act))
  emb._retrieve_variables()  # pylint: disable=protected-access
  expected = reference.Table(INIT, "sgd", {})
  expected.apply(reference.row_gradients((i, np.ones(4)) for i in ids), 0.1)
  (table,) = emb.embedding_tables.values()
  np.testing.assert_allclose(table.numpy(), expected.w, rtol=1e-6)
  table.assign(np.zeros([8, 4]))
  emb._load_variables()  # pylint: disable=protected-access
  np.testing.assert_array_equal(table.numpy(), np.zeros([8, 4]))


def test_same_config_different_instantiations():
  """Two objects of one configuration describe the TPU identically."""
  rng = np.random.default_rng(0)
  dims, vocabs = rng.integers(1, 128, 30), rng.integers(100, 1000, 30)

  def config_proto():
    features = [tfemb.FeatureConfig(tfemb.TableConfig(
        int(v), int(d), initializer=tf.zeros_initializer(), name=f"table{i}"))
                for i, (d, v) in enumerate(zip(dims, vocabs))]
    emb = tfemb.TPUEmbedding(features, tfemb.Adagrad(learning_rate=0.1))
    emb._output_shapes = [tf.TensorShape(128)] * len(features)  # pylint: disable=protected-access
    return emb._create_config_proto()  # pylint: disable=protected-access

  first, second = config_proto(), config_proto()
  assert first == second
  assert [(t.name, t.vocabulary_size, t.dimension)
          for t in first.table_descriptor] == [
              (f"table{i}", v, d) for i, (d, v) in enumerate(zip(dims, vocabs))]
  assert all(t.optimization_parameters.HasField("adagrad")
             for t in first.table_descriptor)
  assert [list(f.input_shape) for f in first.feature_descriptor] == [[128]] * 30
  assert [f.table_id for f in first.feature_descriptor] == list(range(30))


def test_a_ragged_feature_built_with_a_second_dimension_is_a_sequence():
  """hd_valid_input_test.test_enqueue_dense_sparse_ragged: `build` fixes
  the activation shape [2, 4]; a ragged batch of 2 rows is then looked up
  as 2 sequences of 4 (truncated or zero-padded), as on the TPU."""
  emb = embedding()
  emb.build([tf.TensorShape([2, 4, 3])])
  rows = [[1, 2, 3, 4, 5], [6]]
  emb.enqueue({"watched": helpers.ragged(rows)}, training=False)
  got = emb.dequeue()["watched"].numpy()
  np.testing.assert_allclose(got, reference.sequence(INIT, rows, 4))


def test_dense_ids_of_a_higher_rank_after_build():
  emb = embedding()
  emb.build([tf.TensorShape([2, 4, 1])])
  ids = np.array([[[0], [1], [2], [3]], [[4], [5], [6], [7]]])
  emb.enqueue({"watched": tf.constant(ids)}, training=False)
  np.testing.assert_allclose(emb.dequeue()["watched"].numpy(),
                             INIT[ids[..., 0]])


@pytest.mark.parametrize("kind,message", [
    ("dense", "Weight specified for watched, but input is dense."),
    ("sparse", "but it does not match type of the input which is")])
def test_serving_lookup_weight_errors(kind, message):
  """tpu_embedding_for_serving_test's messages, from a direct lookup."""
  emb = embedding()
  if kind == "dense":
    ids, weights = tf.constant([1, 2]), tf.constant([1.0, 2.0])
  else:
    ids, weights = helpers.sparse([[1], [2]]), tf.constant([[1.0], [2.0]])
  with pytest.raises(ValueError, match=message):
    emb({"watched": ids}, weights={"watched": weights})


def test_variables_by_table_config_or_by_name():
  """TensorFlow documents `variables` by TableConfig; its serving class
  returns them by table name. Both keys work; iteration is by config."""
  emb = embedding(tfemb.Adagrad(0.1))
  (table,) = emb.embedding_tables
  assert list(emb.variables) == [table]
  by_name = emb.variables["video"]
  assert by_name.keys() == emb.variables[table].keys() == {"parameters",
                                                           "accumulators"}
  np.testing.assert_array_equal(by_name["parameters"].numpy(), INIT)
  np.testing.assert_allclose(by_name["accumulators"].numpy(),
                             np.full([8, 4], 0.1))
  with pytest.raises(KeyError):
    emb.variables["no_such_table"]  # pylint: disable=pointless-statement
