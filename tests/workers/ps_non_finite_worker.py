"""Non-finite steps on tables over 2 parameter servers.

    python ps_non_finite_worker.py coordinator CLUSTER_JSON OUT_DIR [lock]

Two Adagrad tables: `big` sharded over both servers (rows 0-9 on one,
10-19 on the other) and `plain`, one variable on one server. One step per
phase, through `ClusterCoordinator.schedule` (the servers are
`ps_worker.py server` processes):

1. "raise", a NaN gradient of `big`;
2. "raise", a finite gradient that overflows `big`'s accumulator on its
   second shard;
3. "skip", the NaN gradient; 4. "skip", the overflow; 5. "skip", a finite
   step.

With `lock`, the engine is built with `cluster_update_lock=True` (one
lock for the whole cluster). Writes OUT_DIR/<phase>.npz (every table and
slot after the phase) and prints one JSON line: per phase its error (or
null) and `skipped_steps`, and each variable's shards' devices.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import tfemb

IDS = {"big": [3, 15, 3, 12], "plain": [1, 4, 4, 0]}
LR, INIT = 0.1, {"big": 0.5, "plain": -0.5}


def gradients(kind):
  """Each example's gradient of both features; `big`'s second example (id
  15, on the second shard) is NaN, or so big that g^2 overflows float32."""
  grads = {n: np.arange(16, dtype=np.float32).reshape(4, 4) / 8 - 0.5
           for n in IDS}
  grads["big"][1] = {"nan": np.nan, "overflow": 2e19, "finite": 0.25}[kind]
  return grads


def values(embedding):
  return {f"{t.name}/{n}": tf.convert_to_tensor(v).numpy()
          for t, slots in embedding.variables.items()
          for n, v in slots.items()}


def devices(embedding):
  return {f"{t.name}/{n}": [s.device for s in getattr(v, "variables", [v])]
          for t, slots in embedding.variables.items()
          for n, v in slots.items()}


def coordinator(cluster, out, cluster_lock=False):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), rpc_layer="grpc")
  strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
  coord = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  with strategy.scope(), tfemb.options.use(cluster_update_lock=cluster_lock):
    tables = {n: tfemb.TableConfig(rows, 4, name=n,
                                   initializer=tf.constant_initializer(INIT[n]))
              for n, rows in (("big", 20), ("plain", 6))}
    embedding = tfemb.TPUEmbedding(
        {n: tfemb.FeatureConfig(t) for n, t in tables.items()},
        tfemb.Adagrad(LR))
    # `big` (320 bytes) in 2 shards, `plain` (96 bytes) in one.
    embedding.table_partitioner = (
        tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=128, max_shards=2))
    embedding.build()

  def step_fn():
    @tf.function
    def step(ids, grads):
      embedding.enqueue(ids, training=True)
      embedding.dequeue()
      embedding.apply_gradients(grads)
    return step

  result = {"devices": devices(embedding), "phases": {}}
  step = step_fn()
  for phase, mode, kind in (("1", "raise", "nan"), ("2", "raise", "overflow"),
                            ("3", "skip", "nan"), ("4", "skip", "overflow"),
                            ("5", "skip", "finite")):
    if mode != embedding.non_finite_gradients:
      embedding.non_finite_gradients = mode
      step = step_fn()  # traced again, under the new policy
    ids = {n: tf.constant(v, tf.int64) for n, v in IDS.items()}
    grads = {n: tf.constant(g) for n, g in gradients(kind).items()}
    error = None
    try:
      coord.schedule(step, args=(ids, grads))
      coord.join()
    except Exception as e:  # pylint: disable=broad-except
      error = f"{type(e).__name__}: {e}"
    result["phases"][phase] = {"error": error,
                               "skipped_steps": embedding.skipped_steps}
    np.savez(os.path.join(out, f"{phase}.npz"), **values(embedding))
  print(json.dumps(result))


if __name__ == "__main__":
  coordinator(json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["lock"])
