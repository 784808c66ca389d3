"""`tfemb.TPUEmbeddingForServing` and `tfemb.serving_embedding_lookup`:
TensorFlow's, with tfemb's configs.

Lookups against the numpy reference (gather and combiner); checkpoints of
`tfemb.TPUEmbedding` restored into the serving class; TensorFlow's errors.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

tf_emb = tf.tpu.experimental.embedding
BATCH = 5
VOCAB = {"users": 30, "items": 20, "tags": 12}
DIM = {"users": 4, "items": 3, "tags": 2}


def feature_config(module, named=True):
  """Every combiner, a shared table, a sequence feature."""
  def table(name, combiner):
    return module.TableConfig(VOCAB[name], DIM[name], combiner=combiner,
                              name=name if named else None)

  users, items, tags = (table("users", "sum"), table("items", "mean"),
                        table("tags", "sqrtn"))
  return {
      "user": module.FeatureConfig(users),  # dense ids, no combiner
      "friends": module.FeatureConfig(users),  # sparse, weighted
      "item": module.FeatureConfig(items),  # ragged, weighted
      "history": module.FeatureConfig(items, max_sequence_length=3),
      "tag": module.FeatureConfig(tags),  # sparse, weighted
  }


def tables_of(config):
  return {"users": config["user"].table, "items": config["item"].table,
          "tags": config["tag"].table}


def batch(seed=0):
  """(features, weights, expected(tables)) with the reference's lookups."""
  rng = np.random.default_rng(seed)
  user = rng.integers(0, VOCAB["users"], size=BATCH)
  rows = {name: helpers.random_rows(rng, BATCH, VOCAB[table], 4)
          for name, table in (("friends", "users"), ("item", "items"),
                              ("history", "items"), ("tag", "tags"))}
  w = {name: helpers.random_weights(rng, rows[name])
       for name in ("friends", "item", "tag")}
  features = {
      "user": tf.constant(user),
      "friends": helpers.sparse(rows["friends"]),
      "item": helpers.ragged(rows["item"]),
      "history": helpers.ragged(rows["history"]),
      "tag": helpers.sparse(rows["tag"]),
  }
  weights = {
      "user": None,
      "friends": helpers.sparse(rows["friends"], w["friends"], tf.float32),
      "item": helpers.ragged(w["item"], tf.float32),
      "history": None,
      "tag": helpers.sparse(rows["tag"], w["tag"], tf.float32),
  }

  def expected(t):
    return {
        "user": t["users"][user],
        "friends": reference.combine(t["users"], rows["friends"], "sum",
                                     w["friends"]),
        "item": reference.combine(t["items"], rows["item"], "mean",
                                  w["item"]),
        "history": reference.sequence(t["items"], rows["history"], 3),
        "tag": reference.combine(t["tags"], rows["tag"], "sqrtn", w["tag"]),
    }

  return features, weights, expected


def random_tables(seed=1):
  rng = np.random.default_rng(seed)
  return {n: rng.uniform(-1, 1, (VOCAB[n], DIM[n])).astype(np.float32)
          for n in VOCAB}


def assert_lookups(got, want):
  assert set(got) == set(want)
  for name in want:
    np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_serving_class_looks_up_with_tfemb_configs(named):
  config = feature_config(tfemb, named)
  serving = tfemb.TPUEmbeddingForServing(config, None)
  arrays = random_tables()
  user_tables = tables_of(config)
  for name, table in user_tables.items():
    serving.embedding_tables[table].assign(arrays[name])  # the user's keys
  # One variable per table (the shared one once), keyed by TF's configs.
  assert len(serving.embedding_tables) == 3
  assert all(isinstance(t, tf_emb.TableConfig)
             for t in serving.embedding_tables)
  features, weights, expected = batch()
  assert_lookups(serving(features, weights), expected(arrays))
  assert_lookups(tf.function(serving.embedding_lookup)(features, weights),
                 expected(arrays))
  # The user's configs are not changed (TensorFlow fills in its copies).
  assert all(t.name == (name if named else None)
             for name, t in user_tables.items())


@pytest.mark.parametrize("source", ["dict", "tfemb", "serving"])
def test_serving_lookup_takes_tfemb_configs_and_their_tables(source):
  config = feature_config(tfemb)
  arrays = random_tables()
  user_tables = tables_of(config)
  if source == "dict":  # keyed by the user's tfemb TableConfigs
    tables = {user_tables[n]: tf.Variable(a) for n, a in arrays.items()}
  else:
    engine = (tfemb.TPUEmbedding(config, tfemb.SGD(0.1)) if source == "tfemb"
              else tfemb.TPUEmbeddingForServing(config, None))
    tables = engine.embedding_tables
    for name, table in user_tables.items():
      tables[table].assign(arrays[name])
  features, weights, expected = batch(seed=2)
  got = tfemb.serving_embedding_lookup(features, weights, tables, config)
  assert_lookups(got, expected(arrays))

  @tf.function
  def serve(features, weights):
    return tfemb.serving_embedding_lookup(features, weights, tables, config)

  assert_lookups(serve(features, weights), expected(arrays))
  # A subset of the features, as TensorFlow's function allows.
  subset = tfemb.serving_embedding_lookup(
      {"tag": features["tag"]}, {"tag": weights["tag"]}, tables, config)
  assert_lookups(subset, {"tag": expected(arrays)["tag"]})


def test_unnamed_tables_are_warned_about_once_not_per_lookup(caplog):
  config = feature_config(tfemb, named=False)  # warned here, as TF warns
  arrays = random_tables()
  tables = {t: tf.Variable(arrays[n]) for n, t in tables_of(config).items()}
  features, weights, expected = batch(seed=4)
  caplog.clear()
  for _ in range(3):
    got = tfemb.serving_embedding_lookup(features, weights, tables, config)
  assert_lookups(got, expected(arrays))
  assert not [r for r in caplog.records
              if "Name of the table config" in r.getMessage()]
  assert all(t.name is None for t in tables_of(config).values())


def train_one_step(embedding, seed=3):
  features, weights, _ = batch(seed)
  weights["user"] = None
  embedding.enqueue(features, weights, training=True)
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = tf.add_n([tf.reduce_sum(tf.sin(a)) for a in activations.values()])
  embedding.apply_gradients(tape.gradient(loss, activations))


@pytest.mark.parametrize("with_slots", [True, False])
def test_a_tfemb_checkpoint_restores_into_the_serving_class(with_slots,
                                                           tmp_path):
  trained = tfemb.TPUEmbedding(feature_config(tfemb), tfemb.Adagrad(0.5))
  trained.build()
  before = {t: slots["parameters"].numpy()
            for t, slots in trained._variables.items()}  # pylint: disable=protected-access
  train_one_step(trained)
  path = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "ckpt"))
  saved = {t: {s: v.numpy() for s, v in slots.items()}
           for t, slots in trained._variables.items()}  # pylint: disable=protected-access
  assert any(not np.array_equal(before[t], saved[t]["parameters"])
             for t in saved)  # the step moved some rows

  config = feature_config(tfemb)  # a fresh process's configs
  serving = tfemb.TPUEmbeddingForServing(
      config, tfemb.Adagrad(0.5) if with_slots else None)
  status = tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  if with_slots:
    status.assert_consumed()
  else:
    status.assert_existing_objects_matched()
  for name, table in tables_of(config).items():
    np.testing.assert_array_equal(serving.embedding_tables[table].numpy(),
                                  saved[name]["parameters"])
    if with_slots:
      np.testing.assert_array_equal(
          serving.variables[name]["accumulators"].numpy(),
          saved[name]["accumulators"])
  features, weights, expected = batch(seed=4)
  tables = {n: saved[n]["parameters"] for n in saved}
  assert_lookups(serving(features, weights), expected(tables))


# --- TensorFlow's errors ---------------------------------------------------


def _same_error(make_ours, make_theirs, error):
  with pytest.raises(error) as theirs:
    make_theirs()
  with pytest.raises(error) as ours:
    make_ours()
  assert str(ours.value) == str(theirs.value)


def test_an_optimizer_of_another_kind_is_refused_as_tensorflow_does():
  keras_sgd = tf.keras.optimizers.SGD()
  _same_error(lambda: tfemb.TPUEmbeddingForServing(feature_config(tfemb),
                                                   keras_sgd),
              lambda: tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                                    keras_sgd), ValueError)


def test_serving_under_a_tpu_strategy_is_refused_as_tensorflow_does(
    monkeypatch):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V2))
  _same_error(lambda: tfemb.TPUEmbeddingForServing(feature_config(tfemb),
                                                   None),
              lambda: tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                                    None), RuntimeError)


@pytest.mark.parametrize("features, weights", [
    ({"user": tf.constant([1, 2])}, {"user": tf.constant([1.0, 2.0])}),
    ({"nobody": tf.constant([1, 2])}, None),
    ({"item": helpers.ragged([[1], [2]])}, {"item": helpers.sparse([[1],
                                                                    [2]])}),
    ({"user": np.array([1, 2])}, None),
], ids=["weighted_dense", "unknown_feature", "mixed_kinds", "numpy_ids"])
def test_bad_lookups_raise_tensorflows_errors(features, weights):
  """TensorFlow's function is given the features of the inputs' paths (as
  2.21 picks them itself; older releases take only the same structure)."""

  def lookup(module):
    config = feature_config(module)
    tables = {t: tf.Variable(a) for t, a in zip(
        tables_of(config).values(), random_tables().values())}
    if module is tf_emb and set(features) <= set(config):
      config = {name: config[name] for name in features}
    return lambda: module.serving_embedding_lookup(features, weights, tables,
                                                   config)

  _same_error(lookup(tfemb), lookup(tf_emb), ValueError)
