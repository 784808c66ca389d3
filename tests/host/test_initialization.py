"""Big tables are initialized in blocks of rows (tfemb.initialization).

The block size is shrunk so that small tables take the block path. The
references are numpy: the initializer's own law (a truncated normal's
bounds and moments from the formula), exact constants, and the values
TensorFlow's initializer gives on the full shape where blocks must not be
used.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import tfemb
from tfemb import initialization

ROWS, DIM = 1003, 8  # 1003 rows of 32 bytes: 8 blocks of 128 rows, 1 short


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
  monkeypatch.setattr(initialization, "BLOCK_BYTES", 128 * DIM * 4)


def build(initializer=None, optimizer=None, vocab=ROWS):
  table = tfemb.TableConfig(vocab, DIM, initializer=initializer, name="t")
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                 optimizer or tfemb.Adagrad(0.1))
  embedding.build()
  return {k: v.numpy() for k, v in embedding.variables[table].items()}


def truncated_normal_moments(mean, stddev):
  """Mean and standard deviation of N(mean, stddev) cut at +-2 stddev."""
  phi = math.exp(-2.0) / math.sqrt(2 * math.pi)  # density at 2
  mass = math.erf(2 / math.sqrt(2))  # P(|z| < 2)
  return mean, stddev * math.sqrt(1 - 2 * 2 * phi / mass)


def test_blocks_are_used_for_these_tables():
  default = tfemb.TableConfig(ROWS, DIM).initializer
  assert initialization.block_rows(default, (ROWS, DIM)) == 128
  assert initialization.block_rows(default, (100, DIM)) is None  # one block


def test_default_initializer_in_blocks_follows_truncated_normal():
  values = build()["parameters"]
  mean, std = truncated_normal_moments(0.0, 1 / math.sqrt(DIM))
  assert values.shape == (ROWS, DIM)
  assert np.abs(values).max() <= 2 / math.sqrt(DIM) + 1e-6
  # Within 5 standard errors of the moments (an unseeded draw of ROWS x
  # DIM values): a fixed 0.01 was 2.9 standard errors of the mean.
  assert abs(values.mean() - mean) < 5 * std / math.sqrt(values.size)
  assert abs(values.std() - std) < 5 * std / math.sqrt(2 * values.size)
  # Every block, the short last one included, holds its own draws.
  blocks = [values[i:i + 128] for i in range(0, ROWS, 128)]
  assert all(np.abs(b).sum() > 0 for b in blocks)
  assert len({b[0].tobytes() for b in blocks}) == len(blocks)


@pytest.mark.parametrize("optimizer,slots", [
    (tfemb.Adagrad(0.1, initial_accumulator_value=0.25),
     {"accumulators": 0.25}),
    (tfemb.Adam(0.1), {"momenta": 0.0, "velocities": 0.0}),
    (tfemb.FTRL(0.1, initial_accumulator_value=0.5, beta=0.1),
     {"accumulators": 0.5, "linears": 0.0}),
])
def test_slots_in_blocks_hold_their_constants(optimizer, slots):
  variables = build(optimizer=optimizer)
  for name, value in slots.items():
    np.testing.assert_array_equal(variables[name],
                                  np.full((ROWS, DIM), value, np.float32))


@pytest.mark.parametrize("initializer,expected", [
    (tf.zeros_initializer(), 0.0),
    (tf.ones_initializer(), 1.0),
    (tf.constant_initializer(-0.75), -0.75),
])
def test_constant_tables_in_blocks(initializer, expected):
  np.testing.assert_array_equal(build(initializer)["parameters"],
                                np.full((ROWS, DIM), expected, np.float32))


def test_uniform_in_blocks_stays_in_its_range():
  values = build(tf.random_uniform_initializer(-0.3, 0.2))["parameters"]
  assert values.min() >= -0.3 and values.max() < 0.2
  assert abs(values.mean() - (-0.05)) < 0.01
  assert abs(values.std() - 0.5 / math.sqrt(12)) < 0.01


def test_seeded_initializer_gives_tensorflows_values_on_the_full_shape():
  init = tf.initializers.TruncatedNormal(stddev=0.1, seed=7)
  expected = init((ROWS, DIM)).numpy()  # seeded: same values each call
  np.testing.assert_array_equal(build(init)["parameters"], expected)


def test_callable_and_array_initializers_are_called_once_on_the_full_shape():
  table = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
  np.testing.assert_array_equal(
      build(tf.constant_initializer(table))["parameters"], table)
  shapes = []

  def init(shape, dtype=None):
    shapes.append(tuple(shape))
    return tf.reshape(tf.range(ROWS * DIM, dtype=dtype) * 0.5, shape)

  np.testing.assert_array_equal(build(init)["parameters"], table * 0.5)
  assert shapes == [(ROWS, DIM)]


@pytest.mark.parametrize("offset", [0, 40])
@pytest.mark.parametrize("vocab", [100, ROWS], ids=["one_block", "blocks"])
@pytest.mark.parametrize("optimizer", [tfemb.SGD(0.1), tfemb.Adagrad(0.1)],
                         ids=["sgd", "adagrad"])
def test_row_id_tables_hold_their_row_ids(table_layout, optimizer, vocab,
                                          offset):
  """TensorFlow's `RowIdInitializer`: row i holds offset + i in every
  column, also where the table is written block by block."""
  del table_layout  # both: slots apart, and beside the parameters
  initializer = tfemb.RowIdInitializer(offset=offset)
  in_blocks = initialization.block_rows(initializer, (vocab, DIM))
  assert in_blocks == (128 if vocab == ROWS else None)
  expected = np.tile(np.arange(offset, offset + vocab, dtype=np.float32)
                     [:, None], (1, DIM))
  values = build(initializer, optimizer, vocab)["parameters"]
  np.testing.assert_array_equal(values, expected)


def test_global_seed_makes_block_initialization_repeatable():
  tf.random.set_seed(11)
  first = build()["parameters"]
  tf.random.set_seed(11)
  np.testing.assert_array_equal(build()["parameters"], first)


def test_blocks_under_mirrored_strategy_agree_across_replicas():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    table = tfemb.TableConfig(ROWS, DIM, name="t")
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   tfemb.Adagrad(0.1, 0.5))
    embedding.build()
  for name, variable in embedding.variables[table].items():
    copies = [v.numpy() for v in strategy.experimental_local_results(
        variable)]
    np.testing.assert_array_equal(copies[0], copies[1], err_msg=name)
  params = embedding.embedding_tables[table].numpy()
  assert np.abs(params).max() <= 2 / math.sqrt(DIM) + 1e-6
  assert np.abs(params).min() >= 0 and params.std() > 0.1
  np.testing.assert_array_equal(
      embedding.variables[table]["accumulators"].numpy(),
      np.full((ROWS, DIM), 0.5, np.float32))


def test_checkpoint_restored_before_build_gives_the_saved_values(tmp_path):
  table = tfemb.TableConfig(ROWS, DIM, name="t")
  saved = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                             tfemb.Adagrad(0.1))
  saved.build()
  saved.variables[table]["accumulators"].assign(
      tf.fill([ROWS, DIM], 0.3))
  path = tf.train.Checkpoint(embedding=saved).write(str(tmp_path / "ckpt"))
  expected = {k: v.numpy() for k, v in saved.variables[table].items()}

  table2 = tfemb.TableConfig(ROWS, DIM, name="t")
  restored = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table2)},
                                tfemb.Adagrad(0.1))
  tf.train.Checkpoint(embedding=restored).restore(path)
  restored.build()  # the pending restore supplies the initial values
  for name, value in expected.items():
    np.testing.assert_array_equal(
        restored.variables[table2][name].numpy(), value, err_msg=name)
