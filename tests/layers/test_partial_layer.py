"""`tfemb.layers.PartialTPUEmbedding`, tfrs' signature: a small table is a
Keras `Embedding` trained by the model's optimizer, a big one goes through
tfemb's `TPUEmbedding` and its optimizer; checkpoints use tfrs' names."""

import inspect
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
import tfemb.layers

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
SMALL_INIT = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) / 10
BIG_INIT = np.arange(50 * 4, dtype=np.float32).reshape(50, 4) / 100


def partial_layer(optimizer):
  """Features a and b share the small table (a Keras Embedding), c has the
  big one (tfemb's TPUEmbedding)."""
  small = tfemb.TableConfig(8, 4, name="small",
                            initializer=tf.constant_initializer(SMALL_INIT))
  big = tfemb.TableConfig(50, 4, name="big",
                          initializer=tf.constant_initializer(BIG_INIT))
  layer = tfemb.layers.PartialTPUEmbedding(
      {"a": tfemb.FeatureConfig(small), "b": tfemb.FeatureConfig(small),
       "c": tfemb.FeatureConfig(big)}, optimizer, size_threshold=10)
  return layer


def model():
  layer = partial_layer(tfemb.SGD(0.5))
  inputs = {k: keras.Input(shape=(), dtype="int32", name=k) for k in "abc"}
  act = layer(inputs)
  out = keras.layers.Lambda(lambda t: tf.reduce_sum(
      tf.concat(t, axis=-1), axis=-1, keepdims=True))([act[k] for k in "abc"])
  m = keras.Model(inputs, out)
  # d loss / d activation = 1 everywhere.
  m.compile(optimizer=keras.optimizers.SGD(0.1),
            loss=lambda y, p: tf.reduce_sum(p))
  return m, layer


def test_small_tables_train_by_keras_big_ones_by_tfemb():
  m, layer = model()
  assert sorted(layer.keras_embedding_layers) == ["a", "b"]
  assert (layer.keras_embedding_layers["a"] is
          layer.keras_embedding_layers["b"])  # one shared table
  x = {"a": np.array([1, 2]), "b": np.array([1, 1]), "c": np.array([7, 7])}
  m.train_on_batch(x, np.zeros((2, 1)))
  # SGD on each row's summed gradient: Keras' at 0.1, tfemb's at 0.5.
  small = reference.Table(SMALL_INIT, "sgd", {})
  small.apply({1: np.full(4, 3.0), 2: np.full(4, 1.0)}, 0.1)
  np.testing.assert_allclose(
      layer.keras_embedding_layers["a"].embeddings.numpy(), small.w,
      rtol=1e-6)
  big = reference.Table(BIG_INIT, "sgd", {})
  big.apply({7: np.full(4, 2.0)}, 0.5)
  (table,) = layer.tpu_embedding.embedding_tables.values()
  np.testing.assert_allclose(table.numpy(), big.w, rtol=1e-6)


def test_checkpoints_use_tensorflow_recommenders_names(tmp_path):
  m, layer = model()
  m({k: np.array([0]) for k in "abc"})
  path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
  keys = [k for k, _ in tf.train.list_variables(path)]
  assert any(k.startswith("layer/_keras_embedding_layers/a/") for k in keys)
  assert any(k.startswith("layer/_tpu_embedding/") for k in keys)
  layer.keras_embedding_layers["a"].embeddings.assign(np.ones((8, 4)))
  tf.train.Checkpoint(layer=layer).restore(path)
  np.testing.assert_array_equal(
      layer.keras_embedding_layers["b"].embeddings.numpy(), SMALL_INIT)


def test_the_signature_is_tensorflow_recommenders():
  params = inspect.signature(tfemb.layers.PartialTPUEmbedding).parameters
  assert list(params) == ["feature_config", "optimizer",
                          "pipeline_execution_with_tensor_core", "batch_size",
                          "size_threshold"]
  assert params["size_threshold"].default == 10_000


def test_a_sparse_input_to_a_keras_table_is_refused():
  _, layer = model()
  with pytest.raises(ValueError, match="Feature 'a': only tf.Tensor input"):
    layer({"a": tf.sparse.from_dense([[1]]), "b": tf.constant([1]),
           "c": tf.constant([1])})


def saveable_model(optimizer):
  """`model()` with Keras layers only (a Lambda is not loaded back)."""
  layer = partial_layer(optimizer)
  inputs = {k: keras.Input(shape=(), dtype="int32", name=k) for k in "abc"}
  act = layer(inputs)
  out = keras.layers.Dense(1)(
      keras.layers.Concatenate()([act[k] for k in "abc"]))
  m = keras.Model(inputs, out)
  m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  return m, layer


def tables_and_slots(layer):
  out = {"small": layer.keras_embedding_layers["a"].embeddings.numpy()}
  for table, slots in layer.tpu_embedding.embedding_variables.items():
    for name, var in slots.items():
      out[f"{table.name}/{name}"] = var.numpy()
  return out


@pytest.mark.parametrize("optimizer", [lambda: tfemb.Adagrad(0.5),
                                       lambda: keras.optimizers.Adam(0.1)],
                         ids=["tfemb", "keras"])
def test_model_save_and_load_model(tmp_path, optimizer):
  """The whole model (Keras 3: `.keras`, which needs the layer's config):
  the same routing, tables, slots and predictions."""
  m, layer = saveable_model(optimizer())
  x = {"a": np.array([1, 2]), "b": np.array([1, 3]), "c": np.array([7, 9])}
  m.train_on_batch(x, np.ones((2, 1)))
  path = str(tmp_path / ("model" if LEGACY else "model.keras"))
  m.save(path)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = keras.models.load_model(path)
  # Keras 3 warns when a layer it builds on load has no `build()`.
  assert not [w for w in caught if "build()" in str(w.message)], [
      str(w.message) for w in caught]
  (loaded_layer,) = [l for l in loaded.layers
                     if isinstance(l, tfemb.layers.PartialTPUEmbedding)]
  assert loaded_layer.name == layer.name
  assert sorted(loaded_layer.keras_embedding_layers) == ["a", "b"]
  assert (loaded_layer.keras_embedding_layers["a"] is
          loaded_layer.keras_embedding_layers["b"])
  assert [t.name for t in loaded_layer.tpu_embedding.embedding_tables] == [
      "big"]
  want, got = tables_and_slots(layer), tables_and_slots(loaded_layer)
  assert sorted(got) == sorted(want) and len(want) > 2  # slots too
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  np.testing.assert_allclose(loaded.predict(x, verbose=0),
                             m.predict(x, verbose=0), rtol=1e-6)
