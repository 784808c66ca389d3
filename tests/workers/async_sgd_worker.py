"""Asynchronous ParameterServerStrategy workers training one SGD table.

    python async_sgd_worker.py coordinator CLUSTER_JSON OUT_FILE

The table is sharded over the cluster's parameter servers; STEPS steps are
scheduled with `ClusterCoordinator.schedule`, which runs them on every
worker at once, every step touching the same rows of both shards. The
table and the gradients hold integers and the learning rate is 1, so every
sum is exact in float32: a lost update shows as a wrong integer. OUT_FILE
(.npy) gets the table. The servers are `ps_worker.py server` processes.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tfemb

STEPS, VOCAB, DIM, LR = 90, 16, 4, 1.0
INIT = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) - 32


def batch(step):
  """Step s's ids (rows 0..3 and 8..11 every step: both shards) and
  integer gradients."""
  ids = np.array([0, 1, 2, 3, 8, 9, 10, 11, 4 + step % 4, 12 + step % 4],
                 np.int64)
  grads = np.full((len(ids), DIM), 1 + step % 5, np.float32)
  grads[:, 0] += np.arange(len(ids), dtype=np.float32)
  return ids, grads


def coordinator(cluster, out):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), rpc_layer="grpc")
  strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
  coord = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    table = tfemb.TableConfig(VOCAB, DIM, name="t",
                              initializer=tf.constant_initializer(INIT))
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   tfemb.SGD(LR))
    embedding.table_partitioner = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    embedding.build()

  @tf.function
  def step(ids, grads):
    embedding.enqueue({"f": ids}, training=True)
    embedding.dequeue()
    embedding.apply_gradients({"f": grads})

  for s in range(STEPS):
    coord.schedule(step, args=tuple(tf.constant(x) for x in batch(s)))
  coord.join()
  np.save(out, tf.convert_to_tensor(embedding.embedding_tables["t"]).numpy())


if __name__ == "__main__":
  coordinator(json.loads(sys.argv[2]), sys.argv[3])
