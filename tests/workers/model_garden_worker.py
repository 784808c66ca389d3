"""TensorFlow Model Garden's ranking task (official.recommendation.ranking),
unchanged, under `tfemb.patch()`: builds an experiment's model with small
tables, trains it on Model Garden's synthetic data step by step, and
prints what the test checks as JSON.

`python model_garden_worker.py EXPERIMENT STRATEGY CHECKPOINT_DIR`
(STRATEGY: default; mirrored, over 2 logical CPUs; or tpu: Model Garden's
`distribution_strategy: tpu`, its own `get_distribution_strategy("tpu")`,
on tfemb's host v5p-8, then the same model trained from the same start on
the TPU branch and, in a process of its own (STRATEGY cpu-path), on the
CPU path). Needs tf_keras (`TF_USE_LEGACY_KERAS=1`), as Model
Garden does.
"""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tfemb

# A TPU run emulates a v5p-8 (4 replicas, SparseCores) from the start:
# before TensorFlow sets up its devices.
tfemb.patch(tpu="v5p-8" if sys.argv[2:3] == ["tpu"] else None)

# pylint: disable=g-import-not-at-top,wrong-import-position
from official.common import distribute_utils
from official.core import exp_factory
from official.recommendation.ranking import common
from official.recommendation.ranking import task as ranking_task
import tfemb.layers
from tfemb.sparsecore import table_stacking
# pylint: enable=g-import-not-at-top,wrong-import-position

STEPS = 40
SEED = 0
TWIN_STEPS = 8


def make_task(experiment):
  params = exp_factory.get_exp_config(experiment)
  model = params.task.model
  model.vocab_sizes = [40, 70, 25, 90]
  model.num_dense_features = 5
  model.embedding_dim = 8
  model.bottom_mlp = [16, 8]
  model.top_mlp = [16, 1]
  model.size_threshold = 0  # every table through the TPU embedding layer
  model.dcn_low_rank_dim = 8
  params.task.use_synthetic_data = True
  params.task.train_data.global_batch_size = 64
  lr = params.trainer.optimizer_config.lr_config
  lr.learning_rate = 8.0
  lr.warmup_steps, lr.decay_start_steps, lr.decay_steps = 4, 20, 16
  return params, ranking_task.RankingTask(params.task, params.trainer)


def tables(layer):
  """Each table's rows by table name; a SparseCore run's stacked tables
  (by stacked name) unstacked into them."""
  found = layer.embedding_tables
  if all(not isinstance(t, str) for t in found):
    return {t.name: v.numpy() for t, v in found.items()}
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  return table_stacking.to_unstacked(
      engine._stacking, {n: v.numpy() for n, v in found.items()})  # pylint: disable=protected-access


def _zero_optimizer(model):
  """The optimizers' steps and slots back to a fresh start."""
  for v in model.optimizer.variables():
    v.assign(tf.zeros_like(v))


def _zero_and_train(model, batches):
  """The optimizer back to a fresh start, then a train step per batch;
  returns the losses."""
  _zero_optimizer(model)
  return [float(model.train_on_batch(*batch, return_dict=True)["loss"])
          for batch in batches]


def _start_from(model, layer, start, dense):
  """The model's tables (unstacked rows by name) and dense weights set."""
  engine = getattr(layer, "_tpu_embedding", None)
  if type(engine).__name__ == "TPUEmbeddingV2":
    start = table_stacking.to_stacked(engine._stacking, start)  # pylint: disable=protected-access
    for name, variable in layer.embedding_tables.items():
      variable.assign(start[name])
  else:
    for table, variable in layer.embedding_tables.items():
      variable.assign(start[table.name])
  for variable, value in zip(model.dense_trainable_variables, dense):
    variable.assign(value)


def cpu_path(experiment, work_dir):
  """The CPU path's half of `cpu_twin`, in a process with no TPU emulated
  (the patch gives tfemb's layer on the default strategy, the CPU path):
  the model from the start `work_dir/twin.pkl` holds, trained on its
  batches; writes what `cpu_twin` compares to `work_dir/cpu.pkl`."""
  with open(os.path.join(work_dir, "twin.pkl"), "rb") as f:
    given = pickle.load(f)
  model = make_task(experiment)[1].build_model()
  batches = given["batches"]
  model.train_on_batch(*batches[0])  # builds the tables
  layer = getattr(model._embedding_layer, "tpu_embedding",  # pylint: disable=protected-access
                  model._embedding_layer)  # pylint: disable=protected-access
  assert type(layer).__module__.startswith("tfemb."), type(layer)
  _start_from(model, layer, given["tables"], given["dense"])
  losses = _zero_and_train(model, batches[1:])
  with open(os.path.join(work_dir, "cpu.pkl"), "wb") as f:
    pickle.dump({
        "losses": losses, "tables": tables(layer),
        "dense": [v.numpy() for v in model.dense_trainable_variables],
        "predictions": model.predict(batches[0][0],
                                     batch_size=len(batches[0][1]),
                                     verbose=0)}, f)


def cpu_twin(experiment, tpu_strategy, batches, work_dir):
  """The TPU branch against the CPU path from the same start: the model
  built under `tpu_strategy` (the host TPU's, 4 replicas) here, and under
  the default strategy in a process of its own (`cpu_path`): while a TPU
  type is emulated, a model built outside its TPUStrategy gets tfrs' own
  layer, as on a TPU's host. The CPU model starts from the TPU one's
  tables (unstacked) and dense weights, both optimizers reset, then the
  same batches. Returns the largest differences of the tables, the dense
  weights and the predictions, and the steps' losses."""
  with tpu_strategy.scope():
    model = make_task(experiment)[1].build_model()
  model.train_on_batch(*batches[0])  # builds the tables
  layer = model._embedding_layer.tpu_embedding  # pylint: disable=protected-access
  assert type(layer._tpu_embedding).__name__ == "TPUEmbeddingV2"  # pylint: disable=protected-access
  start = tables(layer)
  dense = [v.numpy() for v in model.dense_trainable_variables]
  with open(os.path.join(work_dir, "twin.pkl"), "wb") as f:
    pickle.dump({"tables": start, "dense": dense, "batches": batches}, f)
  _start_from(model, layer, start, dense)
  done = subprocess.run(
      [sys.executable, __file__, experiment, "cpu-path", work_dir],
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-4000:]
  losses = {"tpu": _zero_and_train(model, batches[1:])}
  last = {"tpu": tables(layer)}
  with open(os.path.join(work_dir, "cpu.pkl"), "rb") as f:
    cpu = pickle.load(f)
  losses["cpu"], last["cpu"] = cpu["losses"], cpu["tables"]
  held = {"tpu": model.predict(batches[0][0], batch_size=len(batches[0][1]),
                               verbose=0), "cpu": cpu["predictions"]}
  return {
      # tf_keras logs the first replica's loss under a TPUStrategy (the
      # sum of the replicas' elsewhere), as on a TPU: a quarter of the
      # batch's here.
      "losses": losses,
      "predictions": float(np.abs(held["tpu"] - held["cpu"]).max()),
      "predicted": held["cpu"].shape[0],
      "tables_moved": max(float(np.abs(last["cpu"][t] - start[t]).max())
                          for t in start),
      "tables": max(float(np.abs(last["tpu"][t] - last["cpu"][t]).max())
                    for t in start),
      "dense": max(float(np.abs(a.numpy() - b).max())
                   for a, b in zip(model.dense_trainable_variables,
                                   cpu["dense"])),
  }


def main(experiment, strategy_name, checkpoint_dir):
  # Model Garden's synthetic data and the model's initial weights are
  # random: a fixed seed makes the held batch's loss, which falls by a few
  # hundredths over these steps, the same on every run.
  tf.keras.utils.set_random_seed(SEED)
  if strategy_name == "tpu":  # Model Garden's own TPU set-up
    strategy = distribute_utils.get_distribution_strategy(
        distribution_strategy="tpu", tpu_address="")
  else:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                if strategy_name == "mirrored" else
                tf.distribute.get_strategy())
  params, task = make_task(experiment)
  with strategy.scope():
    model = task.build_model()
  dataset = task.build_inputs(params.task.train_data)
  embedding = model._embedding_layer  # pylint: disable=protected-access
  layer = getattr(embedding, "tpu_embedding", embedding)
  batches = iter(dataset.repeat())
  held = next(batches)  # a batch the loss is measured on before and after
  model.train_on_batch(*next(batches))  # builds the tables
  first = tables(layer)
  held_before = float(model.test_on_batch(*held, return_dict=True)["loss"])
  schedule = common.WarmUpAndPolyDecay(
      batch_size=64, decay_exp=2, learning_rate=8.0, warmup_steps=4,
      decay_steps=16, decay_start_steps=20)
  rates, losses = [], []
  (opt,) = {ours.optimizer for _, ours in layer._table_config_map}  # pylint: disable=protected-access
  for step in range(1, STEPS):
    rates.append([float(opt.learning_rate()), float(schedule(step))])
    losses.append(float(model.train_on_batch(*next(batches), return_dict=True)["loss"]))
  last = tables(layer)
  held_after = float(model.test_on_batch(*held, return_dict=True)["loss"])
  path = tf.train.Checkpoint(model=model).save(checkpoint_dir + "/ckpt")
  with strategy.scope():
    again = make_task(experiment)[1].build_model()
  again.train_on_batch(*next(iter(dataset)))
  tf.train.Checkpoint(model=again).restore(path)
  again_embedding = again._embedding_layer  # pylint: disable=protected-access
  restored = tables(getattr(again_embedding, "tpu_embedding", again_embedding))
  twin = None
  if strategy_name == "tpu":
    twin = cpu_twin(experiment, strategy, [
        tf.nest.map_structure(lambda t: t.numpy(), next(batches))
        for _ in range(TWIN_STEPS + 1)], checkpoint_dir)
  print(json.dumps({
      "layer": type(layer).__module__ + "." + type(layer).__name__,
      "replicas": strategy.num_replicas_in_sync,
      "moved": {n: float(np.abs(last[n] - first[n]).max()) for n in first},
      "restored": all(np.array_equal(restored[n], last[n]) for n in last),
      "rates": rates,
      "losses": losses,
      "held_loss": [held_before, held_after],
      "engine": type(layer._tpu_embedding).__name__,  # pylint: disable=protected-access
      "tpu_strategy": isinstance(strategy, tf.distribute.TPUStrategy),
      "cpu_twin": twin,
  }))


if __name__ == "__main__":
  if sys.argv[2] == "cpu-path":
    tf.keras.utils.set_random_seed(SEED)
    cpu_path(sys.argv[1], sys.argv[3])
  else:
    main(*sys.argv[1:])
