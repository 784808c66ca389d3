"""The TensorFlow-ops path's pieces give the bits of the ops they stand for
(docs/performance.md, 'The TensorFlow-ops path')."""

import numpy as np
import pytest
import tensorflow as tf

import tfemb
from tfemb import inputs
from tfemb import resolution
from tfemb.host import paths
from tfemb.host import step
from tfemb.host import table_paths


def _bits(x):
  return np.asarray(x, np.float32).view(np.uint32)


def test_row_gradients_are_unsorted_segment_sums_bit_for_bit():
  rng = np.random.default_rng(0)
  positions = [rng.integers(0, 50, 700), rng.integers(0, 50, 300)]
  # Magnitudes far apart: another order of the additions gives other bits.
  grads = [(rng.standard_normal((len(p), 8)) * 10.0 ** rng.integers(
      -6, 6, (len(p), 1))).astype(np.float32) for p in positions]
  grads[0][::7] = -0.0
  table = tfemb.TableConfig(100, 8, name="t")
  path = table_paths.OpsTable(table, {})
  batch = table_paths.OpsBatch([0, 1], tf.range(50, dtype=tf.int64),
                          [tf.constant(p) for p in positions], None)

  got, finite = path.row_gradients(
      batch, [tf.constant(g) for g in grads], raising=False)

  want = tf.math.unsorted_segment_sum(np.concatenate(grads),
                                      np.concatenate(positions), 50)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  assert bool(finite)


def test_each_id_rows_are_the_distinct_rows_expanded():
  table = tfemb.TableConfig(20, 4, name="t")
  values = tf.Variable(np.arange(80, dtype=np.float32).reshape(20, 4))
  ids = [tf.constant([3, 7, 3, 19], tf.int64), tf.constant([7, 0], tf.int64)]
  members = [paths.Member(i, f"f{i}", tfemb.FeatureConfig(table),
                          inputs.Lookup(ids=x, segments=None, scales=None,
                                        num_segments=None, output_shape=None,
                                        static_shape=None))
             for i, x in enumerate(ids)]
  rows = {}
  for each_id in (False, True):
    path = table_paths.OpsTable(table, {"parameters": values}, each_id=each_id)
    batch, _ = path.lookup(members)
    rows[each_id] = [r.numpy() for r in path.feature_rows(batch)]
  for a, b, x in zip(rows[False], rows[True], ids):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(b, values.numpy()[x.numpy()])


class _LooksLikeAPath:
  """The four methods, without declaring `paths.TablePath`."""

  def __init__(self, table):
    self.table = table

  def lookup(self, members):
    raise AssertionError("never called")

  feature_rows = row_gradients = prepare = lookup


def test_a_step_takes_only_declared_table_paths():
  table = tfemb.TableConfig(20, 4, name="t")
  config = resolution.resolve({"f": tfemb.FeatureConfig(table)},
                              tfemb.SGD(0.1))
  lookup = inputs.Lookup(ids=tf.constant([1, 2], tf.int64), segments=None,
                         scales=None, num_segments=None, output_shape=None,
                         static_shape=None)
  values = {"parameters": tf.Variable(tf.ones([20, 4]))}
  assert isinstance(table_paths.OpsTable(config.tables[0], values),
                    paths.TablePath)
  with pytest.raises(TypeError, match="'t': its path is a _LooksLikeAPath"):
    step.gather(config, [_LooksLikeAPath(config.tables[0])], [0], [lookup])
