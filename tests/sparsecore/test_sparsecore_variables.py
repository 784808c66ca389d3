"""The host `TPUEmbeddingV2`'s stacked variables over each table's own
variable (docs/sparsecore.md, "Stacked tables and checkpoints"): read,
assigned, trained, saved and restored in TensorFlow's stacked layout.

Expected stacked arrays are built in numpy from each table's layout proto
(TensorFlow's stacker) with the row formula of docs/sparsecore.md.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
from tensorflow.python.tpu import tpu_embedding_v3_utils
from tensorflow.python.trackable import autotrackable

import reference
from sparsecore_scenario import BATCH, DIM, VOCAB, make, rows
import tfemb
from tfemb import initialization

# The SparseCore host engine needs TensorFlow's stacker (2.17 on).
pytestmark = pytest.mark.requires_tensorflow("2.17")
STACK = "a_b_c"  # the three tables of `make`, one stack of width 8
LR = 0.3


def stacked_array(embedding, tables, fill=0.0):
  """The stack's variable holding `tables` ({name: [vocab, dim]}) at the
  rows of docs/sparsecore.md, `fill` elsewhere."""
  layouts = embedding.embedding_layouts
  proto = layouts["a"]
  shape = (proto.total_rows_per_sparse_core_shard * proto.num_sparse_cores,
           proto.unsharded_padded_shape[1])
  out = np.full(shape, fill, np.float32)
  for name, value in tables.items():
    out[rows(layouts[name], VOCAB[name]), :DIM[name]] = value
  return out


def random_tables(seed):
  rng = np.random.default_rng(seed)
  return {n: rng.normal(size=(VOCAB[n], DIM[n])).astype(np.float32)
          for n in VOCAB}


def features():
  return {"x": tf.constant([3, 3, 19, 0], tf.int64),
          "y": tf.ragged.constant([[1, 3], [19], [0, 0, 5], [7]], tf.int64),
          "z": tf.sparse.from_dense(tf.constant(
              [[11, 0], [2, 2], [0, 0], [11, 4]], tf.int64)),
          "w": tf.constant([8, 0, 4, 8], tf.int32)}


def numpy_activations(tables):
  """The activations of `features()` (combiners of `make`: a mean, b sum,
  c sqrtn; the sparse tensor's explicit entries only)."""
  a, b, c = tables["a"], tables["b"], tables["c"]
  y = [[1, 3], [19], [0, 0, 5], [7]]
  z = [[11], [2, 2], [], [11, 4]]
  return {"x": a[[3, 3, 19, 0]],
          "y": np.stack([a[r].mean(axis=0) for r in y]),
          "z": np.stack([b[r].sum(axis=0) if r else np.zeros(DIM["b"])
                         for r in z]),
          "w": c[[8, 0, 4, 8]]}


def assert_activations(embedding, tables):
  activations, _ = embedding(features())
  for name, want in numpy_activations(tables).items():
    np.testing.assert_allclose(activations[name].numpy(), want, rtol=1e-6,
                               atol=1e-6, err_msg=name)


def test_assigned_stacked_values_are_what_the_tables_look_up():
  embedding, _ = make(tfemb.SGD(LR))
  embedding.build()
  tables = random_tables(1)
  value = stacked_array(embedding, tables, fill=-7.0)  # padding kept too
  embedding.embedding_tables[STACK].assign(value)
  np.testing.assert_array_equal(embedding.embedding_tables[STACK].numpy(),
                                value)
  assert_activations(embedding, tables)


def test_a_step_writes_the_touched_rows_of_the_stacked_layout():
  embedding, _ = make(tfemb.SGD(LR))
  embedding.build()
  tables = random_tables(2)
  embedding.embedding_tables[STACK].assign(stacked_array(embedding, tables))
  _, preserved = embedding(features())
  ones = {k: tf.ones([BATCH, DIM[t]]) for k, t in
          (("x", "a"), ("y", "a"), ("z", "b"), ("w", "c"))}
  embedding.apply_gradients(ones, preserved)
  coef = {k: v.numpy().astype(np.float64) for k, v in ones.items()}
  pairs = {"a": reference.contributions([[3], [3], [19], [0]], "mean",
                                        coef["x"]) +
                reference.contributions([[1, 3], [19], [0, 0, 5], [7]],
                                        "mean", coef["y"]),
           "b": reference.contributions([[11], [2, 2], [], [11, 4]], "sum",
                                        coef["z"]),
           "c": reference.contributions([[8], [0], [4], [8]], "sqrtn",
                                        coef["w"])}
  want = {}
  for name, value in tables.items():
    table = reference.Table(value, "sgd", {"learning_rate": LR})
    table.apply(reference.row_gradients(pairs[name]), LR)
    want[name] = table.w
  np.testing.assert_allclose(embedding.embedding_tables[STACK].numpy(),
                             stacked_array(embedding, want), rtol=1e-6,
                             atol=1e-6)


def trained(optimizer):
  embedding, _ = make(optimizer)
  _, preserved = embedding(features())
  embedding.apply_gradients(
      {k: tf.fill([BATCH, DIM[t]], 0.5) for k, t in
       (("x", "a"), ("y", "a"), ("z", "b"), ("w", "c"))}, preserved)
  return embedding


def state(embedding):
  return {f"{t}/{n}": v.numpy() for t, slots in embedding.variables.items()
          for n, v in slots.items()}


def test_a_checkpoint_holds_each_stacked_variable_as_one_tensor(tmp_path):
  embedding = trained(tfemb.Adagrad(LR))
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
  reader = tf.train.load_checkpoint(path)
  shapes = reader.get_variable_to_shape_map()
  for key, value in ((f"embedding/{STACK}/.ATTRIBUTES/VARIABLE_VALUE",
                      state(embedding)[f"{STACK}/parameters"]),
                     (f"embedding/{STACK}.Saccumulators/.ATTRIBUTES/"
                      "VARIABLE_VALUE",
                      state(embedding)[f"{STACK}/accumulators"])):
    assert shapes[key] == list(value.shape)
    np.testing.assert_array_equal(reader.get_tensor(key), value)


class _Whole(autotrackable.AutoTrackable):
  """Plain variables under the engine's checkpoint names, and TensorFlow's
  layouts trackable: a checkpoint whose stacked tensors are saved whole."""

  def __init__(self, values, layouts):
    super().__init__()
    for name, value in values.items():
      self._track_trackable(tf.Variable(value), name=name)
    proto = sparse_core_layout_pb2.SparseCoreTableLayouts()
    proto.tables.extend(layouts.values())
    self._track_trackable(
        tpu_embedding_v3_utils.SparseCoreLayoutsTrackable(
            tf.constant(proto.SerializeToString())),
        name=tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)


@pytest.mark.parametrize("built", [False, True], ids=["unbuilt", "built"])
def test_restores_stacked_tensors_saved_whole(built, tmp_path):
  source = trained(tfemb.Adagrad(LR))
  values = {STACK: source.variables[STACK]["parameters"].numpy(),
            f"{STACK}/accumulators":
                source.variables[STACK]["accumulators"].numpy()}
  path = tf.train.Checkpoint(
      embedding=_Whole(values, source.embedding_layouts)).save(
      str(tmp_path / "whole"))
  embedding, _ = make(tfemb.Adagrad(LR))
  if built:
    embedding.build()
  status = tf.train.Checkpoint(embedding=embedding).restore(path)
  embedding.build()  # unbuilt: restored as the tables are created
  status.assert_consumed()
  for key, value in state(source).items():
    np.testing.assert_array_equal(state(embedding)[key], value, err_msg=key)
  # The restored rows are the ones the tables look up and train.
  want = {n: values[STACK][rows(embedding.embedding_layouts[n],
                                VOCAB[n]), :DIM[n]] for n in VOCAB}
  assert_activations(embedding, want)


@pytest.mark.parametrize("built", [False, True], ids=["unbuilt", "built"])
def test_round_trip_through_a_checkpoint(built, tmp_path):
  source = trained(tfemb.Adam(0.05))
  path = tf.train.Checkpoint(embedding=source).save(str(tmp_path / "c"))
  embedding, _ = make(tfemb.Adam(0.05))
  if built:
    embedding.build()
  status = tf.train.Checkpoint(embedding=embedding).restore(path)
  embedding.build()
  status.assert_consumed()
  for key, value in state(source).items():
    np.testing.assert_array_equal(state(embedding)[key], value, err_msg=key)


def test_an_async_save_holds_the_values_of_its_call(tmp_path):
  embedding = trained(tfemb.Adagrad(LR))
  saved = state(embedding)
  checkpoint = tf.train.Checkpoint(embedding=embedding)
  options = tf.train.CheckpointOptions(
      experimental_enable_async_checkpoint=True)
  path = checkpoint.save(str(tmp_path / "async"), options=options)
  trained_on = embedding
  _, preserved = trained_on(features())  # training goes on
  trained_on.apply_gradients(
      {k: tf.ones([BATCH, DIM[t]]) for k, t in
       (("x", "a"), ("y", "a"), ("z", "b"), ("w", "c"))}, preserved)
  checkpoint.sync()
  fresh, _ = make(tfemb.Adagrad(LR))
  status = tf.train.Checkpoint(embedding=fresh).restore(path)
  fresh.build()
  status.assert_consumed()
  for key, value in saved.items():
    np.testing.assert_array_equal(state(fresh)[key], value, err_msg=key)


def test_assign_refuses_another_shape():
  embedding, _ = make(tfemb.SGD(LR))
  table = embedding.embedding_tables[STACK]
  with pytest.raises(ValueError, match="Cannot assign a value of shape"):
    table.assign(np.zeros((3, 8), np.float32))


def test_a_slot_creation_fn_makes_each_tables_slots():
  """TensorFlow calls `slot_variable_creation_fn` with the table's variable;
  the host calls it once per table of a stack, with the table's own, and
  trains the slots it returns."""
  made = []

  def create_slots(table, slot_names, slot_initializers):
    made.append(table.shape.as_list())
    return {name: tf.Variable(init(table.shape, dtype=tf.float32),
                              trainable=False, name=name)
            for name, init in zip(slot_names, slot_initializers)}

  custom = trained(tfemb.Adagrad(
      LR, slot_variable_creation_fn=create_slots))
  plain = trained(tfemb.Adagrad(LR))
  layouts = custom.embedding_layouts
  assert sorted(made) == sorted(
      [[layouts[n].unsharded_padded_shape[0], 8] for n in VOCAB])
  for key, value in state(plain).items():
    np.testing.assert_allclose(state(custom)[key], value, rtol=1e-6,
                               err_msg=key)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "in_blocks"])
def test_big_tables_are_filled_in_place_at_their_rows(optimizer, blocks,
                                                      monkeypatch):
  """Each id's initial row at its stacked row, padding zero, whether a
  table is initialized whole or (big) block by block in place (here with
  blocks of 5 rows); TensorFlow's `RowIdInitializer` makes every row its
  own id, plus an offset."""
  if blocks:
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 5 * 8 * 4)
  tables = {n: tfemb.TableConfig(VOCAB[n], DIM[n], name=n,
                                 initializer=tfemb.RowIdInitializer(offset=k))
            for k, n in enumerate(VOCAB)}
  opt = tfemb.SGD(LR) if optimizer == "sgd" else tfemb.Adagrad(LR)
  embedding = tfemb.TPUEmbeddingV2(
      {n: tfemb.FeatureConfig(t, output_shape=[BATCH])
       for n, t in tables.items()}, opt)
  embedding.build()
  want = stacked_array(embedding, {
      n: np.tile(np.arange(VOCAB[n], dtype=np.float32)[:, None] + k,
                 (1, DIM[n])) for k, n in enumerate(VOCAB)})
  np.testing.assert_array_equal(embedding.embedding_tables[STACK].numpy(),
                                want)
