"""Processes of a ParameterServerStrategy cluster on 127.0.0.1.

    python ps_worker.py server CLUSTER_JSON JOB INDEX   # a ps or worker
    python ps_worker.py coordinator CLUSTER_JSON OUT_DIR [RESTORE_FROM]
    python ps_worker.py single OUT_DIR                  # no cluster
    python ps_worker.py fit CLUSTER_JSON|none OUT_DIR [STEPS_PER_EXECUTION..]

The coordinator creates the tables sharded over the parameter servers
(`table_partitioner = FixedShardsPartitioner(2)`: each table is a
ShardedVariable), optionally
restores an unsharded checkpoint first (saving the restored values to
OUT_DIR/restored.npz), trains STEPS steps of the TPU script protocol with
`ClusterCoordinator.schedule`, then saves OUT_DIR/final.npz and a checkpoint
OUT_DIR/ckpt. Without a restore it then trains new tables on the same steps,
two per scheduled function, into OUT_DIR/multistep.npz. `single` trains the
same steps without a cluster. `fit` trains the Keras layer with
`model.fit`; on a cluster once with each of STEPS_PER_EXECUTION, into
OUT_DIR/fit-<steps per execution>.npz (without one, OUT_DIR/fit.npz).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import tfemb

STEPS, BATCH = 4, 8


def features(step):
  rng = np.random.default_rng(step)
  return ({"item": tf.constant(rng.integers(0, 30, size=BATCH)),
           "history": tf.RaggedTensor.from_row_lengths(
               rng.integers(0, 30, size=2 * BATCH), [2] * BATCH)},
          tf.constant(rng.normal(size=(BATCH, 1)), tf.float32))


def make_embedding():
  table = tfemb.TableConfig(30, 4, name="items",
                            initializer=tf.constant_initializer(0.3))
  other = tfemb.TableConfig(11, 2, name="small",
                            initializer=tf.constant_initializer(-0.2),
                            optimizer=tfemb.Adam(0.05))
  # Rows a whole number of SIMD registers wide: updated on the servers
  # without the step's other rows beside them (tfemb/host/sharded.py).
  wide = tfemb.TableConfig(20, 16, name="wide",
                           initializer=tf.constant_initializer(0.7))
  return tfemb.TPUEmbedding(
      {"item": tfemb.FeatureConfig(table),
       "history": tfemb.FeatureConfig(table),
       "small": tfemb.FeatureConfig(other),
       "wide": tfemb.FeatureConfig(wide)}, tfemb.Adagrad(0.2))


def step_fn(embedding):
  @tf.function
  def step(batch, targets):
    batch = dict(batch, small=batch["item"] % 11, wide=batch["item"] % 20)
    embedding.enqueue(batch, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      pred = (tf.reduce_sum(act["item"], 1) + tf.reduce_sum(act["history"], 1)
              + tf.reduce_sum(act["small"], 1)
              + tf.reduce_sum(act["wide"], 1))
      loss = tf.reduce_sum((pred[:, None] - targets) ** 2)
    embedding.apply_gradients(tape.gradient(loss, act))
  return step


def values(embedding):
  return {f"{t.name}/{n}": tf.convert_to_tensor(v).numpy()
          for t, slots in embedding.variables.items()
          for n, v in slots.items()}


def server(cluster, job, index):
  tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                       task_index=index, protocol="grpc", start=True).join()


def coordinator(cluster, out, restore_from=None):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), rpc_layer="grpc")
  # No partitioner for the model: the tables get their own.
  strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
  coord = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    embedding = make_embedding()
    embedding.table_partitioner = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    if restore_from:
      tf.train.Checkpoint(embedding=embedding).restore(restore_from)
    embedding.build()
  shards = {t.name: len(v.variables)
            for t, v in embedding.embedding_tables.items()}
  if restore_from:
    np.savez(os.path.join(out, "restored.npz"), **values(embedding))
  step = step_fn(embedding)
  for s in range(STEPS):
    coord.schedule(step, args=features(s))
  coord.join()
  np.savez(os.path.join(out, "final.npz"), **values(embedding))
  tf.train.Checkpoint(embedding=embedding).write(os.path.join(out, "ckpt"))
  if not restore_from:
    with strategy.scope():
      again = make_embedding()
      again.table_partitioner = (
          tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
      again.build()
    one = step_fn(again)

    @tf.function
    def two_steps(first, second):
      one(*first)
      one(*second)

    for s in range(0, STEPS, 2):
      coord.schedule(two_steps, args=(features(s), features(s + 1)))
    coord.join()
    np.savez(os.path.join(out, "multistep.npz"), **values(again))
  print(json.dumps({"shards": shards}))


def fit_model(steps_per_execution=1):
  """The Keras layer in a small model (tf_keras: TF_USE_LEGACY_KERAS=1)."""
  import tfemb.layers  # pylint: disable=g-import-not-at-top
  keras = tf.keras
  table = tfemb.TableConfig(30, 4, name="items",
                            initializer=tf.constant_initializer(0.3))
  layer = tfemb.layers.TPUEmbedding(
      {"item": tfemb.FeatureConfig(table), "user": tfemb.FeatureConfig(table)},
      tfemb.Adagrad(0.2))
  inputs = {"item": keras.Input(shape=(), dtype="int64", name="item"),
            "user": keras.Input(shape=(), dtype="int64", name="user")}
  act = layer(inputs)
  x = keras.layers.Concatenate()([act["item"], act["user"]])
  model = keras.Model(inputs, keras.layers.Dense(
      1, kernel_initializer="ones")(x))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                steps_per_execution=steps_per_execution)
  return model, layer


def fit_dataset(input_context=None):
  del input_context
  rng = np.random.default_rng(7)
  n = STEPS * BATCH
  x = {"item": rng.integers(0, 30, size=n), "user": rng.integers(0, 30, n)}
  y = rng.normal(size=(n, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def fit(cluster, out, steps_per_execution=(1,)):
  """model.fit through the coordinator with a DatasetCreator (tf_keras),
  once per number of steps per execution."""
  if cluster is None:
    model, layer = fit_model()
    model.fit(fit_dataset(), epochs=1, verbose=0)
    save_fit(layer, os.path.join(out, "fit.npz"))
    return
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), rpc_layer="grpc")
  strategy = tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=(
          tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)))
  for steps in steps_per_execution:
    with strategy.scope():
      model, layer = fit_model(steps)
    model.fit(tf.keras.utils.experimental.DatasetCreator(fit_dataset),
              epochs=1, steps_per_epoch=STEPS, verbose=0)
    save_fit(layer, os.path.join(out, f"fit-{steps}.npz"))
  shards = {t.name: len(getattr(v, "variables", [v]))
            for t, v in layer.embedding_tables.items()}
  print(json.dumps({"shards": shards}))


def save_fit(layer, path):
  np.savez(path, **{f"{t.name}/{n}": tf.convert_to_tensor(v).numpy()
                    for t, slots in layer.embedding_variables.items()
                    for n, v in slots.items()})


def single(out):
  embedding = make_embedding()
  step = step_fn(embedding)
  for s in range(STEPS):
    step(*features(s))
  np.savez(os.path.join(out, "final.npz"), **values(embedding))


if __name__ == "__main__":
  mode = sys.argv[1]
  if mode == "server":
    server(json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
  elif mode == "fit":
    fit(json.loads(sys.argv[2]) if sys.argv[2] != "none" else None,
        sys.argv[3], [int(n) for n in sys.argv[4:]] or (1,))
  elif mode == "coordinator":
    coordinator(json.loads(sys.argv[2]), sys.argv[3],
                sys.argv[4] if len(sys.argv) > 4 else None)
  else:
    single(sys.argv[2])
