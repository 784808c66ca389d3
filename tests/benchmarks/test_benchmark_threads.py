"""The thread-scaling rows of the suite's report (benchmarks/threads.py):
one thread against every core, and why a row is missing."""

from benchmarks import compare
from benchmarks import report


def _run(rows):
  return {"meta": {"command": "x", "date": "d", "machine": "m"},
          "runs": [], "threads": rows}


def test_report_shows_each_optimizers_speedup():
  row = {"stack": "tfemb-emb", "optimizer": "adagrad", "vocab": 5_000_000,
         "status": "ok", "cores": 2, "one_thread_ms": 3.0,
         "all_cores_ms": 2.0, "speedup": 1.5}
  text = report.markdown(_run([row]))
  assert "### Threads: the embedding part on one thread and on every core" \
      in text
  assert "| adagrad | tfemb engine, embedding part only (mid-level API) | 5M | 3.00 | 2.00 (2 cores) " \
      "| 1.50x |" in text


def test_report_says_why_a_row_is_missing():
  row = {"stack": "tfemb-emb", "optimizer": "adam", "vocab": 5_000_000,
         "status": "out of memory", "detail": "skipped: out of memory at 5M"}
  text = report.markdown(_run([row]))
  assert "| adam | tfemb engine, embedding part only (mid-level API) | 5M | out of memory: skipped: " \
      "out of memory at 5M | - | - |" in text


def test_no_thread_rows_no_section():
  assert "### Threads" not in report.markdown(_run([]))


def test_the_suite_runs_them_by_default_and_quick_runs_one_round():
  assert compare.parse_args([]).thread_rounds == 2
  assert compare.parse_args(["--quick"]).thread_rounds == 1
  assert compare.parse_args(["--thread-rounds", "0"]).thread_rounds == 0
