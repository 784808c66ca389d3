"""Checkpoints move between tfemb and TensorFlow's TPUEmbeddingForServing."""

import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import async_checkpoint_helper  # pylint: disable=g-direct-tensorflow-import

import helpers
import tfemb

tf_emb = tf.tpu.experimental.embedding

# Every test with the slots in their own variables and beside the parameters.
pytestmark = pytest.mark.usefixtures("table_layout")



def feature_config(module):
  users = module.TableConfig(30, 4, name="users")
  items = module.TableConfig(20, 2, name="items", combiner="sum")
  return {
      "user": module.FeatureConfig(users),
      "friends": module.FeatureConfig(users),
      "item": module.FeatureConfig(items, max_sequence_length=3),
  }


def train_a_little(embedding, steps=2):
  rng = np.random.default_rng(0)
  for _ in range(steps):
    features = {
        "user": tf.constant(rng.integers(0, 30, size=4)),
        "friends": helpers.sparse(helpers.random_rows(rng, 4, 30, 3)),
        "item": helpers.ragged(helpers.random_rows(rng, 4, 20, 4)),
    }
    embedding.enqueue(features, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      loss = tf.add_n([tf.reduce_sum(tf.sin(a)) for a in act.values()])
    embedding.apply_gradients(tape.gradient(loss, act))


def values_by_name(variables):
  """{table name: {slot name: array}} from an object's `_variables`."""
  return {t: {s: v.numpy() for s, v in slots.items()}
          for t, slots in variables.items()}


def assert_same_values(a, b):
  assert set(a) == set(b)
  for table in a:
    assert set(a[table]) == set(b[table]), table
    for slot in a[table]:
      np.testing.assert_array_equal(a[table][slot], b[table][slot],
                                    err_msg=f"{table}/{slot}")


@pytest.mark.parametrize("opt", helpers.ONE_PER_OPTIMIZER)
def test_tfemb_checkpoint_restores_into_tensorflow_serving(opt, tmp_path):
  ours = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
  train_a_little(ours)
  path = tf.train.Checkpoint(embedding=ours).save(str(tmp_path / "ckpt"))

  theirs = tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                         helpers.optimizer(opt, tf_emb))
  status = tf.train.Checkpoint(embedding=theirs).restore(path)
  theirs.build()
  status.assert_existing_objects_matched()
  expected = values_by_name(ours._variables)
  assert_same_values(values_by_name(theirs._variables), expected)
  # Training moved the tables and slots away from their initial values.
  assert expected["users"]["parameters"].std() > 0


@pytest.mark.parametrize("opt", helpers.ONE_PER_OPTIMIZER)
def test_tensorflow_serving_checkpoint_restores_into_tfemb(opt, tmp_path):
  theirs = tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                         helpers.optimizer(opt, tf_emb))
  theirs.build()
  rng = np.random.default_rng(1)
  for slots in theirs._variables.values():
    for var in slots.values():
      var.assign(rng.uniform(0.1, 1.0, size=var.shape))
  path = tf.train.Checkpoint(embedding=theirs).save(str(tmp_path / "ckpt"))

  # Restore before the variables exist (they are created on first use) ...
  ours = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
  status = tf.train.Checkpoint(embedding=ours).restore(path)
  ours.build()
  status.assert_consumed()
  assert_same_values(values_by_name(ours._variables),
                     values_by_name(theirs._variables))
  # ... and after they exist.
  built = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
  built.build()
  tf.train.Checkpoint(embedding=built).restore(path).assert_consumed()
  assert_same_values(values_by_name(built._variables),
                     values_by_name(theirs._variables))


@pytest.mark.parametrize("opt", helpers.ONE_PER_OPTIMIZER)
def test_checkpoint_keys_are_tensorflows(opt, tmp_path):
  ours = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
  ours.build()
  theirs = tf_emb.TPUEmbedding(feature_config(tf_emb), helpers.optimizer(opt, tf_emb))
  theirs.build()
  a = tf.train.Checkpoint(embedding=ours).save(str(tmp_path / "a"))
  b = tf.train.Checkpoint(embedding=theirs).save(str(tmp_path / "b"))
  assert tf.train.list_variables(a) == tf.train.list_variables(b)
  keys = [k for k, _ in tf.train.list_variables(a)]
  assert "embedding/users/.ATTRIBUTES/VARIABLE_VALUE" in keys


def test_restored_tables_keep_training(tmp_path):
  """A restored object trains on exactly as the one that was saved."""
  first = tfemb.TPUEmbedding(feature_config(tfemb), tfemb.Adam(0.05))
  train_a_little(first, steps=1)
  path = tf.train.Checkpoint(embedding=first).save(str(tmp_path / "ckpt"))
  train_a_little(first, steps=2)
  second = tfemb.TPUEmbedding(feature_config(tfemb), tfemb.Adam(0.05))
  tf.train.Checkpoint(embedding=second).restore(path)
  train_a_little(second, steps=2)
  assert_same_values(values_by_name(second._variables),
                     values_by_name(first._variables))


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_an_async_save_holds_the_values_of_its_call(opt, tmp_path,
                                                    monkeypatch):
  """With `experimental_enable_async_checkpoint`, training goes on while
  the save is written: the checkpoint must hold the tables and slots as
  they were when `save` was called, for TensorFlow's class as for tfemb."""
  # A slow disk: the first save is written only after two more steps.
  steps_done = threading.Event()
  write = async_checkpoint_helper.AsyncCheckpointHelper._async_save

  def write_late(helper):
    steps_done.wait(timeout=120)
    write(helper)

  monkeypatch.setattr(async_checkpoint_helper.AsyncCheckpointHelper,
                      "_async_save", write_late)
  ours = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
  checkpoint = tf.train.Checkpoint(embedding=ours)
  options = tf.train.CheckpointOptions(
      experimental_enable_async_checkpoint=True)
  paths, expected = [], []
  for _ in range(2):  # the first save makes the copies, the second reuses
    train_a_little(ours, steps=1)
    paths.append(checkpoint.save(str(tmp_path / "ckpt"), options=options))
    expected.append(values_by_name(ours._variables))
    train_a_little(ours, steps=2)  # while the save is being written
    steps_done.set()
  checkpoint.sync()
  moved = values_by_name(ours._variables)
  assert not np.array_equal(moved["users"]["parameters"],
                            expected[-1]["users"]["parameters"])

  for path, values in zip(paths, expected):
    theirs = tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                           helpers.optimizer(opt, tf_emb))
    status = tf.train.Checkpoint(embedding=theirs).restore(path)
    theirs.build()
    status.assert_existing_objects_matched()
    assert_same_values(values_by_name(theirs._variables), values)
    again = tfemb.TPUEmbedding(feature_config(tfemb), helpers.optimizer(opt, tfemb))
    again.build()
    tf.train.Checkpoint(embedding=again).restore(path).assert_consumed()
    assert_same_values(values_by_name(again._variables), values)


@pytest.mark.parametrize("restore_before_build", [True, False])
@pytest.mark.parametrize("change,message", [
    (dict(vocabulary_size=40), r"users.*\(40, 4\)|shape \(30, 4\).*\(40, 4\)"),
    (dict(dim=8), r"users.*\(30, 8\)|shape \(30, 4\).*\(30, 8\)"),
    (dict(name="people"), r"table 'users', which this TPUEmbedding does not"),
    (dict(optimizer=tfemb.Adam(0.1)),
     r"slot 'accumulators' of table 'users'.*Adam"),
    (dict(optimizer=tfemb.SGD(0.1)),
     r"slot 'accumulators' of table 'users'.*SGD"),
])
def test_checkpoint_of_another_configuration_is_refused(
    tmp_path, change, message, restore_before_build):
  saved = tfemb.TPUEmbedding(feature_config(tfemb), tfemb.Adagrad(0.1))
  train_a_little(saved, steps=1)
  path = tf.train.Checkpoint(embedding=saved).save(str(tmp_path / "ckpt"))
  config = feature_config(tfemb)
  users = config["user"].table
  args = dict(vocabulary_size=users.vocabulary_size, dim=users.dim,
              name=users.name, optimizer=None)
  args.update(change)
  other = tfemb.TableConfig(**args)
  config["user"] = tfemb.FeatureConfig(other)
  config["friends"] = tfemb.FeatureConfig(other)
  embedding = tfemb.TPUEmbedding(config, tfemb.Adagrad(0.1))
  if not restore_before_build:
    embedding.build()
  with pytest.raises(ValueError, match=message):
    tf.train.Checkpoint(embedding=embedding).restore(path)
    embedding.build()


def _v2_config(name="t"):
  table = tfemb.TableConfig(16, 4, name=name)
  return {"f": tfemb.FeatureConfig(table, output_shape=[4], name="f")}


def _train_v2(embedding):
  ids = {"f": tf.constant([1, 5, 1, 9])}
  with tf.GradientTape() as tape:
    activations, preserved = embedding(ids)
    tape.watch(activations)
    loss = tf.reduce_sum(tf.sin(activations["f"]))
  embedding.apply_gradients(tape.gradient(loss, activations), preserved)


def _make(generation, name="t"):
  if generation == "TPUEmbeddingV2":
    return tfemb.TPUEmbeddingV2(_v2_config(name), tfemb.Adagrad(0.1))
  table = tfemb.TableConfig(16, 4, name=name)
  return tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                            tfemb.Adagrad(0.1))


def _train(embedding):
  if isinstance(embedding, tfemb.TPUEmbeddingV2):
    _train_v2(embedding)
    return
  embedding.enqueue({"f": tf.constant([1, 5, 1, 9])}, training=True)
  embedding.dequeue()
  embedding.apply_gradients({"f": tf.ones([4, 4])})


@pytest.mark.parametrize("generation", [
    "TPUEmbedding",
    pytest.param("TPUEmbeddingV2", marks=pytest.mark.requires_tensorflow(
        "2.17", why="the SparseCore host engine"))])
@pytest.mark.parametrize("write", ["save", "write"])
def test_the_engine_as_a_checkpoints_root_saves_and_restores(
    generation, write, tmp_path):
  # `tf.train.Checkpoint(root=engine)` keeps its save counter (and `root`)
  # on the engine: not tables of another configuration.
  saved = _make(generation)
  _train(saved)
  path = getattr(tf.train.Checkpoint(root=saved), write)(
      str(tmp_path / "ckpt"))
  restored = _make(generation)
  restored.build()
  read = "read" if write == "write" else "restore"  # TensorFlow's pairs
  getattr(tf.train.Checkpoint(root=restored), read)(path).assert_consumed()
  # By table name: TPUEmbedding keys them by TableConfig.
  tables = lambda e: {getattr(k, "name", k): np.asarray(v)  # pylint: disable=g-long-lambda
                      for k, v in e.embedding_tables.items()}
  want, got = tables(saved), tables(restored)
  assert set(got) == set(want) and want
  for name, table in want.items():
    np.testing.assert_array_equal(got[name], table, err_msg=name)
  with pytest.raises(ValueError, match="does not have|other"):
    getattr(tf.train.Checkpoint(root=_make(generation, "other")), read)(path)
