"""Trains tensorflow-recommenders' own layer on the CPU and saves it.

`python tfrs_checkpoint_worker.py OUTDIR` (with `TF_USE_LEGACY_KERAS=1`:
tfrs needs tf_keras) trains `tfrs.layers.embedding.TPUEmbedding` in a
functional model with `model.fit` for `STEPS` steps, the layer's and the
model's optimizer one legacy SGD with an `ExponentialDecay` schedule (tfrs
takes only legacy optimizers), and saves it as users do: `OUTDIR/ckpt-1`
(`tf.train.Checkpoint(model=..., optimizer=...)`), `OUTDIR/weights`
(`model.save_weights`, TensorFlow format), and `OUTDIR/tfrs.npz` with the
table and the optimizer's `iterations`. tests/layers/test_tfrs_checkpoint.py
builds the same model with tfemb's layer and resumes from them.
"""

import os
import sys

import numpy as np
import tensorflow as tf

keras = tf.keras
VOCAB, DIM, BATCH, STEPS = 12, 3, 4, 5


def schedule():
  return keras.optimizers.schedules.ExponentialDecay(
      0.4, decay_steps=1, decay_rate=0.5)


def model_with(layer_class, table_config, feature_config, optimizer):
  """ids -> embedding -> the activations summed: d loss / d activation = 1.

  Shared with the test: the same model with either layer."""
  layer = layer_class({"ids": feature_config(table_config)}, optimizer)
  ids = keras.Input(shape=(), dtype="int64", name="ids")
  total = keras.layers.Lambda(
      lambda a: tf.reduce_sum(a, -1, keepdims=True))(layer({"ids": ids})["ids"])
  model = keras.Model({"ids": ids}, total)
  model.compile(optimizer=optimizer, loss=lambda y, p: tf.reduce_sum(p))
  return model, layer


def main(out):
  import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top
  api = tf.tpu.experimental.embedding
  table = api.TableConfig(VOCAB, DIM, name="t",
                          initializer=tf.random_uniform_initializer(seed=3))
  optimizer = keras.optimizers.legacy.SGD(schedule())
  model, layer = model_with(tfrs.layers.embedding.TPUEmbedding, table,
                            api.FeatureConfig, optimizer)
  ids = np.random.default_rng(2).integers(0, VOCAB, size=BATCH * STEPS)
  data = tf.data.Dataset.from_tensor_slices(
      ({"ids": ids}, np.zeros((len(ids), 1), np.float32))).batch(BATCH)
  model.fit(data, epochs=1, verbose=0)
  tf.train.Checkpoint(model=model, optimizer=optimizer).save(
      os.path.join(out, "ckpt"))
  model.save_weights(os.path.join(out, "weights"))
  np.savez(os.path.join(out, "tfrs.npz"),
           table=layer.embedding_tables[table].numpy(),
           iterations=optimizer.iterations.numpy())


if __name__ == "__main__":
  main(sys.argv[1])
