"""ParameterServerStrategy: tables sharded over 2 parameter servers (TF's
ShardedVariable), trained through a ClusterCoordinator with 1 worker, all
processes on 127.0.0.1, end where one process ends; checkpoints move
between the sharded tables and an unsharded engine both ways."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import

import helpers
import ports
import reference
import tfemb
from tfemb.host import sharded
from tfemb.host import sparse_update
from workers import ps_non_finite_worker
from workers import ps_worker

WORKER = helpers.WORKERS / "ps_worker.py"
NON_FINITE = helpers.WORKERS / "ps_non_finite_worker.py"


def env():
  root = str(helpers.ROOT)
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(name="cluster", scope="module")
def fixture_cluster():
  """2 parameter servers and 1 worker, shared by the module's coordinators
  (each creates its own variables on them)."""
  with ports.reserved(3) as (ps0, ps1, worker):
    cluster = {"ps": [f"127.0.0.1:{ps0}", f"127.0.0.1:{ps1}"],
               "worker": [f"127.0.0.1:{worker}"]}
    servers = [subprocess.Popen(
        [sys.executable, str(WORKER), "server", json.dumps(cluster), job,
         str(i)], env=env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
               for job in ("ps", "worker") for i in range(len(cluster[job]))]
    yield cluster
    for s in servers:
      s.kill()
      s.wait()


def run(*args, legacy_keras=False, worker=WORKER):
  environment = env()
  if legacy_keras:
    environment["TF_USE_LEGACY_KERAS"] = "1"
  result = subprocess.run([sys.executable, str(worker), *args],
                          env=environment,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  return result.stdout


def assert_same(got, expected):
  assert sorted(got) == sorted(expected)
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-6,
                               atol=1e-7, err_msg=key)


# The mid-level engine, no Keras: the same work in both passes, so it runs
# once, in the tf_keras pass beside the fit case (`runs_under`).
@pytest.mark.runs_under("tf_keras")
def test_sharded_tables_train_like_one_process_and_checkpoints_move(
    cluster, tmp_path):
  single_dir = tmp_path / "single"
  single_dir.mkdir()
  run("single", str(single_dir))
  expected = dict(np.load(single_dir / "final.npz"))

  ps_dir = tmp_path / "ps"
  ps_dir.mkdir()
  out = run("coordinator", json.dumps(cluster), str(ps_dir))
  assert json.loads(out.strip().splitlines()[-1])["shards"] == {
      "items": 2, "small": 2, "wide": 2}
  assert_same(dict(np.load(ps_dir / "final.npz")), expected)
  # Two steps per scheduled function (docs/strategies.md, "The
  # coordinator"): the same numbers.
  assert_same(dict(np.load(ps_dir / "multistep.npz")), expected)
  assert not np.allclose(expected["items/parameters"], 0.3)

  # The sharded checkpoint restores into an unsharded engine here ...
  embedding = ps_worker.make_embedding()
  tf.train.Checkpoint(embedding=embedding).restore(
      str(ps_dir / "ckpt")).expect_partial()  # values compared below
  assert_same(ps_worker.values(embedding), expected)

  # ... and an unsharded checkpoint into sharded tables.
  unsharded = tf.train.Checkpoint(embedding=embedding).write(
      str(tmp_path / "unsharded"))
  again = tmp_path / "again"
  again.mkdir()
  run("coordinator", json.dumps(cluster), str(again), unsharded)
  assert_same(dict(np.load(again / "restored.npz")), expected)


@pytest.mark.runs_under("tf_keras")
def test_model_fit_with_a_dataset_creator_under_tf_keras(cluster, tmp_path):
  """The Keras layer under ParameterServerStrategy with tf_keras' model.fit
  and a DatasetCreator (Keras 3 has no ParameterServerStrategy support in
  fit); the strategy's variable_partitioner shards the tables. One step per
  execution and two (`steps_per_execution`, docs/strategies.md, "The
  coordinator") give the numbers of one process."""
  (tmp_path / "ps").mkdir()
  (tmp_path / "single").mkdir()
  out = run("fit", json.dumps(cluster), str(tmp_path / "ps"), "1", "2",
            legacy_keras=True)
  assert json.loads(out.strip().splitlines()[-1])["shards"] == {"items": 2}
  run("fit", "none", str(tmp_path / "single"), legacy_keras=True)
  expected = dict(np.load(tmp_path / "single" / "fit.npz"))
  for steps in (1, 2):
    assert_same(dict(np.load(tmp_path / "ps" / f"fit-{steps}.npz")), expected)
  assert not np.allclose(expected["items/parameters"], 0.3)


@pytest.mark.runs_under("tf_keras")  # no Keras: once, beside the others
@pytest.mark.parametrize("cluster_lock", [False, True],
                         ids=["per_server_locks", "cluster_lock"])
def test_non_finite_steps_change_no_shard_or_only_the_shard_that_overflows(
    cluster, tmp_path, cluster_lock):
  """docs/strategies.md, "Parameter servers": a non-finite gradient is
  refused before anything is sent (no shard changes); an update that
  overflows on one shard leaves that shard as it was and applies the
  others, and the step fails naming the table and the shard ("raise") or
  is counted as skipped ("skip"). Under the one lock for the cluster
  (`cluster_update_lock`), no shard changes. Each slot's shards sit on
  their parameters' servers (the unsharded table's on one)."""
  result = json.loads(run(
      "coordinator", json.dumps(cluster), str(tmp_path),
      *(["lock"] if cluster_lock else []),
      worker=NON_FINITE).strip().splitlines()[-1])
  where = result["devices"]
  assert len(where["big/parameters"]) == 2
  assert len(where["plain/parameters"]) == 1
  for table in ("big", "plain"):
    assert where[f"{table}/accumulators"] == where[f"{table}/parameters"]

  rows = {"big": 20, "plain": 6}
  oracle = {n: reference.Table(np.full((r, 4), ps_non_finite_worker.INIT[n]),
                               "adagrad", {}) for n, r in rows.items()}

  def step(kind, refused=()):
    """The step's update by the numpy reference, but for rows `refused`."""
    grads = ps_non_finite_worker.gradients(kind)
    for name, ids in ps_non_finite_worker.IDS.items():
      pairs = reference.contributions([[i] for i in ids], "mean", grads[name])
      sums = reference.row_gradients(pairs)
      oracle[name].apply({i: g for i, g in sums.items()
                          if not (name == "big" and i in refused)},
                         ps_non_finite_worker.LR)

  def assert_tables(phase):
    got = dict(np.load(tmp_path / f"{phase}.npz"))
    for name, table in oracle.items():
      np.testing.assert_allclose(got[f"{name}/parameters"], table.w,
                                 rtol=1e-6, err_msg=f"phase {phase}: {name}")
      np.testing.assert_allclose(got[f"{name}/accumulators"],
                                 table.slots["accumulators"], rtol=1e-6,
                                 err_msg=f"phase {phase}: {name}")

  def overflow():
    """The overflowing step: on its own shard only, or (one lock) nowhere."""
    if not cluster_lock:
      step("overflow", refused=range(10, 20))  # big's second shard

  phases = result["phases"]
  # tfemb's message, without what gRPC adds (escaped) as it relays it.
  errors = {p: re.search(r"assertion failed: \[(.*?)\]",
                         phases[p]["error"]).group(1) for p in "12"}
  helpers.assert_names(errors["1"], table="big")
  assert "non-finite (NaN or Inf) embedding gradient" in errors["1"]
  assert_tables("1")  # nothing changed
  overflow()
  helpers.assert_names(errors["2"], table="big")
  assert (("the update would make a row of the table or of a slot "
           "non-finite (NaN or Inf); no table was updated") if cluster_lock
          else (f"its shard 1 of 2 (on {where['big/parameters'][1]}); that "
                "shard was not updated, the other shards of the step were")
          ) in errors["2"]
  assert_tables("2")
  assert [phases[p]["error"] for p in "345"] == [None] * 3
  assert [phases[p]["skipped_steps"] for p in "12345"] == [0, 0, 1, 2, 2]
  assert_tables("3")  # the NaN gradient skipped: nothing changed
  overflow()
  assert_tables("4")
  step("finite")
  assert_tables("5")
  assert oracle["big"].w[12, 0] != ps_non_finite_worker.INIT["big"]


def test_table_partitioner_needs_a_parameter_server_strategy():
  embedding = ps_worker.make_embedding()
  with pytest.raises(ValueError, match="ParameterServerStrategy"):
    embedding.table_partitioner = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))


def _tables(opt, dim, start):
  """The table `t` in one variable and the same in a ShardedVariable of 3
  uneven shards (in one process), with its slots: {name: variable}."""
  table = tfemb.TableConfig(10, dim, name="t", optimizer=opt)
  one = {n: tf.Variable(v) for n, v in start.items()}
  shards = {n: sharded_variable.ShardedVariable(
      [tf.Variable(v[:4]), tf.Variable(v[4:7]), tf.Variable(v[7:])])
            for n, v in start.items()}
  return table, one, shards


def _sharded_update(table, shards, ids, grads, lr, per_shard_locks):
  """The update as a step makes it under each design: each shard's alone
  (its own lock), or every shard's checked, then written (one lock)."""
  routes = sharded.route(sharded.shards(shards), ids, grads)
  if per_shard_locks:
    return [bool(part.apply())
            for part in sharded.shard_updates(table, routes, lr)]
  finite, write = sharded.prepare(table, routes, lr)
  if bool(finite):
    write()
  return [bool(finite)]


@pytest.mark.parametrize("per_shard_locks", [True, False])
@pytest.mark.parametrize("dim", [4, 32])
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_an_update_per_shard_equals_the_update_of_one_table(
    dim, optimizer, per_shard_locks):
  """tfemb/host/sharded.py's update of a ShardedVariable writes exactly the
  rows and slots of the update of one unsharded table: rows 32 floats wide
  alone per shard, rows of 4 among the step's rows (TensorFlow's kernels
  may round the elements of a last, partial SIMD register differently)."""
  opt = {"adagrad": tfemb.Adagrad(0.3), "adam": tfemb.Adam(0.05)}[optimizer]
  names = ["parameters"] + list(opt._slot_names())  # pylint: disable=protected-access
  rng = np.random.default_rng(3)
  start = {n: rng.uniform(0.1, 2.0, (10, dim)).astype(np.float32)
           for n in names}
  table, one, shards = _tables(opt, dim, start)
  for step in range(3):
    ids = tf.constant(rng.permutation(10)[:7], tf.int64)
    grads = tf.constant(rng.normal(size=(7, dim)), tf.float32)
    lr = tf.constant(0.3)
    sparse_update.write_rows(table, one, ids, sparse_update.new_rows(
        table, one, ids, grads, lr))
    assert all(_sharded_update(table, shards, ids, grads, lr,
                               per_shard_locks))
    for n in names:
      np.testing.assert_array_equal(
          tf.convert_to_tensor(shards[n]).numpy(), one[n].numpy(),
          err_msg=f"step {step}: {n}")
  assert not np.array_equal(one["parameters"].numpy(), start["parameters"])
  options = tfemb.options.get()
  non_lazy = tfemb.TableConfig(10, dim, name="t",
                               optimizer=tfemb.Adam(0.05, lazy_adam=False))
  assert sharded.servers(non_lazy, shards, True, options) is None
  assert sharded.servers(table, one, False, options) is None
  assert sharded.servers(table, shards, True, options).per_shard_locks


@pytest.mark.parametrize("per_shard_locks", [True, False])
def test_an_update_that_overflows_in_one_shard(per_shard_locks):
  """Adagrad's accumulator overflows (g^2 > float32's max) in rows of shard
  1 only: per shard, that shard keeps its rows and slots and the other
  shards take the update (the numpy reference's); under the engine's one
  lock, no shard changes."""
  dim, lr = 4, 0.5
  start = {"parameters": np.arange(40, dtype=np.float32).reshape(10, dim),
           "accumulators": np.full((10, dim), 0.25, np.float32)}
  table, _, shards = _tables(tfemb.Adagrad(lr), dim, start)
  ids = np.array([0, 5, 8, 4], np.int64)
  grads = np.ones((4, dim), np.float32)
  grads[3] = 2e19  # row 4: in shard 1 (rows 4-6)
  finite = _sharded_update(table, shards, tf.constant(ids),
                           tf.constant(grads), tf.constant(lr),
                           per_shard_locks)
  assert finite == ([True, False, True] if per_shard_locks else [False])
  expected = reference.Table(start["parameters"], "adagrad",
                             {"initial_accumulator_value": 0.25})
  if per_shard_locks:
    expected.apply({i: g for i, g in zip(ids, grads) if not 4 <= i < 7}, lr)
  got = {n: tf.convert_to_tensor(v).numpy() for n, v in shards.items()}
  np.testing.assert_allclose(got["parameters"], expected.w, rtol=1e-6)
  np.testing.assert_allclose(got["accumulators"],
                             expected.slots["accumulators"], rtol=1e-6)
  np.testing.assert_array_equal(got["parameters"][4:7],
                                start["parameters"][4:7])
