"""Inference exports of models with the Keras layer, and of the mid-level
engine: the model is unchanged, the artifact serves any batch size in a
process that never imports tfemb, with the numpy reference's numbers, and
holds each table's parameters once (no optimizer slot)."""

import os

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from exports import assert_each_table_once
from exports import ITEMS
from exports import only
from exports import ranking_data as data
from exports import serve_without_tfemb
from exports import trained_ranking_model as trained_model
from exports import USERS
from exports import variable_bytes
import helpers
import reference
import tfemb
import tfemb.layers

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
EXPORTS = ["model.export", "tf.saved_model.save", "export_for_serving"]


def expected(model, layer, x, dtype=np.float32):
  """numpy: the rows (optionally rounded to `dtype`), the dense layer."""
  tables = {t.name: np.asarray(v.numpy()).astype(dtype).astype(np.float32)
            for t, v in layer.embedding_tables.items()}
  return reference.ranking_predictions(tables, x,
                                       model.layers[-1].get_weights())


def state(layer):
  return {f"{t.name}/{n}": v.numpy().copy()
          for t, slots in layer.embedding_variables.items()
          for n, v in slots.items()}


def export(model, how, path, **kwargs):
  if how == "model.export":
    if not hasattr(model, "export"):
      pytest.fail("this Keras has no model.export")
    model.export(path, **kwargs)
  elif how == "tf.saved_model.save":
    tf.saved_model.save(model, path)
  else:
    tfemb.export_for_serving(model, path, **kwargs)


def parameter_bytes(model, layer):
  tables = sum(v.numpy().nbytes for v in layer.embedding_tables.values())
  return tables + sum(w.nbytes for w in model.layers[-1].get_weights())


@pytest.mark.parametrize("how", EXPORTS)
def test_export_leaves_the_model_working_at_any_batch_size(how, tmp_path):
  model, layer = trained_model()
  before = state(layer)
  export(model, how, str(tmp_path / "export"))
  for key, value in before.items():  # the export changed nothing
    np.testing.assert_array_equal(state(layer)[key], value, err_msg=key)
  for n in (32, 5, 64):
    x, _ = data(n, n)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               expected(model, layer, x), rtol=1e-5,
                               atol=1e-6)
  x, y = data(10, 1)
  loss = model.evaluate(x, y, batch_size=10, verbose=0)
  np.testing.assert_allclose(
      loss, reference.mean_squared_error(y, expected(model, layer, x)),
      rtol=1e-5)
  x, y = data(48, 2)
  model.fit(x, y, batch_size=16, verbose=0)
  assert not np.array_equal(state(layer)["users/parameters"],
                            before["users/parameters"])
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             expected(model, layer, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", EXPORTS)
def test_served_at_any_batch_size_without_tfemb(how, tmp_path):
  model, layer = trained_model()
  path = str(tmp_path / "export")
  export(model, how, path)
  batches = [data(n, 10 + n)[0] for n in (1, 7, 64, 100)]
  served = only(serve_without_tfemb(tmp_path, [(path, x) for x in batches]))
  for x, got in zip(batches, served):
    np.testing.assert_allclose(got, expected(model, layer, x), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got, model.predict(x, verbose=0), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("how", ["model.export", "export_for_serving"])
def test_inference_export_holds_each_table_once_and_no_slot(how, tmp_path):
  model, layer = trained_model()
  path = str(tmp_path / "export")
  export(model, how, path)
  assert_each_table_once(
      path, {t.name: v.numpy() for t, v in layer.embedding_tables.items()},
      model)


def test_full_saves_keep_the_slots(tmp_path):
  model, layer = trained_model()
  tfemb.export_for_serving(model, str(tmp_path / "export"))
  accumulators = state(layer)["users/accumulators"]
  assert not np.all(accumulators == accumulators.flat[0])  # trained
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  reader = tf.train.load_checkpoint(path)
  keys = [k for k in reader.get_variable_to_shape_map()
          if "users.Saccumulators" in k]
  assert len(keys) == 1
  np.testing.assert_array_equal(reader.get_tensor(keys[0]), accumulators)
  saved = str(tmp_path / ("model" if LEGACY else "model.keras"))
  model.save(saved)
  loaded = keras.models.load_model(saved)
  loaded_layer = next(l for l in loaded.layers
                      if isinstance(l, tfemb.layers.TPUEmbedding))
  for key, value in state(layer).items():
    np.testing.assert_array_equal(state(loaded_layer)[key], value,
                                  err_msg=key)


def mid_level_embedding():
  users = tfemb.TableConfig(*USERS, name="users")
  items = tfemb.TableConfig(*ITEMS, name="items", combiner="sqrtn")
  config = {"user": tfemb.FeatureConfig(users),
            "items": tfemb.FeatureConfig(items),
            "history": tfemb.FeatureConfig(items, max_sequence_length=3)}
  embedding = tfemb.TPUEmbedding(config, tfemb.Adam(0.1))
  embedding.build()
  rng = np.random.default_rng(3)
  for table in (users, items):
    embedding.embedding_tables[table].assign(
        rng.normal(size=(table.vocabulary_size, table.dim)).astype(
            np.float32))
  return embedding, users, items


def test_mid_level_export_serves_dense_and_ragged_ids_without_tfemb(tmp_path):
  embedding, users, items = mid_level_embedding()
  ragged = tf.RaggedTensorSpec([None, None], tf.int64)
  signature = {"user": tf.TensorSpec([None], tf.int64), "items": ragged,
               "history": ragged}
  path = str(tmp_path / "export")
  tfemb.export_for_serving(embedding, path, input_signature=signature)
  u = embedding.embedding_tables[users].numpy()
  i = embedding.embedding_tables[items].numpy()
  assert sum(variable_bytes(path).values()) <= 1.05 * (u.nbytes + i.nbytes)
  rng = np.random.default_rng(4)
  requests, expected_rows = [], []
  for n in (1, 6, 33):
    rows = helpers.random_rows(rng, n, ITEMS[0], 4)
    history = helpers.random_rows(rng, n, ITEMS[0], 5)
    user = rng.integers(0, USERS[0], size=n)
    requests.append((path, {"user": user, "items": rows,
                            "history": history}))
    expected_rows.append((user, rows, history))
  served = serve_without_tfemb(tmp_path, requests,
                               ragged=("items", "history"))
  for got, (user, rows, history) in zip(served, expected_rows):
    np.testing.assert_array_equal(got["user"], u[user])
    np.testing.assert_allclose(got["items"],
                               reference.combine(i, rows, "sqrtn"),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["history"],
                                  reference.sequence(i, history, 3))


def test_mid_level_export_with_sharded_tables_says_what_to_do(tmp_path):
  """Tables over parameter servers are `ShardedVariable`s; one made here
  stands for them."""
  embedding, users, _ = mid_level_embedding()
  table = embedding._variables["users"]  # pylint: disable=protected-access
  value = table["parameters"].numpy()
  table["parameters"] = tf.__internal__.distribute.ShardedVariable(
      [tf.Variable(value[:250]), tf.Variable(value[250:])])
  with pytest.raises(ValueError, match="Table 'users' is sharded over "
                     "parameter servers.*restore it into the same model "
                     "built without ParameterServerStrategy"):
    tfemb.export_for_serving(embedding, str(tmp_path / "export"))


def test_bfloat16_tables_halve_the_export(tmp_path):
  model, layer = trained_model()
  full, half = str(tmp_path / "float32"), str(tmp_path / "bfloat16")
  tfemb.export_for_serving(model, full)
  tfemb.export_for_serving(model, half, table_dtype=tf.bfloat16)
  tables = sum(v.numpy().nbytes for v in layer.embedding_tables.values())
  saved_full, saved_half = (sum(variable_bytes(p).values())
                            for p in (full, half))
  assert saved_full - saved_half == tables // 2
  x, _ = data(50, 5)
  served, = only(serve_without_tfemb(tmp_path, [(half, x)]))
  # Exactly the model with its rows rounded to bfloat16 ...
  np.testing.assert_allclose(
      served, expected(model, layer, x, ml_dtypes.bfloat16), rtol=1e-5,
      atol=1e-6)
  # ... within the documented tolerance of float32's predictions: each
  # output moves by at most 2^-8 x sum |kernel x activation|.
  tables = {t.name: v.numpy() for t, v in layer.embedding_tables.items()}
  act = np.concatenate([tables["users"][x["user"]],
                        tables["items"][x["item"][:, 0]]], axis=1)
  kernel = model.layers[-1].get_weights()[0]
  bound = 2.0 ** -8 * (np.abs(act) @ np.abs(kernel))
  assert np.all(np.abs(served - model.predict(x, verbose=0)) <= bound + 1e-7)


def test_export_of_an_unbuilt_embedding_or_a_bad_dtype():
  embedding = tfemb.TPUEmbedding(
      {"f": tfemb.FeatureConfig(tfemb.TableConfig(4, 2, name="t"))},
      tfemb.SGD(0.1))
  with pytest.raises(ValueError, match="table_dtype must be tf.float32 or "
                     "tf.bfloat16, got float16"):
    tfemb.export_for_serving(embedding, "/nonexistent", table_dtype=tf.float16)
  with pytest.raises(TypeError, match="takes a Keras model"):
    tfemb.export_for_serving(object(), "/nonexistent")


def subclassed(layer):
  """A subclassed model around `layer`, never called."""

  class Model(keras.Model):

    def __init__(self):
      super().__init__()
      self.embedding = layer

    def call(self, features):
      return self.embedding(features)["f"]

  return Model()


def test_unbuilt_layer_export_says_what_to_do(tmp_path):
  layer = tfemb.layers.TPUEmbedding(
      {"f": tfemb.FeatureConfig(tfemb.TableConfig(4, 2, name="t"))}, "sgd")
  with pytest.raises(ValueError, match="pass input_signature"):
    tfemb.export_for_serving(subclassed(layer), str(tmp_path / "export"))


def test_model_with_ragged_inputs_serves_them_without_tfemb(tmp_path):
  items = tfemb.TableConfig(*ITEMS, name="items", combiner="mean")
  layer = tfemb.layers.TPUEmbedding(
      {"items": tfemb.FeatureConfig(items),
       "history": tfemb.FeatureConfig(items, max_sequence_length=2)},
      tfemb.Adagrad(0.5))
  inputs = {name: keras.Input(shape=(None,), dtype="int64", ragged=True,
                              name=name) for name in ("items", "history")}
  act = layer(inputs)
  out = keras.layers.Dense(1)(keras.layers.Concatenate()([
      act["items"], keras.layers.Flatten()(act["history"])]))
  model = keras.Model(inputs, out)
  model.compile(optimizer="sgd", loss="mse")
  rng = np.random.default_rng(6)

  def batch(n):
    return {name: helpers.random_rows(rng, n, ITEMS[0], 4)
            for name in ("items", "history")}

  for _ in range(2):
    x = batch(16)
    model.train_on_batch({k: helpers.ragged(v) for k, v in x.items()},
                         np.ones((16, 1), np.float32))
  path = str(tmp_path / "export")
  tfemb.export_for_serving(model, path)
  batches = [batch(n) for n in (3, 40)]
  served = only(serve_without_tfemb(tmp_path, [(path, x) for x in batches],
                                    ragged=("items", "history")))
  table = layer.embedding_tables[items].numpy()
  kernel, bias = model.layers[-1].get_weights()
  for x, got in zip(batches, served):
    act = np.concatenate([
        reference.combine(table, x["items"], "mean"),
        reference.sequence(table, x["history"], 2).reshape(len(got), -1)],
                         axis=1)
    np.testing.assert_allclose(got, act @ kernel + bias, rtol=1e-5,
                               atol=1e-6)


def test_unbuilt_model_exports_its_initial_tables_given_a_signature(
    tmp_path):
  table = tfemb.TableConfig(4, 2, name="t")
  layer = tfemb.layers.TPUEmbedding({"f": tfemb.FeatureConfig(table)}, "sgd")
  path = str(tmp_path / "export")
  tfemb.export_for_serving(subclassed(layer), path, input_signature={
      "f": tf.TensorSpec([None], tf.int64)})
  loaded = tf.saved_model.load(path)
  got = loaded.serve({"f": tf.constant([3, 0, 3], tf.int64)})
  np.testing.assert_array_equal(
      got.numpy(), layer.embedding_tables[table].numpy()[[3, 0, 3]])


def test_an_export_archive_written_by_hand_holds_each_table_once(tmp_path):
  model, layer = trained_model()
  archive = keras.export.ExportArchive()
  archive.track(model)
  archive.add_endpoint(
      "serve", lambda x: model(x, training=False),
      input_signature=[{"user": tf.TensorSpec([None], tf.int64),
                        "item": tf.TensorSpec([None, 1], tf.int64)}])
  path = str(tmp_path / "export")
  archive.write_out(path)
  saved = variable_bytes(path)
  assert sum(saved.values()) <= 1.05 * parameter_bytes(model, layer), saved
  x, _ = data(9, 9)
  loaded = tf.saved_model.load(path)
  got = loaded.serve({k: tf.constant(v) for k, v in x.items()})
  np.testing.assert_allclose(got.numpy(), expected(model, layer, x),
                             rtol=1e-5, atol=1e-6)
