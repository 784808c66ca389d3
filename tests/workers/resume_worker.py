"""A training process that may be killed and restarted.

`python resume_worker.py OUT.npz MODE WORKDIR` trains a small model with the
tfemb layer for 3 epochs of 4 steps and saves its final tables and slots in
OUT.npz. MODE is `fit` (model.fit with keras.callbacks.BackupAndRestore, a
backup per epoch) or `manager` (a loop that saves a tf.train.Checkpoint with
a CheckpointManager every 2 steps). Both resume from WORKDIR.

Environment: KILL_AT_STEP=n kills the process with SIGKILL after its n-th
training step (0-based, counting from the start of the run); KILL_IN_SAVE=n
kills it in the middle of writing its n-th checkpoint.
"""

import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

import tfemb
import tfemb.layers

keras = tf.keras
KERAS3 = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() not in ("1",
                                                                   "true")
BATCH, STEPS_PER_EPOCH, EPOCHS = 8, 4, 3


def die():
  os.kill(os.getpid(), signal.SIGKILL)


def data():
  rng = np.random.default_rng(4)
  n = BATCH * STEPS_PER_EPOCH
  x = {"user": rng.integers(0, 20, size=n), "item": rng.integers(0, 30, n)}
  y = rng.normal(size=(n, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def build():
  users = tfemb.TableConfig(20, 4, name="users",
                            initializer=tf.constant_initializer(0.1))
  items = tfemb.TableConfig(30, 4, name="items", optimizer=tfemb.Adam(0.05),
                            initializer=tf.constant_initializer(-0.1))
  layer = tfemb.layers.TPUEmbedding(
      {"user": tfemb.FeatureConfig(users), "item": tfemb.FeatureConfig(items)},
      tfemb.Adagrad(0.2))
  inputs = {"user": keras.Input(shape=(), dtype="int64", name="user"),
            "item": keras.Input(shape=(), dtype="int64", name="item")}
  act = layer(inputs)
  x = keras.layers.Concatenate()([act["user"], act["item"]])
  model = keras.Model(inputs, keras.layers.Dense(
      1, kernel_initializer="ones")(x))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model, layer


class CountSteps(keras.callbacks.Callback):
  """Counts this run's training steps; with `kill_at`, dies after that one."""

  def __init__(self, kill_at=None):
    super().__init__()
    self.kill_at, self.seen = kill_at, 0

  def on_train_batch_end(self, batch, logs=None):
    if self.seen == self.kill_at:
      die()
    self.seen += 1


def kill_in_save(n):
  """Dies half-way through the n-th save of the layer's variables."""
  calls = {"count": 0}
  original = tfemb.layers.TPUEmbedding.save_own_variables

  def save_own_variables(self, store):
    if calls["count"] == n:
      store["0"] = np.zeros(1)  # a partial file...
      die()  # ...and the process is gone
    calls["count"] += 1
    return original(self, store)

  tfemb.layers.TPUEmbedding.save_own_variables = save_own_variables


def kill_in_checkpoint_save(n):
  """Dies after the n-th checkpoint's data is written, before the manager
  records it as the latest."""
  from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-import-not-at-top
  original = checkpoint_management.update_checkpoint_state_internal
  calls = {"count": 0}

  def update(*args, **kwargs):
    if calls["count"] == n:
      die()
    calls["count"] += 1
    return original(*args, **kwargs)

  checkpoint_management.update_checkpoint_state_internal = update


def run_fit(workdir, kill_at):
  model, layer = build()
  # Keras 3 keeps the previous backup to fall back on if the latest is
  # corrupt (killed while writing); tf_keras writes through a
  # CheckpointManager, whose latest checkpoint is always complete.
  extra = {"double_checkpoint": True} if KERAS3 else {}
  counter = CountSteps(kill_at)
  callbacks = [keras.callbacks.BackupAndRestore(workdir, **extra), counter]
  model.fit(data(), epochs=EPOCHS, callbacks=callbacks, verbose=0,
            shuffle=False)
  return layer, counter.seen


def run_manager(workdir, kill_at):
  model, layer = build()
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(model=model, step=step)
  manager = tf.train.CheckpointManager(checkpoint, workdir, max_to_keep=2)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
  batches = list(data())
  done = 0
  total = EPOCHS * STEPS_PER_EPOCH
  while int(step.numpy()) < total:
    x, y = batches[int(step.numpy()) % STEPS_PER_EPOCH]
    model.train_on_batch(x, y)
    step.assign_add(1)
    if kill_at is not None and done == kill_at:
      die()
    done += 1
    if int(step.numpy()) % 2 == 0:
      manager.save()
  return layer, done


def main(out, mode, workdir):
  kill_at = os.environ.get("KILL_AT_STEP")
  kill_at = None if kill_at is None else int(kill_at)
  save_kill = os.environ.get("KILL_IN_SAVE")
  if save_kill is not None:
    if mode == "fit" and KERAS3:
      kill_in_save(int(save_kill))
    else:
      kill_in_checkpoint_save(int(save_kill))
  layer, steps = (run_fit if mode == "fit" else run_manager)(workdir,
                                                             kill_at)
  np.savez(out, **{f"{t.name}/{n}": v.numpy()
                   for t, slots in layer.embedding_variables.items()
                   for n, v in slots.items()})
  print(json.dumps({"steps": steps}))


if __name__ == "__main__":
  main(*sys.argv[1:4])
