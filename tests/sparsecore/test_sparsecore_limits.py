"""The SparseCore's id limits on the CPU (docs/sparsecore.md, "Id limits"):
`compute_sparse_core_stats` against a numpy partitioning that follows the
docs, the host `TPUEmbeddingV2` failing or dropping what a TPU fails or
drops (random batches against `reference.sparse_core_limits`, on one chip
or several, eagerly and in a `tf.function` that runs no Python), and the
report of `python -m tfemb.tpu sparsecore`.
"""

import collections
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import sparsecore_scenario
import tfemb
import tfemb.layers
from tfemb.sparsecore import pipeline_report
from tfemb.tpu.planner import cli

# The SparseCore host engine needs TensorFlow's stacker (2.17 on).
pytestmark = pytest.mark.requires_tensorflow("2.17")

ROOT = str(helpers.ROOT)
C = 4  # SparseCores per chip


def reference_stats(batch, table_of, chips):
  """Per stacked table (here one stack of every table), the most
  deduplicated ids and distinct (table, id) one (SparseCore of the chip,
  partition) gets. Sample k of S goes to SparseCore k // (S / C); id i of
  the k-th table of the stack (by name) to partition (i + k * C) mod N."""
  n = chips * C
  names = sorted(set(table_of.values()))
  ids = collections.Counter()
  unique = collections.defaultdict(set)
  for feature, rows in batch.items():
    table = table_of[feature]
    rotation = names.index(table) * C % n
    per_core = len(rows) // C
    for k, row in enumerate(rows):
      for i in set(row):
        cell = (k // per_core, (i + rotation) % n)
        ids[cell] += 1
        unique[cell].add((table, i))
  return max(ids.values()), max(len(u) for u in unique.values())


def config(samples=16, vocab=(64, 40)):
  a = tfemb.TableConfig(vocab[0], 8, name="a")
  b = tfemb.TableConfig(vocab[1], 8, name="b")
  return {"x": tfemb.FeatureConfig(a, output_shape=[samples]),
          "y": tfemb.FeatureConfig(a, output_shape=[samples]),
          "z": tfemb.FeatureConfig(b, output_shape=[samples])}


TABLE_OF = {"x": "a", "y": "a", "z": "b"}


def as_inputs(batch):
  return {k: tf.ragged.constant(v, dtype=tf.int64) for k, v in batch.items()}


def batches():
  rng = np.random.default_rng(0)
  yield "one id everywhere", {k: [[0]] * 16 for k in "xyz"}
  yield "ids 0..n-1", {"x": [[i] for i in range(16)],
                       "y": [[i + 16] for i in range(16)],
                       "z": [[i] for i in range(16)]}
  yield "multi-hot", {k: [list(rng.integers(0, 40, rng.integers(1, 6)))
                          for _ in range(16)] for k in "xyz"}


@pytest.mark.parametrize("chips", [1, 2, 4])
@pytest.mark.parametrize("name,batch", list(batches()),
                         ids=[n for n, _ in batches()])
def test_stats_match_a_numpy_partitioning(name, batch, chips):
  del name
  max_ids, max_unique = tfemb.TPUEmbeddingV2.compute_sparse_core_stats(
      as_inputs(batch), config(), chips)
  assert list(max_ids) == ["a_b"]  # both tables of width 8, stacked
  want_ids, want_unique = reference_stats(batch, TABLE_OF, chips)
  assert max_ids["a_b"].dtype == tf.int32
  assert int(max_ids["a_b"]) == want_ids
  assert int(max_unique["a_b"]) == want_unique


def test_stats_cast_ids_to_int32_as_tensorflow_does():
  """Float ids truncated, int64 ids wrapped to their low 32 bits."""
  batch = {k: [[i] for i in range(16)] for k in "xyz"}
  features = as_inputs(batch)
  features["x"] = tf.constant([i + 0.9 for i in range(16)])
  features["y"] = tf.constant([i + 2**32 for i in range(16)], tf.int64)
  max_ids, max_unique = tfemb.TPUEmbeddingV2.compute_sparse_core_stats(
      features, config(), 2)
  want_ids, want_unique = reference_stats(batch, TABLE_OF, 2)
  assert (int(max_ids["a_b"]), int(max_unique["a_b"])) == (want_ids,
                                                           want_unique)


def test_stats_have_tensorflows_signature():
  ours = inspect.signature(tfemb.TPUEmbeddingV2.compute_sparse_core_stats)
  theirs = inspect.signature(
      tf.tpu.experimental.embedding.TPUEmbeddingV2.compute_sparse_core_stats)
  assert list(ours.parameters) == list(theirs.parameters)
  assert [p.default for p in ours.parameters.values()] == [
      p.default for p in theirs.parameters.values()]


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_tpu_chips=0), "num_tpu_chips must be a positive integer"),
    (dict(features={"x": tf.constant([1.0] * 16)}),
     "features must have the structure"),
    (dict(features={"x": tf.constant(["1"] * 16), "y": tf.constant([1] * 16),
                    "z": tf.constant([1] * 16)}),
     "Feature `x` .*Cast string to int32 is not supported"),
    (dict(features={"x": tf.constant([99] * 16), "y": tf.constant([1] * 16),
                    "z": tf.constant([1] * 16)}), r"id 99 outside \[0, 64\)"),
], ids=["chips", "structure", "strings", "range"])
def test_stats_refuse_bad_input(kwargs, message):
  args = dict(features={k: tf.constant([1] * 16) for k in "xyz"},
              feature_config=config(), num_tpu_chips=1)
  args.update(kwargs)
  with pytest.raises((ValueError, TypeError), match=message):
    tfemb.TPUEmbeddingV2.compute_sparse_core_stats(**args)


# --- the host engine under a SparseCoreEmbeddingConfig ------------------------


def engine(sc_config, combiner="sum"):
  table = tfemb.TableConfig(32, 8, name="t", combiner=combiner,
                            initializer=tf.ones_initializer())
  return tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[16])}, tfemb.SGD(0.5),
      sparse_core_embedding_config=sc_config)


def table_rows(embedding):
  proto = embedding.embedding_layouts["t"]
  i = np.arange(32)
  n = proto.num_sparse_cores
  rows = (((i % n + proto.sparse_core_shard_rotation) % n) *
          proto.total_rows_per_sparse_core_shard +
          proto.sparse_core_shard_row_offset + i // n)
  return embedding.embedding_tables["t"].numpy()[rows, :8]


def step(embedding, ids):
  activations, preserved = embedding({"f": ids})
  embedding.apply_gradients({"f": tf.ones([16, 8])}, preserved)
  return activations["f"]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
def test_a_partition_over_max_ids_fails_naming_it_and_writes_nothing(
    in_function):
  """Id 0 in every sample: each SparseCore of the chip sends its 4 samples'
  ids to partition 0."""
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_ids_per_table={"t": 3}))
  run = tf.function(step) if in_function else step
  # In a tf.function, tf.debugging.Assert's message escapes the quotes.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Stacked table \\?'t\\?': SparseCore 0 of the chip "
                     r"sends 4 ids to partition 0 .*over the limit of 3"):
    run(embedding, tf.zeros([16], tf.int32))
  np.testing.assert_array_equal(table_rows(embedding), 1.0)


def test_a_partition_over_max_unique_ids_fails():
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_unique_ids_per_table={"t": 1}))
  ids = tf.ragged.constant([[0, 4]] * 16)  # partitions 0 and 0 (mod 4)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"2 unique ids to partition 0.*limit of 1"):
    embedding({"f": ids})


def test_a_full_chip_buffer_fails_without_id_dropping():
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=1))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"48 ids do not fit in its buffer of 16"):
    step(embedding, tf.ragged.constant([[1, 2, 3]] * 16))
  np.testing.assert_array_equal(table_rows(embedding), 1.0)


def test_allow_id_dropping_drops_what_the_sparsecore_drops():
  """16 samples of ids [1, 2, 3], a buffer of 1 x 16 ids. SparseCore 0 of
  the chip sends its 4 samples' ids 1, 2, 3 to partitions 1, 2, 3: 4 ids
  (padded to 8), 4 (to 16), then the buffer is full; the other SparseCores'
  ids are dropped. Kept: ids 1 and 2 of samples 0-3."""
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=1, allow_id_dropping=True))
  activations = step(embedding, tf.ragged.constant([[1, 2, 3]] * 16)).numpy()
  np.testing.assert_array_equal(activations[:4], 2.0)  # rows 1 + 2
  np.testing.assert_array_equal(activations[4:], 0.0)
  want = reference.Table(np.ones((32, 8)), "sgd", {})
  want.apply({1: np.full(8, 4.0), 2: np.full(8, 4.0)}, 0.5)  # 4 samples' 1
  np.testing.assert_array_equal(table_rows(embedding), want.w)
  assert embedding.dropped_ids == {"t": 40}
  step(embedding, tf.ragged.constant([[1, 2, 3]] * 16))
  assert embedding.dropped_ids == {"t": 80}


def test_dropped_ids_keep_the_combiners_gains():
  """As on a SparseCore, a mean is over the sample's ids before dropping."""
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=1, allow_id_dropping=True), "mean")
  activations = step(embedding, tf.ragged.constant([[1, 2, 3]] * 16)).numpy()
  np.testing.assert_allclose(activations[:4], 2 / 3, rtol=1e-6)


def test_without_a_config_nothing_is_checked():
  embedding = engine(None)
  step(embedding, tf.zeros([16], tf.int32))
  assert embedding.dropped_ids == {}


def test_a_buffer_not_a_multiple_of_8_fails_every_batch():
  table = tfemb.TableConfig(32, 8, name="t")
  embedding = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[4])}, tfemb.SGD(0.5),
      sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
          max_ids_per_chip_per_sample=1, allow_id_dropping=True))
  with pytest.raises(reference.SparseCoreFailure) as failure:
    reference.sparse_core_limits(
        [dict(stack="t", position=0, rows=[[]] * 4)], {"t": 4}, 1,
        dict(max_ids={}, max_unique_ids={}, per_sample=1, dropping=True))
  lookup = lambda features: embedding(features)[0]
  for run in (lookup, tf.function(lookup)):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=_failure_pattern(failure.value)):
      run({"f": tf.ragged.constant([[], [], [], []], tf.int64)})


def test_the_step_runs_no_python():
  """The limits are TensorFlow ops: no PyFunc, EagerPyFunc or
  NumpyFunction in the traced step, nor in its conditionals' functions."""
  embedding = engine(tfemb.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=1, max_unique_ids_per_table={"t": 2},
      allow_id_dropping=True))
  graph = tf.function(step).get_concrete_function(
      embedding, tf.RaggedTensorSpec([16, None], tf.int64)).graph
  definition = graph.as_graph_def()
  ops = {node.op for node in definition.node}
  for function in definition.library.function:
    ops.update(node.op for node in function.node_def)
  assert {"If", "StatelessIf", "Unique", "Assert"} & ops  # looked inside
  assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc",
                    "NumpyFunction"}


def test_the_limits_add_no_checkpoint_key(tmp_path):
  """The dropped-id counters are the host's, untracked."""
  keys = {}
  for name, config in (("without", None), ("with", (
      tfemb.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=1,
                                      allow_id_dropping=True)))):
    embedding = engine(config)
    step(embedding, tf.ragged.constant([[1, 2, 3]] * 16, tf.int64))
    saved = tf.train.Checkpoint(embedding=embedding).save(
        str(tmp_path / name / "ckpt"))
    keys[name] = [k for k, _ in tf.train.list_variables(saved)]
  assert embedding.dropped_ids == {"t": 40}
  assert keys["with"] == keys["without"]


# The warning goes to TensorFlow's log, which CI quiets
# (TF_CPP_MIN_LOG_LEVEL=2): it is read in a process of its own, logging.
_LOGGING_STEPS = """
import tensorflow as tf
import tfemb
table = tfemb.TableConfig(32, 8, name="t", combiner="sum",
                          initializer=tf.ones_initializer())
embedding = tfemb.TPUEmbeddingV2(
    {"f": tfemb.FeatureConfig(table, output_shape=[16])}, tfemb.SGD(0.5),
    sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
        max_ids_per_chip_per_sample=1, allow_id_dropping=True))

@tf.function
def run(ids):
  activations, preserved = embedding({"f": ids})
  embedding.apply_gradients({"f": tf.ones([16, 8])}, preserved)

for _ in range(3):
  run(tf.ragged.constant([[1, 2, 3]] * 16, tf.int64))
print("DROPPED", embedding.dropped_ids)
"""


def test_dropped_ids_are_logged_at_most_once_a_minute():
  result = subprocess.run(
      [sys.executable, "-c", _LOGGING_STEPS], capture_output=True, text=True,
      timeout=600, check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
  assert result.returncode == 0, result.stderr[-3000:]
  logged = result.stderr
  assert logged.count("The SparseCore drops ids") == 1, logged[-3000:]
  assert ("dropped so far, per stacked table: {'t': 40}. See "
          "TPUEmbeddingV2.dropped_ids.") in logged
  assert "DROPPED {'t': 120}" in result.stdout


# --- the report ---------------------------------------------------------------


def test_the_command_line_report(tmp_path, capsys, monkeypatch):
  monkeypatch.syspath_prepend(os.path.join(ROOT, "tutorials"))
  out = tmp_path / "report.json"
  assert cli.main(["sparsecore", "--config", "sparsecore_limits:features",
                   "--data", "sparsecore_limits:batches", "--chips", "2",
                   "--batches", "2", "--json", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "items_users" in printed and "SparseCoreEmbeddingConfig(" in printed
  result = json.loads(out.read_text())
  import sparsecore_limits  # pylint: disable=g-import-not-at-top
  want_ids = want_unique = 0
  for batch in sparsecore_limits.batches(2):
    rows = {k: (v.to_list() if isinstance(v, tf.RaggedTensor)
                else [[i] for i in v.numpy()]) for k, v in batch.items()}
    ids, unique = reference_stats(
        rows, {"item": "items", "history": "items", "user": "users"}, 2)
    want_ids, want_unique = max(want_ids, ids), max(want_unique, unique)
  table = result["tables"]["items_users"]
  assert (table["max_ids"], table["max_unique_ids"]) == (want_ids,
                                                         want_unique)
  assert table["failed"] == 2  # over TensorFlow's default of 256
  suggested = result["suggested_config"]["max_ids_per_table"]["items_users"]
  assert suggested >= 1.25 * want_ids and suggested % 8 == 0
  rows = sum(v for v in sparsecore_limits.VOCAB.values()
             if v != sparsecore_limits.VOCAB["history"])
  assert table["bytes_per_chip"] >= rows * 32 * 4 * 2 // 2  # + Adagrad


_PIPELINE = '''
import tensorflow as tf
import tfemb

FEATURES = {"item": tfemb.FeatureConfig(tfemb.TableConfig(50, 4, name="t"),
                                        output_shape=[8])}
NUMBER = 3

def model():
  return FEATURES, tfemb.SGD(0.1)

def batches():
  return [{"item": tf.constant(list(range(8)))}] * 2

def other_batches():
  return [{"user": tf.constant([1]), "page": tf.constant([2])}]

def broken_batches():
  yield {"item": tf.constant(list(range(8)))}
  raise OSError("lost the input files")

def broken():
  raise ZeroDivisionError("no data")
'''


@pytest.mark.parametrize("flags, line", [
    (["--chips", "0"], "argument --chips: expected an integer >= 1, got '0'"),
    (["--batches", "0"],
     "argument --batches: expected an integer >= 1, got '0'"),
    (["--config", "no_such_module_47:model"],
     "--config: no module named 'no_such_module_47' (a module importable "
     "from the current directory, or a .py file)"),
    (["--config", "{m}:missing"],
     "--config: module '{m}' has no attribute 'missing'"),
    (["--config", "{m}"], "argument --config: expected MODULE:ATTR (e.g. "
     "my_model:features), got '{m}'"),
    (["--config", "{m}:NUMBER"],
     "--config: feature_config[''] must be a FeatureConfig, got int."),
    (["--data", "{m}:NUMBER"], "--data: expected batches (an iterable: a "
     "tf.data.Dataset, a list, a generator), got int"),
    (["--data", "{m}:broken"], "--data: calling {m}:broken raised "
     "ZeroDivisionError: no data\n(--debug shows the traceback)"),
    (["--data", "{m}:broken_batches"], "--data: reading batch 1 raised "
     "OSError: lost the input files\n(--debug shows the traceback)"),
    (["--data", "{m}:other_batches"], "--data: batch 0 has features "
     "['page', 'user']; expected the structure of --config: ['item'] (or a "
     "(features, labels) pair)"),
    (["--sparse-core-config", "{m}:NUMBER"], "--sparse-core-config: expected "
     "a SparseCoreEmbeddingConfig, got int"),
    (["--json", "{d}/no_dir/r.json"], "--json: cannot write "
     "'{d}/no_dir/r.json': no directory '{d}/no_dir'"),
    (["--json", "{d}"], "--json: '{d}' is a directory; expected a file"),
])
def test_the_command_line_refuses_bad_input_in_one_line(tmp_path, capsys,
                                                         flags, line):
  module = tmp_path / "pipeline.py"
  module.write_text(_PIPELINE)
  fill = dict(m=str(module), d=str(tmp_path))
  given = dict(zip(flags[::2], flags[1::2]))
  argv = ["sparsecore"]
  for flag, value in {"--config": "{m}:model", "--data": "{m}:batches",
                      "--chips": "1", **given}.items():
    argv += [flag, value.format(**fill)]
  try:
    status = cli.main(argv)
  except SystemExit as e:  # argparse's own errors
    status = e.code
  out, err = capsys.readouterr()
  assert status == 2 and out == ""
  assert err == (f"python -m tfemb.tpu sparsecore: error: "
                 f"{line.format(**fill)}\n")
  assert sorted(set(os.listdir(tmp_path)) - {"__pycache__"}) == [
      "pipeline.py"]
  if "(--debug" in line:
    with pytest.raises(ValueError, match=" raised "):  # the traceback
      cli.main(argv + ["--debug"])


@pytest.mark.parametrize("optimizer", ["adagrad", "custom_1d_slot"])
def test_the_report_counts_the_bytes_of_the_built_tables(optimizer):
  if optimizer == "adagrad":
    opt = tfemb.Adagrad(0.1)
  else:  # an Adagrad-like rule whose accumulator is one value per row
    opt = tfemb.CustomOptimizer(
        lambda g, w, s, lr, h: (w - lr * g, s[0] + 1.0), 0.1,
        slot_names=["count"], slot_initializers=[tf.zeros_initializer()],
        slot_dims=[1])
  features = config()
  result = pipeline_report.report(
      [as_inputs(b) for _, b in batches()][:1], features, 1, optimizer=opt)
  embedding = tfemb.TPUEmbeddingV2(features, opt)
  embedding.build()
  built = collections.Counter()
  for stacked, variables in embedding.variables.items():
    for v in variables.values():
      built[stacked] += int(np.prod(v.shape)) * 4
  assert {n: t["bytes_per_chip"] for n, t in result["tables"].items()
          } == dict(built)


def test_the_tutorial_tunes_the_drops_to_zero():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "tutorials", "sparsecore_limits.py"),
       "--batches", "3"], capture_output=True, text=True, timeout=600,
      check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  dropped = int(result.stdout.split("allow_id_dropping: ")[1].split()[0])
  assert dropped > 0
  assert "The suggested config: 0 ids dropped, 0 batches failed." in (
      result.stdout)


def test_samples_that_do_not_divide_among_a_chips_sparsecores_are_refused():
  table = tfemb.TableConfig(32, 8, name="t")
  with pytest.raises(ValueError, match="Feature 'f': its 6 samples"):
    tfemb.TPUEmbeddingV2(
        {"f": tfemb.FeatureConfig(table, output_shape=[6])}, tfemb.SGD(0.5),
        sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig())


def test_the_keras_layer_counts_the_dropped_ids():
  keras = tf.keras
  table = tfemb.TableConfig(32, 8, name="t", initializer=tf.ones_initializer())
  layer = tfemb.layers.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, output_shape=[16])}, tfemb.SGD(0.5),
      sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
          max_ids_per_chip_per_sample=1, allow_id_dropping=True))
  inputs = {"f": keras.Input(shape=(None,), batch_size=16, dtype="int64",
                             ragged=True, name="f")}
  out = keras.layers.Lambda(lambda a: tf.reduce_sum(a, -1, keepdims=True))(
      layer(inputs)["f"])
  model = keras.Model(inputs, out)
  model.compile(optimizer="sgd", loss=lambda y, p: tf.reduce_sum(p))
  ids = tf.ragged.constant([[1, 2, 3]] * 16, dtype=tf.int64)
  model.fit({"f": ids}, np.zeros((16, 1)), batch_size=16, verbose=0)
  assert layer.dropped_ids == {"t": 40}  # as in the engine's test above


# --- random batches against the numpy reference -------------------------------

# Tables "a" and "b" (width 8) stack, "c" (width 16) does not; "x" (ragged,
# repeated ids, mean) and "y" (dense) share "a", "z" (sparse, weighted) looks
# up "b", "w" (ragged, sqrtn) "c". Each replica (chip) has 8 samples.
_VOCAB, _DIM = {"a": 40, "b": 24, "c": 30}, {"a": 8, "b": 8, "c": 16}
_COMBINER = {"a": "mean", "b": "sum", "c": "sqrtn"}
_TABLE = {"w": "c", "x": "a", "y": "a", "z": "b"}  # flattened in this order
_SAMPLES = 8


def _initial(name):
  return np.random.default_rng(sum(map(ord, name))).normal(
      size=(_VOCAB[name], _DIM[name]))


def _limits_engine(strategy, stacking, **limits):
  with strategy.scope():
    tables = {n: tfemb.TableConfig(
        _VOCAB[n], _DIM[n], name=n, combiner=_COMBINER[n],
        initializer=tf.constant_initializer(_initial(n))) for n in _VOCAB}
    return tfemb.TPUEmbeddingV2(
        {f: tfemb.FeatureConfig(tables[t], output_shape=[_SAMPLES])
         for f, t in _TABLE.items()}, tfemb.SGD(0.5),
        sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
            disable_table_stacking=not stacking, **limits))


def _random_batch(rng, long_runs):
  """One chip's batch: per feature, per sample its ids (and z's weights).
  `long_runs`: z's ids of a batch all 4k + r (one partition of 4, two of
  8), up to 6 a sample, so that a partition's run can be cut by a full
  buffer (which keeps a multiple of 8 of it): then which of its ids are
  kept depends on their order."""
  z = helpers.random_rows(rng, _SAMPLES, _VOCAB["b"], 4, 1)
  if long_runs:
    r = rng.integers(4)
    z = [list(rng.choice(6, size=rng.integers(1, 7), replace=False) * 4 + r)
         for _ in range(_SAMPLES)]
  rows = {"w": helpers.random_rows(rng, _SAMPLES, _VOCAB["c"], 3, 1),
          "x": [list(rng.choice(6, size=rng.integers(1, 5)) * 7 % 40)
                for _ in range(_SAMPLES)],  # few ids: repeats
          "y": [[i] for i in rng.integers(0, _VOCAB["a"], _SAMPLES)],
          "z": z}
  return rows, helpers.random_weights(rng, rows["z"])


def _inputs(rows, z_weights):
  features = {"w": helpers.ragged(rows["w"]), "x": helpers.ragged(rows["x"]),
              "y": tf.constant([r[0] for r in rows["y"]], tf.int64),
              "z": helpers.sparse(rows["z"])}
  weights = {"w": None, "x": None, "y": None,
             "z": helpers.sparse(rows["z"], z_weights, tf.float32)}
  return features, weights


def _parameters(embedding):
  """`{table: its rows}` (replica 0's copy), out of the stacked tables."""
  out = {}
  for t, layout in embedding.embedding_layouts.items():
    v = embedding.variables[layout.stacked_table_name]["parameters"]
    stacked = (v.values[0] if hasattr(v, "values") else v).numpy()
    out[t] = stacked[sparsecore_scenario.rows(layout, _VOCAB[t]), :_DIM[t]]
  return out


def _reference_layout(embedding):
  """What sparse_core_limits takes of the engine: per feature its stacked
  table and its table's place in it (by name, as docs/sparsecore.md says
  tables are stacked), and the stacked tables in TensorFlow's order with
  their samples."""
  stack_of = {t: layout.stacked_table_name
              for t, layout in embedding.embedding_layouts.items()}
  position = {t: sorted(u for u in stack_of if stack_of[u] == s).index(t)
              for t, s in stack_of.items()}
  stacks = {s: _SAMPLES * sum(stack_of[t] == s for t in _TABLE.values())
            for s in embedding.embedding_tables}
  return stack_of, position, stacks


def _failure_pattern(failure):
  """The engine's message of a reference failure (in a tf.function the
  quotes come escaped)."""
  name = r"\\?'" + failure.stack + r"\\?'"
  if failure.kind == "capacity":
    return (f"Stacked table {name}: max_ids_per_chip_per_sample x samples = "
            f"{failure.count} is not a multiple of 8")
  if failure.kind == "buffer":
    return (rf"Stacked table {name}: the chip\\?'s {failure.count} ids do not "
            f"fit in its buffer of {failure.limit} .*would drop "
            f"{failure.dropped} of them")
  core, part = failure.cell
  return (f"Stacked table {name}: SparseCore {core} of the chip sends "
          f"{failure.count} {failure.kind} to partition {part} "
          rf"\(SparseCore {part} of the TPU\), over the limit of "
          rf"{failure.limit} \(max_{failure.kind.replace(' ', '_')}_per_"
          rf"table\[{name}\]")


_CASES = [  # replicas, stacking, dropping, in a tf.function, fused kernels
    (1, True, False, False, True), (1, False, False, True, True),
    (1, True, True, True, True), (1, False, True, False, True),
    (2, True, True, True, True), (2, False, True, False, True),
    (2, True, False, True, True),
    # In a graph the fused kernels' op fails the batch itself; TensorFlow's
    # ops word the same message (without the kernels).
    (1, True, False, True, False)]
# The slowest case in the long suite (the suite's time): CI keeps dropping
# on two chips (unstacked, eager) and stacked in a function (one chip).
_LONG = {(2, True, True, True, True)}


@pytest.mark.parametrize("replicas,stacking,dropping,in_function,kernels", [
    pytest.param(*c, marks=[pytest.mark.long] if c in _LONG else [],
                 id=f"{c[0]}chips-{'stacked' if c[1] else 'unstacked'}-"
                 f"{'dropping' if c[2] else 'failing'}-"
                 f"{'fn' if c[3] else 'eager'}"
                 f"{'' if c[4] else '-tensorflow-ops'}")
    for c in _CASES])
def test_random_batches_keep_drop_and_fail_as_the_reference(
    replicas, stacking, dropping, in_function, kernels):
  """Per batch, limits drawn so that some batches pass, some drop (or
  fail) ids: the activations are those of the ids the reference keeps,
  with their gains over the whole sample; the step trains only them (SGD,
  the global batch's summed gradient); `dropped_ids` counts the dropped
  ones; a failing batch raises the reference's first failure and changes
  nothing. Several chips each count their own batch (MirroredStrategy);
  every failing case is on one chip (a replica that fails alone would
  leave the others waiting in the step's all-gather)."""
  rng = np.random.default_rng(replicas * 8 + stacking * 4 + dropping * 2 +
                              in_function)
  strategy = sparsecore_scenario.mirrored_strategy(replicas)
  names = ["a_b", "c"] if stacking else ["a", "b", "c"]
  seen = collections.Counter()
  # An engine per limit made tight (a chip's cell gets ~3 ids, ~20 cells).
  for tight in ("ids", "unique ids", "buffer", None):
    if replicas > 1 and tight in ("ids", "unique ids"):
      continue
    limits = dict(
        max_ids_per_chip_per_sample=int(rng.choice([1, 2, 4])) if (
            tight == "buffer") else 16,
        allow_id_dropping=dropping,
        max_ids_per_table={n: int(rng.integers(2, 5)) if tight == "ids" else
                           16 for n in names},
        max_unique_ids_per_table={n: int(rng.integers(2, 4)) if (
            tight == "unique ids") else 16 for n in names})
    with tfemb.options.use(fused_kernels=kernels):
      embedding = _limits_engine(strategy, stacking, **limits)
    assert embedding._id_limits._ops._fused == kernels  # pylint: disable=protected-access
    layout = _reference_layout(embedding)
    assert sorted(layout[2]) == names
    seen += _check_batches(
        embedding, strategy, rng, in_function, layout, dict(
            max_ids=limits["max_ids_per_table"],
            max_unique_ids=limits["max_unique_ids_per_table"],
            per_sample=limits["max_ids_per_chip_per_sample"],
            dropping=dropping))
  assert seen["passed"] >= 2
  if dropping:
    assert seen["dropping"] >= 2
  elif replicas == 1:  # each limit failed some batch
    assert all(seen[kind] for kind in ("ids", "unique ids", "buffer"))


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "fn"])
def test_a_run_the_buffer_cuts_keeps_the_sparsecores_first_ids(in_function):
  """SparseCore 0's ids to partition 0 (samples 0 and 1, ids 4k) are more
  than the buffer of 24 (3 features x 8 samples x 1): it keeps the first
  24 in the SparseCore's order (table a then b, by id, x before y, then
  input order; a sample's repeats once), drops the rest and every other
  run."""

  def draw(rng, long_runs):
    del long_runs
    rows, _ = _random_batch(rng, False)
    rows["x"][:2] = [list(rng.permutation(10) * 4) + [8],
                     list(rng.permutation(10) * 4)]
    rows["y"][:2] = [[4], [0]]
    rows["z"][:2] = [list(rng.permutation(6) * 4) for _ in range(2)]
    return rows, helpers.random_weights(rng, rows["z"])

  strategy = sparsecore_scenario.mirrored_strategy(1)
  embedding = _limits_engine(strategy, True, max_ids_per_chip_per_sample=1,
                             allow_id_dropping=True)
  seen = _check_batches(
      embedding, strategy, np.random.default_rng(3), in_function,
      _reference_layout(embedding), dict(max_ids={}, max_unique_ids={},
                                         per_sample=1, dropping=True), draw)
  assert seen == {"passed": 4, "dropping": 4}


@pytest.mark.parametrize("kernels,dense", [
    (True, False), (True, True), (False, False)],
                         ids=["fused-kernels", "fused-kernels-dense",
                              "tensorflow-ops"])
def test_the_cells_ids_and_distinct_ids_equal_a_numpy_count(kernels, dense):
  """What the limits are checked on, each (stacked table, SparseCore of the
  chip, partition) cell's ids and distinct (table, id), by the fused op
  (TfembIdCounts) or TensorFlow's ops, equal a count that follows
  docs/sparsecore.md: a sample's repeated ids once, an id's cell its
  sample's SparseCore and (id + rotation) mod N. Two chips: N = 8, so the
  stacked tables' second table is rotated. `dense`: every feature dense,
  one id a sample (the fused op counts those SparseCore by SparseCore)."""
  from tfemb.sparsecore import id_cells  # pylint: disable=g-import-not-at-top
  strategy = sparsecore_scenario.mirrored_strategy(2)
  with tfemb.options.use(fused_kernels=kernels):
    embedding = _limits_engine(
        strategy, True, max_ids_per_table={"a_b": 64, "c": 64},
        max_unique_ids_per_table={"a_b": 1, "c": 1})
  ops = embedding._id_limits._ops  # pylint: disable=protected-access
  assert ops._fused == kernels  # pylint: disable=protected-access
  layouts = embedding.embedding_layouts
  parts = layouts["a"].num_sparse_cores
  cores = parts // 2
  assert {layouts[t].sparse_core_shard_rotation for t in "ab"} == {0, cores}
  rng = np.random.default_rng(11)
  for long_runs in (False, True, False):
    rows, _ = _random_batch(rng, long_runs)
    if dense:  # Zipf-like repeats across samples
      rows = {f: [[int(x)] for x in rng.integers(0, 6, _SAMPLES) * 3]
              for f in _TABLE}
    runs = {s: np.zeros([cores * parts], np.int64) for s in ops.names}
    cells = {s: [set() for _ in range(cores * parts)] for s in ops.names}
    for f, t in _TABLE.items():
      layout = layouts[t]
      for sample, ids in enumerate(rows[f]):
        for x in set(ids):
          cell = (sample // (_SAMPLES // cores) * parts +
                  (x + layout.sparse_core_shard_rotation) % parts)
          runs[layout.stacked_table_name][cell] += 1
          cells[layout.stacked_table_name][cell].add((t, x))
    ids, samples = [], []
    for f in _TABLE:
      ids.append(tf.constant([x for r in rows[f] for x in r], tf.int64))
      samples.append(None if f == "y" or dense else tf.constant(
          [b for b, r in enumerate(rows[f]) for _ in r], tf.int64))
    if kernels:
      got_runs, got_unique = ops._counted(  # pylint: disable=protected-access
          range(4), ops._features, ids, samples, False)  # pylint: disable=protected-access
    else:
      batch = id_cells.Batch(ops, ops._features, ids, samples)  # pylint: disable=protected-access
      got_runs = ops._runs(batch)  # pylint: disable=protected-access
      got_unique = ops._distinct(batch, got_runs)  # pylint: disable=protected-access
    np.testing.assert_array_equal(got_runs.numpy(),
                                  np.stack([runs[s] for s in ops.names]))
    np.testing.assert_array_equal(got_unique.numpy(), np.stack(
        [[len(c) for c in cells[s]] for s in ops.names]))
    assert got_unique.numpy().sum() < got_runs.numpy().sum()  # repeats


@pytest.mark.parametrize("vocabulary", [50, 2**40],
                         ids=["bitmap-of-ids", "hash-set-of-ids"])
@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_the_fused_count_of_distinct_ids_over_any_vocabulary(vocabulary,
                                                              dense):
  """TfembIdCounts' distinct ids of each (stacked table, SparseCore,
  partition) cell equal a NumPy count, whether the op keeps the distinct
  ids in a bitmap of the vocabulary (a small one) or in a hash set (a
  vocabulary of 2^40 ids); two tables in one stack, the second's ids after
  the first's, the first feature's samples repeating ids (sparse)."""
  from tfemb.kernels import fused_ops  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  samples, cores, parts = 16, 2, 4
  ids = [rng.integers(0, 12, 40 if not dense else samples) * (vocabulary // 50)
         for _ in range(2)]
  rows = [np.sort(rng.integers(0, samples, x.size)) if not dense else
          np.arange(samples) for x in ids]
  rotation, first = [0, 1], [0, vocabulary]
  runs, distinct = fused_ops.id_counts(
      [tf.constant(x) for x in ids],
      [None if dense else tf.constant(r) for r in rows], stacks=1,
      cores=cores, partitions=parts, count_distinct=True,
      feature_names=["x", "y"], stack=[0, 0], vocabulary=[vocabulary] * 2,
      rotation=rotation, sizes=[samples] * 2, first_id=first)
  per_cell = np.zeros(cores * parts, np.int64)
  cells = [set() for _ in range(cores * parts)]
  for f in range(2):
    for x, sample in set(zip(ids[f].tolist(), rows[f].tolist())):
      cell = sample // (samples // cores) * parts + (x + rotation[f]) % parts
      per_cell[cell] += 1
      cells[cell].add(x + first[f])
  np.testing.assert_array_equal(runs.numpy(), per_cell[None])
  np.testing.assert_array_equal(distinct.numpy(),
                                [[len(c) for c in cells]])
  assert distinct.numpy().sum() < runs.numpy().sum()  # repeated ids


def test_ids_outside_the_vocabulary_raise_naming_the_feature_under_limits():
  """Under a config the ids are counted first: an id outside its table
  raises as the lookup would, naming the feature and its table, and
  nothing is trained."""
  strategy = sparsecore_scenario.mirrored_strategy(1)
  embedding = _limits_engine(strategy, True)
  before = _parameters(embedding)
  rows, z_weights = _random_batch(np.random.default_rng(5), False)
  rows["x"][3] = [_VOCAB["a"]]
  features, weights = _inputs(rows, z_weights)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Feature `x` \(table `a`\): ids must be in "
                     r"\[0, 40\)"):
    with strategy.scope():
      activations, preserved = embedding(features, weights)
      embedding.apply_gradients(
          tf.nest.map_structure(tf.ones_like, activations), preserved)
  after = _parameters(embedding)
  for t, value in before.items():
    np.testing.assert_array_equal(after[t], value)


def _check_batches(embedding, strategy, rng, in_function, layout, limits,
                   draw=_random_batch):
  """Four steps of random batches (`draw(rng, long_runs)`); how many
  passed, dropped ids, failed (by the kind of the failure)."""
  stack_of, position, stacks = layout
  replicas = strategy.num_replicas_in_sync
  seen = collections.Counter()
  tables = {t: _initial(t) for t in _VOCAB}
  dropped = dict.fromkeys(stacks, 0)

  def replica_step(features, weights):
    activations, preserved = embedding(features, weights)
    embedding.apply_gradients(
        {f: tf.ones([_SAMPLES, _DIM[t]]) for f, t in _TABLE.items()},
        preserved)
    return activations

  def step(per_replica):
    return strategy.run(replica_step, args=per_replica)

  run = tf.function(step) if in_function else step
  for _ in range(4):
    batches = [draw(rng, limits["dropping"]) for _ in range(replicas)]
    outcomes = []
    for rows, z_weights in batches:
      features = [dict(stack=stack_of[_TABLE[f]],
                       position=position[_TABLE[f]], rows=rows[f])
                  for f in _TABLE]
      try:
        outcomes.append(reference.sparse_core_limits(
            features, stacks, replicas, limits))
      except reference.SparseCoreFailure as failure:
        outcomes.append(failure)
    failures = [o for o in outcomes if isinstance(o, Exception)]
    if failures and replicas > 1:
      continue  # see the test's docstring
    per_replica = [_inputs(*b) for b in batches]
    distributed = strategy.experimental_distribute_values_from_function(
        lambda ctx, p=per_replica: p[ctx.replica_id_in_sync_group])
    before = _parameters(embedding)
    if failures:
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=_failure_pattern(failures[0])):
        run(distributed)
      after = _parameters(embedding)
      for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
      assert embedding.dropped_ids == dropped
      seen[failures[0].kind] += 1
      continue
    got = strategy.experimental_local_results(run(distributed))
    pairs = {t: [] for t in _VOCAB}
    for r, ((rows, z_weights), (kept, drops)) in enumerate(zip(batches,
                                                              outcomes)):
      for k, f in enumerate(_TABLE):
        t, w = _TABLE[f], z_weights if f == "z" else None
        np.testing.assert_allclose(
            got[r][f], reference.combine_kept(tables[t], rows[f], kept[k],
                                              _COMBINER[t], w),
            rtol=1e-5, atol=1e-6, err_msg=f"replica {r}, feature {f}")
        pairs[t] += reference.kept_contributions(
            rows[f], kept[k], _COMBINER[t], np.ones((_SAMPLES, _DIM[t])), w)
      for name, n in drops.items():
        dropped[name] += n
      seen["dropping"] += any(drops.values())
    seen["passed"] += 1
    after = _parameters(embedding)
    for t in _VOCAB:
      table = reference.Table(tables[t], "sgd", {})
      table.apply(reference.row_gradients(pairs[t]), 0.5)
      np.testing.assert_allclose(after[t], table.w,
                                 rtol=1e-5, atol=1e-5, err_msg=t)
      tables[t] = table.w
    assert embedding.dropped_ids == dropped
  return seen
