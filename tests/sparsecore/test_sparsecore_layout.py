"""`tfemb.sparsecore.table_stacking` stacks and lays out tables as
TensorFlow 2.21's `TPUEmbeddingV2` does.

The expected numbers come from TensorFlow's own code, all of which runs on
the CPU: `_stack_tables_with_same_table_dim_and_optimizer` (on TensorFlow's
clones of TensorFlow's configs), `TpuEmbeddingV3CheckpointAdapter` (which
makes a SparseCore checkpoint value out of unstacked tables, or out of
another SparseCore layout), `TPUEmbeddingForServing` (which reads stacked
checkpoints back into tables) and `tpu_embedding_v3_utils.map_indices_in_shard`;
or from a few lines of numpy written here from TensorFlow's formulas.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
# pylint: disable=g-direct-tensorflow-import,protected-access
from tensorflow.python.tpu import _pywrap_sparse_core_layout
from tensorflow.python.tpu import tpu_embedding_v3
from tensorflow.python.tpu import tpu_embedding_v3_checkpoint_adapter as adapter_lib
from tensorflow.python.tpu import tpu_embedding_v3_utils
from tensorflow.python.trackable import base as trackable_base
from tensorflow.python.util import nest
# pylint: enable=g-direct-tensorflow-import

import tfemb
from tfemb.sparsecore import table_stacking

tf_emb = tf.tpu.experimental.embedding
SC_PER_CHIP = 4


def feature_config(module):
  """a and b stack (dim 4 -> 8, same optimizer); c has another padded width
  (12 -> 16); d has another optimizer. Rows pad to 8 * SparseCores."""
  sgd = module.SGD(0.1)
  a = module.TableConfig(10, 4, name="a", optimizer=sgd)
  b = module.TableConfig(50, 4, name="b", optimizer=module.SGD(0.1))
  c = module.TableConfig(7, 12, name="c", optimizer=sgd)
  d = module.TableConfig(20, 4, name="d", optimizer=module.Adagrad(0.1))
  return {
      "f_a": module.FeatureConfig(a, output_shape=[16]),
      "f_b": module.FeatureConfig(b, output_shape=[16, 3]),
      "f_b2": module.FeatureConfig(b, output_shape=[16]),
      "f_c": module.FeatureConfig(c, output_shape=[16]),
      "f_d": module.FeatureConfig(d, output_shape=[16]),
  }


def flat(config):
  return nest.flatten_with_joined_string_paths(config)


def tables_of(config):
  tables = []
  for _, feature in flat(config):
    if feature.table not in tables:
      tables.append(feature.table)
  return tables


def tensorflow_stacking(config, partitions, disable=False):
  """TensorFlow's TableStacking, computed on its clones of `config`."""
  clone = tpu_embedding_v3._clone_feature_config(config)
  return tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
      tables_of(clone), flat(clone), partitions, SC_PER_CHIP,
      tf_emb.SparseCoreEmbeddingConfig(disable_table_stacking=disable))


def ours(config, partitions, disable=False):
  return table_stacking.stack(
      tables_of(config), flat(config), partitions, SC_PER_CHIP,
      tf_emb.SparseCoreEmbeddingConfig(disable_table_stacking=disable))


def distinct_arrays(stacking):
  """Every table row and column a distinct nonzero value."""
  return {
      name: (1000 * (i + 1) + 16 * np.arange(t.vocabulary_size)[:, None] +
             np.arange(t.dim)[None, :]).astype(np.float32)
      for i, (name, t) in enumerate(stacking.tables.items())
  }


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("disable", [False, True])
@pytest.mark.parametrize("module", [tf_emb, tfemb], ids=["tf", "tfemb"])
def test_stacking_is_tensorflows(partitions, disable, module):
  expected = tensorflow_stacking(feature_config(tf_emb), partitions, disable)
  got = ours(feature_config(module), partitions, disable)
  assert got.embedding_layouts() == expected.table_to_layout
  assert list(got.embedding_layouts()) == list(expected.table_to_layout)
  assert {n: s.table_names for n, s in got.stacked_tables.items()} == {
      n: tuple(t.name for t in ts)
      for n, ts in expected.stacked_table_to_tables.items()}
  assert list(got.stacked_tables) == list(expected.stacked_table_to_tables)
  for name, tables in expected.stacked_table_to_tables.items():
    # TensorFlow's _create_variables: (sum of padded rows, padded dim).
    rows = sum(t.vocabulary_size for t in tables)
    assert got.stacked_tables[name].shape == (rows, tables[0].dim)
    assert got.stacked_tables[name].sample_count == (
        expected.table_to_sample_count[name])
  assert {n: (t.stacked_table_name, t.row_offset, t.rotation)
          for n, t in got.tables.items()} == (
              expected.table_to_stacked_table_offset)
  assert {n: t.padding_rows for n, t in got.tables.items()} == (
      expected.table_to_padding_rows)
  assert {n: t.padding_columns for n, t in got.tables.items()} == (
      expected.table_to_padding_columns)
  assert dict(got.feature_to_sample_offset) == expected.feature_to_sample_offset


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_stacking_numbers(partitions):
  n = partitions * SC_PER_CHIP
  got = ours(feature_config(tfemb), partitions)
  assert {s.name: s.table_names for s in got.stacked_tables.values()} == {
      "a_b": ("a", "b"), "c": ("c",), "d": ("d",)}
  pad = lambda v: -(-v // (8 * n)) * 8 * n
  assert got.stacked_tables["a_b"].shape == (pad(10) + pad(50), 8)
  assert got.stacked_tables["c"].shape == (pad(7), 16)
  b = got.tables["b"]
  assert (b.padded_vocabulary_size, b.padded_dim) == (pad(50), 8)
  assert (b.padding_rows, b.padding_columns) == (pad(50) - 50, 4)
  assert b.shard_row_offset == pad(10) // n and b.row_offset == pad(10)
  # The second table of a stack advances one chip: visible with 2 chips.
  assert b.rotation == (SC_PER_CHIP % n)
  assert got.tables["a"].rotation == 0
  assert got.stacked_tables["a_b"].sample_count == 16 + 48 + 16
  assert dict(got.feature_to_sample_offset) == {
      "f_a": 0, "f_b": 16, "f_b2": 64, "f_c": 0, "f_d": 0}


def test_stacking_disabled_keeps_every_table_alone():
  got = ours(feature_config(tfemb), 2, disable=True)
  assert list(got.stacked_tables) == ["a", "b", "c", "d"]
  assert all(t.rotation == 0 and t.row_offset == 0
             for t in got.tables.values())


def test_configs_are_not_changed():
  config = feature_config(tf_emb)
  before = [(t.name, t.vocabulary_size, t.dim, t.layout)
            for t in tables_of(config)]
  ours(config, 2)
  assert [(t.name, t.vocabulary_size, t.dim, t.layout)
          for t in tables_of(config)] == before


def test_only_the_first_feature_is_counted_as_in_tensorflow_2_21():
  """Two width-8 tables of 131072 samples each need 1 MiB of activations per
  SparseCore each; a stack may hold less than 2 MiB. Counted right they
  would not stack; TensorFlow 2.21 counts only the first feature, and stacks
  them (TensorFlow 2.17 to 2.20 have the same loop). Both agree with
  TensorFlow."""
  sgd = tf_emb.SGD(0.1)
  config = {
      f"f{i}": tf_emb.FeatureConfig(
          tf_emb.TableConfig(64, 8, name=f"t{i}", optimizer=sgd),
          output_shape=[131072]) for i in range(2)
  }
  expected = tensorflow_stacking(config, 1)
  got = ours(config, 1)
  assert got.embedding_layouts() == expected.table_to_layout
  assert list(got.stacked_tables) == ["t0_t1"]
  if "num_features" not in (
      _pywrap_sparse_core_layout.SparseCoreLayoutStacker.AddTable.__doc__):
    return  # TensorFlow 2.17 to 2.20: the stacker counts no features
  assert got.tables["t0"].layout.per_sparse_core_batch_size == 131072 // 4
  assert got.tables["t1"].layout.per_sparse_core_batch_size == 0
  counted_right = _pywrap_sparse_core_layout.SparseCoreLayoutStacker(
      num_partitions=1, sparse_cores_per_partition=4,
      disable_table_stacking=False)
  for i in range(2):
    counted_right.AddTable(table_name=f"t{i}", table_height=64, table_width=8,
                           group="g", output_samples=131072, num_features=1)
  assert {l.stacked_table_name for l in counted_right.GetLayouts().tables} == {
      "t0", "t1"}


def test_given_layouts_are_kept():
  expected = ours(feature_config(tfemb), 2).embedding_layouts()
  config = feature_config(tf_emb)
  for table in tables_of(config):
    table.layout = expected[table.name]
  assert ours(config, 2).embedding_layouts() == expected


# The reference, TensorFlow's own checkpoint adapter, reshards as 2.21's
# from 2.19 ("Changing topology is not implemented yet" before).
@pytest.mark.requires_tensorflow("2.19")
@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_to_stacked_is_the_adapters(partitions):
  stacking = ours(feature_config(tfemb), partitions)
  arrays = distinct_arrays(stacking)
  stacked = table_stacking.to_stacked(stacking, arrays)
  adapter = adapter_lib.TpuEmbeddingV3CheckpointAdapter(None)
  adapter.initialize_reshard_callbacks(stacking.embedding_layouts())
  for name, table in stacking.stacked_tables.items():
    callback = adapter.get_reshard_callback(table.table_names[0])
    assert callback.object_name() == name
    values = [tf.constant(arrays[t]) for t in table.table_names]
    rows, cols = table.shape
    full = callback.reshard(values, f"{rows} {cols} 0,{rows}:0,{cols}")
    np.testing.assert_array_equal(stacked[name], full.numpy())
    part = rows // partitions
    for p in range(partitions):  # what each TPU's shard restores
      spec = f"{rows} {cols} {p * part},{part}:0,{cols}"
      shard = callback.reshard(values, spec)
      np.testing.assert_array_equal(stacked[name][p * part:(p + 1) * part],
                                    shard.numpy())


class TPUEmbeddingV2(trackable_base.Trackable):
  """Restores as TensorFlow's class does: the adapter is used for a type whose
  name holds ".TPUEmbeddingV2"; each stacked variable restores on creation,
  one ShardInfo per partition (`make_sharded_variable_creator`)."""

  def __init__(self, stacking):
    self._stacking = stacking
    self.values = {}

  @property
  def embedding_layouts(self):
    return self._stacking.embedding_layouts()

  def _checkpoint_adapter(self, path):
    return adapter_lib.TpuEmbeddingV3CheckpointAdapter.create_from_checkpoint(
        path)

  def build(self):
    for name, table in self._stacking.stacked_tables.items():
      self.values[name] = self._add_variable_with_custom_getter(
          name=name, initializer=None, shape=table.shape, dtype=tf.float32,
          getter=self._restore_on_create, trainable=False)

  def _restore_on_create(self, name, shape, dtype, initializer, trainable):
    del shape, trainable  # The shape is the stacked variable's, as below.
    assert isinstance(initializer,
                      trackable_base.CheckpointInitialValueCallable)
    rows, cols = self._stacking.stacked_tables[name].shape
    partitions = self._stacking.num_partitions
    part = rows // partitions
    parts = [initializer(shape=(rows, cols), dtype=dtype,
                         shard_info=trackable_base.ShardInfo(
                             [part, cols], [p * part, 0])).wrapped_value
             for p in range(partitions)]
    variable = tf.Variable(tf.concat(parts, 0), name=name)
    variable._maybe_initialize_trackable()
    variable._update_uid = initializer.restore_uid
    return variable


# The reference, TensorFlow's own checkpoint adapter, reshards as 2.21's
# from 2.19 ("Changing topology is not implemented yet" before).
@pytest.mark.requires_tensorflow("2.19")
@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_adapter_restores_an_unstacked_checkpoint_as_to_stacked(
    partitions, tmp_path):
  config = feature_config(tf_emb)
  for i, table in enumerate(tables_of(config)):
    table.initializer = tf_emb.RowIdInitializer(offset=1000 * i)
  serving = tf_emb.TPUEmbeddingForServing(config, optimizer=None)
  serving.build()
  arrays = {t.name: v.numpy() for t, v in serving.embedding_tables.items()}
  path = tf.train.Checkpoint(embedding=serving).save(
      os.path.join(tmp_path, "unstacked"))
  stacking = ours(config, partitions)
  embedding = TPUEmbeddingV2(stacking)
  tf.train.Checkpoint(embedding=embedding).restore(path).expect_partial()
  embedding.build()
  expected = table_stacking.to_stacked(stacking, arrays)
  assert set(embedding.values) == set(expected)
  for name, variable in embedding.values.items():
    np.testing.assert_array_equal(variable.numpy(), expected[name])


def save_stacked(stacking, stacked, path):
  """A checkpoint as TPUEmbeddingV2 writes one: each stacked variable under
  its name, and the layouts under `_sparse_core_table_layouts`."""
  holder = trackable_base.Trackable()
  for name, value in stacked.items():
    holder._track_trackable(tf.Variable(value, name=name), name)
  holder._track_trackable(
      tf.Variable(stacking.layouts_proto().SerializeToString()),
      tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)
  return tf.train.Checkpoint(embedding=holder).save(path)


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_tensorflow_serving_reads_a_stacked_checkpoint(partitions, tmp_path):
  stacking = ours(feature_config(tfemb), partitions)
  arrays = distinct_arrays(stacking)
  path = save_stacked(stacking, table_stacking.to_stacked(stacking, arrays),
                      os.path.join(tmp_path, "stacked"))
  serving = tf_emb.TPUEmbeddingForServing(feature_config(tf_emb), None)
  tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  got = {t.name: v.numpy() for t, v in serving.embedding_tables.items()}
  assert set(got) == set(arrays)
  for name, array in arrays.items():
    np.testing.assert_array_equal(got[name], array)


# The reference, TensorFlow's own checkpoint adapter, reshards as 2.21's
# from 2.19 ("Changing topology is not implemented yet" before).
@pytest.mark.requires_tensorflow("2.19")
@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_adapter_reshards_to_another_partition_count_as_to_stacked(
    partitions, tmp_path):
  source = ours(feature_config(tfemb), partitions)
  target = ours(feature_config(tfemb), {1: 2, 2: 4, 4: 1}[partitions])
  arrays = distinct_arrays(source)
  stacked = table_stacking.to_stacked(source, arrays)
  path = save_stacked(source, stacked, os.path.join(tmp_path, "stacked"))
  adapter = adapter_lib.TpuEmbeddingV3CheckpointAdapter.create_from_checkpoint(
      path)
  assert adapter.is_layouts_same(source.embedding_layouts())
  assert not adapter.is_layouts_same(target.embedding_layouts())
  adapter.initialize_reshard_callbacks(target.embedding_layouts())
  expected = table_stacking.to_stacked(target, arrays)
  for name, table in target.stacked_tables.items():
    callback = adapter.get_reshard_callback(name)
    keys, _ = callback.update_restore_inputs(f"embedding/{name}/x", "")
    rows, cols = table.shape
    resharded = callback.reshard(
        [tf.constant(stacked[key.split("/")[1]]) for key in keys],
        f"{rows} {cols} 0,{rows}:0,{cols}")
    np.testing.assert_array_equal(resharded.numpy(), expected[name])


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_round_trip_and_zero_padding(partitions):
  stacking = ours(feature_config(tfemb), partitions)
  arrays = distinct_arrays(stacking)
  stacked = table_stacking.to_stacked(stacking, arrays)
  assert sum(np.count_nonzero(v) for v in stacked.values()) == sum(
      a.size for a in arrays.values())
  back = table_stacking.to_unstacked(stacking, stacked)
  assert list(back) == list(arrays)
  for name, array in arrays.items():
    np.testing.assert_array_equal(back[name], array)


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_stacked_rows_find_each_id(partitions, dtype):
  stacking = ours(feature_config(tfemb), partitions)
  expected_tf = tensorflow_stacking(feature_config(tf_emb), partitions)
  arrays = distinct_arrays(stacking)
  stacked = table_stacking.to_stacked(stacking, arrays)
  rng = np.random.default_rng(partitions)
  n = partitions * SC_PER_CHIP
  for name, table in stacking.tables.items():
    ids = rng.integers(0, table.vocabulary_size, size=64)
    rows = table_stacking.stacked_rows(stacking, name, tf.constant(ids, dtype))
    assert rows.dtype == dtype
    traced = tf.function(table_stacking.stacked_rows)(
        stacking, name, tf.constant(ids, dtype))
    np.testing.assert_array_equal(rows.numpy(), traced.numpy())
    np.testing.assert_array_equal(
        table_stacking.stacked_rows_numpy(stacking, name, ids), rows.numpy())
    value = stacked[table.stacked_table_name]
    np.testing.assert_array_equal(value[rows.numpy(), :table.dim],
                                  arrays[name][ids])
    # TensorFlow's column id for the SparseCore (its preprocessing), then
    # shard col mod n holds rows [shard * T, (shard + 1) * T).
    stack_name, col_offset, col_shift = (
        expected_tf.table_to_stacked_table_offset[name])
    per_shard = value.shape[0] // n
    col = (ids + col_shift) % n + ids // n * n + col_offset
    np.testing.assert_array_equal(rows.numpy(),
                                  col % n * per_shard + col // n)
    tf_layout = expected_tf.table_to_layout[name]
    shard, position = tpu_embedding_v3_utils.map_indices_in_shard(
        num_sparse_cores=n,
        offset_in_shard=tf_layout.sparse_core_shard_row_offset,
        shard_rotation=tf_layout.sparse_core_shard_rotation,
        row_indices=tf.constant(ids))
    np.testing.assert_array_equal(
        rows.numpy(), shard.numpy() * per_shard + position.numpy())
    assert stack_name == table.stacked_table_name


def test_bad_input():
  stacking = ours(feature_config(tfemb), 1)
  arrays = distinct_arrays(stacking)
  with pytest.raises(ValueError, match="tables"):
    table_stacking.to_stacked(stacking, {"a": arrays["a"]})
  with pytest.raises(ValueError, match="'b' has shape"):
    table_stacking.to_stacked(stacking, {**arrays, "b": arrays["b"][:3]})
  stacked = table_stacking.to_stacked(stacking, arrays)
  with pytest.raises(ValueError, match="'c' has shape"):
    table_stacking.to_unstacked(stacking, {**stacked, "c": stacked["c"][:8]})
  table = tfemb.TableConfig(8, 4, name="t")
  with pytest.raises(ValueError, match="output_shape"):
    table_stacking.stack([table], [("f", tfemb.FeatureConfig(table))], 1, 4)
  with pytest.raises(ValueError, match="distinct names"):
    table_stacking.stack([table, tfemb.TableConfig(8, 4, name="t")],
                         [("f", tfemb.FeatureConfig(table, output_shape=[2]))],
                         1, 4)
