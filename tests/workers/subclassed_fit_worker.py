"""A Keras 3 subclassed model, as a TPU user writes one: its embedding layer
made in `__init__`, nothing built before `fit` (which builds it from the
first batch's shapes, on symbolic float inputs under a TPUStrategy). The
embedding is tfemb's `tfemb.layers.TPUEmbedding` or keras-rs'
`DistributedEmbedding` (placement "sparsecore"); the prediction is the sum
of each example's row; MSE, `fit` for EPOCHS epochs.

    python -m tfemb.run --tpu v5p-8 tests/workers/subclassed_fit_worker.py \
        tfemb,keras_rs 3 tpu
    python tests/workers/subclassed_fit_worker.py tfemb 3 cpu  # the CPU branch

Prints one JSON line per model: the ids, labels and initial table it
trained on, each epoch's loss, the table after `fit` (a SparseCore's stacked
table as it is, with its shard count), and per epoch the functions
TensorFlow traced during it (new names in the eager context) and the time
from the epoch's start to the end of its first batch. Run by
tests/tpu/test_host_tpu_subclassed.py and benchmarks/epoch_start.py.
"""

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

import tfemb
import tfemb.layers

VOCAB, DIM, GLOBAL_BATCH, EXAMPLES, LR = 30, 4, 16, 64, 0.3
INIT = np.random.default_rng(0).uniform(-0.5, 0.5, (VOCAB, DIM))


def strategy(on_tpu):
  """The program's TPU (under `tfemb.run --tpu`), or the default strategy."""
  if not on_tpu:
    return tf.distribute.get_strategy()
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


class SumOfRows(keras.Model):

  def __init__(self, kind, replicas):
    super().__init__()
    if kind == "tfemb":
      table = tfemb.TableConfig(VOCAB, DIM, name="items",
                                initializer=tf.constant_initializer(INIT))
      self.embedding = tfemb.layers.TPUEmbedding(
          {"item": tfemb.FeatureConfig(
              table, output_shape=[GLOBAL_BATCH // replicas])},
          tfemb.Adagrad(LR))
    else:
      import keras_rs  # pylint: disable=g-import-not-at-top
      table = keras_rs.layers.TableConfig(
          name="items", vocabulary_size=VOCAB, embedding_dim=DIM,
          optimizer=keras.optimizers.Adagrad(LR), placement="sparsecore",
          initializer=keras.initializers.Constant(INIT))
      self.embedding = keras_rs.layers.DistributedEmbedding(
          {"item": keras_rs.layers.FeatureConfig(
              name="item", table=table, input_shape=(GLOBAL_BATCH, 1),
              output_shape=(GLOBAL_BATCH, DIM))})

  def call(self, x):
    return tf.reduce_sum(self.embedding(x)["item"], axis=-1, keepdims=True)


class EpochWatch(keras.callbacks.Callback):
  """Per epoch: the functions traced during it and the time to the end of
  its first batch."""

  def __init__(self):
    super().__init__()
    self.traced, self.first_batch = [], []

  def on_epoch_begin(self, epoch, logs=None):
    self._names = set(context.context().list_function_names())
    self._start, self._first = time.perf_counter(), True

  def on_train_batch_end(self, batch, logs=None):
    if self._first:
      self.first_batch.append(time.perf_counter() - self._start)
      self._first = False

  def on_epoch_end(self, epoch, logs=None):
    self.traced.append(sorted(set(context.context().list_function_names()) -
                              self._names))


def stacked_table(kind, model):
  layer = model.embedding
  if kind == "tfemb":
    (table,) = layer.embedding_tables.values()
  else:
    (table,) = layer._tpu_embedding.embedding_tables.values()  # pylint: disable=protected-access
  return np.asarray(table.numpy() if hasattr(table, "numpy") else table)


def main(kind, epochs, on_tpu):
  tpu = strategy(on_tpu)
  replicas = tpu.num_replicas_in_sync
  rng = np.random.default_rng(3)
  ids = rng.integers(0, VOCAB, size=EXAMPLES)
  labels = rng.normal(size=(EXAMPLES, 1)).astype(np.float32)
  with tpu.scope():
    model = SumOfRows(kind, replicas)
    model.compile(optimizer="sgd", loss="mse")
  data = tf.data.Dataset.from_tensor_slices(
      ({"item": ids[:, None]}, labels)).batch(GLOBAL_BATCH,
                                              drop_remainder=True)
  watch = EpochWatch()
  history = model.fit(data, epochs=epochs, verbose=0, callbacks=[watch])
  feature = tpu.extended.tpu_hardware_feature if isinstance(
      tpu, tf.distribute.TPUStrategy) else None
  cores = feature.num_embedding_devices_per_chip if feature else 0
  print(json.dumps({
      "kind": kind, "replicas": replicas, "shards": replicas * cores,
      "ids": ids.tolist(), "labels": labels[:, 0].tolist(),
      "init": INIT.tolist(), "loss": history.history["loss"],
      "table": stacked_table(kind, model).tolist(),
      "traced": watch.traced, "first_batch": watch.first_batch}), flush=True)


if __name__ == "__main__":
  # KINDS (tfemb,keras_rs) EPOCHS tpu|cpu
  for name in sys.argv[1].split(","):
    main(name, int(sys.argv[2]), sys.argv[3] == "tpu")
