"""A TPU training script runs unchanged under MirroredStrategy.

The script of TensorFlow's TPU documentation (`enqueue` outside
`strategy.run`, `dequeue` + GradientTape + `apply_gradients` inside it) runs
with 2 and 4 replicas on logical CPUs, and its tables and slots equal those
of one replica on the same global batch, as the TPU sums the global batch.
The 1-replica run is itself checked against the numpy reference in
tests/host/test_training.py. Mirrored CPU tables train through the fused
kernels, each replica on its own copy; the same scenarios run on
TensorFlow's ops too.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.kernels import fused_ops
from workers import v2_worker

GLOBAL_BATCH, STEPS = 8, 3


def configs(opt):
  rng = np.random.default_rng(3)
  shared = tfemb.TableConfig(
      20, 4, name="shared", combiner="sqrtn",
      initializer=tf.constant_initializer(rng.normal(size=(20, 4))))
  other = tfemb.TableConfig(
      15, 3, name="other",
      initializer=tf.constant_initializer(rng.normal(size=(15, 3))))
  return {
      "dense": tfemb.FeatureConfig(shared),
      "ragged": tfemb.FeatureConfig(shared),
      "seq": tfemb.FeatureConfig(other, max_sequence_length=2),
  }, opt


def dataset():
  rng = np.random.default_rng(0)
  n = GLOBAL_BATCH * STEPS
  features = {
      "dense": rng.integers(0, 12, size=n),
      "ragged": helpers.ragged(helpers.random_rows(rng, n, 12, 3)),
      "seq": helpers.ragged(helpers.random_rows(rng, n, 10, 3)),
  }
  weights = {"dense": None,
             "ragged": helpers.ragged([list(rng.uniform(0.5, 2, len(r)))
                                       for r in features["ragged"].numpy()],
                                      tf.float32),
             "seq": None}
  targets = rng.normal(size=(n, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(
      ((features, {"ragged": weights["ragged"]}), targets)).batch(
          GLOBAL_BATCH, drop_remainder=True)


def loss_fn(act, targets):
  """Summed over the replica's examples, divided by the global batch: the
  replicas' losses add up to the 1-replica loss."""
  pred = (tf.reduce_sum(act["dense"], 1) + tf.reduce_sum(act["ragged"], 1)
          + tf.reduce_sum(act["seq"], [1, 2]))
  return tf.reduce_sum((pred[:, None] - targets) ** 2) / GLOBAL_BATCH


def train(strategy, make_opt, input_fn="distribute_dataset", steps=STEPS):
  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
  with strategy.scope():
    config, opt = configs(make_opt())
    embedding = tfemb.TPUEmbedding(config, opt)
  if input_fn == "distribute_dataset":
    dist = strategy.experimental_distribute_dataset(dataset(), options)
  else:
    def per_replica_dataset(ctx):
      ds = dataset().unbatch().batch(ctx.get_per_replica_batch_size(
          GLOBAL_BATCH), drop_remainder=True)
      return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    dist = strategy.distribute_datasets_from_function(per_replica_dataset,
                                                      options)
  iterator = iter(dist)

  @tf.function
  def step():
    def tpu_step(targets):
      with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = loss_fn(activations, targets)
      embedding.apply_gradients(tape.gradient(loss, activations))

    (features, weights), targets = next(iterator)
    weights = {"dense": None, "ragged": weights["ragged"], "seq": None}
    embedding.enqueue(features, weights, training=True)
    strategy.run(tpu_step, args=(targets,))

  states = [snapshot(embedding)]
  for _ in range(steps):
    step()
    states.append(snapshot(embedding))
  return states, embedding


def snapshot(embedding):
  return {f"{t.name}/{n}": v.numpy()
          for t, slots in embedding.variables.items()
          for n, v in slots.items()}


# Clipping and weight decay apply to the global batch's gradient, not a
# replica's.
CASES = ("adagrad_halfclip_decay", "adam_eps_outside", "ftrl")


_STRATEGIES = {}


def mirrored(n):
  """One MirroredStrategy per replica count for the whole test process.

  Strategies of different sizes in one process must not share collective
  group keys (TensorFlow starts every strategy's keys at the same base), so
  each gets its own base, as TensorFlow's own tests do.
  """
  if n not in _STRATEGIES:
    tf.distribute.MirroredStrategy._collective_key_base = 1000 * n  # pylint: disable=protected-access
    _STRATEGIES[n] = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(n)])
  return _STRATEGIES[n]


_ONE_REPLICA = {}


def one_replica(opt):
  """The 1-replica run on the global batch, once per optimizer."""
  if opt not in _ONE_REPLICA:
    _ONE_REPLICA[opt] = train(tf.distribute.get_strategy(),
                              lambda: helpers.optimizer(opt))[0]
  return _ONE_REPLICA[opt]


def assert_same_states(got, expected):
  assert len(got) == len(expected)
  for step, (g, e) in enumerate(zip(got, expected)):
    assert set(g) == set(e)
    for key in e:
      np.testing.assert_allclose(g[key], e[key], rtol=1e-5, atol=1e-6,
                                 err_msg=f"after step {step}: {key}")


@pytest.fixture(params=["kernels", "tensorflow"])
def host_path(request):
  """The mirrored tables trained by the fused kernels, or by TensorFlow's
  ops (the option `fused_kernels=False`, as where the kernels cannot
  build), for the engines the test creates."""
  with tfemb.options.use(fused_kernels=request.param == "kernels"):
    yield request.param


# 4 replicas in the long suite (the suite's time): CI's 4-replica cases are
# test_a_table_without_ids_in_a_step's and the host TPU types'.
@pytest.mark.parametrize("replicas",
                         [2, pytest.param(4, marks=pytest.mark.long)])
@pytest.mark.parametrize("opt", CASES)
def test_mirrored_equals_one_replica(opt, replicas, host_path):
  """After one and after every further step."""
  expected = one_replica(opt)
  assert not np.allclose(expected[-1]["shared/parameters"],
                         expected[0]["shared/parameters"])
  assert_same_states(
      train(mirrored(replicas), lambda: helpers.optimizer(opt))[0], expected)


def test_distribute_datasets_from_function():
  got, _ = train(mirrored(2), lambda: helpers.optimizer(CASES[0]),
                 input_fn="distribute_datasets_from_function")
  assert_same_states(got, one_replica(CASES[0]))


def test_replica_copies_stay_identical(host_path):
  _, embedding = train(mirrored(4), lambda: tfemb.Adam(0.1), steps=2)
  for table, slots in embedding.variables.items():
    for name, var in slots.items():
      copies = [v.numpy() for v in var.values]
      assert len(copies) == 4
      for c in copies[1:]:
        np.testing.assert_array_equal(c, copies[0],
                                      err_msg=f"{table.name}/{name}")


def _two_steps(strategy, case, init, ids, coef, distributed=True,
               non_finite="raise", enqueue_in_run=False):
  """Two steps of `loss = sum(activations * coef)` over a global batch of
  single ids, with the optimizer of `case` (tests/helpers.py); returns the
  embedding and the step function. With
  `enqueue_in_run`, each replica enqueues its own ids inside `strategy.run`
  (so the tables are created there, in the first step)."""
  with strategy.scope():
    table = tfemb.TableConfig(
        init.shape[0], init.shape[1], name="t",
        initializer=tf.constant_initializer(init))
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   helpers.optimizer(case))
  embedding.non_finite_gradients = non_finite
  data = tf.data.Dataset.from_tensor_slices(
      (ids.reshape(-1), coef.reshape(-1, init.shape[1]).astype(np.float32)))
  data = data.batch(ids.shape[1], drop_remainder=True)
  if distributed:
    data = strategy.experimental_distribute_dataset(
        data, tf.distribute.InputOptions(experimental_fetch_to_device=False))
  iterator = iter(data)

  def tpu_step(c, features=None):
    if features is not None:
      embedding.enqueue({"f": features}, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      loss = tf.reduce_sum(act["f"] * c)
    embedding.apply_gradients(tape.gradient(loss, act))

  @tf.function
  def step():
    features, c = next(iterator)
    if enqueue_in_run:
      strategy.run(tpu_step, args=(c, features))
    elif distributed:
      embedding.enqueue({"f": features}, training=True)
      strategy.run(tpu_step, args=(c,))
    else:  # outside strategy.run: one step on the whole batch
      embedding.enqueue({"f": features}, training=True)
      tpu_step(c)

  for _ in range(ids.shape[0]):
    step()
  return embedding, step


def _reference(case, init, ids, coef):
  ref = reference.Table(init, *helpers.reference_optimizer(case))
  for step_ids, step_coef in zip(ids, coef):
    ref.apply(reference.row_gradients(zip(step_ids, step_coef)),
              ref.params["learning_rate"])
  return ref


def _assert_every_copy(embedding, ref):
  (variables,) = embedding.variables.values()
  expected = {"parameters": ref.w, **ref.slots}
  assert set(variables) == set(expected)
  for name, var in variables.items():
    for k, copy in enumerate(var.values):
      np.testing.assert_allclose(copy.numpy(), expected[name], rtol=1e-5,
                                 atol=1e-6, err_msg=f"{name}, copy {k}")


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_each_replica_runs_the_kernels_on_its_own_copy(kind):
  """2 replicas, 2 steps: the step's graph holds each kernel once per
  replica and no TensorFlow gather or scatter of a table, and every copy
  of the table and its slots equals the numpy reference."""
  rng = np.random.default_rng(11)
  init = rng.normal(size=(10, 3))
  ids = np.array([[1, 2, 1, 7], [7, 7, 0, 2]])
  coef = rng.normal(size=(2, 4, 3))
  embedding, step = _two_steps(mirrored(2), kind, init, ids, coef)
  types = [op.type for op in step.get_concrete_function().graph.get_operations()]
  for kernel in ("TfembDedupGather", "TfembRowGradients"):
    assert types.count(kernel) == 2, kernel
  assert types.count("TfembApplyTables") == 2  # one table, on each replica
  for op_type in ("ResourceGather", "ResourceScatterUpdate"):
    assert op_type not in types, op_type
  _assert_every_copy(embedding, _reference(kind, init, ids, coef))


def test_an_update_outside_strategy_run_reaches_every_copy():
  """enqueue, dequeue and apply_gradients all outside strategy.run under 2
  replicas: a one-replica step, written to both copies (TensorFlow's
  mirrored scatters, not the kernels on one copy)."""
  strategy = mirrored(2)
  with strategy.scope():
    copies = {"parameters": tf.Variable(tf.zeros([4, 2]))}
  assert not fused_ops.in_place_here(copies)  # another strategy's context
  with strategy.scope():  # the cross-replica context
    assert not fused_ops.in_place_here(copies)
  # In each replica's context (equal results regroup into one value).
  assert strategy.run(lambda: fused_ops.in_place_here(copies)) is True
  rng = np.random.default_rng(12)
  init = rng.normal(size=(10, 3))
  ids = np.array([[1, 2, 1, 7], [7, 7, 0, 2]])
  coef = rng.normal(size=(2, 4, 3))
  embedding, _ = _two_steps(strategy, "adagrad", init, ids, coef,
                            distributed=False)
  _assert_every_copy(embedding, _reference("adagrad", init, ids, coef))


def test_tables_created_in_the_first_strategy_run():
  """The first enqueue inside `strategy.run` under 2 replicas: the tables
  are created once, in the cross-replica context (mirrored, one copy per
  replica), and every copy trains to the numpy reference."""
  rng = np.random.default_rng(14)
  init = rng.normal(size=(10, 3))
  ids = np.array([[1, 2, 1, 7], [7, 7, 0, 2]])
  coef = rng.normal(size=(2, 4, 3))
  embedding, _ = _two_steps(mirrored(2), "adagrad", init, ids, coef,
                            enqueue_in_run=True)
  (variables,) = embedding.variables.values()
  assert all(len(v.values) == 2 for v in variables.values())
  _assert_every_copy(embedding, _reference("adagrad", init, ids, coef))


def test_a_non_finite_gradient_on_one_replica_skips_the_step_on_all():
  """Policy "skip", 2 replicas: replica 1's half of the first batch has a
  NaN gradient. Both copies skip that step (the check is of the global
  gradient, not of each replica's own) and take the second."""
  rng = np.random.default_rng(13)
  init = rng.normal(size=(10, 3))
  ids = np.array([[1, 2, 1, 7], [7, 7, 0, 2]])
  coef = rng.normal(size=(2, 4, 3))
  coef[0, 3, 1] = np.nan  # the first step's last example: replica 1's
  embedding, _ = _two_steps(mirrored(2), "adam", init, ids, coef,
                            non_finite="skip")
  _assert_every_copy(embedding, _reference("adam", init, ids[1:], coef[1:]))
  assert [int(c.numpy()) for c in embedding._core.policy._skipped.values] == [1, 1]  # pylint: disable=protected-access


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_a_mirrored_step_reads_rows_not_tables(kind, host_path):
  """On either path, 2 replicas: no op of the traced step reads a whole
  table or slot or makes a tensor of the vocabulary's size (tf.gather on a
  mirrored variable reads all of it: the rows come from each copy's
  resource gather)."""
  vocab = 100_003  # a size no batch-derived tensor can have by accident
  init = np.zeros((vocab, 3))
  ids = np.array([[1, 2, 1, 7]])
  _, step = _two_steps(mirrored(2), kind, init, ids,
                       np.ones((1, 4, 3)))
  graph = step.get_concrete_function().graph
  types = [op.type for op in graph.get_operations()]
  if host_path == "tensorflow":
    # Per replica: the lookup's rows, then the update's (of the global
    # batch's ids) of the table and of each slot.
    slots = len(helpers.optimizer(kind)._slot_names())  # pylint: disable=protected-access
    assert types.count("ResourceGather") == 2 * (2 + slots)
  for op in graph.get_operations():
    for out in op.outputs:
      dims = out.shape.as_list() if out.shape.rank is not None else []
      assert vocab not in dims, (op.type, op.name)


def test_an_enqueue_per_device():
  """valid_input_test.test_enqueue_per_device: each replica's batch
  enqueued with `device=` (from `experimental_distribute_values_from_
  function`) is what that replica dequeues."""
  strategy = mirrored(2)
  init = np.arange(40, dtype=np.float64).reshape(10, 4)
  with strategy.scope():
    table = tfemb.TableConfig(10, 4, name="t", combiner="sum",
                              initializer=tf.constant_initializer(init))
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   tfemb.SGD(0.1))
  rows = [[1], [2, 3], [4, 5], [6, 9]]

  @tf.function
  def step():
    def enqueue_one(context):
      index = context.replica_id_in_sync_group
      mine = helpers.sparse(rows[2 * index:2 * index + 2])
      embedding.enqueue({"f": mine}, training=False,
                        device=strategy.extended.worker_devices[index])
      return 0.0

    data = strategy.experimental_distribute_values_from_function(enqueue_one)
    return strategy.run(lambda unused: embedding.dequeue(), args=(data,))

  per_replica = strategy.experimental_local_results(step()["f"])
  for index, got in enumerate(per_replica):
    np.testing.assert_allclose(
        got.numpy(), reference.combine(init, rows[2 * index:2 * index + 2],
                                       "sum"))
  with pytest.raises(ValueError, match="no replica of this worker"):
    embedding.enqueue({"f": helpers.sparse(rows[:2])}, device="/cpu:3")


# --- a table that gets no id in a step ---------------------------------------

_EMPTY_BATCH = 16  # under 4 replicas, 4 samples each: a chip's SparseCores


def _empty_case_batches(case, per_replica, rng):
  """Two global batches of features "x" (table a) and "y" (table b): in
  the first, "x" is empty in the whole batch ("everywhere"), or in the
  first replica's share only ("one_replica"); "dropped": every id of
  every table is dropped by the SparseCore limits."""
  batches = []
  for step in range(2):
    x = helpers.random_rows(rng, _EMPTY_BATCH, 16, 3, min_len=1)
    if step == 0 and case == "everywhere":
      x = [[] for _ in x]
    elif step == 0 and case == "one_replica":
      x = [[] for _ in x[:per_replica]] + x[per_replica:]
    y = helpers.random_rows(rng, _EMPTY_BATCH, 16, 3, min_len=1)
    batches.append({"x": x, "y": y})
  return batches


def _train_with_empty_features(strategy, engine, case, in_function):
  per_replica = _EMPTY_BATCH // strategy.num_replicas_in_sync
  batches = _empty_case_batches(case, per_replica,
                                np.random.default_rng(21))
  init = np.arange(16 * 4, dtype=np.float64).reshape(16, 4) / 64
  with strategy.scope():
    tables = {n: tfemb.TableConfig(16, 4, name=n, initializer=(
        tf.constant_initializer(init * k))) for k, n in ((1, "a"), (2, "b"))}
    if engine == "TPUEmbedding":
      embedding = tfemb.TPUEmbedding(
          {f: tfemb.FeatureConfig(tables[t]) for f, t in (("x", "a"),
                                                         ("y", "b"))},
          tfemb.Adagrad(0.1))
      embedding.build(per_replica_input_shapes={
          "x": tf.TensorShape([per_replica, None]),
          "y": tf.TensorShape([per_replica, None])})
    else:
      limits = (tfemb.SparseCoreEmbeddingConfig(
          max_ids_per_chip_per_sample=0, allow_id_dropping=True)
                if case == "dropped" else None)
      embedding = tfemb.TPUEmbeddingV2(
          {f: tfemb.FeatureConfig(tables[t], output_shape=[per_replica])
           for f, t in (("x", "a"), ("y", "b"))},
          tfemb.Adagrad(0.1), sparse_core_embedding_config=limits)
      if case == "dropped":  # else built by its first lookup, in a step
        embedding.build()

  def replica_step(features):
    ones = {f: tf.ones([per_replica, 4]) for f in ("x", "y")}
    if engine == "TPUEmbedding":
      embedding.dequeue()
      embedding.apply_gradients(ones)
    else:
      _, preserved = embedding(features)
      embedding.apply_gradients(ones, preserved)

  def step(features):
    if engine == "TPUEmbedding":
      embedding.enqueue(features, training=True)
    strategy.run(replica_step, args=(features,))

  if in_function:
    step = tf.function(step)
  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
  for batch in batches:
    data = tf.data.Dataset.from_tensors(
        {f: helpers.ragged(rows) for f, rows in batch.items()})
    if strategy.num_replicas_in_sync > 1:
      data = strategy.experimental_distribute_dataset(
          data.unbatch().batch(_EMPTY_BATCH), options)
    step(next(iter(data)))
  return embedding, init, batches


# Every pair of (replicas, eager or tf.function, fused kernels or TensorFlow's
# ops) for each engine, two runs per case (the suite's time).
_PAIRS = [(2, "eager", "kernels"), (4, "fn", "kernels"),
          (2, "fn", "tensorflow"), (4, "eager", "tensorflow")]


@pytest.mark.parametrize("engine,case,replicas,mode,path", [
    pytest.param(*((engine, case) + _PAIRS[k % 4]), marks=[
        pytest.mark.requires_tensorflow("2.17")] if engine.endswith("V2")
                 else [])
    for n, (engine, case) in enumerate([
        ("TPUEmbedding", "everywhere"), ("TPUEmbedding", "one_replica"),
        ("TPUEmbeddingV2", "everywhere"), ("TPUEmbeddingV2", "one_replica"),
        ("TPUEmbeddingV2", "dropped")])
    for k in (2 * n, 2 * n + 1)])
def test_a_table_without_ids_in_a_step(engine, case, replicas, mode, path):
  """A feature empty in a step on every replica, or on one, or every id
  dropped: the step trains the global batch's rows (TensorFlow's all-gather
  of a tensor empty on every replica would kill the process), and every
  copy equals the numpy reference of the global batch. The first two
  TPUEmbeddingV2 cases create their tables in their first lookup, inside
  strategy.run."""
  with tfemb.options.use(fused_kernels=path == "kernels"):
    embedding, init, batches = _train_with_empty_features(
        mirrored(replicas), engine, case, mode == "fn")
  for copy in range(replicas):
    got = v2_worker.unstacked(embedding, copy)
    for name, feature, k in (("a", "x", 1), ("b", "y", 2)):
      ref = reference.Table(init * k, "adagrad", {})
      for batch in batches if case != "dropped" else ():
        ref.apply(reference.row_gradients(reference.contributions(
            batch[feature], "mean", np.ones((_EMPTY_BATCH, 4)))), 0.1)
      for slot, want in (("parameters", ref.w),
                         ("accumulators", ref.slots["accumulators"])):
        np.testing.assert_allclose(got[f"{name}/{slot}"], want, rtol=1e-5,
                                   atol=1e-6,
                                   err_msg=f"{name}/{slot}, copy {copy}")
  if case == "dropped":
    assert embedding.dropped_ids == {"a_b": sum(  # each (sample, id) once
        len(set(r)) for batch in batches for rows in batch.values()
        for r in rows)}


