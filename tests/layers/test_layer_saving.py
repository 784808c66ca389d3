"""Saving a model with the layer: whole model, SavedModel, weights and
checkpoints all round-trip the predictions, tables, slots and step count."""

import os

import numpy as np
import pytest
import tensorflow as tf

import helpers
import tfemb
import tfemb.layers

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
BATCH = 8


def build_model():
  users = tfemb.TableConfig(20, 4, name="users")
  items = tfemb.TableConfig(30, 3, name="items", combiner="sqrtn",
                            optimizer=tfemb.FTRL(0.1, beta=0.2))
  config = {"user": tfemb.FeatureConfig(users),
            "history": tfemb.FeatureConfig(items, max_sequence_length=3),
            "items": tfemb.FeatureConfig(items)}
  # A Keras Adam with a schedule: slots, a step counter and a schedule.
  layer = tfemb.layers.TPUEmbedding(
      config, keras.optimizers.Adam(
          keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5)))
  inputs = {
      "user": keras.Input(shape=(), dtype="int64", name="user"),
      "history": keras.Input(shape=(None,), dtype="int64", ragged=True,
                             name="history"),
      "items": keras.Input(shape=(None,), dtype="int64", ragged=True,
                           name="items"),
  }
  act = layer(inputs)
  x = keras.layers.Concatenate()([
      act["user"], keras.layers.Flatten()(act["history"]), act["items"]])
  model = keras.Model(inputs, keras.layers.Dense(1)(x))
  model.compile(optimizer="adam", loss="mse")
  return model, layer


def data(seed):
  rng = np.random.default_rng(seed)
  x = {"user": rng.integers(0, 20, size=BATCH),
       "history": helpers.ragged(helpers.random_rows(rng, BATCH, 30, 5)),
       "items": helpers.ragged(helpers.random_rows(rng, BATCH, 30, 3))}
  return x, rng.normal(size=(BATCH, 1)).astype(np.float32)


def trained_model():
  model, layer = build_model()
  for seed in range(3):
    model.train_on_batch(*data(seed))
  return model, layer


def embedding_layer(model):
  return next(l for l in model.layers
              if isinstance(l, tfemb.layers.TPUEmbedding))


def state(layer):
  out = {"iterations": int(layer.embedding_iterations.numpy())}
  for table, slots in layer.embedding_variables.items():
    for name, var in slots.items():
      out[f"{table.name}/{name}"] = var.numpy().copy()
  return out


def assert_same_state(a, b):
  assert set(a) == set(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_model_save_and_load_model(tmp_path):
  model, layer = trained_model()
  x, y = data(9)
  expected = model.predict(x, verbose=0)
  path = str(tmp_path / ("model" if LEGACY else "model.keras"))
  model.save(path)
  loaded = keras.models.load_model(path)
  np.testing.assert_allclose(loaded.predict(x, verbose=0), expected,
                             rtol=1e-6, atol=1e-6)
  loaded_layer = embedding_layer(loaded)
  assert_same_state(state(loaded_layer), state(layer))
  # Both keep training to the same place.
  loaded.compile(optimizer="adam", loss="mse")
  loaded.optimizer.build(loaded.trainable_variables)
  for m in (model, loaded):
    m.train_on_batch(x, y)
  assert_same_state(state(loaded_layer), state(layer))


def test_tf_saved_model_with_ragged_inputs(tmp_path):
  model, _ = trained_model()
  x, _ = data(9)
  expected = model.predict(x, verbose=0)
  spec = {
      "user": tf.TensorSpec([None], tf.int64),
      "history": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
      "items": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
  }
  # Keras 3 would trace its own default signature for a Model with dense
  # placeholders for ragged inputs; tracking the layers avoids that.
  root = tf.Module()
  root.layers = model.layers
  root.serve = tf.function(lambda f: model(f, training=False),
                           input_signature=[spec])
  tf.saved_model.save(root, str(tmp_path / "saved_model"))
  loaded = tf.saved_model.load(str(tmp_path / "saved_model"))
  got = loaded.serve({k: tf.convert_to_tensor(v) if k == "user" else v
                      for k, v in x.items()})
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_exported_serving_signature(tmp_path):
  table = tfemb.TableConfig(20, 4, name="ids")
  layer = tfemb.layers.TPUEmbedding({"ids": tfemb.FeatureConfig(table)},
                                    "adagrad")
  ids = keras.Input(shape=(), dtype="int64", name="ids")
  model = keras.Model({"ids": ids},
                      keras.layers.Dense(1)(layer({"ids": ids})["ids"]))
  model.compile(optimizer="sgd", loss="mse")
  x = {"ids": np.arange(BATCH, dtype=np.int64)}
  model.train_on_batch(x, np.ones((BATCH, 1)))
  expected = model.predict(x, verbose=0)
  path = str(tmp_path / "exported")
  if LEGACY:
    tf.saved_model.save(model, path)
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    got = list(serve(ids=tf.constant(x["ids"])).values())[0]
  else:
    model.export(path)
    loaded = tf.saved_model.load(path)
    got = loaded.serve({"ids": tf.constant(x["ids"])})
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_save_weights_and_load_weights(tmp_path):
  model, layer = trained_model()
  path = str(tmp_path / ("ckpt" if LEGACY else "model.weights.h5"))
  model.save_weights(path)
  fresh, fresh_layer = build_model()
  assert not np.array_equal(state(fresh_layer)["users/parameters"],
                            state(layer)["users/parameters"])
  # Keras loads an optimizer's state only into a built optimizer (it skips
  # an unbuilt one's, with a warning).
  fresh.optimizer.build(fresh.trainable_variables)
  fresh.load_weights(path)
  assert_same_state(state(fresh_layer), state(layer))
  assert (int(fresh.optimizer.iterations.numpy()) ==
          int(model.optimizer.iterations.numpy()) == 3)


def test_checkpoint_round_trip_and_layout(tmp_path):
  model, layer = trained_model()
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  keys = [k for k, _ in tf.train.list_variables(path)]
  assert any(k.endswith("_tpu_embedding/users/.ATTRIBUTES/VARIABLE_VALUE")
             for k in keys)
  assert any("_tpu_embedding/items.Saccumulators/" in k for k in keys)
  assert not any("tpu_embedding_helper_dummy" in k for k in keys)
  fresh, fresh_layer = build_model()
  tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
  assert_same_state(state(fresh_layer), state(layer))


def test_callable_learning_rate_cannot_go_in_a_config():
  table = tfemb.TableConfig(5, 2, name="t", optimizer=tfemb.SGD(lambda: 0.1))
  layer = tfemb.layers.TPUEmbedding({"f": tfemb.FeatureConfig(table)}, None)
  with pytest.raises(ValueError, match="'t'.*callable learning rate"):
    layer.get_config()
