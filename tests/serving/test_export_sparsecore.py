"""Inference exports of the layer following the SparseCore, and of the host
`tfemb.TPUEmbeddingV2`: each user table once, unstacked (`[vocabulary_size,
dim]`, no padding) and without slots, served at any batch size in a process
that never imports tfemb, with the numbers of the numpy reference over the
tables TensorFlow's own unshuffling reads out of the stacked variables."""

import os

import numpy as np
import pytest
import tensorflow as tf

from exports import assert_each_table_once
from exports import ITEMS
from exports import only
from exports import ranking_data as data
from exports import ranking_model
from exports import serve_without_tfemb
from exports import unstacked
from exports import USERS
from exports import variable_bytes
import helpers
import reference
import tfemb
import tfemb.layers

pytestmark = pytest.mark.requires_tensorflow("2.17")  # the SparseCore host
keras = tf.keras
BATCH = 16  # each feature's per-replica output_shape
EXPORTS = ["model.export", "tf.saved_model.save", "export_for_serving"]


def trained_model():
  model, layer = ranking_model(
      output_shape=[BATCH],
      sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig())
  x, y = data(4 * BATCH, 0)
  model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
  return model, layer


def expected(model, layer, x):
  tables = unstacked(layer._tpu_embedding)  # pylint: disable=protected-access
  return reference.ranking_predictions(tables, x,
                                       model.layers[-1].get_weights())


def export(model, how, path):
  if how == "model.export":
    model.export(path)
  elif how == "tf.saved_model.save":
    tf.saved_model.save(model, path)
  else:
    tfemb.export_for_serving(model, path)


def state(layer):
  return {f"{t}/{n}": v.numpy().copy()
          for t, slots in layer.embedding_variables.items()
          for n, v in slots.items()}


@pytest.mark.parametrize("how", EXPORTS)
def test_served_at_any_batch_size_without_tfemb(how, tmp_path):
  model, layer = trained_model()
  before = state(layer)
  path = str(tmp_path / "export")
  export(model, how, path)
  for key, value in before.items():  # the export changed nothing
    np.testing.assert_array_equal(state(layer)[key], value, err_msg=key)
  batches = [data(n, 10 + n)[0] for n in (1, 7, BATCH, 40)]
  served = only(serve_without_tfemb(tmp_path, [(path, x) for x in batches]))
  for x, got in zip(batches, served):
    np.testing.assert_allclose(got, expected(model, layer, x), rtol=1e-5,
                               atol=1e-6)
  # The model itself takes its output_shape's batch (and multiples of it).
  x, y = data(2 * BATCH, 3)
  predicted = model.predict(x, batch_size=BATCH, verbose=0)
  np.testing.assert_allclose(predicted, expected(model, layer, x), rtol=1e-5,
                             atol=1e-6)
  served, = only(serve_without_tfemb(tmp_path, [(path, x)]))
  np.testing.assert_allclose(served, predicted, rtol=1e-6, atol=1e-6)
  model.fit(x, y, batch_size=BATCH, verbose=0)  # trains on after the export
  assert not np.array_equal(state(layer)["items_users/parameters"],
                            before["items_users/parameters"])


@pytest.mark.parametrize("how", ["model.export", "export_for_serving"])
def test_inference_export_holds_each_table_once_unstacked(how, tmp_path):
  model, layer = trained_model()
  path = str(tmp_path / "export")
  export(model, how, path)
  assert_each_table_once(path, unstacked(layer._tpu_embedding), model)  # pylint: disable=protected-access


def mid_level_embedding(combiner="sqrtn"):
  users = tfemb.TableConfig(*USERS, name="users")
  items = tfemb.TableConfig(*ITEMS, name="items", combiner=combiner)
  config = {"user": tfemb.FeatureConfig(users, output_shape=[BATCH]),
            "items": tfemb.FeatureConfig(items, output_shape=[BATCH])}
  embedding = tfemb.TPUEmbeddingV2(config, tfemb.Adam(0.1))
  embedding.build()
  rng = np.random.default_rng(3)
  for name, variable in embedding.embedding_tables.items():
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  return embedding


def test_mid_level_export_serves_dense_and_ragged_ids_without_tfemb(tmp_path):
  embedding = mid_level_embedding()
  signature = {"user": tf.TensorSpec([None], tf.int64),
               "items": tf.RaggedTensorSpec([None, None], tf.int64)}
  path = str(tmp_path / "export")
  tfemb.export_for_serving(embedding, path, input_signature=signature)
  tables = unstacked(embedding)
  assert sum(variable_bytes(path).values()) <= 1.05 * sum(
      t.nbytes for t in tables.values())
  # Each table unstacked into a data file of its own, one after the other
  # (one table's copy at a time), and one file for the rest.
  data_files = [f for f in os.listdir(os.path.join(path, "variables"))
                if f.startswith("variables.data-")]
  assert len(data_files) == len(tables) + 1, data_files
  rng = np.random.default_rng(4)
  requests = []
  for n in (1, 6, 33):
    requests.append((path, {"user": rng.integers(0, USERS[0], size=n),
                            "items": helpers.random_rows(rng, n, ITEMS[0],
                                                         4)}))
  served = serve_without_tfemb(tmp_path, requests, ragged=("items",))
  for got, (_, features) in zip(served, requests):
    np.testing.assert_array_equal(got["user"],
                                  tables["users"][features["user"]])
    np.testing.assert_allclose(
        got["items"], reference.combine(tables["items"], features["items"],
                                        "sqrtn"), rtol=1e-5, atol=1e-6)


def test_sharded_tables_say_what_to_do(tmp_path):
  """Tables over parameter servers are `ShardedVariable`s; one made here
  stands for a table's own variable (under its stacked one)."""
  embedding = mid_level_embedding()
  name = "users"
  variables = embedding._tables[name]  # pylint: disable=protected-access
  value = variables["parameters"].numpy()
  half = len(value) // 2
  variables["parameters"] = tf.__internal__.distribute.ShardedVariable(
      [tf.Variable(value[:half]), tf.Variable(value[half:])])
  with pytest.raises(ValueError, match=f"Table {name!r} is sharded over "
                     "parameter servers.*restore it into the same model "
                     "built without ParameterServerStrategy"):
    tfemb.export_for_serving(embedding, str(tmp_path / "export"))


def test_custom_combiner_export_says_what_to_do(tmp_path):
  combiner = tfemb.CustomCombiner(
      lambda valency, vectors: tf.reduce_sum(vectors, axis=0), max_valency=2)
  embedding = mid_level_embedding(combiner)
  with pytest.raises(ValueError, match="Feature 'items' has a "
                     "CustomCombiner.*serve it where tfemb is installed"):
    tfemb.export_for_serving(embedding, str(tmp_path / "export"))


class Subclassed(keras.Model):
  """A model around a layer following the SparseCore, never called."""

  def __init__(self, table):
    super().__init__()
    self.embedding = tfemb.layers.TPUEmbedding(
        {"f": tfemb.FeatureConfig(table, output_shape=[BATCH])}, "sgd",
        sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig())

  def call(self, features):
    return self.embedding(features)["f"]


def test_unbuilt_layer_exports_its_initial_tables_given_a_signature(
    tmp_path):
  table = tfemb.TableConfig(4, 2, name="t")
  model = Subclassed(table)
  with pytest.raises(ValueError, match="pass input_signature"):
    tfemb.export_for_serving(model, str(tmp_path / "unknown"))
  path = str(tmp_path / "export")
  tfemb.export_for_serving(model, path, input_signature={
      "f": tf.TensorSpec([None], tf.int64)})
  loaded = tf.saved_model.load(path)
  got = loaded.serve({"f": tf.constant([3, 0, 3], tf.int64)})
  table_value = unstacked(model.embedding._tpu_embedding)["t"]  # pylint: disable=protected-access
  np.testing.assert_array_equal(got.numpy(), table_value[[3, 0, 3]])
