"""keras-rs' `DistributedEmbedding` (Keras 3, TensorFlow backend) trains on
a host v5p-8 with the SparseCore's numbers (tests/reference.py).

Unmodified keras-rs: under `tfemb.patch(tpu="v5p-8")` its placement
`"sparsecore"` (and `"auto"`, which picks the SparseCore on a TPU) makes
TensorFlow's `TPUEmbeddingV2`, which is tfemb's host engine. Each case
trains with `model.fit` over 4 replicas, then checks
`get_embedding_tables`, `predict` and `evaluate` against the numpy
reference on the global batch; the engine's checkpoint restores the
tables.
"""

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
from tfemb.sparsecore import table_stacking

# keras-rs is Keras 3's, and needs TensorFlow's SparseCore classes (2.17).
pytestmark = [pytest.mark.runs_under("keras3"),
              pytest.mark.requires_tensorflow("2.17")]
import keras  # pylint: disable=g-import-not-at-top,wrong-import-position

GLOBAL_BATCH, STEPS, SEQUENCE = 16, 3, 3
TABLES = {"small": (20, 4, "sum"), "wide": (30, 8, "mean")}
# Keras optimizers as keras-rs converts them (its OPTIMIZER_MAPPINGS), and
# the reference's view: TensorFlow's embedding Adam is lazy, epsilon inside
# the square root; Keras' Adagrad and FTRL start their accumulators at 0.1.
OPTIMIZERS = {
    "sgd": (lambda: keras.optimizers.SGD(0.3), "sgd", {}),
    "adagrad": (lambda: keras.optimizers.Adagrad(0.2), "adagrad",
                {"initial_accumulator_value": 0.1}),
    "adam": (lambda: keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.9),
             "adam", {"beta_1": 0.8, "beta_2": 0.9, "epsilon": 1e-7}),
    "ftrl": (lambda: keras.optimizers.Ftrl(
        0.2, l1_regularization_strength=0.01,
        l2_regularization_strength=0.02, beta=0.3), "ftrl",
             {"initial_accumulator_value": 0.1, "learning_rate_power": -0.5,
              "l1_regularization_strength": 0.01,
              "l2_regularization_strength": 0.02, "beta": 0.3}),
}
LEARNING_RATES = {"sgd": 0.3, "adagrad": 0.2, "adam": 0.05, "ftrl": 0.2}


@pytest.fixture(name="strategies", scope="module")
def fixture_strategies():
  """The v5p-8's 4 replicas, and one replica of it (a device assignment,
  as keras-rs' own tests make)."""
  patch = tfemb.patch(tpu="v5p-8")
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
  tf.config.experimental_connect_to_cluster(resolver)
  topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  one = tf.tpu.experimental.DeviceAssignment.build(topology, num_replicas=1)
  yield {4: tf.distribute.TPUStrategy(resolver),
         1: tf.distribute.TPUStrategy(
             resolver, experimental_device_assignment=one)}
  patch.undo()


def _batches(input_type, rng):
  """Per step and feature: each example's ids and weights."""
  out = []
  for _ in range(STEPS):
    step = {}
    for name, (vocab, _, _) in TABLES.items():
      if input_type == "dense":
        rows = [[int(i)] for i in rng.integers(0, vocab, GLOBAL_BATCH)]
      else:
        rows = [list(rng.integers(0, vocab, 1 + b % SEQUENCE))
                for b in range(GLOBAL_BATCH)]
      weights = [list(rng.uniform(0.5, 2.0, len(r))) for r in rows]
      step[name] = (rows, weights)
    out.append(step)
  return out


def _tensor(rows, input_type, dtype):
  if input_type == "dense":
    return tf.constant(rows, dtype)
  ragged = tf.ragged.constant(rows, dtype)
  return ragged if input_type == "ragged" else ragged.to_sparse()


def _model(input_type, optimizer, placement, stacking):
  """Per feature a table of its own; the prediction is the sum of every
  activation."""
  import keras_rs  # pylint: disable=g-import-not-at-top
  make, _, _ = OPTIMIZERS[optimizer]
  features = {}
  for name, (vocab, dim, combiner) in TABLES.items():
    table = keras_rs.layers.TableConfig(
        name=name, vocabulary_size=vocab, embedding_dim=dim,
        optimizer=make(), combiner=combiner, placement=placement,
        initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=1))
    length = 1 if input_type == "dense" else SEQUENCE
    features[name] = keras_rs.layers.FeatureConfig(
        name=name, table=table, input_shape=(GLOBAL_BATCH, length),
        output_shape=(GLOBAL_BATCH, dim))
  layer = keras_rs.layers.DistributedEmbedding(features,
                                               table_stacking=stacking)
  kind = dict(ragged=input_type == "ragged", sparse=input_type == "sparse")
  ids = {n: keras.Input((features[n].input_shape[1],), dtype="int32", **kind)
         for n in TABLES}
  weights = {n: keras.Input((features[n].input_shape[1],), dtype="float32",
                            **kind) for n in TABLES}
  activations = layer(ids, weights)
  pred = keras.ops.sum(keras.ops.concatenate(
      [keras.ops.sum(activations[n], axis=1, keepdims=True) for n in TABLES],
      axis=1), axis=1, keepdims=True)
  model = keras.Model((ids, weights), pred)
  model.compile(optimizer="sgd", loss="mse")
  return model, layer


def _dataset(strategy, batches, labels, input_type):
  def one(step):
    ids = {n: _tensor(step[n][0], input_type, tf.int32) for n in TABLES}
    weights = {n: _tensor(step[n][1], input_type, tf.float32) for n in TABLES}
    return ids, weights

  parts = [one(step) for step in batches]
  data = tf.data.Dataset.from_tensors((parts[0], labels[0]))
  for part, y in zip(parts[1:], labels[1:]):
    data = data.concatenate(tf.data.Dataset.from_tensors((part, y)))
  return strategy.experimental_distribute_dataset(
      data, tf.distribute.InputOptions(experimental_fetch_to_device=False))


def _tables(layer, strategy):
  """Each table's rows. keras-rs 0.4.0's `get_embedding_tables` reads
  TensorFlow's `embedding_tables` by table name, which names stacked
  tables only (a KeyError for a table in a stack, on a TPU too): a stack
  is unstacked as docs/sparsecore.md lays it out."""
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  stacked = engine.embedding_tables
  if set(stacked) == set(TABLES):
    with strategy.scope():
      return {n: np.asarray(t) for n, t in layer.get_embedding_tables().items()}
  return table_stacking.to_unstacked(
      engine._stacking, {n: v.numpy() for n, v in stacked.items()})  # pylint: disable=protected-access


def _predictions(tables, step):
  pred = np.zeros(GLOBAL_BATCH)
  for name, (_, _, combiner) in TABLES.items():
    rows, weights = step[name]
    pred += reference.combine(tables[name], rows, combiner, weights).sum(1)
  return pred


# Keras 3's `fit` cannot take ragged or sparse inputs over several replicas
# (it MEAN-reduces the first batch to build the model, which composite
# tensors refuse, on a TPU's strategy too): those cases train on one
# replica, as keras-rs' own tests do.
@pytest.mark.parametrize("optimizer,input_type,placement,stacking", [
    ("sgd", "dense", "sparsecore", "auto"),
    ("adam", "dense", "auto", None),
    ("ftrl", "ragged", "sparsecore", "auto"),
    ("adagrad", "sparse", "auto", None),
])
def test_keras_rs_trains_with_the_sparsecores_numbers(
    strategies, tmp_path, optimizer, input_type, placement, stacking):
  strategy = strategies[4 if input_type == "dense" else 1]
  rng = np.random.default_rng(11)
  batches = _batches(input_type, rng)
  labels = [rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
            for _ in range(STEPS)]
  with strategy.scope():
    model, layer = _model(input_type, optimizer, placement, stacking)
    layer._tpu_embedding.build()  # pylint: disable=protected-access
  initial = {n: np.asarray(t, np.float64)
             for n, t in _tables(layer, strategy).items()}
  assert type(layer._tpu_embedding) is tfemb.TPUEmbeddingV2  # pylint: disable=protected-access
  distributed = _dataset(strategy, batches, labels, input_type)
  history = model.fit(distributed, epochs=1, verbose=0)

  _, kind, params = OPTIMIZERS[optimizer]
  expected = {n: reference.Table(initial[n], kind, params) for n in TABLES}
  losses = []
  for step, y in zip(batches, labels):
    pred = _predictions({n: t.w for n, t in expected.items()}, step)
    losses.append(reference.mean_squared_error(y[:, 0], pred))
    grad = 2 * (pred - y[:, 0]) / GLOBAL_BATCH
    for name, (_, dim, combiner) in TABLES.items():
      rows, weights = step[name]
      pairs = reference.contributions(
          rows, combiner, np.repeat(grad[:, None], dim, axis=1), weights)
      expected[name].apply(reference.row_gradients(pairs),
                           LEARNING_RATES[optimizer])
  tables = _tables(layer, strategy)
  for name in TABLES:
    np.testing.assert_allclose(tables[name], expected[name].w, rtol=2e-5,
                               atol=2e-6, err_msg=name)
  assert history.history["loss"][0] == pytest.approx(np.mean(losses),
                                                     rel=1e-4)

  trained = {n: t.w for n, t in expected.items()}
  want = np.concatenate([_predictions(trained, step) for step in batches])
  got = model.predict(distributed, verbose=0)
  np.testing.assert_allclose(got[:, 0], want, rtol=1e-4, atol=1e-5)
  loss = model.evaluate(distributed, verbose=0)
  assert loss == pytest.approx(np.mean([
      reference.mean_squared_error(y[:, 0], _predictions(trained, step))
      for step, y in zip(batches, labels)]), rel=1e-4)

  # keras-rs 0.4.0 does not track its SparseCore engine (its own
  # save-and-load test is skipped on a TPU: "TODO table reloading"), so a
  # model's checkpoint holds no table. The engine's own checkpoint, as
  # TensorFlow's mid-level API saves it, restores them.
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  path = tf.train.Checkpoint(embedding=engine).save(str(tmp_path / "ckpt"))
  with strategy.scope():
    _, again = _model(input_type, optimizer, placement, stacking)
    again._tpu_embedding.build()  # pylint: disable=protected-access
  tf.train.Checkpoint(embedding=again._tpu_embedding).restore(path)  # pylint: disable=protected-access
  restored = _tables(again, strategy)
  for name in TABLES:
    np.testing.assert_array_equal(restored[name], tables[name])


def _lookup_layer(strategy, features, inputs, weights, jit_compile=False):
  """keras-rs' layer called in `strategy.run`, as keras-rs' own tests call
  it; its activations and the layer."""
  import keras_rs  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    layer = keras_rs.layers.DistributedEmbedding(features)

  @tf.function(jit_compile=jit_compile)
  def call(ids, w):
    return strategy.run(layer.__call__, args=(ids, w))

  return call(inputs, weights), layer


def test_a_shared_table_beside_a_default_device_table(strategies):
  """What keras-rs' own tests check on a TPU (shared table, mixed
  placement, a sqrtn combiner over weighted ragged ids): each feature's
  activations are the reference's, from its own table's rows."""
  import keras_rs  # pylint: disable=g-import-not-at-top
  strategy = strategies[1]  # ragged inputs: one replica, as keras-rs' tests
  shared = keras_rs.layers.TableConfig(
      name="shared", vocabulary_size=12, embedding_dim=4, combiner="sqrtn",
      placement="sparsecore",
      initializer=keras.initializers.RandomUniform(-1, 1, seed=3))
  own = keras_rs.layers.TableConfig(
      name="own", vocabulary_size=6, embedding_dim=8,
      placement="default_device",
      initializer=keras.initializers.RandomUniform(-1, 1, seed=4))
  rows = {"a": [[1, 2], [3], [4, 4, 5], [0]], "b": [[2], [6, 7], [8], []],
          "c": [[1], [2], [3], [5]]}
  weights = {"a": [[0.5, 2.0], [1.0], [1.0, 3.0, 0.25], [2.0]],
             "b": [[1.5], [1.0, 0.5], [4.0], []]}
  features = {
      n: keras_rs.layers.FeatureConfig(
          name=n, table=shared if n != "c" else own,
          input_shape=(4, 3 if n != "c" else 1),
          output_shape=(4, 4 if n != "c" else 8)) for n in rows}
  inputs = {n: tf.ragged.constant(r, tf.int32) if n != "c"
            else tf.constant(r, tf.int32) for n, r in rows.items()}
  w = {n: tf.ragged.constant(weights[n], tf.float32) if n in weights
       else tf.ones((4, 1), tf.float32) for n in rows}
  activations, layer = _lookup_layer(strategy, features, inputs, w)
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  shared_rows = table_stacking.to_unstacked(
      engine._stacking,  # pylint: disable=protected-access
      {n: v.numpy() for n, v in engine.embedding_tables.items()})["shared"]
  with strategy.scope():
    own_rows = np.asarray(layer.get_embedding_tables()["own"])
  for name in ("a", "b"):
    np.testing.assert_allclose(
        np.asarray(activations[name]),
        reference.combine(shared_rows, rows[name], "sqrtn", weights[name]),
        rtol=1e-5, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(np.asarray(activations["c"]),
                             own_rows[np.asarray(rows["c"])[:, 0]],
                             rtol=1e-6)


def test_jit_compile_is_refused_naming_the_remedy(strategies):
  """keras-rs' jit cases, on the host engine: XLA cannot compile its
  step, refused naming the remedy."""
  import keras_rs  # pylint: disable=g-import-not-at-top
  strategy = strategies[4]
  table = keras_rs.layers.TableConfig(
      name="t", vocabulary_size=8, embedding_dim=4, placement="sparsecore")
  features = {"f": keras_rs.layers.FeatureConfig(
      name="f", table=table, input_shape=(16, 1), output_shape=(16, 4))}
  ids = tf.constant(np.arange(16).reshape(16, 1) % 8, tf.int32)
  with pytest.raises(ValueError, match=r"XLA cannot compile.*"
                     r"jit_compile=False"):
    _lookup_layer(strategy, features, {"f": ids}, None, jit_compile=True)
