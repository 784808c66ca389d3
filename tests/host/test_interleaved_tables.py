"""Tables whose slots sit beside their parameters (the default on a CPU host).

Training, lookups, bad input and checkpoints run on this layout too (the
`engine_path` and `table_layout` fixtures); this file checks what is its
own: which tables take it, the column views as variables, their gradient,
their initialization in blocks, and export.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import io_ops  # pylint: disable=g-direct-tensorflow-import
import reference
import tfemb
from tfemb import initialization
from tfemb import interleaved_tables

VOCAB, DIM = 12, 3


@pytest.fixture(autouse=True)
def interleave():
  with tfemb.options.use(interleaved_slots=True, fused_kernels=True):
    yield


def _embedding(optimizer, **table_kwargs):
  table = tfemb.TableConfig(VOCAB, DIM, name="t", **table_kwargs)
  return table, tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   optimizer)


def _is_view(v):
  return isinstance(v, interleaved_tables.ColumnView)


def test_tables_with_slots_are_interleaved_and_others_are_not():
  _, adam = _embedding(tfemb.Adam(0.1))
  adam.build()
  variables = adam._variables["t"]
  assert list(variables) == ["momenta", "velocities", "parameters"]
  assert all(_is_view(v) for v in variables.values())
  storage = variables["parameters"].interleaved_storage
  assert storage.shape == (VOCAB, 3 * DIM)
  assert all(v.interleaved_storage is storage for v in variables.values())

  for plain in (tfemb.SGD(0.1), tfemb.Adam(0.1, lazy_adam=False)):
    _, embedding = _embedding(plain)
    embedding.build()
    assert not any(_is_view(v) for v in embedding._variables["t"].values())

  with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    _, mirrored = _embedding(tfemb.Adagrad(0.1))
  mirrored.build()
  assert not any(_is_view(v) for v in mirrored._variables["t"].values())

  for off in ({"interleaved_slots": False}, {"fused_kernels": False}):
    with tfemb.options.use(**off):
      _, embedding = _embedding(tfemb.Adam(0.1))
    embedding.build()  # as the options were when it was constructed
    assert not any(_is_view(v) for v in embedding._variables["t"].values())


def _built_views(optimizer, offset=0.0):
  """Rows 0, 1, 2, ... + offset in a built table of `optimizer`: (those
  values, the table's variables by name: its views)."""
  start = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM)
  start += offset
  _, embedding = _embedding(optimizer,
                            initializer=tf.constant_initializer(start))
  embedding.build()
  return start, embedding._variables["t"]


def _adagrad_views(offset=0.0):
  """As _built_views, with Adagrad (accumulators 0.5): (the values, the
  parameters' view, the accumulators' view)."""
  start, variables = _built_views(
      tfemb.Adagrad(0.1, initial_accumulator_value=0.5), offset)
  return start, variables["parameters"], variables["accumulators"]


def test_a_view_reads_and_writes_its_columns_only():
  start, table, accumulators = _adagrad_views()
  assert isinstance(table, tf.Variable)
  assert table.shape == (VOCAB, DIM) and table.dtype == tf.float32
  assert table.name == "t:0" and accumulators.name == "t/accumulators:0"
  assert table.trainable and not accumulators.trainable
  np.testing.assert_array_equal(table.numpy(), start)
  np.testing.assert_array_equal(tf.convert_to_tensor(accumulators),
                                np.full((VOCAB, DIM), 0.5))
  np.testing.assert_array_equal((table + 1).numpy(), start + 1)
  np.testing.assert_array_equal(tf.gather(table, [4, 1]), start[[4, 1]])

  accumulators.assign(np.full((VOCAB, DIM), 2.0))
  np.testing.assert_array_equal(accumulators.numpy(), 2.0)
  np.testing.assert_array_equal(table.numpy(), start)  # untouched
  storage = table.interleaved_storage.numpy()
  np.testing.assert_array_equal(storage[:, :DIM], start)
  np.testing.assert_array_equal(storage[:, DIM:], 2.0)

  with pytest.raises(ValueError, match=r"shape \(12, 4\).*t:0.*\(12, 3\)"):
    table.assign(np.zeros((VOCAB, DIM + 1), np.float32))
  np.testing.assert_array_equal(table.numpy(), start)


def _reference_scatter(array, method, rows, values):
  """numpy: tf.Variable's scatter `method` of `values` at `rows` (repeats
  accumulate for add/sub/mul/div/max/min, the last one wins for update)."""
  out = array.copy()
  for r, v in zip(rows, values):
    out[r] = {"update": lambda a, b: b, "add": np.add, "sub": np.subtract,
              "mul": np.multiply, "div": np.divide, "max": np.maximum,
              "min": np.minimum}[method](out[r], v)
  return out


@pytest.mark.parametrize("in_function", [False, True])
@pytest.mark.parametrize("method",
                         ["update", "add", "sub", "mul", "div", "max", "min"])
def test_a_view_scatters_into_its_columns_only(method, in_function):
  start, table, accumulators = _adagrad_views(offset=1.0)
  rows = np.array([4, 1, 9], np.int64)  # distinct: mul/div read, then write
  values = np.array([[2, -3, 0.5], [7, 8, 9], [-1, 4, 2]], np.float32)
  delta = tf.IndexedSlices(tf.constant(values), tf.constant(rows))
  scatter = getattr(table, f"scatter_{method}")
  if in_function:

    @tf.function
    def step():
      scatter(delta)

    step()
  else:
    assert scatter(delta) is table
  np.testing.assert_allclose(table.numpy(),
                             _reference_scatter(start, method, rows, values),
                             rtol=1e-7)
  np.testing.assert_array_equal(accumulators.numpy(), 0.5)


@pytest.mark.parametrize("method", ["update", "add", "sub", "max", "min"])
def test_a_view_scatters_nd_by_rows_and_by_elements(method):
  start, variables = _built_views(tfemb.Adam(0.1))
  table = variables["parameters"]
  # A repeated row or element accumulates; for "update" TensorFlow leaves
  # the winner open, so there no position repeats.
  repeat = method != "update"
  rows = np.array([[3], [3 if repeat else 7], [0]])
  values = np.array([[1, 2, 3], [10, 20, 30], [-5, 50, -6]], np.float32)
  getattr(table, f"scatter_nd_{method}")(rows, values)
  expected = _reference_scatter(start, method, rows[:, 0], values)
  np.testing.assert_array_equal(table.numpy(), expected)

  elements = np.array([[2, 0], [5, 2], [2, 0 if repeat else 1]])
  deltas = np.array([1.5, -2.0, 4.0], np.float32)
  getattr(table, f"scatter_nd_{method}")(elements, deltas)
  for (r, c), d in zip(elements, deltas):
    expected[r, c] = _reference_scatter(expected[r, c:c + 1], method, [0],
                                        [d])[0]
  np.testing.assert_array_equal(table.numpy(), expected)
  for slot in ("momenta", "velocities"):  # the other columns
    np.testing.assert_array_equal(variables[slot].numpy(), 0)


def test_a_view_passes_for_a_variable_where_numpy_and_keras_take_one():
  start, table, accumulators = _adagrad_views()
  np.testing.assert_array_equal(np.asarray(table), start)
  assert np.asarray(table, np.float64).dtype == np.float64
  with warnings.catch_warnings():  # numpy 2's protocol, no deprecation
    warnings.simplefilter("error")
    np.testing.assert_array_equal(np.array(table, copy=True), start)
    with pytest.raises(ValueError, match="always copied"):
      table.__array__(copy=False)  # what numpy 2's asarray(copy=False) asks
  np.testing.assert_array_equal(table.read_value_no_copy(), start)
  table.set_shape([VOCAB, None])
  with pytest.raises(ValueError, match="t:0"):
    table.set_shape([VOCAB + 1, DIM])
  assert table._unique_id != accumulators._unique_id

  # A Keras optimizer (not tfemb's) steps a view as a plain variable, with
  # a dense gradient and with a gradient of some rows.
  dense = np.full((VOCAB, DIM), 0.5, np.float32)
  rows, values = np.array([2, 7]), np.array([[1, 2, 3], [4, 5, 6]], np.float32)
  optimizer = tf.keras.optimizers.SGD(learning_rate=0.25)
  optimizer.apply_gradients([(tf.constant(dense), table)])
  optimizer.apply_gradients(
      [(tf.IndexedSlices(tf.constant(values), tf.constant(rows),
                         tf.constant([VOCAB, DIM])), table)])
  oracle = reference.Table(start, "sgd", {})
  oracle.apply(dict(enumerate(dense)), 0.25)  # every row
  oracle.apply(reference.row_gradients(zip(rows, values)), 0.25)
  np.testing.assert_allclose(table.numpy(), oracle.w, rtol=1e-6)
  np.testing.assert_array_equal(accumulators.numpy(), 0.5)


def test_the_gradient_of_a_lookup_is_the_tables():
  """A direct lookup is differentiable with respect to the table, as with a
  plain variable: the gradient of a gather of a [rows, dim] variable."""
  _, embedding = _embedding(tfemb.Adam(0.1))
  table = embedding.embedding_tables[embedding._table_config[0]]
  ids = tf.constant([2, 7, 2], tf.int64)
  with tf.GradientTape() as tape:
    rows = tf.gather(table, ids)
    loss = tf.reduce_sum(rows * tf.constant([[1.0], [2.0], [3.0]]))
  grad = tape.gradient(loss, table)
  assert isinstance(grad, tf.IndexedSlices)
  dense = tf.convert_to_tensor(grad).numpy()
  want = reference.dense(reference.row_gradients(
      zip([2, 7, 2], np.full((3, DIM), [[1.0], [2.0], [3.0]]))), (VOCAB, DIM))
  np.testing.assert_array_equal(dense, want)

  @tf.function
  def lookup(ids):
    return embedding({"f": ids})["f"]

  for look in (lambda ids: embedding({"f": ids})["f"], lookup):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(look(tf.constant([5, 5, 0])))
    grad = tape.gradient(loss, table)
    assert grad.dense_shape.numpy().tolist() == [VOCAB, DIM]
    np.testing.assert_array_equal(
        tf.convert_to_tensor(grad).numpy()[[0, 5, 6]],
        [[1.0] * DIM, [2.0] * DIM, [0.0] * DIM])


def test_big_tables_are_initialized_in_blocks_of_rows(monkeypatch):
  monkeypatch.setattr(initialization, "BLOCK_BYTES", 64)  # 5 rows a block
  rows = 4000
  table = tfemb.TableConfig(rows, 4, name="t", initializer=(
      tf.keras.initializers.RandomUniform(-1.0, 1.0)))
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                 tfemb.Adagrad(0.1,
                                               initial_accumulator_value=0.25))
  embedding.build()
  params = embedding._variables["t"]["parameters"]
  assert isinstance(params, interleaved_tables.ColumnView)
  values = params.numpy()
  # Uniform on [-1, 1): mean 0, variance 1/3; every block drawn anew.
  assert abs(values.mean()) < 0.03 and abs(values.var() - 1 / 3) < 0.02
  assert len(np.unique(values[:5])) == 20 and not np.array_equal(
      values[:5], values[5:10])
  np.testing.assert_array_equal(
      embedding._variables["t"]["accumulators"].numpy(), 0.25)


def test_a_restore_as_tables_are_created_reads_each_view_once(
    monkeypatch, tmp_path):
  """A checkpoint restored before build: each view is written from the
  checkpoint as it is created, and the deferred restore does not read it a
  second time."""
  rows = 600
  start = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32)
  accumulators = np.random.default_rng(1).uniform(
      0.1, 1.0, size=(rows, 4)).astype(np.float32)
  saved = tf.train.Checkpoint(
      emb=_saved_tables(rows, start, accumulators)).write(str(tmp_path / "c"))
  reads = []  # the tensor names of every RestoreV2 TensorFlow runs
  real_restore_v2 = io_ops.restore_v2

  def restore_v2(*args, **kwargs):
    names = kwargs["tensor_names"] if "tensor_names" in kwargs else args[1]
    reads.extend(tf.compat.as_str(n) for n in names)
    return real_restore_v2(*args, **kwargs)

  monkeypatch.setattr(io_ops, "restore_v2", restore_v2)
  embedding = _adagrad_tables(rows)
  status = tf.train.Checkpoint(emb=embedding).read(saved)
  embedding.build()
  status.assert_consumed()
  np.testing.assert_array_equal(
      embedding._variables["t"]["parameters"].numpy(), start)
  np.testing.assert_array_equal(
      embedding._variables["t"]["accumulators"].numpy(), accumulators)
  assert sorted(n for n in reads if "emb/t" in n) == [
      "emb/t.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE",
      "emb/t/.ATTRIBUTES/VARIABLE_VALUE"]


@pytest.mark.requires_tensorflow(
    "2.17", why="its checkpoint adapters run the restore pre-check")
def test_a_restore_of_another_shape_names_the_table(tmp_path):
  saved = tf.train.Checkpoint(emb=_saved_tables(
      500, np.zeros((500, 4), np.float32), np.ones((500, 4), np.float32))
  ).write(str(tmp_path / "c"))
  embedding = _adagrad_tables(600)
  with pytest.raises(ValueError, match=r"Table 't'.*\(600, 4\)"):
    tf.train.Checkpoint(emb=embedding).read(saved)  # refused before build


def _adagrad_tables(rows, **table_kwargs):
  table = tfemb.TableConfig(rows, 4, name="t", **table_kwargs)
  return tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                            tfemb.Adagrad(0.1))


def _saved_tables(rows, start, accumulators):
  embedding = _adagrad_tables(
      rows, initializer=tf.constant_initializer(start))
  embedding.build()
  embedding._variables["t"]["accumulators"].assign(accumulators)
  return embedding


def test_a_saved_model_looks_up_like_the_object(tmp_path):
  _, embedding = _embedding(tfemb.Adam(0.1))
  embedding.build()
  module = tf.Module()
  module.embedding = embedding

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
  def lookup(ids):
    return embedding({"f": ids})["f"]

  module.lookup = lookup
  ids = tf.constant([3, 0, 11], tf.int64)
  want = lookup(ids).numpy()
  tf.saved_model.save(module, str(tmp_path / "model"))
  loaded = tf.saved_model.load(str(tmp_path / "model"))
  np.testing.assert_array_equal(loaded.lookup(ids).numpy(), want)
  # Only TensorFlow's ops: the model loads where tfemb is not installed.
  proto = saved_model_pb2.SavedModel()
  proto.ParseFromString((tmp_path / "model" / "saved_model.pb").read_bytes())
  graph = proto.meta_graphs[0].graph_def
  types = {n.op for n in graph.node}
  types |= {n.op for f in graph.library.function for n in f.node_def}
  assert "ResourceGather" in types
  assert not [t for t in types if t.startswith("Tfemb")], types
