"""A restore is all or nothing (docs/numerics.md, "Checkpoints"): a
checkpoint refused for any table changes no table or slot, before or after
`build`, and the object stays usable: a later correct restore or build
works. A checkpoint without this optimizer's slots leaves them as they are.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfemb


def make_embedding(dim_b=2, optimizer=None, extra_table=False):
  a = tfemb.TableConfig(6, 3, name="a",
                        initializer=tf.constant_initializer(1.0))
  b = tfemb.TableConfig(5, dim_b, name="b",
                        initializer=tf.constant_initializer(2.0))
  features = {"fa": tfemb.FeatureConfig(a), "fb": tfemb.FeatureConfig(b)}
  if extra_table:
    features["fc"] = tfemb.FeatureConfig(
        tfemb.TableConfig(4, 2, name="c"))
  return tfemb.TPUEmbedding(features, optimizer or tfemb.Adagrad(0.1))


def fill(embedding, value):
  """Every table and slot set to `value` (+ 0.5 for the slots)."""
  for variables in embedding.variables.values():
    for name, v in variables.items():
      v.assign(tf.fill(v.shape, value + (0.0 if name == "parameters" else
                                         0.5)))


def save(embedding, tmp_path, name):
  return tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / name))


def checkpoints(tmp_path, source):
  """A refused checkpoint of `source` (everything 7, slots 7.5) and a good
  one (everything 3, slots 3.5)."""
  good_source = make_embedding()
  paths = []
  for embedding, value, name in ((source, 7.0, "bad"),
                                 (good_source, 3.0, "good")):
    embedding.build()
    fill(embedding, value)
    paths.append(save(embedding, tmp_path, name))
  return paths


def snapshot(embedding):
  return {(t.name, n): v.numpy().copy()
          for t, variables in embedding.variables.items()
          for n, v in variables.items()}


def assert_all(embedding, value):
  for (table, name), got in snapshot(embedding).items():
    expected = value + (0.0 if name == "parameters" else 0.5)
    np.testing.assert_array_equal(got, np.full_like(got, expected),
                                  err_msg=f"{table}/{name}")


# Checkpoints refused for their second table.
REFUSED = {
    "b has another dim": lambda: make_embedding(dim_b=4),
    "another table": lambda: make_embedding(extra_table=True),
    "another optimizer": lambda: make_embedding(optimizer=tfemb.Adam(0.1)),
}
MESSAGES = {
    "b has another dim": r"Table 'b' \(b\): expected shape \(5, 2\)",
    "another table": "embedding table 'c'",
    "another optimizer": "slot 'momenta' of table 'a'",
}


@pytest.mark.requires_tensorflow(
    "2.17", why="its checkpoint adapters run the restore pre-check")
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_restore_changes_nothing(table_layout, tmp_path, case):
  bad, good = checkpoints(tmp_path, REFUSED[case]())

  embedding = make_embedding()
  embedding.build()
  fill(embedding, 5.0)
  with pytest.raises(ValueError, match=MESSAGES[case]):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  assert_all(embedding, 5.0)
  tf.train.Checkpoint(embedding=embedding).restore(good).assert_consumed()
  assert_all(embedding, 3.0)


@pytest.mark.requires_tensorflow(
    "2.17", why="its checkpoint adapters run the restore pre-check")
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_restore_before_build_leaves_the_object_usable(
    table_layout, tmp_path, case):
  bad, good = checkpoints(tmp_path, REFUSED[case]())

  embedding = make_embedding()
  with pytest.raises(ValueError, match=MESSAGES[case]):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  embedding.build()  # nothing of the refused checkpoint is waiting
  np.testing.assert_array_equal(embedding.variables["a"]["parameters"],
                                np.ones((6, 3)))
  np.testing.assert_array_equal(embedding.variables["b"]["accumulators"],
                                np.full((5, 2), 0.1, np.float32))
  tf.train.Checkpoint(embedding=embedding).restore(good).assert_consumed()
  assert_all(embedding, 3.0)


@pytest.mark.requires_tensorflow(
    "2.17", why="its checkpoint adapters run the restore pre-check")
def test_refused_restore_before_build_then_good_restore_before_build(
    tmp_path):
  bad, good = checkpoints(tmp_path, make_embedding(dim_b=4))
  embedding = make_embedding()
  with pytest.raises(ValueError, match="Table 'b'"):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  tf.train.Checkpoint(embedding=embedding).restore(good)
  embedding.build()
  assert_all(embedding, 3.0)


def test_sgd_checkpoint_leaves_trained_slots_as_they_are(tmp_path):
  """As TensorFlow's TPUEmbedding with tf.train.Checkpoint: slots absent
  from the checkpoint keep their current values."""
  source = make_embedding(optimizer=tfemb.SGD(0.1))
  source.build()
  fill(source, 3.0)
  path = save(source, tmp_path, "sgd")
  embedding = make_embedding()
  embedding.build()
  fill(embedding, 5.0)  # "trained" accumulators: 5.5
  tf.train.Checkpoint(embedding=embedding).restore(path)
  for table in ("a", "b"):
    variables = embedding.variables[table]
    np.testing.assert_array_equal(
        variables["parameters"],
        np.full(variables["parameters"].shape, 3.0, np.float32))
    np.testing.assert_array_equal(
        variables["accumulators"],
        np.full(variables["accumulators"].shape, 5.5, np.float32))


# --- a checkpoint that cannot be read ----------------------------------------


def make_v2():
  """Tables "a" and "b" of the SparseCore generation (stacked as "a_b")."""
  return tfemb.TPUEmbeddingV2(
      {f"f{t.name}": tfemb.FeatureConfig(t, output_shape=[2]) for t in (
          tfemb.TableConfig(6, 4, name="a",
                            initializer=tf.constant_initializer(1.0)),
          tfemb.TableConfig(5, 4, name="b",
                            initializer=tf.constant_initializer(2.0)))},
      tfemb.Adagrad(0.1))


ENGINES = {"TPUEmbedding": make_embedding, "TPUEmbeddingV2": make_v2}
# What creates the tables of an object not yet built.
FIRST_USES = {
    "build": lambda e: e.build(),
    "variables": lambda e: e.variables,
    "lookup": lambda e: e({"fa": tf.constant([1, 2]),
                           "fb": tf.constant([0, 4])}),
}


def damaged_checkpoint(tmp_path, make):
  """A checkpoint of `make()` (everything 9, slots 9.5) whose data file has
  a table's bytes changed."""
  source = make()
  source.build()
  fill(source, 9.0)
  path = save(source, tmp_path, "damaged")
  data = next(tmp_path.glob("damaged-1.data-*"))
  content = bytearray(data.read_bytes())
  start = content.index(np.full(4, 9.0, np.float32).tobytes())
  content[start:start + 16] = np.full(4, 8.0, np.float32).tobytes()
  data.write_bytes(bytes(content))
  return path


def unstacked_snapshot(embedding):
  return {(str(getattr(t, "name", t)), n): v.numpy().copy()
          for t, variables in embedding.variables.items()
          for n, v in variables.items()}


@pytest.mark.requires_tensorflow("2.17", why="TPUEmbeddingV2's stacker")
@pytest.mark.parametrize("first_use", sorted(FIRST_USES))
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_damaged_checkpoint_restored_before_build(table_layout, tmp_path,
                                                     engine, first_use):
  """`read()` defers the restore; the first use that creates the tables
  says the checkpoint cannot be read and drops the restore; the next
  creates them as if it had not been tried. A built object refuses the
  file with nothing changed."""
  make = ENGINES[engine]
  path = damaged_checkpoint(tmp_path, make)
  fresh = make()
  fresh.build()
  want = unstacked_snapshot(fresh)
  with pytest.raises(tf.errors.DataLossError, match="Checksum"):
    tf.train.Checkpoint(embedding=fresh).read(path)
  np.testing.assert_equal(unstacked_snapshot(fresh), want)

  embedding = make()
  tf.train.Checkpoint(embedding=embedding).read(path)
  with pytest.raises(tf.errors.DataLossError,
                     match="cannot be read, so nothing of it was restored"):
    FIRST_USES[first_use](embedding)
  FIRST_USES[first_use](embedding)
  np.testing.assert_equal(unstacked_snapshot(embedding), want)
