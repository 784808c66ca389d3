"""ParameterServerStrategy clusters of benchmarks/cluster/ on 127.0.0.1
(a coordinator, 1 or 2 workers, 2 or 3 parameter servers; tf_keras `model.fit`):
traffic per step against the table's size, parameter servers whose memory
is capped below the tables' total, and a parameter server or a worker killed
mid-run.
"""

import os
import re
import time

import numpy as np
import pytest

import ports
from benchmarks import cluster
from benchmarks import procnet
from benchmarks import workload as workload_lib

ROW = 32 * 4  # bytes of a row of dim 32


def args_for(*argv):
  return cluster.parse_args(["--workers", "1", "--ps", "2", "--timeout",
                             "240", "--min-shard-bytes", "65536", *argv])


@pytest.mark.long  # a cluster run of minutes; test_parameter_server shards tables in CI
@pytest.mark.runs_under("tf_keras")
def test_tables_bigger_than_a_parameter_server_may_hold(tmp_path):
  """Adagrad tables of 8 x 300k rows (614 MB with the accumulators) over 3
  parameter servers whose address space may grow by 0.7x that at most
  (RLIMIT_AS; a server grows by ~1.5x its third of the tables): one
  process holding them all would pass its cap. Training runs, the
  cluster's checkpoint restores into one process with the same values, and
  that process's checkpoint restores back into a new capped cluster as its
  tables are created (TensorFlow's deferred restoration, one variable at a
  time: docs/strategies.md), which then trains on."""
  vocab = 300_000
  work = workload_lib.Workload(vocab=vocab, optimizer="adagrad")
  total = work.table_and_slot_bytes()
  margin = int(0.7 * total)
  run = tmp_path / "run"
  run.mkdir()
  common = ["--vocab", str(vocab), "--batch", "1024", "--steps", "5",
            "--epochs", "1", "--ps", "3"]
  with ports.reserved(4) as reserved:
    layout = cluster.ps_cluster(reserved, 3)
    with cluster.Processes(str(tmp_path / "logs")) as procs:
      cluster.start_servers(procs, layout, memory_margin=margin,
                            check_bytes=total)
      result = cluster.coordinate(procs, layout, args_for(
          *common, "--save", str(run)), "tfemb", "adagrad")
      assert np.isfinite(result["losses"]).all(), result
      one = procs.start("single", ["--role", "single", "--stack", "tfemb",
                                   "--optimizer", "adagrad", *common,
                                   "--restore", str(run / "ckpt"),
                                   "--save", str(run)])
      assert one.wait(timeout=240) == 0, procs.log("single")[-3000:]
      for ps in ("ps0", "ps1", "ps2"):
        assert f"cap holds: {total} bytes refused" in procs.log(ps)
      for name in ("ps0", "ps1", "ps2", "worker0"):
        procs.kill(name)
      cluster.start_servers(procs, layout, memory_margin=margin,
                            check_bytes=total)
      (run / "back").mkdir()
      again = cluster.coordinate(procs, layout, args_for(
          *common, "--restore", str(run / "single-ckpt"),
          "--save", str(run / "back")), "tfemb", "adagrad", name="again")
      assert np.isfinite(again["losses"]).all(), again
  trained = dict(np.load(run / "final.npz"))
  assert sorted(trained) == sorted(
      f"table_f{i}/{n}" for i in range(8)
      for n in ("parameters", "accumulators"))
  assert not np.allclose(trained["table_f0/accumulators"], 0.1)
  for restored in (run / "single.npz", run / "back" / "restored.npz"):
    got = dict(np.load(restored))
    assert sorted(got) == sorted(trained), restored
    for key, value in trained.items():
      np.testing.assert_array_equal(got[key], value,
                                    err_msg=f"{restored}: {key}")


@pytest.fixture(name="servers", scope="module")
def fixture_servers(tmp_path_factory):
  """2 parameter servers and 1 worker, shared by the tests that start
  their own coordinators (a new coordinator on running servers is how
  ParameterServerStrategy restarts)."""
  with ports.reserved(3) as reserved:
    layout = cluster.ps_cluster(reserved, 2)
    with cluster.Processes(str(tmp_path_factory.mktemp("servers"))) as procs:
      cluster.start_servers(procs, layout)
      yield layout, procs


def total_sent(result) -> float:
  return sum(p["sent_per_step"] for p in result["per_process"].values())


@pytest.mark.long  # the suite's time: a measurement over two table sizes
@pytest.mark.runs_under("tf_keras")
def test_bytes_per_step_follow_the_distinct_ids_not_the_table(servers):
  """The same batches (same distinct ids) on tables of 2k and of 200k rows
  (ids spread 100 apart): the bytes per step stay within 1.2x, and are
  about what the step must move: each distinct row fetched once for the
  lookup and its gradient sent once for the update, which runs on the
  parameter servers (not the rows and slots fetched and written back)."""
  sent, base = {}, ["--batch", "1024", "--steps", "10", "--epochs", "1"]
  layout, procs = servers
  for vocab, stride in ((2000, 1), (200_000, 100)):
    args = args_for("--vocab", str(vocab), "--id-stride", str(stride), *base)
    result = cluster.coordinate(procs, layout, args, "tfemb", "adagrad",
                                name=f"coordinator{vocab}")
    assert result["shards"] == {f"table_f{i}": 2 for i in range(8)}
    sent[vocab] = total_sent(result)
  work = workload_lib.Workload(vocab=2000, optimizer="adagrad", batch=1024)
  distinct = np.mean([sum(len(np.unique(ids)) for ids in f.values())
                      for f, _ in work.make_batches()])
  rows_and_grads = 2 * distinct * ROW  # the lookup's rows, the update's grads
  assert sent[200_000] / sent[2000] < 1.2, sent
  assert sent[2000] > rows_and_grads, (sent, rows_and_grads)
  # Rows and accumulators fetched and written back would add 4 rows each.
  assert sent[2000] < 2 * rows_and_grads, (sent, rows_and_grads)


@pytest.mark.runs_under("tf_keras")
def test_a_killed_parameter_server_is_named_and_training_resumes(
    servers, tmp_path):
  """Parameter server 1 is killed after the first checkpoint: the
  coordinator fails naming it first; with it restarted, a new coordinator
  resumes from the last checkpoint and finishes. (Runs last on the shared
  servers.)"""
  layout, procs = servers
  common = ["--vocab", "2000", "--batch", "256", "--steps", "5",
            "--min-shard-bytes", "65536",
            "--checkpoint-dir", str(tmp_path / "ckpts")]
  procs.start("first", ["--role", "coordinator", "--cluster",
                        cluster.json.dumps(layout), "--stack", "tfemb",
                        "--optimizer", "adagrad", "--epochs", "1000",
                        *common])
  deadline = time.monotonic() + 180
  while not (tmp_path / "ckpts" / "checkpoint").exists():
    assert procs.procs["first"].poll() is None, procs.log("first")[-3000:]
    assert time.monotonic() < deadline, "no checkpoint"
    time.sleep(0.2)
  procs.kill("ps1")
  assert cluster.wait(procs, "first", 180) != 0
  log = procs.log("first")
  # The first server named is the dead one; the other may be named after
  # it, relaying the failed receive from it.
  named = re.findall(r"/job:ps/replica:0/task:\d", log)
  assert named and named[0] == "/job:ps/replica:0/task:1", log[-3000:]
  cluster.start_servers(procs, layout, only="ps1")
  result = cluster.coordinate(procs, layout, args_for(
      *common, "--epochs", "3", "--warmup-epochs", "0"), "tfemb", "adagrad",
                              name="second")
  assert result["initial_epoch"] >= 1, result
  assert len(result["losses"]) == 3 - result["initial_epoch"]
  assert np.isfinite(result["losses"]).all(), result
  assert os.path.exists(tmp_path / "ckpts" / "ckpt-3.index")


@pytest.mark.long  # CI keeps the killed parameter server's run
@pytest.mark.runs_under("tf_keras")
def test_a_killed_worker_is_named_and_training_goes_on(tmp_path):
  """Worker 1 of 2 is killed mid-run, after the first checkpoint: the
  coordinator names it, runs the remaining steps on worker 0 and finishes
  every epoch (TensorFlow's worker failure handling); a step of the killed
  worker that held the tables' update lock does not stall the others."""
  epochs = 6
  with ports.reserved(4) as reserved:
    layout = cluster.ps_cluster(reserved, 2)
    with cluster.Processes(str(tmp_path / "logs")) as procs:
      cluster.start_servers(procs, layout)
      procs.start("coordinator", [
          "--role", "coordinator", "--cluster", cluster.json.dumps(layout),
          "--stack", "tfemb", "--optimizer", "adagrad", "--vocab", "2000",
          "--batch", "256", "--steps", "10", "--epochs", str(epochs - 1),
          "--min-shard-bytes", "65536",
          "--checkpoint-dir", str(tmp_path / "ckpts")])
      deadline = time.monotonic() + 180
      while not (tmp_path / "ckpts" / "checkpoint").exists():
        assert procs.procs["coordinator"].poll() is None, procs.log(
            "coordinator")[-3000:]
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
      procs.kill("worker1")
      assert cluster.wait(procs, "coordinator", 240) == 0, procs.log(
          "coordinator")[-3000:]
      log = procs.log("coordinator")
  assert "Worker /job:worker/replica:0/task:1 failed" in log, log[-3000:]
  result = cluster.last_json(log)
  assert len(result["losses"]) == epochs, result
  assert np.isfinite(result["losses"]).all(), result
  assert os.path.exists(tmp_path / "ckpts" / f"ckpt-{epochs}.index")


SS = """\
ESTAB 0 0 [::ffff:127.0.0.1]:34093 [::ffff:127.0.0.1]:60456 users:(("python",pid=16286,fd=8)) ino:18288 sk:1059 cgroup:/ <->
\t ts sack bbr wscale:10,10 rto:208 mss:32768 cwnd:17 bytes_sent:449 bytes_acked:449 bytes_received:1201 segs_out:10
ESTAB 0 0 [::ffff:127.0.0.1]:40620 [::ffff:127.0.0.1]:55303 users:(("python",pid=16287,fd=9)) ino:18284 sk:105a cgroup:/ <->
\t ts sack bbr wscale:10,10 rto:204 mss:32768 cwnd:16 bytes_acked:1 segs_out:1
ESTAB 0 0 127.0.0.1:22 127.0.0.1:5000 users:(("sshd",pid=99,fd=3)) ino:7 sk:1 <->
\t ts bytes_sent:5 bytes_received:6
"""


def test_tcp_bytes_per_process_from_ss():
  """`ss -tinpHe`: counters per socket of the processes asked for (a
  counter still at zero is absent), differences per socket."""
  before = procnet.parse(SS, [16286, 16287])
  assert before == {16286: {"18288": (449, 1201)}, 16287: {}}
  after = procnet.parse(SS.replace("bytes_sent:449", "bytes_sent:1449")
                        .replace("bytes_acked:1 ", "bytes_acked:1 "
                                 "bytes_received:70 "), [16286, 16287])
  assert procnet.delta(before, after) == {
      16286: {"sent": 1000, "received": 0},
      16287: {"sent": 0, "received": 70}}
