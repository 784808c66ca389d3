"""One process of a multi-worker `tfemb.TPUEmbeddingV2` run.

`python v2_worker.py OUT.npz` with TF_CONFIG set joins a
MultiWorkerMirroredStrategy cluster and trains on its share of each global
batch; without it, it trains alone on the whole global batch. It saves its
tables unstacked (`{table}/{slot}`), so runs of different layouts compare.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import tfemb
from tfemb.sparsecore import layout

GLOBAL_BATCH, EXAMPLES, VOCAB = 8, 48, 40


def main(out):
  if "TF_CONFIG" in os.environ:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  else:
    strategy = tf.distribute.get_strategy()
  per_replica = GLOBAL_BATCH // strategy.num_replicas_in_sync
  init = np.random.default_rng(0).normal(size=(VOCAB, 4))
  rng = np.random.default_rng(1)
  ids = rng.integers(0, VOCAB, size=(EXAMPLES, 2))
  coef = rng.normal(size=(EXAMPLES, 4)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
      (ids[:, 0], tf.RaggedTensor.from_tensor(ids), coef)).batch(
          GLOBAL_BATCH, drop_remainder=True)
  with strategy.scope():
    items = tfemb.TableConfig(VOCAB, 4, name="items",
                              initializer=tf.constant_initializer(init))
    users = tfemb.TableConfig(VOCAB // 2, 4, name="users",
                              initializer=tf.constant_initializer(
                                  init[:VOCAB // 2] / 2))
    embedding = tfemb.TPUEmbeddingV2(
        {"item": tfemb.FeatureConfig(items, output_shape=[per_replica]),
         "both": tfemb.FeatureConfig(items, output_shape=[per_replica]),
         "user": tfemb.FeatureConfig(users, output_shape=[per_replica])},
        tfemb.Adagrad(0.3))
    embedding.build()

  @tf.function
  def step(item, both, gradient):
    def replica_step(item, both, gradient):
      features = {"item": item, "both": both, "user": item // 2}
      activations, preserved = embedding(features)
      del activations
      embedding.apply_gradients(
          {"item": gradient, "both": 2 * gradient, "user": -gradient},
          preserved)
    strategy.run(replica_step, args=(item, both, gradient))

  for _ in range(2):
    for batch in strategy.experimental_distribute_dataset(dataset):
      step(*batch)
  stacking = embedding._stacking  # pylint: disable=protected-access
  arrays = {}
  for slot in ("parameters", "accumulators"):
    stacked = {name: tables[slot].values[0].numpy()
               if hasattr(tables[slot], "values") else tables[slot].numpy()
               for name, tables in embedding.variables.items()}
    for table, value in layout.to_unstacked(stacking, stacked).items():
      arrays[f"{table}/{slot}"] = value
  np.savez(out, **arrays)
  print(json.dumps({"replicas": strategy.num_replicas_in_sync}))


if __name__ == "__main__":
  main(sys.argv[1])
