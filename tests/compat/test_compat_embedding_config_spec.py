"""EmbeddingConfigSpec: TF 2.15's validation, and its conversion to tfemb
configs (from TPU embedding feature columns and from dict-style configs),
checked against hand-written expectations and the numpy reference."""

import inspect
import logging

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.compat import v1
from tfemb.tpu import delegate

fc = tf.feature_column
tpu_fc = tf.compat.v1.tpu.experimental
BATCH = 4
SHARED = "tbl_history_item_weighted_by_item_weight_query_shared_embedding"


def sgd(**kwargs):
  return v1.StochasticGradientDescentParameters(0.3, **kwargs)


class Columns:
  """A TPUEstimator-style model: a user column with its own dynamic learning
  rate, and one table shared by a weighted, a sequence and a plain column."""

  def __init__(self):
    rng = np.random.default_rng(0)
    self.init_user = rng.normal(size=(20, 4)) * 0.3
    self.init_shared = rng.normal(size=(15, 3)) * 0.3
    user = fc.categorical_column_with_identity("user", 20)
    item = fc.weighted_categorical_column(
        fc.categorical_column_with_identity("item", 15), "item_weight")
    history = fc.sequence_categorical_column_with_identity("history", 15)
    query = fc.categorical_column_with_identity("query", 15)
    self.user_lr = lambda step: 0.5 / (1.0 + tf.cast(step, tf.float32))
    self.columns = [
        tpu_fc.embedding_column(
            user, 4, combiner="sqrtn",
            initializer=tf.constant_initializer(self.init_user),
            learning_rate_fn=self.user_lr)
    ] + tpu_fc.shared_embedding_columns(
        [item, history, query], 3, combiner="sum",
        initializer=tf.constant_initializer(self.init_shared),
        max_sequence_lengths=[0, 3, 0])


def test_feature_columns_become_tables_and_features():
  cols = Columns()
  step = tf.Variable(0, dtype=tf.int64)
  spec = v1.EmbeddingConfigSpec(feature_columns=cols.columns,
                                optimization_parameters=sgd())
  config = spec.feature_config(global_step=step)
  assert sorted(config) == ["history", "item", "query", "user"]
  user, shared = config["user"].table, config["item"].table
  assert (user.name, user.vocabulary_size, user.dim, user.combiner) == (
      "tbl_user", 20, 4, "sqrtn")
  assert (shared.name, shared.vocabulary_size, shared.dim,
          shared.combiner) == (SHARED, 15, 3, "sum")
  assert config["history"].table is shared and config["query"].table is shared
  assert [config[k].max_sequence_length
          for k in ("user", "item", "history", "query")] == [0, 0, 3, 0]
  # Only the user table has its own (dynamic) learning rate.
  assert shared.optimizer is None
  assert isinstance(user.optimizer, tfemb.SGD)
  assert float(user.optimizer.learning_rate()) == pytest.approx(0.5)
  step.assign(3)
  assert float(user.optimizer.learning_rate()) == pytest.approx(0.125)
  assert spec.optimizer() == tfemb.SGD(0.3)


def test_feature_columns_train_like_the_reference():
  """Gradient multiplier, clipping, weights, sequences, shared tables and a
  learning_rate_fn, through split_features and create_embedding."""
  cols = Columns()
  step = tf.Variable(0, dtype=tf.int64)
  spec = v1.EmbeddingConfigSpec(
      feature_columns=cols.columns,
      optimization_parameters=sgd(clip_gradient_min=-0.4,
                                  clip_gradient_max=0.3),
      experimental_gradient_multiplier_fn=(
          lambda s: 2.0 + tf.cast(s, tf.float32)))
  embedding = spec.create_embedding(global_step=step)
  rng = np.random.default_rng(1)
  targets = {"user": rng.normal(size=(BATCH, 4)),
             "item": rng.normal(size=(BATCH, 3)),
             "history": rng.normal(size=(BATCH, 3, 3)),
             "query": rng.normal(size=(BATCH, 3))}
  tf_targets = {k: tf.constant(v, tf.float32) for k, v in targets.items()}

  @tf.function
  def train_step(features):
    ids, weights, rest = spec.split_features(features)
    embedding.enqueue(ids, weights, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      loss = tf.add_n([0.5 * tf.reduce_sum((act[k] - tf_targets[k]) ** 2)
                       for k in act]) + tf.reduce_sum(rest["age"])
    embedding.apply_gradients(tape.gradient(loss, act))
    step.assign_add(1)

  # The user table's optimizer is the global one at its own learning rate.
  clip = {"clip_gradient": (-0.4, 0.3)}
  ref_user = reference.Table(cols.init_user, "sgd", clip)
  ref_shared = reference.Table(cols.init_shared, "sgd", clip)
  for s in range(3):
    b = {k: helpers.random_rows(rng, BATCH, v, 4) for k, v in
         (("user", 20), ("item", 15), ("history", 15), ("query", 15))}
    item_w = helpers.random_weights(rng, b["item"])
    train_step({
        "user": helpers.sparse(b["user"]),
        "item": helpers.sparse(b["item"]),
        "item_weight": helpers.sparse(b["item"], item_w, tf.float64),
        "history": helpers.sparse(b["history"]),
        "query": helpers.sparse(b["query"]),
        "age": tf.ones([BATCH, 1]),
    })
    act = {
        "user": reference.combine(ref_user.w, b["user"], "sqrtn"),
        "item": reference.combine(ref_shared.w, b["item"], "sum", item_w),
        "history": reference.sequence(ref_shared.w, b["history"], 3),
        "query": reference.combine(ref_shared.w, b["query"], "sum"),
    }
    grad = {k: (2.0 + s) * (act[k] - targets[k]) for k in act}
    user_pairs = reference.contributions(b["user"], "sqrtn", grad["user"])
    shared_pairs = (
        reference.contributions(b["item"], "sum", grad["item"], item_w) +
        reference.contributions(b["history"], "sum", grad["history"],
                                length=3) +
        reference.contributions(b["query"], "sum", grad["query"]))
    ref_user.apply(reference.row_gradients(user_pairs), 0.5 / (1.0 + s))
    ref_shared.apply(reference.row_gradients(shared_pairs), 0.3)
    tables = {t.name: v for t, v in embedding.embedding_tables.items()}
    np.testing.assert_allclose(tables["tbl_user"].numpy(), ref_user.w,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tables[SHARED].numpy(), ref_shared.w,
                               rtol=1e-5, atol=1e-6)
  assert not np.allclose(ref_shared.w, cols.init_shared)


def test_split_features_pops_ids_and_weights():
  spec = v1.EmbeddingConfigSpec(feature_columns=Columns().columns,
                                optimization_parameters=sgd())
  sp = helpers.sparse([[1, 2], [3]])
  w = helpers.sparse([[1, 2], [3]], [[0.5, 2], [1]], tf.float64)
  features = {"user": sp, "item": sp, "item_weight": w, "history": sp,
              "query": sp, "age": tf.ones([2])}
  ids, weights, rest = spec.split_features(features)
  assert sorted(ids) == sorted(weights) == ["history", "item", "query",
                                            "user"]
  assert list(rest) == ["age"]
  assert [k for k, v in weights.items() if v is not None] == ["item"]
  assert weights["item"].dtype == tf.float32
  np.testing.assert_allclose(weights["item"].values.numpy(), [0.5, 2, 1])
  with pytest.raises(ValueError, match="Cannot find weights 'item_weight'"):
    spec.split_features({k: v for k, v in features.items()
                         if k != "item_weight"})
  with pytest.raises(ValueError, match="'item_weight' of feature 'item' are "
                     "dense"):
    spec.split_features(dict(features, item_weight=tf.ones([2, 2])))
  with pytest.raises(ValueError, match="'query' is missing"):
    spec.split_features({k: v for k, v in features.items() if k != "query"})


def test_dict_configs_convert_with_tpuestimators_precedence():
  own = v1.AdagradParameters(0.9, initial_accumulator=0.2)
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={
          "own_lr": v1.TableConfig(10, 2, learning_rate=0.05),
          "own_opt": v1.TableConfig(11, 2, optimization_parameters=own),
          "own_both": v1.TableConfig(12, 2, combiner="sqrtn",
                                     learning_rate=0.07,
                                     optimization_parameters=own),
          "global": v1.TableConfig(13, 3, combiner="sum", learning_rate=0.0),
      },
      feature_to_config_dict={
          "a": v1.FeatureConfig("own_lr"),
          "b": v1.FeatureConfig("own_opt", max_sequence_length=5),
          "c": v1.FeatureConfig("own_both", weight_key="c_w"),
          "d": v1.FeatureConfig("global"),
          "e": v1.FeatureConfig("global"),
      },
      optimization_parameters=sgd(clip_gradient_max=1.0))
  config = spec.feature_config()
  tables = {f.table.name: f.table for f in config.values()}
  assert tables["own_lr"].optimizer == tfemb.SGD(0.05, clipvalue=(None, 1.0))
  assert tables["own_opt"].optimizer == tfemb.Adagrad(
      0.9, initial_accumulator_value=0.2)
  assert tables["own_both"].optimizer == tfemb.Adagrad(
      0.07, initial_accumulator_value=0.2)
  # learning_rate=0.0 reads as "not set", as TensorFlow's truth test did.
  assert tables["global"].optimizer is None
  assert config["d"].table is config["e"].table
  assert config["b"].max_sequence_length == 5
  assert (tables["own_both"].combiner, tables["global"].dim) == ("sqrtn", 3)
  assert spec.optimizer() == tfemb.SGD(0.3, clipvalue=(None, 1.0))
  # The default initializer is TF 2.15's: truncated normal, 1/sqrt(dim).
  assert tables["global"].initializer.stddev == pytest.approx(3 ** -0.5)


def test_dict_config_without_any_optimizer_is_refused():
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={"t": v1.TableConfig(10, 2),
                            "u": v1.TableConfig(10, 2,
                                                optimization_parameters=sgd())},
      feature_to_config_dict={"a": v1.FeatureConfig("t"),
                              "b": v1.FeatureConfig("u")})
  with pytest.raises(ValueError, match=r"tables \['t'\] have none"):
    spec.feature_config()


def test_unused_table_is_refused():
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={"t": v1.TableConfig(10, 2),
                            "unused": v1.TableConfig(10, 2)},
      feature_to_config_dict={"a": v1.FeatureConfig("t")},
      optimization_parameters=sgd())
  with pytest.raises(ValueError, match=r"not used .*\['unused'\]"):
    spec.feature_config()


def test_learning_rate_fn_and_multiplier_need_a_global_step():
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={"t": v1.TableConfig(
          10, 2, learning_rate_fn=lambda step: 0.1)},
      feature_to_config_dict={"a": v1.FeatureConfig("t")},
      optimization_parameters=sgd())
  with pytest.raises(ValueError, match="Table 't' has a learning_rate_fn"):
    spec.feature_config()
  spec = v1.EmbeddingConfigSpec(
      feature_columns=Columns().columns[1:], optimization_parameters=sgd(),
      experimental_gradient_multiplier_fn=lambda step: 2.0)
  with pytest.raises(ValueError, match="experimental_gradient_multiplier_fn"):
    spec.create_embedding()


def test_combiner_none_and_ignored_fields_warn(caplog):
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={"t": v1.TableConfig(10, 2, combiner=None,
                                                hot_id_replication=True)},
      feature_to_config_dict={"a": v1.FeatureConfig("t")},
      optimization_parameters=sgd(), clipping_limit=3.0,
      partition_strategy="mod", profile_data_directory="/tmp/profile")
  with caplog.at_level(logging.WARNING):
    config = spec.feature_config()
  assert config["a"].table.combiner == "sum"
  text = caplog.text
  for expected in ("combiner=None", "hot_id_replication",
                   "clipping_limit=3.0 is ignored", "profile_data_directory",
                   "--partition-strategy mod"):
    assert expected in text, expected


def test_tensor_core_and_non_tpu_columns_have_no_equivalent():
  user = fc.categorical_column_with_identity("user", 20)
  tensor_core = tpu_fc.embedding_column(
      user, 4, embedding_lookup_device="tpu_tensor_core",
      tensor_core_shape=[None, 3])
  spec = v1.EmbeddingConfigSpec(feature_columns=[tensor_core],
                                optimization_parameters=sgd())
  assert spec.tensor_core_feature_columns == [tensor_core]
  with pytest.raises(ValueError, match="user_embedding.*tpu_tensor_core"):
    spec.feature_config()
  numeric = fc.numeric_column("age")
  spec = v1.EmbeddingConfigSpec(feature_columns=[numeric],
                                optimization_parameters=sgd())
  with pytest.raises(TypeError, match="Unsupported feature column 'age'"):
    spec.feature_config()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(), ValueError, "Exactly one of `feature_columns`"),
    (dict(feature_columns="COLUMNS", table_to_config_dict={"t": 1},
          feature_to_config_dict={"a": 1}),
     ValueError, "Exactly one of `feature_columns`"),
    (dict(feature_columns="COLUMNS", optimization_parameters=sgd(),
          partition_strategy="hash"), ValueError, "Invalid partition_strategy"),
    (dict(feature_columns=["not a column"], optimization_parameters=sgd()),
     TypeError, "All feature columns must be supported types"),
    (dict(feature_columns="COLUMNS", optimization_parameters=tfemb.SGD(0.1)),
     ValueError, "optimization_parameters must be an instance of type"),
    (dict(table_to_config_dict={"t": v1.TableConfig(3, 2)},
          feature_to_config_dict={"a": ("t", 0, None)}),
     TypeError, "Config for feature a must be of type `FeatureConfig`"),
    (dict(table_to_config_dict={"t": v1.TableConfig(3, 2)},
          feature_to_config_dict={"a": v1.FeatureConfig("x")}),
     ValueError, "Feature a refers to table x which is not in the"),
    (dict(table_to_config_dict={"t": (3, 2)},
          feature_to_config_dict={"a": v1.FeatureConfig("t")}),
     TypeError, "Config for table t must be of type `TableConfig`"),
])
def test_validation_is_tensorflows(kwargs, error, message):
  if kwargs.get("feature_columns") == "COLUMNS":
    kwargs["feature_columns"] = Columns().columns
  with pytest.raises(error, match=message):
    v1.EmbeddingConfigSpec(**kwargs)


def test_dict_config_validation_is_tensorflows():
  with pytest.raises(ValueError, match="Invalid vocabulary_size 0"):
    v1.TableConfig(0, 2)
  with pytest.raises(ValueError, match="Invalid dimension 2.0"):
    v1.TableConfig(3, 2.0)
  with pytest.raises(ValueError, match="initializer must be callable"):
    v1.TableConfig(3, 2, initializer=1.0)
  with pytest.raises(ValueError, match="Invalid combiner max"):
    v1.TableConfig(3, 2, combiner="max")
  with pytest.raises(ValueError, match="At most one of learning_rate"):
    v1.TableConfig(3, 2, learning_rate=0.1, learning_rate_fn=lambda s: 0.1)
  with pytest.raises(ValueError, match="must inherit from"):
    v1.TableConfig(3, 2, optimization_parameters=tfemb.SGD(0.1))
  with pytest.raises(ValueError, match="Invalid max_sequence_length -1"):
    v1.FeatureConfig("t", max_sequence_length=-1)
  assert v1.FeatureConfig("t") == ("t", 0, None)
  assert v1.TableConfig(3, 2)._fields == (
      "vocabulary_size", "dimension", "initializer", "combiner",
      "hot_id_replication", "learning_rate", "learning_rate_fn",
      "optimization_parameters")


def _signature(callable_):
  return [(p.name, p.default)
          for p in inspect.signature(callable_).parameters.values()][1:]


def test_signatures_are_tensorflow_2_15s():
  required = inspect.Parameter.empty
  assert _signature(v1.EmbeddingConfigSpec.__new__) == [
      ("feature_columns", None), ("optimization_parameters", None),
      ("clipping_limit", None), ("pipeline_execution_with_tensor_core", False),
      ("experimental_gradient_multiplier_fn", None),
      ("feature_to_config_dict", None), ("table_to_config_dict", None),
      ("partition_strategy", "div"), ("profile_data_directory", None)]
  assert _signature(v1.TableConfig.__new__) == [
      ("vocabulary_size", required), ("dimension", required),
      ("initializer", None), ("combiner", "mean"),
      ("hot_id_replication", False), ("learning_rate", None),
      ("learning_rate_fn", None), ("optimization_parameters", None)]
  assert _signature(v1.FeatureConfig.__new__) == [
      ("table_id", required), ("max_sequence_length", 0),
      ("weight_key", None)]


def test_gradient_multiplier_wraps_tensorflows_engine_on_a_tpu(monkeypatch):
  """Under a TPUStrategy the spec's engine is TensorFlow's: the multiplier
  wraps it (no subclass of the host engine), so TensorFlow's
  apply_gradients receives the scaled gradients."""
  from tpu_stand_in import StandInTPUStrategy, use_strategy  # pylint: disable=g-import-not-at-top
  received = []

  class Engine:
    def __init__(self, *args):
      del args

    def apply_gradients(self, gradients, name=None):
      received.append((gradients, name))

  monkeypatch.setitem(delegate.TENSORFLOW_ENGINES, "TPUEmbedding", Engine)
  use_strategy(monkeypatch, StandInTPUStrategy())
  spec = v1.EmbeddingConfigSpec(
      table_to_config_dict={"t": v1.TableConfig(10, 2)},
      feature_to_config_dict={"a": v1.FeatureConfig("t"),
                              "b": v1.FeatureConfig("t")},
      optimization_parameters=sgd(),
      experimental_gradient_multiplier_fn=lambda s: 1.5 * tf.cast(
          s, tf.float32))
  step = tf.Variable(2, dtype=tf.int64)
  embedding = spec.create_embedding(global_step=step)
  assert type(embedding) is Engine  # pylint: disable=unidiomatic-typecheck
  grads = {"a": tf.constant([[1.0, -2.0]]), "b": None}
  embedding.apply_gradients(grads, name="x")
  step.assign(4)
  embedding.apply_gradients(grads)
  np.testing.assert_allclose(received[0][0]["a"].numpy(), [[3.0, -6.0]])
  assert received[0][0]["b"] is None and received[0][1] == "x"
  np.testing.assert_allclose(received[1][0]["a"].numpy(), [[6.0, -12.0]])
