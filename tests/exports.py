"""What the tests of exports (tests/serving/) share: a small ranking model
(a user and an item feature, Adagrad, whose slots an export must leave out,
and a dense head; its numbers: `reference.ranking_predictions`); serving a
SavedModel in a process that never imports tfemb; what its variables
hold."""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tfemb
import tfemb.layers

keras = tf.keras
USERS, ITEMS = (500, 8), (300, 4)  # (vocabulary, dim)


def ranking_model(output_shape=None, **layer_kwargs):
  """`(model, layer)`, compiled; `output_shape`: each feature's."""
  shape = {} if output_shape is None else dict(output_shape=output_shape)
  users = tfemb.TableConfig(*USERS, name="users")
  items = tfemb.TableConfig(*ITEMS, name="items", combiner="mean")
  layer = tfemb.layers.TPUEmbedding(
      {"user": tfemb.FeatureConfig(users, **shape),
       "item": tfemb.FeatureConfig(items, **shape)},
      tfemb.Adagrad(0.5), **layer_kwargs)
  inputs = {"user": keras.Input(shape=(), dtype="int64", name="user"),
            "item": keras.Input(shape=(1,), dtype="int64", name="item")}
  act = layer(inputs)
  concatenated = keras.layers.Concatenate()([act[k] for k in ("user", "item")])
  model = keras.Model(inputs, keras.layers.Dense(1)(concatenated))
  model.compile(optimizer="sgd", loss="mse")
  return model, layer


def trained_ranking_model():
  """`(model, layer)` of `ranking_model()`, fit for two epochs."""
  model, layer = ranking_model()
  x, y = ranking_data(256, 0)
  # Equal batches: Keras traces the step with a static batch size of 64.
  model.fit(x, y, batch_size=64, epochs=2, verbose=0)
  return model, layer


def ranking_data(n, seed):
  rng = np.random.default_rng(seed)
  x = {"user": rng.integers(0, USERS[0], size=n),
       "item": rng.integers(0, ITEMS[0], size=(n, 1))}
  return x, rng.normal(size=(n, 1)).astype(np.float32)


_SERVER = r"""
import importlib.abc, json, sys

class NoTfemb(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "tfemb" or name.startswith("tfemb."):
      raise ImportError("tfemb is not importable in this process")

sys.meta_path.insert(0, NoTfemb())
import numpy as np
import tensorflow as tf

requests = json.load(open(sys.argv[1]))
out = {}
for i, (path, features, ragged) in enumerate(requests):
  loaded = tf.saved_model.load(path)
  if ragged:  # `serve`: SavedModel signatures take dense tensors only
    got = loaded.serve({k: tf.ragged.constant(v, tf.int64) if k in ragged
                        else tf.constant(np.asarray(v, np.int64))
                        for k, v in features.items()})
  else:
    serve = loaded.signatures["serving_default"]
    names = sorted(serve.structured_input_signature[1])
    if set(names) != set(features):  # Keras 3's names: the nest order
      features = dict(zip(names, [features[k] for k in sorted(features)]))
    got = serve(**{k: tf.constant(np.asarray(v, np.int64))
                   for k, v in features.items()})
  if not isinstance(got, dict):
    got = {"output_0": got}
  for name, value in got.items():
    out[f"{i}/{name}"] = value.numpy()
np.savez(sys.argv[2], **out)
assert "tfemb" not in sys.modules, "tfemb was imported"
print("served without tfemb")
"""


def serve_without_tfemb(tmp_path, requests, ragged=()):
  """Each (SavedModel path, features) served in a process where tfemb
  cannot be imported: by `serving_default` (its outputs' dict), or with
  the features named in `ragged` as RaggedTensors, by `serve`."""
  (tmp_path / "server.py").write_text(_SERVER)
  (tmp_path / "requests.json").write_text(json.dumps(
      [(p, {k: [np.asarray(r).tolist() for r in v] if k in ragged else
            np.asarray(v).tolist()
            for k, v in f.items()}, list(ragged)) for p, f in requests]))
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  result = subprocess.run(
      [sys.executable, "-I", str(tmp_path / "server.py"),
       str(tmp_path / "requests.json"), str(tmp_path / "served.npz")],
      cwd=str(tmp_path), env=env, capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "served without tfemb" in result.stdout
  served = np.load(tmp_path / "served.npz")
  outputs = [{} for _ in requests]
  for key in served.files:
    i, name = key.split("/", 1)
    outputs[int(i)][name] = served[key]
  return outputs


def only(outputs):
  """The single output of each served request."""
  assert all(len(o) == 1 for o in outputs)
  return [next(iter(o.values())) for o in outputs]


def variable_bytes(path):
  reader = tf.train.load_checkpoint(os.path.join(path, "variables",
                                                 "variables"))
  dtypes = reader.get_variable_to_dtype_map()
  return {name: int(np.prod(shape)) * dtypes[name].size
          for name, shape in reader.get_variable_to_shape_map().items()
          if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def unstacked(embedding):
  """Each user table, by name, as TensorFlow reads it out of a SparseCore
  checkpoint (`unshuffle_from_sc_to_cpu`, then `remove_padding_from_sc`)."""
  # TensorFlow 2.17 on, as the SparseCore host engine.
  from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  stacked = {name: v.numpy() for name, v in embedding.embedding_tables.items()}
  tables = {}
  for name, layout in embedding.embedding_layouts.items():
    value = tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(
        tf.constant(stacked[layout.stacked_table_name]),
        layout.num_sparse_cores, layout.sparse_core_shard_row_offset,
        layout.unsharded_padded_shape[0] // layout.num_sparse_cores,
        layout.sparse_core_shard_rotation)
    tables[name] = tpu_embedding_v3_utils.remove_padding_from_sc(
        value, tuple(layout.unsharded_shape)).numpy()
  return tables


def assert_each_table_once(path, tables, model):
  """The SavedModel's variables: each of `tables` (by name) once, with its
  values, and at most 1.05x the bytes of the tables and the dense head."""
  parameters = sum(t.nbytes for t in tables.values()) + sum(
      w.nbytes for w in model.layers[-1].get_weights())
  saved = variable_bytes(path)
  assert sum(saved.values()) <= 1.05 * parameters, saved
  reader = tf.train.load_checkpoint(os.path.join(path, "variables",
                                                 "variables"))
  found = []
  for name, shape in reader.get_variable_to_shape_map().items():
    for table, value in tables.items():
      if list(shape) == list(value.shape):
        np.testing.assert_array_equal(reader.get_tensor(name), value)
        found.append(table)
  assert sorted(found) == sorted(tables)
