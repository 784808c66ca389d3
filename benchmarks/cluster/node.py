"""What each process of a cluster runs (`--role`): a server, the
coordinator or a worker that trains and measures, or one process alone that
restores a cluster's checkpoint."""

import dataclasses
import json
import os
import resource
import sys
from typing import Dict

from benchmarks import procmem
from benchmarks import workload as workload_lib
from benchmarks.cluster import meter


def server(args):
  stack = 2 << 20
  if args.memory_margin and resource.getrlimit(
      resource.RLIMIT_STACK)[0] != stack:
    # Each thread reserves its stack (the soft limit, read as the process
    # starts: 8 MiB by default) of the capped address space: 2 MiB.
    resource.setrlimit(resource.RLIMIT_STACK,
                       (stack, resource.getrlimit(resource.RLIMIT_STACK)[1]))
    os.execv(sys.executable, sys.orig_argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  srv = tf.distribute.Server(tf.train.ClusterSpec(json.loads(args.cluster)),
                             job_name=args.job, task_index=args.index,
                             protocol="grpc", start=True)
  if args.memory_margin:
    # Address space capped at what the started server has mapped plus the
    # margin; a margin under the tables' total keeps this process from
    # ever holding them all.
    cap = procmem.virtual_size() + args.memory_margin
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(json.dumps({"rlimit_as": cap}), flush=True)
    if args.check_bytes:
      try:
        _ = bytearray(args.check_bytes)
        print(f"cap not effective: {args.check_bytes} bytes allocated",
              flush=True)
      except MemoryError:
        print(f"cap holds: {args.check_bytes} bytes refused", flush=True)
  srv.join()


def workload_of(args) -> workload_lib.Workload:
  return workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               batch=args.batch)


def dataset(work: workload_lib.Workload, id_stride: int = 1):
  """The workload's batches, cycled. With `id_stride` the ids are those of
  a table `id_stride` times smaller, times `id_stride`: the same distinct
  ids per batch, spread over the bigger table."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batches = dataclasses.replace(work, vocab=work.vocab // id_stride
                                ).make_batches()
  x = {n: np.concatenate([f[n] for f, _ in batches]) * id_stride
       for n in work.names}
  y = np.concatenate([labels for _, labels in batches])[:, None]
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(
      work.batch, drop_remainder=True).repeat()


def build_model(stack: str, work: workload_lib.Workload, restore: str = "",
                steps_per_execution: int = 1):
  """(model, embedding layer or None), compiled; under the current scope.

  With `restore`, tfemb's tables are restored from that checkpoint (of a
  `tf.train.Checkpoint(model=...)`) as they are created: TensorFlow's
  deferred restoration reads one variable at a time, where a restore into
  variables that exist reads all of a parameter server's shards in one op
  and holds them beside the variables (twice the shards)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  keras = tf.keras
  vocab = work.vocab
  inputs = train_step.keras_inputs(keras, work)
  layer = None
  if stack == "tfemb":
    import tfemb.layers  # pylint: disable=g-import-not-at-top
    from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
    layer = tfemb.layers.TPUEmbedding(
        tfemb_common.feature_config(work), tfemb_common.optimizer(work))
    if restore:
      # The layer's place in the functional model's checkpoint.
      tf.train.Checkpoint(model=tf.train.Checkpoint(
          **{"layer_with_weights-0": layer})).restore(restore).expect_partial()
    activations = layer(inputs)
  else:
    activations = {n: keras.layers.Embedding(vocab, work.dim,
                                             name=f"table_{n}")(inputs[n])
                   for n in work.names}
  model = keras.Model(inputs, train_step.concat_head(keras, activations,
                                                     work.names))
  model.compile(optimizer=train_step.keras_optimizer(keras.optimizers, work),
                loss="mse", steps_per_execution=steps_per_execution)
  return model, layer


def values(layer, model) -> Dict[str, "object"]:
  """The tables (and slots) by name, read whole."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if layer is not None:
    return {f"{t.name}/{n}": tf.convert_to_tensor(v).numpy()
            for t, slots in layer.embedding_variables.items()
            for n, v in slots.items()}
  return {v.name: tf.convert_to_tensor(v).numpy()
          for v in model.trainable_variables if "table_" in v.name}


def train(args):
  """The coordinator (ps) or one worker (mwms): trains and measures."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  work = workload_of(args)
  cluster = json.loads(args.cluster) if args.cluster else None
  if args.role == "coordinator":
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=(
            tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=args.min_shard_bytes,
                max_shards=len(cluster["ps"]))))
    data = tf.keras.utils.experimental.DatasetCreator(
        lambda _: dataset(work, args.id_stride))
  else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = dataset(work, args.id_stride)
  with strategy.scope():
    model, layer = build_model(args.stack, work, args.restore,
                               args.steps_per_execution)
  checkpoint = manager = None
  initial_epoch = 0
  if args.checkpoint_dir:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, 2)
    if manager.latest_checkpoint:
      checkpoint.restore(manager.latest_checkpoint)
      initial_epoch = int(manager.latest_checkpoint.rsplit("-", 1)[1])
  if args.restore:
    if layer is None:
      tf.train.Checkpoint(model=model).restore(args.restore).expect_partial()
    np.savez(os.path.join(args.save, "restored.npz"), **values(layer, model))
  measured = meter.make_meter(args) if args.pids_file else None
  callbacks = [measured] if measured else []
  if manager:
    callbacks.append(tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: manager.save(epoch + 1)))
  history = model.fit(data, epochs=args.warmup_epochs + args.epochs,
            initial_epoch=initial_epoch, steps_per_epoch=args.steps,
            callbacks=callbacks, verbose=0)
  out = dict(measured.result if measured else {}, stack=args.stack,
             optimizer=args.optimizer, vocab=args.vocab,
             replicas=strategy.num_replicas_in_sync,
             initial_epoch=initial_epoch,
             losses=[float(x) for x in history.history.get("loss", [])])
  if layer is not None:
    out["shards"] = {t.name: len(getattr(v, "variables", [v]))
                     for t, v in layer.embedding_tables.items()}
  if args.save:
    np.savez(os.path.join(args.save, "final.npz"), **values(layer, model))
    tf.train.Checkpoint(model=model).write(os.path.join(args.save, "ckpt"))
  print(json.dumps(out), flush=True)


def single(args):
  """No cluster: restores `--restore` into one process, saves its tables
  to `--save`/single.npz and writes them back as `--save`/single-ckpt."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model, layer = build_model(args.stack, workload_of(args))
  tf.train.Checkpoint(model=model).restore(args.restore).expect_partial()
  np.savez(os.path.join(args.save, "single.npz"), **values(layer, model))
  tf.train.Checkpoint(model=model).write(
      os.path.join(args.save, "single-ckpt"))
  print(json.dumps({"restored": args.restore}), flush=True)
