"""A TPU program that makes its distributed dataset's iterator inside a
`tf.function` (TensorFlow's `MultiDeviceIterator`, one blocking read per
replica): under `python -m tfemb.run --tpu TYPE`, it must finish. Prints,
as JSON, each replica's batches of two steps and TensorFlow's inter-op
pool size."""

import json
import os

import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
replicas = strategy.num_replicas_in_sync
batches = tf.data.Dataset.range(4 * replicas).batch(2 * replicas)
distributed = strategy.experimental_distribute_dataset(batches)


@tf.function
def two_steps():
  iterator = iter(distributed)  # made here: TensorFlow's own iterator
  return [strategy.run(lambda x: x * 10, args=(next(iterator),))
          for _ in range(2)]


steps = two_steps()
print(json.dumps({
    "replicas": replicas,
    "steps": [[v.numpy().tolist()
               for v in strategy.experimental_local_results(step)]
              for step in steps],
    "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    "cpus": os.cpu_count(),
}))
