"""`tfemb.TPUEmbeddingV2` on the host: the SparseCore's numbers
(docs/sparsecore.md) against the numpy reference.

The three tables of tests/sparsecore_scenario.py, stacked as TensorFlow
stacks them (two of width 4 and one of width 3, all padded to 8 columns): a
dense and a ragged multi-hot feature share table "a" (mean), a weighted
sparse feature looks up "b" (sum), a dense feature "c" (sqrtn). Ids repeat
within and across features. Gradient
and weight clipping are set and must be ignored (the SparseCore does not get
them).
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
from sparsecore_scenario import BATCH, VOCAB
from sparsecore_scenario import batches, initial_values, inputs, make
from sparsecore_scenario import mirrored_strategy, train
import tfemb
from tfemb.sparsecore import table_stacking
from tfemb.tpu import delegate

# The SparseCore host engine needs TensorFlow's stacker (2.17 on).
pytestmark = pytest.mark.requires_tensorflow("2.17")

CLIPPED = dict(clipvalue=0.01, clip_weight_min=-0.05, clip_weight_max=0.05)

# The SparseCore has no gradient or weight clipping and refuses weight
# decay: its cases leave them out (`CLIPPED` is set on top, and ignored).
CASES = ("sgd", "adagrad", "adagrad_momentum_nesterov", "adam_eps_outside",
         "ftrl")
NOT_ON_SPARSECORE = ("clipvalue", "clip_weight_min", "clip_weight_max",
                     "weight_decay_factor",
                     "multiply_weight_decay_factor_by_learning_rate")


def expected_tables(kind, params, data):
  tables = {n: reference.Table(initial_values(n), kind, params) for n in VOCAB}
  lr = params["learning_rate"]
  for b in data:
    pairs = {"a": [], "b": [], "c": []}
    pairs["a"] += reference.contributions(b["x"], "mean", b["coef"]["x"])
    pairs["a"] += reference.contributions(b["y"], "mean", b["coef"]["y"])
    pairs["b"] += reference.contributions(b["z"], "sum", b["coef"]["z"],
                                          b["z_w"])
    pairs["c"] += reference.contributions(b["w"], "sqrtn", b["coef"]["w"])
    for name, table in tables.items():
      table.apply(reference.row_gradients(pairs[name]), lr)
  return tables


def unstacked(embedding):
  variables = {name: {k: v.numpy() for k, v in slots.items()}
               for name, slots in embedding.variables.items()}
  stacking = embedding._stacking  # pylint: disable=protected-access
  out = {}
  for slot in next(iter(variables.values())):
    arrays = table_stacking.to_unstacked(
        stacking, {n: v[slot] for n, v in variables.items()})
    for name, value in arrays.items():
      out.setdefault(name, {})[slot] = value
  return out


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
@pytest.mark.parametrize("name", CASES)
def test_steps_match_the_reference_without_clipping(name, in_function,
                                                    engine_path, caplog):
  with caplog.at_level(logging.WARNING):
    embedding, _ = make(helpers.optimizer(name, without=NOT_ON_SPARSECORE,
                                          **CLIPPED))
  warned = [r.getMessage() for r in caplog.records
            if "no effect on a SparseCore" in r.getMessage()]
  assert sorted(m.split("'")[1] for m in warned) == ["a", "b", "c"]
  assert all("clipvalue and clip_weight_min and clip_weight_max" in m
             for m in warned)
  data = batches(7)
  train(embedding, data, in_function)
  want = expected_tables(
      *helpers.reference_optimizer(name, without=NOT_ON_SPARSECORE), data)
  got = unstacked(embedding)
  for table, ref in want.items():
    np.testing.assert_allclose(got[table]["parameters"], ref.w, rtol=2e-5,
                               atol=2e-6, err_msg=table)
    for slot, value in ref.slots.items():
      np.testing.assert_allclose(got[table][slot], value, rtol=2e-5,
                                 atol=2e-6, err_msg=f"{table}/{slot}")


def test_tables_are_stacked_as_tensorflow_stacks_them():
  embedding, _ = make(tfemb.Adagrad(0.1))
  tables = embedding.embedding_tables
  (name,) = tables
  # One partition of 4 SparseCores: each table's rows padded to a multiple
  # of 8 x 4, the width to a multiple of 8.
  assert name == "a_b_c" and tables[name].shape == (3 * 32, 8)
  assert set(embedding.variables[name]) == {"parameters", "accumulators"}
  assert sorted(embedding.embedding_layouts) == ["a", "b", "c"]
  # Activations are the table's width; the padding columns never show.
  b = batches(3)[0]
  activations, _ = embedding(*inputs(b))
  assert activations["w"].shape == (BATCH, 3)
  np.testing.assert_allclose(
      activations["w"].numpy(),
      reference.combine(initial_values("c"), b["w"], "sqrtn"), rtol=1e-6)


def test_weight_decay_is_refused_as_tensorflow_refuses_it():
  with pytest.raises(NotImplementedError, match="found in table c setting"):
    make(tfemb.SGD(0.1, weight_decay_factor=0.1))


def test_output_shapes_must_be_fully_defined():
  table = tfemb.TableConfig(10, 4, name="t")
  with pytest.raises(ValueError, match="'f'.*output_shape"):
    tfemb.TPUEmbeddingV2({"f": tfemb.FeatureConfig(table)}, tfemb.SGD(0.1))


def test_a_bad_id_raises_naming_the_feature_and_writes_nothing():
  embedding, _ = make(tfemb.Adagrad(0.1))
  features, weights = inputs(batches(5)[0])
  before = {k: v.numpy() for k, v in embedding.variables["a_b_c"].items()}
  features["w"] = tf.constant([0, 1, 9, 2], tf.int32)  # c has 9 rows
  with pytest.raises(tf.errors.InvalidArgumentError, match="Feature .*w.* ids must be in \\[0, 9\\)"):
    activations, preserved = embedding(features, weights)
    embedding.apply_gradients(
        tf.nest.map_structure(tf.ones_like, activations), preserved)
  for k, v in embedding.variables["a_b_c"].items():
    np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)



@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_an_overflowing_update_of_one_stacked_table_changes_nothing(
    engine_path, policy, in_function):
  """Tables a, b, c share one stacked variable (and one update): b's
  Adagrad accumulators overflow, so the error names b, and no row of a, b
  or c, parameters or slot, changes."""
  del engine_path  # the fused kernels, interleaved or not, and TF's ops
  embedding, _ = make(tfemb.Adagrad(0.1))
  embedding.non_finite_gradients = policy
  b = batches(5)[0]
  features, weights = inputs(b)
  coef = {k: tf.constant(v, tf.float32) for k, v in b["coef"].items()}
  coef["z"] *= 1e20  # table b's feature: finite gradients, g^2 overflows

  def step():
    activations, preserved = embedding(features, weights)
    embedding.apply_gradients(coef, preserved)
    return activations

  run = tf.function(step) if in_function else step
  embedding.build()
  before = {k: v.numpy() for k, v in embedding.variables["a_b_c"].items()}
  if policy == "raise":
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Table \W*b\W*: the update would make a "
                       "row"):
      run()
  else:
    run()
    assert embedding.skipped_steps == 1
  for k, v in embedding.variables["a_b_c"].items():
    np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)


@pytest.mark.parametrize("replicas", [2, 4])
def test_replicas_train_on_the_global_batch_sum(replicas):
  """MirroredStrategy over logical CPUs: every replica's copy equals one
  replica trained on the whole global batch (here every replica looks up
  the same batch, so the global gradient is `replicas` times one's)."""
  data = batches(11)
  single, _ = make(tfemb.Adagrad(0.2))
  strategy = mirrored_strategy(replicas)
  with strategy.scope():
    mirrored, _ = make(tfemb.Adagrad(0.2))
    mirrored.build()

  @tf.function
  def step(features, weights, coef):
    def replica_fn():
      _, preserved = mirrored(features, weights)
      mirrored.apply_gradients(coef, preserved)
    strategy.run(replica_fn)

  for b in data:
    features, weights = inputs(b)
    coef = {k: tf.constant(v, tf.float32) for k, v in b["coef"].items()}
    step(features, weights, coef)
    _, preserved = single(features, weights)
    single.apply_gradients({k: v * replicas for k, v in coef.items()},
                           preserved)
  want = unstacked(single)
  stacking = mirrored._stacking  # pylint: disable=protected-access
  for key, variable in mirrored.variables["a_b_c"].items():
    assert len(variable.values) == replicas
    for copy in variable.values:
      got = table_stacking.to_unstacked(stacking, {"a_b_c": copy.numpy()})
      for table, value in got.items():
        np.testing.assert_allclose(value, want[table][key], rtol=1e-5,
                                   atol=1e-6, err_msg=f"{table}/{key}")


def test_under_a_tpu_strategy_it_is_tensorflows_class(monkeypatch):
  from tpu_stand_in import StandInTPUStrategy, use_strategy  # pylint: disable=g-import-not-at-top
  received = []
  monkeypatch.setitem(delegate.TENSORFLOW_ENGINES, "TPUEmbeddingV2",
                      lambda *args: received.append(args) or "tensorflow's")
  use_strategy(monkeypatch, StandInTPUStrategy())
  table = tfemb.TableConfig(10, 4, name="t")
  result = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[2])}, tfemb.SGD(0.1))
  assert result == "tensorflow's"
  (feature_config, optimizer, pipelining, sc_config), = received
  assert isinstance(feature_config["f"],
                    tf.tpu.experimental.embedding.FeatureConfig)
  assert isinstance(optimizer, tf.tpu.experimental.embedding.SGD)
  assert pipelining is False and sc_config is None


# --- CustomOptimizer ---------------------------------------------------------


def _sgd_like(gradient, embedding_table, slot_variables, learning_rate,
              hyperparameters):
  del slot_variables, hyperparameters
  return embedding_table - learning_rate * gradient


def _row_norm_slot(gradient, embedding_table, slot_variables, learning_rate,
                   hyperparameters):
  del hyperparameters
  seen = slot_variables[0] + tf.reduce_sum(gradient * gradient, axis=1)
  return (embedding_table - learning_rate * gradient / tf.sqrt(seen)[:, None],
          seen)


def _one_table(optimizer, vocab=10, dim=4):
  init = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim) / 10
  table = tfemb.TableConfig(vocab, dim, name="t",
                            initializer=tf.constant_initializer(init))
  embedding = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[3])}, optimizer)
  return embedding, init


def _custom_steps(embedding, ids_per_step, coef):
  for ids in ids_per_step:
    activations, preserved = embedding({"f": tf.constant(ids)})
    embedding.apply_gradients({"f": tf.constant(coef, tf.float32)}, preserved)


def _summed(ids, coef):
  """{id: summed gradient}: row b of `coef` is the gradient of ids[b]."""
  return reference.row_gradients(zip(ids, coef))


def test_a_custom_sgd_matches_numpy_with_a_dynamic_learning_rate():
  lr = tf.Variable(0.5)
  embedding, w = _one_table(tfemb.CustomOptimizer(_sgd_like,
                                                  learning_rate=lambda: lr))
  coef = np.array([[1, 2, 3, 4], [1, 1, 1, 1], [0.5, 0, 0, -1]], np.float32)
  oracle = reference.Table(w, "sgd", {})
  for step, ids in enumerate([[1, 4, 1], [4, 4, 0]]):
    lr.assign(0.5 / (step + 1))
    _custom_steps(embedding, [ids], coef)
    oracle.apply(_summed(ids, coef), 0.5 / (step + 1))
  np.testing.assert_allclose(unstacked(embedding)["t"]["parameters"], oracle.w,
                             rtol=1e-6)


def test_a_custom_adagrad_with_hyperparameters_matches_numpy():
  scale = tf.Variable(2.0)
  embedding, w = _one_table(tfemb.CustomOptimizer(
      helpers.adagrad_like, learning_rate=0.1, slot_names=["acc"],
      slot_initializers=[tf.constant_initializer(0.5)],
      hyperparameters=[lambda: scale]))
  coef = np.array([[1, 2, 3, 4], [1, 1, 1, 1], [0.5, 0, 0, -1]], np.float32)
  # Adagrad (docs/numerics.md) at the learning rate times the scale.
  oracle = reference.Table(w, "adagrad", {"initial_accumulator_value": 0.5})
  for step, ids in enumerate([[1, 4, 1], [4, 4, 0]]):
    scale.assign(2.0 + step)
    _custom_steps(embedding, [ids], coef)
    oracle.apply(_summed(ids, coef), (2.0 + step) * 0.1)
  got = unstacked(embedding)["t"]
  np.testing.assert_allclose(got["parameters"], oracle.w, rtol=1e-5)
  np.testing.assert_allclose(got["acc"], oracle.slots["accumulators"],
                             rtol=1e-6)


def test_a_custom_optimizer_with_a_one_dimensional_slot():
  embedding, w = _one_table(tfemb.CustomOptimizer(
      _row_norm_slot, learning_rate=0.1, slot_names=["seen"],
      slot_initializers=[tf.constant_initializer(1.0)], slot_dims=[1]))
  assert embedding.variables["t"]["seen"].shape.rank == 1
  coef = np.array([[1, 2, 3, 4], [1, 1, 1, 1], [0.5, 0, 0, -1]], np.float32)
  ids = [1, 4, 1]
  _custom_steps(embedding, [ids], coef)
  w, seen_by_id = reference.row_norm_adagrad(w, np.ones(len(w)),
                                             _summed(ids, coef), 0.1)
  # The slot is stacked: id i's value sits at its stacked row (the padding
  # rows keep their initial 1).
  seen = np.ones(embedding.variables["t"]["seen"].shape[0])
  stacking = embedding._stacking  # pylint: disable=protected-access
  seen[table_stacking.stacked_rows_numpy(stacking, "t", np.arange(len(w)))] = (
      seen_by_id)
  np.testing.assert_allclose(embedding.variables["t"]["seen"].numpy(), seen,
                             rtol=1e-6)
  np.testing.assert_allclose(unstacked_parameters(embedding), w, rtol=1e-6)


def unstacked_parameters(embedding):
  stacking = embedding._stacking  # pylint: disable=protected-access
  return table_stacking.to_unstacked(
      stacking, {"t": embedding.variables["t"]["parameters"].numpy()})["t"]


def test_a_custom_computation_of_the_wrong_shape_is_refused_naming_the_table():
  bad = lambda g, w, s, lr, h: w[:, :2]  # pylint: disable=g-long-lambda
  embedding, _ = _one_table(tfemb.CustomOptimizer(bad, learning_rate=0.1))
  before = embedding.variables["t"]["parameters"].numpy()
  with pytest.raises(ValueError, match="Table 't'.*custom_computation"):
    _custom_steps(embedding, [[1, 2, 3]], np.ones((3, 4), np.float32))
  np.testing.assert_array_equal(embedding.variables["t"]["parameters"].numpy(),
                                before)


def test_the_v1_engine_refuses_a_custom_optimizer():
  table = tfemb.TableConfig(10, 4, name="t")
  with pytest.raises(ValueError, match="'t'.*TPUEmbeddingV2"):
    tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                       tfemb.CustomOptimizer(_sgd_like))


# --- checkpoints ---------------------------------------------------------------


def _trained(seed=3):
  embedding, features = make(tfemb.Adagrad(0.2))
  train(embedding, batches(seed), in_function=False)
  return embedding, features


def test_tensorflows_serving_class_restores_a_host_checkpoint(tmp_path):
  """The checkpoint holds the stacked tables and TensorFlow's layouts key:
  TensorFlow's own TPUEmbeddingForServing reads each table back, unpadded."""
  embedding, features = _trained()
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "v2"))
  keys = [k for k, _ in tf.train.list_variables(path)]
  assert any("_sparse_core_table_layouts" in k for k in keys)
  serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      tfemb.to_tensorflow(features), None)
  tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  want = unstacked(embedding)
  got = {t.name: v.numpy() for t, v in serving.embedding_tables.items()}
  assert sorted(got) == ["a", "b", "c"]
  for name, value in got.items():
    np.testing.assert_array_equal(value, want[name]["parameters"])


def test_a_host_checkpoint_restores_into_a_new_object(tmp_path):
  embedding, _ = _trained()
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "v2"))
  again, _ = make(tfemb.Adagrad(0.2))
  status = tf.train.Checkpoint(embedding=again).restore(path)
  again.build()  # the tables are restored as they are created
  status.assert_consumed()
  for key, variable in again.variables["a_b_c"].items():
    np.testing.assert_array_equal(
        variable.numpy(), embedding.variables["a_b_c"][key].numpy(), key)


# --- CustomCombiner ----------------------------------------------------------


def _sum_combiner(valency, vectors):
  mask = tf.range(vectors.shape[0]) < valency
  return tf.reduce_sum(tf.where(mask[:, None], vectors,
                                tf.zeros_like(vectors)), axis=0)


def _weighted_combiner(valency, vectors, weights):
  mask = tf.cast(tf.range(vectors.shape[0]) < valency, tf.float32)
  return tf.reduce_sum((mask * weights)[:, None] * vectors, axis=0)


def _combiner_table(combiner):
  init = np.arange(40, dtype=np.float32).reshape(10, 4) / 10
  table = tfemb.TableConfig(10, 4, name="t", combiner=combiner,
                            initializer=tf.constant_initializer(init))
  return tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[2])},
      tfemb.SGD(0.5)), init


def test_a_custom_sum_combiner_is_the_sum_combiner():
  """Forward and after two steps; ids beyond max_valency are not looked up
  (and so not touched)."""
  custom, _ = _combiner_table(tfemb.CustomCombiner(_sum_combiner, 3))
  plain, _ = _combiner_table("sum")
  ids = tf.ragged.constant([[1, 2, 1, 5], [3]], dtype=tf.int64)
  kept = tf.ragged.constant([[1, 2, 1], [3]], dtype=tf.int64)
  coef = tf.constant([[1.0, -2.0, 0.5, 0.0], [0.3, 0.3, 0.3, 0.3]])
  for _ in range(2):
    got, preserved = custom({"f": ids})
    want, plain_preserved = plain({"f": kept})
    np.testing.assert_allclose(got["f"].numpy(), want["f"].numpy(),
                               rtol=1e-6)
    custom.apply_gradients({"f": coef}, preserved)
    plain.apply_gradients({"f": coef}, plain_preserved)
  np.testing.assert_allclose(custom.embedding_tables["t"].numpy(),
                             plain.embedding_tables["t"].numpy(), rtol=1e-6)


def test_a_weighted_custom_combiner_trains_its_weights_by_sgd():
  combiner = tfemb.CustomCombiner(
      _weighted_combiner, max_valency=2, num_weights=2,
      initializer=tf.constant_initializer([1.0, 0.5]),
      combiner_weights_learning_rate=0.1)
  embedding, init = _combiner_table(combiner)
  rows = [[1, 4, 7], [4]]  # id 7 is beyond max_valency
  coef = np.array([[1.0, -2.0, 0.5, 0.0], [0.3, 0.3, 0.3, 0.3]])
  oracle, cw = reference.Table(init, "sgd", {}), np.array([1.0, 0.5])
  stacking = embedding._stacking  # pylint: disable=protected-access
  for _ in range(2):
    activations, preserved = embedding(
        {"f": tf.ragged.constant(rows, dtype=tf.int64)})
    want = reference.positional(oracle.w, rows, cw, 2)
    np.testing.assert_allclose(activations["f"].numpy(), want, rtol=1e-5)
    embedding.apply_gradients({"f": tf.constant(coef, tf.float32)}, preserved)
    pairs, weight_grads = reference.positional_gradients(oracle.w, rows, cw,
                                                         2, coef)
    oracle.apply(reference.row_gradients(pairs), 0.5)
    cw, _ = reference.update_row("sgd", {}, cw, weight_grads, {}, 0.1)
  got = table_stacking.to_unstacked(
      stacking, {"t": embedding.embedding_tables["t"].numpy()})["t"]
  np.testing.assert_allclose(got, oracle.w, rtol=1e-5)
  np.testing.assert_allclose(
      embedding._combiners.weights["t"].numpy(), cw, rtol=1e-5)  # pylint: disable=protected-access


def test_custom_optimizer_and_combiner_under_mirrored_sum_the_global_batch():
  """Two replicas, each with its own examples: the combiner weights and the
  custom Adagrad's rows and slot get the global batch's summed gradients,
  the same on both replicas' copies."""
  strategy = mirrored_strategy(2)
  combiner = tfemb.CustomCombiner(
      _weighted_combiner, max_valency=2, num_weights=2,
      initializer=tf.constant_initializer([1.0, 0.5]),
      combiner_weights_learning_rate=0.1)
  optimizer = tfemb.CustomOptimizer(
      helpers.adagrad_like, learning_rate=0.2, slot_names=["acc"],
      slot_initializers=[tf.constant_initializer(0.5)],
      hyperparameters=[lambda: 1.5])
  init = np.arange(40, dtype=np.float32).reshape(10, 4) / 10
  table = tfemb.TableConfig(10, 4, name="t", combiner=combiner,
                            initializer=tf.constant_initializer(init))
  with strategy.scope():
    embedding = tfemb.TPUEmbeddingV2(
        {"f": tfemb.FeatureConfig(table, output_shape=[2])}, optimizer)
    embedding.build()
  rows = [[[1, 4, 7], [4]], [[4, 2], [9, 1]]]  # per replica; 7 is dropped
  coef = np.array([[[1.0, -2.0, 0.5, 0.0], [0.3, 0.3, 0.3, 0.3]],
                   [[0.2, 0.1, -0.4, 1.0], [-1.0, 0.5, 0.5, 2.0]]])
  ids = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.ragged.constant(rows[ctx.replica_id_in_sync_group],
                                     dtype=tf.int64))
  grads = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(coef[ctx.replica_id_in_sync_group], tf.float32))

  @tf.function
  def step(ids, grads):
    def replica_fn(ids, grads):
      activations, preserved = embedding({"f": ids})
      embedding.apply_gradients({"f": grads}, preserved)
      return activations["f"]
    return strategy.run(replica_fn, (ids, grads))

  # Adagrad (docs/numerics.md) at the learning rate times the scale.
  oracle = reference.Table(init, "adagrad", {"initial_accumulator_value": 0.5})
  cw = np.array([1.0, 0.5])
  for _ in range(2):
    activations = strategy.experimental_local_results(step(ids, grads))
    pairs, weight_grads = [], np.zeros(2)
    for replica, (examples, c) in enumerate(zip(rows, coef)):
      want = reference.positional(oracle.w, examples, cw, 2)
      np.testing.assert_allclose(activations[replica].numpy(), want,
                                 rtol=1e-5)
      more, more_weights = reference.positional_gradients(
          oracle.w, examples, cw, 2, c)
      pairs += more
      weight_grads += more_weights
    oracle.apply(reference.row_gradients(pairs), 1.5 * 0.2)
    cw, _ = reference.update_row("sgd", {}, cw, weight_grads, {}, 0.1)
  stacking = embedding._stacking  # pylint: disable=protected-access
  for key, want in (("parameters", oracle.w),
                    ("acc", oracle.slots["accumulators"])):
    for copy in embedding.variables["t"][key].values:
      got = table_stacking.to_unstacked(stacking, {"t": copy.numpy()})["t"]
      np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)
  weights = embedding._combiners.weights["t"]  # pylint: disable=protected-access
  assert len(weights.values) == 2
  for copy in weights.values:
    np.testing.assert_allclose(copy.numpy(), cw, rtol=1e-5)
