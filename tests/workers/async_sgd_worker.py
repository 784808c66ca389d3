"""Two asynchronous ParameterServerStrategy workers training one SGD table.

    python async_sgd_worker.py coordinator CLUSTER_JSON OUT_FILE

The table is sharded over the cluster's parameter servers; STEPS steps are
scheduled with `ClusterCoordinator.schedule`, which runs them on both
workers at once, every step touching the same rows. OUT_FILE (.npy) gets
the table. The servers are `ps_worker.py server` processes.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tfemb

STEPS, VOCAB, DIM, LR = 60, 16, 4, 0.01
INIT = np.linspace(-1.0, 1.0, VOCAB * DIM).reshape(VOCAB, DIM)


def batch(step):
  """Step s's ids (rows 0..7 every step) and gradients."""
  ids = np.concatenate([np.arange(8), [8 + step % 8]]).astype(np.int64)
  grads = np.full((len(ids), DIM), 0.1 * (1 + step % 5), np.float32)
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
