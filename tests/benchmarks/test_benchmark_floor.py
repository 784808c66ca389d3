"""The C++ floor (benchmarks/floor.py, floor.cc): the exact step and the rows
alone, the child, and how the report sets their numbers beside the targets
memory decides (docs/performance.md, 'Method')."""

import json
import os
import re
import subprocess
import sys

import numpy as np

from benchmarks import analysis
from benchmarks import floor
from benchmarks import report
from benchmarks import workload as workload_lib
import helpers
import reference

ROOT = helpers.ROOT


def _distinct_per_step(vocab):
  """The rows floor.cc must count: the workload's distinct ids per batch,
  over its 8 tables, averaged over the batches (rounded down)."""
  batches = workload_lib.Workload(vocab=vocab, optimizer="sgd").make_batches()
  per_batch = [sum(len(set(ids.tolist())) for ids in features.values())
               for features, _ in batches]
  return sum(per_batch) // len(per_batch)


def _floor_inputs(vocab):
  """floor.cc's exact-step inputs at `vocab` rows: the workload's ids per
  batch and table, and each id's gradient, 1e-6 (1 + (k * 2654435761 mod
  2^32) / 2^16 mod 1000) for the k-th float of [batches, tables, batch,
  dim] (floor.cc's formula)."""
  work = workload_lib.Workload(vocab=vocab, optimizer="sgd")
  batches = [[features[name] for name in work.names]
             for features, _ in work.make_batches()]
  shape = (len(batches), work.features, work.batch, work.dim)
  k = np.arange(np.prod(shape), dtype=np.uint64)
  h = (k * np.uint64(2654435761)) % np.uint64(2**32)
  grads = ((1 + (h >> np.uint64(16)) % np.uint64(1000)).astype(np.float32) *
           np.float32(1e-6)).reshape(shape)
  return batches, grads


def test_the_exact_step_sums_each_rows_gradients_and_updates_it_once(
    tmp_path):
  binary, ids = floor.build(str(tmp_path)), str(tmp_path / "ids")
  floor.write_ids(ids, [1000])
  for rule, kind in (("sgd", "step"), ("adagrad", "step"),
                     ("adagrad", "threads")):  # on 1 and 2 threads in turn
    done = subprocess.run([binary, ids, rule, kind], capture_output=True,
                          text=True, timeout=120, check=True)
    m = re.search(r"after (\d+) steps the parameters sum to (\S+), the "
                  r"last step's activations to (\S+)", done.stdout)
    assert m, done.stdout
    # floor.cc's rules: sgd and adagrad at learning rate 0.01.
    parameters, activations = reference.floor_exact_steps(
        *_floor_inputs(1000), 1000, rule, {}, 0.01, int(m.group(1)))
    # 330 steps of repeated ids (1000 rows, 4096 ids per table): summing
    # only one gradient per row, or updating a row once per id, would be
    # off by far more than the order of the float sums.
    np.testing.assert_allclose(float(m.group(2)), parameters, rtol=1e-4)
    np.testing.assert_allclose(float(m.group(3)), activations, rtol=1e-4)
    assert parameters < 0 and activations < 0


def test_child_times_the_workloads_rows_with_every_optimizer(tmp_path):
  path = tmp_path / "floor.json"
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.floor", "--sizes", "1000,4000,2k",
       "--out", str(path)],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
      capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(path.read_text())
  assert result["sizes"] == [1000, 2000, 4000]
  assert [r["optimizer"] for r in result["floors"]] == ["sgd", "adagrad",
                                                        "adam"]
  # floor.cc read the suite's own batches: the rows it timed per step are
  # the workload's distinct ids, counted here, for every rule.
  want = {str(v): _distinct_per_step(v) for v in (1000, 2000, 4000)}
  for row in result["floors"]:
    assert row["status"] == "ok"
    assert row["distinct"] == want
    assert all(ms > 0 for ms in row["ms"].values())
    for key in ("step_ms", "step_1thread_ms", "step_2thread_ms"):
      assert sorted(row[key]) == sorted(want)
      assert all(ms > 0 for ms in row[key].values())


def test_a_size_that_does_not_fit_is_skipped_not_run(monkeypatch):
  monkeypatch.setattr(floor.procmem, "available", lambda: 4 * 2**30)
  # Adam at 5M rows: 8 x 5M x 32 x 4 bytes x 3 = 15.4 GB.
  row = floor.measure("/nonexistent/binary", "/nonexistent/ids", "adam",
                      [5_000_000], 10)
  assert row["status"] == "skipped"
  assert "5M rows: needs 14.3 GiB" in row["detail"]


def test_sizes_that_do_not_fit_together_keep_the_ends_side_by_side():
  gib = 2**30
  # Adam's tables and slots: 0.29 GiB at 100k rows, 2.86 at 1M, 14.3 at 5M.
  sizes = [100_000, 1_000_000, 5_000_000]
  assert floor.groups("adam", sizes, 19 * gib) == [sizes]
  assert floor.groups("adam", sizes, None) == [sizes]
  assert floor.groups("adam", sizes, 17 * gib) == [[100_000, 5_000_000],
                                                   [1_000_000]]
  assert floor.groups("adam", [100_000], 0) == [[100_000]]


def test_the_sizes_run_in_their_groups(monkeypatch, tmp_path):
  """Each group is one run of floor.cc per kind, with its sizes on the
  command line; the rows per size come from the run that timed it."""
  monkeypatch.setattr(floor.procmem, "available", lambda: 17 * 2**30)
  calls = []

  def fake_run(argv, **kwargs):
    del kwargs
    kind, sizes = argv[3], argv[4:]
    calls.append([kind] + sizes)
    scales = {"rows": {"rows": 1e6}, "step": {"step": 1e5},
              "threads": {"step1": 1e4, "step2": 2e4}}[kind]
    lines = [f"adam {name}, {v} rows x 8 tables: {int(v) / scale:.3f} ms "
             f"per step ({int(v) // 100} distinct rows, 43 ns each)"
             for name, scale in scales.items() for v in sizes]
    return subprocess.CompletedProcess(argv, 0, "\n".join(lines), "")

  monkeypatch.setattr(floor.subprocess, "run", fake_run)
  row = floor.measure("floor", "ids", "adam",
                      [100_000, 1_000_000, 5_000_000], 10)
  assert calls == [["rows", "100000", "5000000"],
                   ["step", "100000", "5000000"],
                   ["threads", "100000", "5000000"],
                   ["rows", "1000000"], ["step", "1000000"],
                   ["threads", "1000000"]]
  assert row["ms"] == {"100000": 0.1, "1000000": 1.0, "5000000": 5.0}
  assert row["step_ms"] == {"100000": 1.0, "1000000": 10.0, "5000000": 50.0}
  assert row["step_1thread_ms"] == {"100000": 10.0, "1000000": 100.0,
                                    "5000000": 500.0}
  assert row["step_2thread_ms"] == {"100000": 5.0, "1000000": 50.0,
                                    "5000000": 250.0}
  assert row["distinct"] == {"100000": 1000, "1000000": 10000,
                             "5000000": 50000}


def _run():
  bandwidth = {"copy_gbps": 20.0, "numpy_copy_gbps": 20.0,
               "tf_copy_gbps": 8.0, "row_gather_gbps": 10.0}
  rows = 2 * 3 * 15_000 * 32 * 4
  per_batch = 8 * 4096 * 32 * 4
  emb = {"stack": "tfemb-emb", "optimizer": "adam", "vocab": 5_000_000,
         "status": "ok", "median_ms": 2.0, "examples_per_s": 16e6,
         "peak_rss": None,
         "traffic_bytes_per_step": {"rows": rows, "total": rows + 2 *
                                    per_batch}}
  paired = {"stack": "tfemb", "optimizer": "adam", "status": "ok",
            "small": 100_000, "large": 5_000_000, "small_ms": 3.5,
            "large_ms": 4.9, "ratio": 4.9 / 3.5, "blocks": 4,
            "block_steps": 10, "block_ratio_p10": 1.3,
            "block_ratio_median": 1.4, "block_ratio_p90": 1.5}
  return {"meta": {"command": "x", "date": "d", "machine": "m"},
          "bandwidth": bandwidth, "runs": [emb], "flatness": [paired],
          "floor": {"sizes": [100_000, 5_000_000], "floors": [{
              "optimizer": "adam", "status": "ok",
              "ms": {"100000": 0.55, "5000000": 1.1},
              "step_ms": {"100000": 1.0, "5000000": 1.9}}]}}, rows, per_batch


FLAT_TARGET = "adam: tfemb Keras layer flat in the vocabulary (<= 1.1x)"
BOUND_TARGET = ("adam at 5,000,000 rows: embedding part <= 1.5x the "
                "memory-traffic bound")


def test_targets_set_the_floor_beside_flatness_and_the_bound():
  run, rows, per_batch = _run()
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  flat, verdict = targets[FLAT_TARGET]
  # The exact step grows by 1.9 - 1.0 ms; 1.1x allows 0.1 x 3.5 ms: the
  # machine alone grows by more than the target allows.
  assert ("the exact step in C++ grows by +0.90 ms (the rows alone by "
          "+0.55 ms), 1.1x allows +0.35 ms") in flat
  assert verdict == analysis.OUT_OF_REACH
  bound, verdict = targets[BOUND_TARGET]
  bound_ms = (rows + 2 * per_batch) / 20e9 * 1e3
  least = 1.1 + 2 * per_batch / 20e9 * 1e3  # the rows, then the batch
  assert f"the rows alone in C++: 1.100 ms, {1.1 / bound_ms:.1f}x" in bound
  assert (f"with the activations and gradients: {least:.3f} ms, "
          f"{least / bound_ms:.1f}x") in bound
  assert f"the exact step in C++: 1.900 ms, {1.9 / bound_ms:.1f}x" in bound
  assert 1.9 > 1.5 * bound_ms and verdict == analysis.OUT_OF_REACH


def test_the_exact_step_decides_whether_a_target_is_in_reach():
  run, rows, per_batch = _run()
  run["floor"]["floors"][0]["step_ms"] = {"100000": 0.7, "5000000": 0.8}
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  # The exact step grows by 0.1 ms, within the 0.35 ms 1.1x allows, and
  # takes 0.8 ms, within 1.5x the bound: both in reach, not met (the rows
  # alone and the batch at copy bandwidth would have said out of reach).
  bound_ms = (rows + 2 * per_batch) / 20e9 * 1e3
  assert 0.8 < 1.5 * bound_ms < 1.1 + 2 * per_batch / 20e9 * 1e3
  assert targets[FLAT_TARGET][1] is False
  assert targets[BOUND_TARGET][1] is False


def test_a_run_without_the_exact_step_is_judged_by_the_rows_alone():
  run, rows, per_batch = _run()
  del run["floor"]["floors"][0]["step_ms"]
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  flat, verdict = targets[FLAT_TARGET]
  assert "the rows alone in C++ grow by +0.55 ms, 1.1x allows +0.35 ms" in flat
  assert verdict == analysis.OUT_OF_REACH
  assert "exact step" not in targets[BOUND_TARGET][0]
  run["floor"]["floors"][0]["ms"] = {"100000": 0.55, "5000000": 0.6}
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  # The rows alone grow by 0.05 ms, and 0.6 ms plus the batch is within
  # 1.5x the bound: both in reach.
  bound_ms = (rows + 2 * per_batch) / 20e9 * 1e3
  assert 0.6 + 2 * per_batch / 20e9 * 1e3 < 1.5 * bound_ms
  assert targets[FLAT_TARGET][1] is False
  assert targets[BOUND_TARGET][1] is False


def test_report_shows_the_floor_in_the_flatness_table():
  run, _, _ = _run()
  text = report.markdown(run)
  assert "| +0.35 | 1.90 / 1.00 (+0.90) | 1.10 / 0.55 (+0.55) |" in text
  assert ("- adam: the exact step 100k 1.000, 5M 1.900; the rows alone "
          "100k 0.550, 5M 1.100") in text
  assert (f"| {FLAT_TARGET} | " in text and
          "| **no**: out of reach here |" in text)


def test_report_says_why_the_floor_is_missing():
  run, _, _ = _run()
  run["floor"] = {"status": "error", "detail": "exit 1: no C++ compiler"}
  text = report.markdown(run)
  assert ("The C++ floor (benchmarks/floor.py): not measured, "
          "error: exit 1: no C++ compiler") in text
  assert "in C++" not in text.split("### Targets")[1].split("\n", 3)[3]
