"""A checkpoint written by tensorflow-recommenders' own layer resumes in
tfemb's: the tables, under the same checkpoint keys, and the embedding
learning-rate schedule where tfrs' optimizer stopped.

tfrs' layer trains in a tf_keras subprocess (tests/workers/
tfrs_checkpoint_worker.py: tfrs needs tf_keras) for 5 steps with a
scheduled legacy SGD and saves as users do. The same model with tfemb's
layer then restores it and takes one step; the step's learning rate, fitted
from the table change with SGD's formula (`w -= lr * g`, g the summed
activation gradients of a row), must be schedule(5), not schedule(0).

Under tf_keras the model restores the whole checkpoint (and, apart,
`model.save_weights`' file). Under Keras 3, whose models and optimizers
have other checkpoint paths than tf_keras', the user maps tfrs' paths onto
the new objects: `tf.train.Checkpoint(model=tf.train.Checkpoint(
**{"layer_with_weights-0": layer}), optimizer=tf.train.Checkpoint(
iter=optimizer.iterations))` restores the layer and the step.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import tfemb
import tfemb.layers
from workers import tfrs_checkpoint_worker as worker

keras = tf.keras
KERAS3 = not os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1",
                                                                  "true")
WORKER = pathlib.Path(worker.__file__).resolve()
ROOT = helpers.ROOT
LAYER_PATH = "layer_with_weights-0"  # tf_keras' path of the embedding layer


@pytest.fixture(scope="module")
def tfrs_checkpoint(tmp_path_factory):
  out = tmp_path_factory.mktemp("tfrs")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
             PYTHONPATH=str(ROOT) + os.pathsep +
             os.environ.get("PYTHONPATH", ""))
  done = subprocess.run([sys.executable, str(WORKER), str(out)], env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return out


def tfemb_model():
  table = tfemb.TableConfig(worker.VOCAB, worker.DIM, name="t")
  sgd = (keras.optimizers.SGD if KERAS3 else keras.optimizers.legacy.SGD)
  optimizer = sgd(worker.schedule())
  model, layer = worker.model_with(tfemb.layers.TPUEmbedding, table,
                                   tfemb.FeatureConfig, optimizer)
  return model, layer, table, optimizer


def restore_checkpoint(model, layer, optimizer, directory):
  path = str(directory / "ckpt-1")
  if KERAS3:
    iterations = getattr(optimizer.iterations, "value", optimizer.iterations)
    tf.train.Checkpoint(
        model=tf.train.Checkpoint(**{LAYER_PATH: layer}),
        optimizer=tf.train.Checkpoint(iter=iterations)).restore(
            path).expect_partial()
  else:
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
        path).expect_partial()


def load_weights(model, layer, optimizer, directory):
  del layer, optimizer
  model.load_weights(str(directory / "weights")).expect_partial()


RESTORES = {"checkpoint": restore_checkpoint, "save_weights": load_weights}


# A tf_keras save_weights file restores into tf_keras models only (Keras 3
# reads .weights.h5): under Keras 3 the checkpoint alone.
@pytest.mark.parametrize(
    "how", [h for h in RESTORES if not (KERAS3 and h == "save_weights")])
def test_tfemb_resumes_tfrs_tables_and_schedule(tfrs_checkpoint, how):
  saved = np.load(tfrs_checkpoint / "tfrs.npz")
  k = int(saved["iterations"])
  assert k == worker.STEPS
  model, layer, table, optimizer = tfemb_model()
  RESTORES[how](model, layer, optimizer, tfrs_checkpoint)
  before = layer.embedding_tables[table].numpy()
  np.testing.assert_array_equal(before, saved["table"])

  ids = np.array([1, 5, 5, 9])
  model.train_on_batch({"ids": ids}, np.zeros((len(ids), 1), np.float32))
  after = layer.embedding_tables[table].numpy()
  counts = np.bincount(ids, minlength=worker.VOCAB)
  touched = counts > 0
  # SGD: w -= lr * g, with g = (times the row was looked up) per element.
  fitted = (before - after)[touched] / counts[touched][:, None]
  expected = float(worker.schedule()(k))
  np.testing.assert_allclose(fitted, expected, rtol=1e-4)
  assert expected != pytest.approx(float(worker.schedule()(0)))
  np.testing.assert_array_equal(after[~touched], before[~touched])


def layer_keys(path, prefix):
  """The checkpoint keys under the embedding layer, from `prefix` on."""
  return sorted(name[len(prefix):] for name, _ in tf.train.list_variables(path)
                if name.startswith(prefix) and "_tpu_embedding" in name)


def test_tables_have_tfrs_checkpoint_keys(tfrs_checkpoint, tmp_path):
  """tfemb writes and reads its tables under the keys tfrs writes."""
  theirs = layer_keys(str(tfrs_checkpoint / "ckpt-1"), f"model/{LAYER_PATH}/")
  assert theirs == ["_tpu_embedding/t/.ATTRIBUTES/VARIABLE_VALUE"]
  _, layer, _, _ = tfemb_model()
  path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ours"))
  assert layer_keys(path, "layer/") == theirs
