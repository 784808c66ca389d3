"""A TPU program that makes its distributed datasets' iterators inside a
`tf.function` (on a TPU, TensorFlow's `MultiDeviceIterator`: a blocking
read per replica): under `python -m tfemb.run --tpu TYPE` it must finish,
whatever the size of TensorFlow's inter-op pool. Prints, as JSON, each
replica's batches of two steps of `experimental_distribute_dataset` and of
`distribute_datasets_from_function`."""

import json
import os

import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
replicas = strategy.num_replicas_in_sync
batches = tf.data.Dataset.range(4 * replicas).batch(2 * replicas)
distributed = {
    "dataset": strategy.experimental_distribute_dataset(batches),
    "from_function": strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.range(4 * replicas).batch(2)),
}


@tf.function
def two_steps(dataset):
  iterator = iter(dataset)  # made here
  return [strategy.run(tf.identity, args=(next(iterator),))
          for _ in range(2)]


print(json.dumps({
    "replicas": replicas,
    "inter_op_threads": os.environ.get("TF_NUM_INTEROP_THREADS"),
    **{kind: [[v.numpy().tolist()
               for v in strategy.experimental_local_results(step)]
              for step in two_steps(dataset)]
       for kind, dataset in distributed.items()},
}))
