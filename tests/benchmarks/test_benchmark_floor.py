"""The rows alone in C++ (benchmarks/floor.py, floor.cc): the child, and how
the report sets its numbers beside the targets memory decides
(docs/performance.md, 'Method')."""

import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import analysis
from benchmarks import floor
from benchmarks import report
from benchmarks import workload as workload_lib
import helpers

ROOT = helpers.ROOT


def _distinct_per_step(vocab):
  """The rows floor.cc must count: the workload's distinct ids per batch,
  over its 8 tables, averaged over the batches (rounded down)."""
  batches = workload_lib.Workload(vocab=vocab, optimizer="sgd").make_batches()
  per_batch = [sum(len(set(ids.tolist())) for ids in features.values())
               for features, _ in batches]
  return sum(per_batch) // len(per_batch)


def test_distinct_rows_keep_the_order_ids_first_appear():
  ids = np.array([7, 3, 7, 9, 3, 1, 9])
  (rows,) = floor.distinct_rows([({"f0": ids}, None)], ["f0"])
  np.testing.assert_array_equal(rows[0], [7, 3, 9, 1])


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
  """Each group is one run of floor.cc, with its sizes on the command
  line; the rows per size come from the run that timed it."""
  monkeypatch.setattr(floor.procmem, "available", lambda: 17 * 2**30)
  calls = []

  def fake_run(argv, **kwargs):
    del kwargs
    calls.append(argv[3:])
    lines = [f"adam, {v} rows x 8 tables: {int(v) / 1e6:.3f} ms per step "
             f"({int(v) // 100} distinct rows, 43 ns each)" for v in argv[3:]]
    return subprocess.CompletedProcess(argv, 0, "\n".join(lines), "")

  monkeypatch.setattr(floor.subprocess, "run", fake_run)
  row = floor.measure("floor", "ids", "adam",
                      [100_000, 1_000_000, 5_000_000], 10)
  assert calls == [["100000", "5000000"], ["1000000"]]
  assert row["ms"] == {"100000": 0.1, "1000000": 1.0, "5000000": 5.0}
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
              "ms": {"100000": 0.55, "5000000": 1.1}}]}}, rows, per_batch


FLAT_TARGET = "adam: tfemb Keras layer flat in the vocabulary (<= 1.1x)"
BOUND_TARGET = ("adam at 5,000,000 rows: embedding part <= 1.5x the "
                "memory-traffic bound")


def test_targets_set_the_floor_beside_flatness_and_the_bound():
  run, rows, per_batch = _run()
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  flat, verdict = targets[FLAT_TARGET]
  # The rows alone grow by 1.1 - 0.55 ms; 1.1x allows 0.1 x 3.5 ms: the
  # machine alone grows by more than the target allows.
  assert "the rows alone in C++ grow by +0.55 ms, 1.1x allows +0.35 ms" in flat
  assert verdict == analysis.OUT_OF_REACH
  bound, verdict = targets[BOUND_TARGET]
  bound_ms = (rows + 2 * per_batch) / 20e9 * 1e3
  least = 1.1 + 2 * per_batch / 20e9 * 1e3  # the rows, then the batch
  assert f"the rows alone in C++: 1.100 ms, {1.1 / bound_ms:.1f}x" in bound
  assert (f"with the activations and gradients: {least:.3f} ms, "
          f"{least / bound_ms:.1f}x") in bound
  assert least > 1.5 * bound_ms and verdict == analysis.OUT_OF_REACH


def test_a_target_the_floor_leaves_in_reach_is_not_met():
  run, rows, per_batch = _run()
  run["floor"]["floors"][0]["ms"] = {"100000": 0.55, "5000000": 0.6}
  targets = {t: (m, v) for t, m, v in analysis.targets(run)}
  # The rows alone grow by 0.05 ms, within the 0.35 ms 1.1x allows; and
  # 0.6 ms plus the batch is within 1.5x the bound: both in reach.
  assert targets[FLAT_TARGET][1] is False
  bound_ms = (rows + 2 * per_batch) / 20e9 * 1e3
  assert 0.6 + 2 * per_batch / 20e9 * 1e3 < 1.5 * bound_ms
  assert targets[BOUND_TARGET][1] is False


def test_report_shows_the_floor_in_the_flatness_table():
  run, _, _ = _run()
  text = report.markdown(run)
  assert "| +0.35 | 1.10 / 0.55 (+0.55) |" in text
  assert "- adam: 100k 0.550, 5M 1.100" in text
  assert (f"| {FLAT_TARGET} | " in text and
          "| **no**: out of reach here |" in text)


def test_report_says_why_the_floor_is_missing():
  run, _, _ = _run()
  run["floor"] = {"status": "error", "detail": "exit 1: no C++ compiler"}
  text = report.markdown(run)
  assert ("The rows alone in C++ (benchmarks/floor.py): not measured, "
          "error: exit 1: no C++ compiler") in text
  assert "the rows alone in C++" not in text.split("### Targets")[1]
