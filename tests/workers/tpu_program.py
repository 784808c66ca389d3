"""A TPU training program as Cloud TPU's guides write it: nothing in it
knows about tfemb. It sets up the TPU, picks TensorFlow's embedding engine
for the TPU's hardware and trains two steps of SGD on
`loss = sum(activations * coef)`, then prints what the test checks as JSON.

Run by tests/tpu/test_host_tpu_programs.py under `python -m tfemb.run
--tpu TYPE` or with `TFEMB_TPU=TYPE`.
"""

import json

import numpy as np
import tensorflow as tf

VOCAB, DIM, GLOBAL_BATCH, LR = 32, 4, 16, 0.5
Feature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature


def main():
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tf.distribute.TPUStrategy(resolver)
  feature = strategy.extended.tpu_hardware_feature.embedding_feature
  replicas = strategy.num_replicas_in_sync
  per_replica = GLOBAL_BATCH // replicas
  rng = np.random.default_rng(5)
  init = rng.uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
  ids = rng.integers(0, VOCAB, (2, GLOBAL_BATCH))
  coef = rng.uniform(-1, 1, (2, GLOBAL_BATCH, DIM)).astype(np.float32)
  embedding_api = tf.tpu.experimental.embedding
  with strategy.scope():
    table = embedding_api.TableConfig(
        VOCAB, DIM, name="t", initializer=tf.constant_initializer(init))
    if feature == Feature.V2:
      embedding = embedding_api.TPUEmbeddingV2(
          {"f": embedding_api.FeatureConfig(table, output_shape=[per_replica])},
          embedding_api.SGD(LR))
      embedding.build()
    elif feature == Feature.V1:
      embedding = embedding_api.TPUEmbedding(
          {"f": embedding_api.FeatureConfig(table)}, embedding_api.SGD(LR))
      embedding.build(per_replica_input_shapes={
          "f": tf.TensorShape([per_replica, 1])})
    else:
      embedding = embedding_api.TPUEmbeddingV0(
          {"f": embedding_api.FeatureConfig(table)}, embedding_api.SGD(LR))
      embedding.build()

  def replica_step(x, c):
    with tf.GradientTape() as tape:
      if feature == Feature.V2:
        activations, preserved = embedding({"f": x})
      elif feature == Feature.V1:
        activations = embedding.dequeue()
      else:
        activations = embedding.embedding_lookup({"f": x})
      tape.watch(activations)
      loss = tf.reduce_sum(activations["f"] * c)
    gradients = tape.gradient(loss, activations)
    if feature == Feature.V2:
      embedding.apply_gradients(gradients, preserved)
    elif feature == Feature.V1:
      embedding.apply_gradients(gradients)
    return activations["f"]

  data = tf.data.Dataset.from_tensor_slices(
      (ids.reshape(-1, 1), coef.reshape(-1, DIM))).batch(GLOBAL_BATCH)
  iterator = iter(strategy.experimental_distribute_dataset(
      data, tf.distribute.InputOptions(experimental_fetch_to_device=False)))

  @tf.function
  def step():
    x, c = next(iterator)
    if feature == Feature.V1:
      embedding.enqueue({"f": x}, training=True)
    return strategy.run(replica_step, args=(x, c))

  first = strategy.gather(step(), axis=0)
  step()
  tables = embedding.embedding_tables
  if feature == Feature.V2:  # per-chip shards of the stacked table
    got = np.concatenate([s.numpy() for s in tables["t"].values])
    shards = len(tables["t"].values)
  else:
    got = next(iter(tables.values())).numpy()
    shards = 1
  print(json.dumps({
      "tpu_strategy": isinstance(strategy, tf.distribute.TPUStrategy),
      "replicas": replicas,
      "feature": feature.value,
      "sparse_cores_per_chip": (
          strategy.extended.tpu_hardware_feature
          .num_embedding_devices_per_chip),
      "engine": type(embedding).__module__ + "." + type(embedding).__name__,
      "shards": shards,
      "init": init.tolist(), "ids": ids.tolist(), "coef": coef.tolist(),
      "first_activations": np.asarray(first).tolist(),
      "table": got.tolist(),
  }))


if __name__ == "__main__":
  main()
