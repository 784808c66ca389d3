"""Checkpoints of other layouts restored into the host `TPUEmbeddingV2`
(docs/sparsecore.md, "Checkpoints"): unstacked tables (tfemb's V1 engine,
TensorFlow's `TPUEmbeddingForServing`) and stacked tables laid out for
another number of SparseCores (another strategy, a TPU), slots included.

The expected stacked rows follow the formula of docs/sparsecore.md
(`reference.stacked_rows`), from each table's layout proto.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils
from tensorflow.python.trackable import base as trackable_base

from sparsecore_scenario import DIM, VOCAB
from sparsecore_scenario import batches, inputs, make, mirrored_strategy
from sparsecore_scenario import rows, train
import tfemb
from tfemb.sparsecore import table_stacking

# The SparseCore host engine needs TensorFlow's stacker (2.17 on).
pytestmark = pytest.mark.requires_tensorflow("2.17")
# TensorFlow's checkpoint adapters, which rearrange a restore as the tables
# are created, are not in every supported TensorFlow; where absent,
# TensorFlow never asks the engine for one.
pytest.importorskip("tensorflow.python.checkpoint.checkpoint_adapter")


def tables_of(embedding, copy=0):
  """{table: {slot: array}} read out of the stacked variables."""
  out = {}
  for name, proto in embedding.embedding_layouts.items():
    for slot, variable in embedding.variables[proto.stacked_table_name].items():
      value = variable.values[copy] if hasattr(variable, "values") else variable
      out.setdefault(name, {})[slot] = value.numpy()[
          rows(proto, VOCAB[name])][:, :DIM[name]]
  return out


def v1_tables(embedding):
  return {t.name: {k: v.numpy() for k, v in slots.items()}
          for t, slots in embedding.variables.items()}


def assert_tables_equal(got, want, slots=("parameters", "accumulators")):
  assert sorted(got) == sorted(want)
  for name in want:
    for slot in slots:
      np.testing.assert_array_equal(got[name][slot], want[name][slot],
                                    err_msg=f"{name}/{slot}")


def test_a_v1_checkpoint_restores_into_the_stacked_tables_and_slots(tmp_path):
  """tfemb's TPUEmbedding (tables and Adagrad slots unstacked) -> the host
  V2: every table and slot lands at its stacked rows; one more step on each
  gives the same tables (the rules are the same on one replica)."""
  first, later = batches(5)[:2], batches(5)[2:]
  v1, _ = make_v1()
  train_v1(v1, first)
  path = tf.train.Checkpoint(embedding=v1).save(str(tmp_path / "v1"))
  v2, _ = make(tfemb.Adagrad(0.2))
  tf.train.Checkpoint(embedding=v2).restore(path)
  v2.build()
  assert_tables_equal(tables_of(v2), v1_tables(v1))
  # Padding as in a new object: Adagrad's initial accumulator (0.1), so the
  # padding columns of touched rows stay finite.
  proto = v2.embedding_layouts["c"]
  accumulators = v2.variables[proto.stacked_table_name]["accumulators"]
  np.testing.assert_allclose(
      accumulators.numpy()[rows(proto, VOCAB["c"]), DIM["c"]:], 0.1)
  train_v1(v1, later)
  train(v2, later, in_function=False)
  got, want = tables_of(v2), v1_tables(v1)
  for name in want:
    for slot in ("parameters", "accumulators"):
      np.testing.assert_allclose(got[name][slot], want[name][slot],
                                 rtol=1e-6, atol=1e-7)


def make_v1():
  """The V1 engine over the same tables and features as `make`."""
  _, features = make(tfemb.Adagrad(0.2))
  embedding = tfemb.TPUEmbedding(features, tfemb.Adagrad(0.2))
  return embedding, features


def train_v1(embedding, data):
  """The V1 protocol on the same batches and gradients as `train`."""
  for b in data:
    features, weights = inputs(b)
    embedding.enqueue(features, weights, training=True)
    embedding.dequeue()
    embedding.apply_gradients({k: tf.constant(v, tf.float32)
                               for k, v in b["coef"].items()})


def test_tensorflows_serving_checkpoint_restores_the_parameters(tmp_path):
  """TensorFlow's TPUEmbeddingForServing (no optimizer) -> the host V2: the
  parameters land at their stacked rows, the slots keep their initial
  values."""
  _, features = make(None)
  serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      tfemb.to_tensorflow(features), None)
  serving.build()
  rng = np.random.default_rng(0)
  for variable in serving.embedding_tables.values():
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  want = {t.name: {"parameters": v.numpy()}
          for t, v in serving.embedding_tables.items()}
  path = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "cpu"))
  v2, _ = make(tfemb.Adagrad(0.2, initial_accumulator_value=0.3))
  tf.train.Checkpoint(embedding=v2).restore(path)
  v2.build()
  got = tables_of(v2)
  assert_tables_equal(got, want, slots=("parameters",))
  for name in want:
    np.testing.assert_array_equal(got[name]["accumulators"],
                                  np.float32(0.3))


@pytest.mark.parametrize("source,target", [(2, 1), (1, 4), (4, 2)])
def test_a_checkpoint_of_another_partition_count_is_resharded(
    source, target, tmp_path):
  """The host under `source` replicas (so laid out for source x 4
  SparseCores) -> the host under `target`: tables and slots equal."""
  def made(replicas):
    if replicas == 1:
      return make(tfemb.Adagrad(0.2))[0]
    with mirrored_strategy(replicas).scope():
      return make(tfemb.Adagrad(0.2))[0]

  saved = made(source)
  saved.build()
  rng = np.random.default_rng(source)
  for slots in saved.variables.values():
    for variable in slots.values():
      variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  want = tables_of(saved)
  path = tf.train.Checkpoint(embedding=saved).save(str(tmp_path / "saved"))
  restored = made(target)
  assert restored.embedding_layouts != saved.embedding_layouts
  tf.train.Checkpoint(embedding=restored).restore(path)
  restored.build()
  for copy in range(target):
    assert_tables_equal(tables_of(restored, copy), want)


def tpu_checkpoint(features, num_chips, path):
  """A checkpoint as TensorFlow's TPUEmbeddingV2 writes it on `num_chips`
  chips of 4 SparseCores: the stacked tables under their names, the layouts
  under `_sparse_core_table_layouts`; values distinct per table and row."""
  from tfemb import resolution  # pylint: disable=g-import-not-at-top
  config = resolution.resolve(features, None)
  stacking = table_stacking.stack(config.tables,
                                  list(zip(config.paths, config.features)),
                                  num_chips, 4)
  arrays = {n: np.arange(VOCAB[n] * DIM[n], dtype=np.float32).reshape(
      VOCAB[n], DIM[n]) + 1000 * i for i, n in enumerate(sorted(VOCAB))}
  holder = trackable_base.Trackable()
  for name, value in table_stacking.to_stacked(stacking, arrays).items():
    holder._track_trackable(tf.Variable(value, name=name), name)  # pylint: disable=protected-access
  holder._track_trackable(  # pylint: disable=protected-access
      tf.Variable(stacking.layouts_proto().SerializeToString()),
      tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)
  return tf.train.Checkpoint(embedding=holder).save(path), arrays


def test_a_checkpoint_laid_out_for_a_tpu_restores_on_the_host(tmp_path):
  """A 16-chip TPU's layout (64 SparseCores) -> the host's (4)."""
  v2, features = make(None)
  path, arrays = tpu_checkpoint(features, 16, str(tmp_path / "tpu"))
  tf.train.Checkpoint(embedding=v2).restore(path)
  got = tables_of(v2)
  for name, array in arrays.items():
    np.testing.assert_array_equal(got[name]["parameters"], array, name)


def test_a_restore_of_another_layout_after_build_is_refused(tmp_path):
  """A checkpoint that fits, but unstacked: refused whole once built, and
  restored as the error advises, before the build of a new object."""
  v1, _ = make_v1()
  train_v1(v1, batches(5)[:1])
  path = tf.train.Checkpoint(embedding=v1).save(str(tmp_path / "v1"))
  v2, _ = make(tfemb.Adagrad(0.2))
  v2.build()
  before = {k: v.numpy() for k, v in v2.variables["a_b_c"].items()}
  with pytest.raises(ValueError, match=(
      "holds the tables unstacked; they fit this configuration.*restore it "
      r"before the first lookup or build\(\)")):
    tf.train.Checkpoint(embedding=v2).restore(path)
  for k, v in v2.variables["a_b_c"].items():
    np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
  advised, _ = make(tfemb.Adagrad(0.2))
  tf.train.Checkpoint(embedding=advised).restore(path)
  advised.build()
  assert_tables_equal(tables_of(advised), v1_tables(v1))


def test_a_checkpoint_of_other_tables_or_slots_is_refused(tmp_path):
  v1, _ = make_v1()
  v1.build({k: tf.TensorShape([4]) for k in "xyzw"})
  path = tf.train.Checkpoint(embedding=v1).save(str(tmp_path / "v1"))
  sgd, _ = make(tfemb.SGD(0.1))
  with pytest.raises(ValueError, match="slot 'accumulators' of table '[abc]'"):
    tf.train.Checkpoint(embedding=sgd).restore(path)
  table = tfemb.TableConfig(8, 4, name="a")
  other = tfemb.TPUEmbeddingV2(
      {"x": tfemb.FeatureConfig(table, output_shape=[4])}, tfemb.Adagrad(0.1))
  with pytest.raises(ValueError,
                     match=r"holds embedding table '[bc]'.*tables: \['a'\]"):
    tf.train.Checkpoint(embedding=other).restore(path)


def test_tfemb_serving_restores_a_host_checkpoint_with_restore_info(tmp_path):
  """TPUEmbeddingForServing(..., experimental_sparsecore_restore_info=...)
  reads the host's checkpoint (trained under 2 replicas) back unstacked."""
  with mirrored_strategy(2).scope():
    v2, features = make(tfemb.Adagrad(0.2))
    v2.build()
  rng = np.random.default_rng(1)
  for variable in v2.variables["a_b_c"].values():
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  want = tables_of(v2)
  path = tf.train.Checkpoint(embedding=v2).save(str(tmp_path / "v2"))
  serving = tfemb.TPUEmbeddingForServing(
      features, None, experimental_sparsecore_restore_info={
          "num_tpu_devices": 2})
  tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  for name in VOCAB:
    np.testing.assert_array_equal(serving.embedding_tables[name].numpy(),
                                  want[name]["parameters"], name)
