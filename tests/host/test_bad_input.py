"""Bad input and misuse: an error naming the feature or table, and every
table and slot bit-identical afterwards (docs/numerics.md, "Errors").

Each case runs a whole training step (enqueue, dequeue, apply_gradients)
eagerly and inside `tf.function`, after a good step has given the slots
values of their own.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

GOOD_SPARSE = [[1, 2], [3], [], [4, 4]]
GOOD_RAGGED = [[0, 1], [2], [3, 5, 7], []]
E = tf.errors.InvalidArgumentError
# Refused when the step runs; or, for constants a tf.function's trace
# already sees, when it is traced (ValueError, as TensorFlow raises there).
STATIC = (E, ValueError)


def make_embedding():
  a = tfemb.TableConfig(10, 3, name="a")
  b = tfemb.TableConfig(8, 2, name="b", optimizer=tfemb.Adam(0.1))
  config = {
      "d": tfemb.FeatureConfig(a),
      "s": tfemb.FeatureConfig(a),
      "r": tfemb.FeatureConfig(b),
      "q": tfemb.FeatureConfig(b, max_sequence_length=2),
  }
  return tfemb.TPUEmbedding(config, tfemb.Adagrad(0.1))


def good_inputs():
  features = {
      "d": tf.constant([1, 2, 3, 9], tf.int64),
      "s": helpers.sparse(GOOD_SPARSE),
      "r": helpers.ragged(GOOD_RAGGED),
      "q": helpers.ragged(GOOD_RAGGED),
  }
  weights = {
      "d": None,
      "s": helpers.sparse(GOOD_SPARSE, [[0.5, 1.0], [2.0], [], [1.0, 3.0]],
                          tf.float32),
      "r": None,
      "q": None,
  }
  return features, weights


def loss_gradients(act):
  return {k: 2.0 * v for k, v in act.items()}  # d/dact of sum(act^2)


def step(embedding, features, weights, grads_fn=loss_gradients):
  embedding.enqueue(features, weights, training=True)
  act = embedding.dequeue()
  embedding.apply_gradients(grads_fn(act))


def replace(structure, **changes):
  out = dict(structure)
  out.update(changes)
  return out


def sparse_from(indices, values, shape):
  return tf.SparseTensor(np.asarray(indices, np.int64),
                         tf.constant(values, tf.int64), shape)


def ragged_from(values, splits):
  """A RaggedTensor built without TensorFlow's own check of its splits."""
  return tf.RaggedTensor.from_row_splits(tf.constant(values, tf.int64),
                                         tf.constant(splits, tf.int64),
                                         validate=False)


def outside(feature, table):
  return (rf"Feature \W*{feature}\W* \(table \W*{table}\W*\): every "
          r"SparseTensor index must be in \[0, dense_shape\)")


def bad_splits(feature, table):
  return (rf"Feature \W*{feature}\W* \(table \W*{table}\W*\): the "
          r"row_splits of a RaggedTensor must start at 0, never decrease")


# name: (features/weights mutation, run, expected error, message pattern)
def bad_features(**changes):
  """The good batch with some features replaced (their weights dropped)."""
  def run(embedding, f, w):
    w = replace(w, **{k: None for k in changes if k in w})
    step(embedding, replace(f, **changes), w)
  return run


def bad_weights(**changes):
  def run(embedding, f, w):
    step(embedding, f, replace(w, **changes))
  return run


def bad_grads(grads_fn):
  def run(embedding, f, w):
    step(embedding, f, w, grads_fn)
  return run


def run_raw(fn):
  return fn


CASES = {
    "id_equal_to_vocabulary": (
        bad_features(d=tf.constant([1, 2, 3, 10], tf.int64)), E,
        r"Feature \W*d\W*[^:]*: .*\[0, 10\)"),
    "id_above_vocabulary_ragged": (
        bad_features(r=helpers.ragged([[0, 99], [2], [3], []])), E,
        r"Feature \W*r\W*[^:]*: .*\[0, 8\)"),
    "negative_id_sparse": (
        bad_features(s=helpers.sparse([[1, -2], [3], [], [4, 4]])), E,
        r"Feature \W*s\W*[^:]*: .*\[0, 10\)"),
    "int64_id_beyond_int32": (
        bad_features(d=tf.constant([1, 2, 3, 2**33], tf.int64)), E,
        r"Feature \W*d\W*[^:]*: .*\[0, 10\)"),
    # Float ids are cast to int64 as TensorFlow's enqueue casts them
    # (truncated; NaN to the minimum): then out of the table.
    "float_id_out_of_range_once_cast": (
        bad_features(d=tf.constant([1.0, 2.0, 3.0, 10.5])), E,
        r"Feature \W*d\W*[^:]*: .*\[0, 10\)"),
    "nan_float_id": (
        bad_features(d=tf.constant([1.0, 2.0, 3.0, np.nan])), E,
        r"Feature \W*d\W*[^:]*: .*\[0, 10\)"),
    "string_ids": (
        bad_features(d=tf.constant(["1", "2", "3", "4"])),
        tf.errors.UnimplementedError,
        r"Feature \W*d\W*[^:]*: Cast string to int64 is not supported"),
    "string_weights": (
        bad_weights(s=helpers.sparse(GOOD_SPARSE, [["1", "2"], ["3"], [],
                                                   ["4", "4"]], tf.string)),
        tf.errors.UnimplementedError,
        r"Feature \W*s\W*[^:]*: Cast string to float is not supported"),
    "rank_0_ids": (
        bad_features(d=tf.constant(3, tf.int64)), ValueError,
        r"rank 1 and above.*d"),
    "dense_last_dim_not_1": (
        bad_features(d=tf.constant([[1, 2]] * 4, tf.int64)), ValueError,
        r"last dimension.*input d"),
    "rank_1_sparse": (
        bad_features(s=tf.sparse.from_dense(tf.constant([1, 2, 0, 3],
                                                        tf.int64))),
        ValueError, r"rank 2 and above.*input s"),
    "rank_3_ragged": (
        bad_features(r=tf.ragged.constant([[[1]], [[2]], [[3]], [[4]]],
                                          dtype=tf.int64)),
        ValueError, r"rank 2 ragged.*input r"),
    "sparse_unsorted_indices": (
        bad_features(s=sparse_from([[1, 0], [0, 0], [3, 0]], [1, 2, 3],
                                   [4, 2])), E,
        r"Feature \W*s\W*[^:]*: .*sorted"),
    "sparse_duplicate_indices": (
        bad_features(s=sparse_from([[0, 0], [0, 0], [3, 0]], [1, 2, 3],
                                   [4, 2])), E,
        r"Feature \W*s\W*[^:]*: .*duplicates"),
    "sparse_row_beyond_dense_shape": (
        bad_features(s=sparse_from([[0, 0], [1, 0], [4, 0]], [1, 2, 3],
                                   [4, 2])), STATIC, outside("s", "a")),
    "sparse_negative_row": (
        bad_features(s=sparse_from([[-1, 0], [1, 0]], [1, 2], [4, 2])),
        STATIC, outside("s", "a")),
    "sparse_column_beyond_dense_shape": (
        bad_features(s=sparse_from([[0, 0], [1, 5]], [1, 2], [4, 2])),
        STATIC, outside("s", "a")),
    "ragged_decreasing_row_splits": (
        bad_features(r=ragged_from([0, 1, 2, 3, 5, 7], [0, 3, 2, 5, 6])),
        STATIC, bad_splits("r", "b")),
    "ragged_row_splits_past_the_values": (
        bad_features(r=ragged_from([0, 1, 2, 3, 5, 7], [0, 2, 3, 6, 7])),
        STATIC, bad_splits("r", "b")),
    "ragged_row_splits_not_from_zero": (
        bad_features(r=ragged_from([0, 1, 2, 3, 5, 7], [1, 2, 3, 4, 6])),
        STATIC, bad_splits("r", "b")),
    "ragged_sequence_decreasing_row_splits": (
        bad_features(q=ragged_from([0, 1, 2, 3, 5, 7], [0, 3, 2, 5, 6])),
        STATIC, bad_splits("q", "b")),
    "batch_size_other_than_built": (
        bad_features(d=tf.constant([1, 2, 3, 4, 5], tf.int64)), ValueError,
        r"Inconsistent shape.*feature d"),
    "missing_feature_key": (
        run_raw(lambda e, f, w: step(e, {k: v for k, v in f.items()
                                         if k != "r"}, w)),
        (ValueError, TypeError), r"structure of feature_config"),
    "unknown_feature_key": (
        run_raw(lambda e, f, w: step(e, replace(f, z=f["d"]), w)),
        (ValueError, TypeError), r"structure of feature_config"),
    "weights_structure_mismatch": (
        run_raw(lambda e, f, w: step(e, f, {"s": w["s"]})),
        (ValueError, TypeError), r"weights must have the structure"),
    "weights_kind_mismatch": (
        bad_weights(s=helpers.ragged([[0.5, 1.0], [2.0], [], [1.0, 3.0]],
                                     tf.float32)),
        ValueError, r"Weight for s .*does not match"),
    "weights_shape_mismatch": (
        bad_weights(s=helpers.sparse([[1], [3], [], [4]], [[0.5], [2.0], [],
                                                           [1.0]],
                                     tf.float32)),
        (E, ValueError),
        r"Feature \W*s\W*[^:]*: .*same shape"),
    # As many weights as ids, but in other examples.
    "weights_same_count_other_sparse_indices": (
        bad_weights(s=helpers.sparse([[1, 2], [], [3], [4, 4]],
                                     [[0.5, 1.0], [], [2.0], [1.0, 3.0]],
                                     tf.float32)),
        (E, ValueError), r"Feature \W*s\W*[^:]*: .*same shape"),
    "weights_same_count_other_ragged_splits": (
        run_raw(lambda e, f, w: step(
            e, replace(f, r=helpers.ragged([[0, 1], [2], [3, 5, 7], []])),
            replace(w, r=helpers.ragged([[1.0], [1.0, 1.0], [1.0, 1.0, 1.0],
                                         []], tf.float32)))),
        (E, ValueError), r"Feature \W*r\W*[^:]*: .*same shape"),
    "weights_on_dense_feature": (
        bad_weights(d=tf.constant([1.0, 1.0, 1.0, 1.0])), ValueError,
        r"dense input d"),
    "weights_on_sequence_feature": (
        bad_weights(q=helpers.ragged([[1.0, 1.0], [1.0], [1.0] * 3, []],
                                     tf.float32)),
        ValueError, r"q, but this is a sequence feature"),
    "gradient_structure_mismatch": (
        bad_grads(lambda act: [act["d"]]), (ValueError, TypeError),
        r"gradients must have the structure"),
    "gradient_shape_mismatch": (
        bad_grads(lambda act: replace(loss_gradients(act),
                                      r=tf.zeros([4, 3]))), ValueError,
        r"Found gradient of shape.*at path r"),
    "gradient_integer_dtype": (
        bad_grads(lambda act: replace(loss_gradients(act),
                                      d=tf.zeros([4, 3], tf.int32))),
        ValueError, r"Gradient at path d must be a float"),
    "nan_gradient": (
        bad_grads(lambda act: replace(loss_gradients(act),
                                      r=act["r"] * np.nan)), E,
        r"Table \W*b\W*.*non-finite"),
    "inf_gradient_on_one_table_changes_no_table": (
        bad_grads(lambda act: replace(loss_gradients(act),
                                      s=act["s"] + np.inf)), E,
        r"Table \W*a\W*.*non-finite"),
    "dequeue_without_enqueue": (
        run_raw(lambda e, f, w: e.dequeue()), RuntimeError,
        r"without a preceding enqueue"),
    "apply_gradients_after_inference_enqueue": (
        run_raw(lambda e, f, w: (e.enqueue(f, w, training=False),
                                 e.apply_gradients(loss_gradients(
                                     e.dequeue())))),
        RuntimeError, r"training=True"),
}


# What each case's message names: (feature, table). tfemb's own checks name
# both; TensorFlow's messages, kept as they are (the rank, batch, weight
# and gradient rules), name the feature; a case not here names neither
# (the structure of the whole batch, or the protocol).
NAMES = {
    **dict.fromkeys(["id_equal_to_vocabulary", "int64_id_beyond_int32",
                     "float_id_out_of_range_once_cast", "nan_float_id",
                     "string_ids"], ("d", "a")),
    **dict.fromkeys(["negative_id_sparse", "sparse_unsorted_indices",
                     "sparse_duplicate_indices", "weights_shape_mismatch",
                     "string_weights", "sparse_row_beyond_dense_shape",
                     "weights_same_count_other_sparse_indices",
                     "sparse_negative_row", "sparse_column_beyond_dense_shape"],
                    ("s", "a")),
    **dict.fromkeys(["id_above_vocabulary_ragged",
                     "weights_same_count_other_ragged_splits",
                     "ragged_decreasing_row_splits",
                     "ragged_row_splits_past_the_values",
                     "ragged_row_splits_not_from_zero"], ("r", "b")),
    "ragged_sequence_decreasing_row_splits": ("q", "b"),
    **dict.fromkeys(["rank_0_ids", "dense_last_dim_not_1",
                     "batch_size_other_than_built", "weights_on_dense_feature",
                     "gradient_integer_dtype"], ("d", None)),
    **dict.fromkeys(["rank_1_sparse", "weights_kind_mismatch"], ("s", None)),
    **dict.fromkeys(["rank_3_ragged", "gradient_shape_mismatch"],
                    ("r", None)),
    "weights_on_sequence_feature": ("q", None),
    "nan_gradient": (None, "b"),
    "inf_gradient_on_one_table_changes_no_table": (None, "a"),
}


def snapshot(embedding):
  return {f"{t.name}/{n}": v.numpy().copy()
          for t, slots in embedding.variables.items()
          for n, v in slots.items()}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_and_changes_nothing(name, mode, engine_path):
  run, error, pattern = CASES[name]
  embedding = make_embedding()
  features, weights = good_inputs()
  step(embedding, features, weights)
  before = snapshot(embedding)

  def attempt():
    run(embedding, features, weights)

  with pytest.raises(error, match=pattern) as raised:
    if mode == "function":
      tf.function(attempt)()
    else:
      attempt()
  helpers.assert_names(str(raised.value), *NAMES.get(name, (None, None)))
  after = snapshot(embedding)
  for key, value in before.items():
    np.testing.assert_array_equal(after[key], value, err_msg=key)
  # And the object still trains afterwards.
  step(embedding, features, weights)
  assert not np.array_equal(snapshot(embedding)["a/parameters"],
                            before["a/parameters"])


def test_apply_gradients_twice_for_one_enqueue():
  embedding = make_embedding()
  features, weights = good_inputs()
  embedding.enqueue(features, weights, training=True)
  act = embedding.dequeue()
  embedding.apply_gradients(loss_gradients(act))
  before = snapshot(embedding)
  with pytest.raises(RuntimeError, match="once per enqueue"):
    embedding.apply_gradients(loss_gradients(act))
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(embedding)[key], value)

  @tf.function
  def twice():
    embedding.enqueue(features, weights, training=True)
    act = embedding.dequeue()
    embedding.apply_gradients(loss_gradients(act))
    embedding.apply_gradients(loss_gradients(act))

  with pytest.raises(RuntimeError, match="once per enqueue"):
    twice()
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(embedding)[key], value)


def test_unsorted_sparse_is_fine_when_validation_is_off():
  # validate_weights_and_indices=False skips the checks (for speed): an
  # unsorted SparseTensor is then looked up as it is.
  table = tfemb.TableConfig(10, 2, name="t", combiner="sum")
  embedding = tfemb.TPUEmbedding(
      {"s": tfemb.FeatureConfig(table, validate_weights_and_indices=False)},
      tfemb.SGD(0.1))
  unsorted = sparse_from([[1, 0], [0, 0]], [3, 4], [2, 1])
  out = embedding({"s": unsorted})["s"].numpy()
  tables = embedding.embedding_tables[table].numpy()
  np.testing.assert_allclose(out, tables[[4, 3]], rtol=1e-6)


def test_table_name_used_twice():
  config = {"x": tfemb.FeatureConfig(tfemb.TableConfig(5, 2, name="t")),
            "y": tfemb.FeatureConfig(tfemb.TableConfig(6, 2, name="t"))}
  with pytest.raises(ValueError, match="unique name.*t"):
    tfemb.TPUEmbedding(config, tfemb.SGD())


def test_feature_config_leaf_must_be_a_feature_config():
  with pytest.raises(TypeError, match=r"feature_config\['x'\].*FeatureConfig"):
    tfemb.TPUEmbedding({"x": tfemb.TableConfig(5, 2, name="t")}, tfemb.SGD())


def test_table_shared_by_two_objects_with_different_optimizers():
  """Each object resolves the user's TableConfig for itself (a copy with
  its own global optimizer): both train with their own, and the user's
  object is never changed."""
  table = tfemb.TableConfig(5, 2, initializer=tf.zeros_initializer())
  features = {"x": tfemb.FeatureConfig(table)}
  sgd = tfemb.TPUEmbedding(features, tfemb.SGD(0.5))
  adagrad = tfemb.TPUEmbedding(features, tfemb.Adagrad(0.5))
  assert table.optimizer is None and table.name is None
  for embedding in (sgd, adagrad):
    embedding.enqueue({"x": tf.constant([1])}, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients({"x": tf.ones_like(activations["x"])})
  # SGD: w = -0.5 * 1; Adagrad: a = 0.1 + 1, w = -0.5 / sqrt(1.1).
  for embedding, kind, rtol in ((sgd, "sgd", 1e-7), (adagrad, "adagrad", 1e-6)):
    oracle = reference.Table(np.zeros((5, 2)), kind, {})
    oracle.apply({1: np.ones(2)}, 0.5)
    np.testing.assert_allclose(embedding.embedding_tables[table].numpy()[1],
                               oracle.w[1], rtol=rtol)
  assert table.optimizer is None and table.name is None


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_non_finite_gradients_can_skip_the_step(mode, engine_path):
  embedding = make_embedding()
  embedding.non_finite_gradients = "skip"
  features, weights = good_inputs()
  step(embedding, features, weights)
  before = snapshot(embedding)
  nan_step = lambda: step(embedding, features, weights,  # pylint: disable=g-long-lambda
                          lambda act: replace(loss_gradients(act),
                                              q=act["q"] * np.nan))
  (tf.function(nan_step) if mode == "function" else nan_step)()
  assert embedding.skipped_steps == 1
  after = snapshot(embedding)
  for key, value in before.items():
    np.testing.assert_array_equal(after[key], value, err_msg=key)
  step(embedding, features, weights)
  assert embedding.skipped_steps == 1
  assert not np.array_equal(snapshot(embedding)["b/parameters"],
                            before["b/parameters"])
  with pytest.raises(ValueError, match="'raise' or 'skip'"):
    embedding.non_finite_gradients = "ignore"


# The shapes of the tensors TensorFlow refuses, on a feature of
# their own: (input, max_sequence_length, the example it used to land in).
OUTSIDE_DENSE_SHAPE = {
    # Index (0, 2) of a [2, 2] batch: was looked up as example (1, 0).
    "rank_3_inner_index_beyond": (
        lambda: sparse_from([[0, 2, 0]], [3], [2, 2, 3]), 0),
    # Index -1 of example 1's sequence: was position 2 of example 0.
    "sequence_position_negative": (
        lambda: sparse_from([[1, -1]], [3], [2, 3]), 3),
    "sequence_position_beyond": (
        lambda: sparse_from([[0, 3]], [3], [2, 3]), 3),
}


@pytest.mark.parametrize("validate", [True, False],
                         ids=["validated", "not_validated"])
@pytest.mark.parametrize("mode", ["eager", "function", "function_argument"])
@pytest.mark.parametrize("name", list(OUTSIDE_DENSE_SHAPE))
def test_sparse_indices_outside_the_dense_shape_never_train(
    name, mode, validate, engine_path):
  """Refused with an error naming the feature and table, whatever
  validate_weights_and_indices says: the index decides the example."""
  del engine_path  # every path
  make, length = OUTSIDE_DENSE_SHAPE[name]
  table = tfemb.TableConfig(10, 2, name="t", optimizer=tfemb.Adagrad(0.1))
  embedding = tfemb.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, max_sequence_length=length,
                                validate_weights_and_indices=validate)},
      tfemb.SGD(0.1))
  good = (sparse_from([[0, 0, 0], [1, 1, 2]], [3, 4], [2, 2, 3])
          if name.startswith("rank_3") else
          sparse_from([[0, 0], [1, 1]], [3, 4], [2, 3]))
  step(embedding, {"f": good}, None)
  before = snapshot(embedding)

  def attempt(x):
    step(embedding, {"f": x}, None)

  # A constant in a traced function is refused as it is traced; a tensor
  # the function takes, when it runs.
  with pytest.raises(ValueError if mode == "function" else E,
                     match=outside("f", "t")):
    if mode == "function":
      tf.function(lambda: attempt(make()))()
    elif mode == "function_argument":
      tf.function(attempt)(make())
    else:
      attempt(make())
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(embedding)[key], value,
                                  err_msg=key)


def test_direct_lookups_refuse_indices_outside_the_dense_shape(engine_path):
  del engine_path  # every path
  table = tfemb.TableConfig(10, 2, name="t")
  embedding = tfemb.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, validate_weights_and_indices=False)},
      tfemb.SGD(0.1))
  with pytest.raises(E, match=outside("f", "t")):
    embedding({"f": sparse_from([[0, 0], [3, 0]], [1, 2], [2, 2])})
  with pytest.raises(E, match=bad_splits("f", "t")):
    embedding({"f": ragged_from([1, 2, 3], [0, 2, 1, 3])})
