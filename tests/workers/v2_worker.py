"""One process of a multi-worker `tfemb.TPUEmbeddingV2` run.

`python v2_worker.py OUT.npz` with TF_CONFIG set joins a
MultiWorkerMirroredStrategy cluster and trains on its share of each global
batch; without it, it trains alone on the whole global batch. It saves its
tables unstacked (`{table}/{slot}`), so runs of different layouts compare.

The V2 object creates its tables in its first lookup, inside strategy.run.
Feature "optional" is empty in the whole first global batch and in the
first half of the second (one worker's share); beside the V2 object, a
first-generation `TPUEmbedding` trains on the same batches (`v1/...`), and
a V2 object whose SparseCore limits drop every id takes the same steps
(`dropped/...`).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import tfemb
from tfemb.sparsecore import table_stacking

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
  optional = [list(rng.integers(0, VOCAB // 2, size=rng.integers(1, 3)))
              if k >= GLOBAL_BATCH * 3 // 2 else [] for k in range(EXAMPLES)]
  dataset = tf.data.Dataset.from_tensor_slices(
      (ids[:, 0], tf.RaggedTensor.from_tensor(ids),
       tf.ragged.constant(optional, tf.int64), coef)).batch(
           GLOBAL_BATCH, drop_remainder=True)
  with strategy.scope():
    items = tfemb.TableConfig(VOCAB, 4, name="items",
                              initializer=tf.constant_initializer(init))
    users = tfemb.TableConfig(VOCAB // 2, 4, name="users",
                              initializer=tf.constant_initializer(
                                  init[:VOCAB // 2] / 2))
    extra = tfemb.TableConfig(VOCAB // 2, 8, name="extra",
                              initializer=tf.constant_initializer(
                                  init[:VOCAB // 2, :2].repeat(4, 1)))
    features = {
        "item": tfemb.FeatureConfig(items, output_shape=[per_replica]),
        "both": tfemb.FeatureConfig(items, output_shape=[per_replica]),
        "user": tfemb.FeatureConfig(users, output_shape=[per_replica]),
        "optional": tfemb.FeatureConfig(extra, output_shape=[per_replica])}
    engines = {
        "": tfemb.TPUEmbeddingV2(features, tfemb.Adagrad(0.3)),
        "v1/": tfemb.TPUEmbedding(features, tfemb.Adagrad(0.3)),
        "dropped/": tfemb.TPUEmbeddingV2(
            features, tfemb.Adagrad(0.3),
            sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
                max_ids_per_chip_per_sample=0, allow_id_dropping=True))}

  @tf.function
  def step(item, both, optional, gradient):
    def replica_step(item, both, optional, gradient):
      features = {"item": item, "both": both, "user": item // 2,
                  "optional": optional}
      gradients = {"item": gradient, "both": 2 * gradient,
                   "user": -gradient,
                   "optional": tf.tile(gradient, [1, 2]) / 3}
      for prefix, embedding in engines.items():
        if prefix == "v1/":
          embedding.enqueue(features, training=True)
          embedding.dequeue()
          embedding.apply_gradients(gradients)
        else:
          _, preserved = embedding(features)
          embedding.apply_gradients(gradients, preserved)
    strategy.run(replica_step, args=(item, both, optional, gradient))

  for _ in range(2):
    for batch in strategy.experimental_distribute_dataset(dataset):
      step(*batch)
  arrays = {}
  for prefix, embedding in engines.items():
    arrays.update({prefix + name: value
                   for name, value in unstacked(embedding).items()})
  np.savez(out, **arrays)
  print(json.dumps({"replicas": strategy.num_replicas_in_sync,
                    "dropped": engines["dropped/"].dropped_ids}))


def unstacked(embedding, copy=0):
  """`{table/slot: array}` of replica `copy`'s copy (of the only one, for
  variables that are not mirrored); tests/strategies/test_mirrored.py reads its
  tables with it too."""
  def value(variable):
    return (variable.values[copy] if hasattr(variable, "values")
            else variable).numpy()
  if isinstance(embedding, tfemb.TPUEmbedding):
    return {f"{t.name}/{slot}": value(v)
            for t, slots in embedding.variables.items()
            for slot, v in slots.items()}
  arrays = {}
  for slot in ("parameters", "accumulators"):
    stacked = {name: value(tables[slot])
               for name, tables in embedding.variables.items()}
    for table, array in table_stacking.to_unstacked(
        embedding._stacking, stacked).items():  # pylint: disable=protected-access
      arrays[f"{table}/{slot}"] = array
  return arrays


if __name__ == "__main__":
  main(sys.argv[1])
