"""The benchmark suite's memory-traffic bound (docs/performance.md, 'Method'): bytes moved
per step over the measured bandwidth, and how the report judges it; the
memory model; and the children's count of memory on 2 MiB pages."""

import numpy as np
import pytest

from benchmarks import analysis
from benchmarks import workload as workload_lib

# 8 tables of dim 32, Adam (2 slots), 1,800 distinct ids per table, batch
# 4096: rows read and written once each, activations and gradients once.
DISTINCT, SLOTS, DIM, BATCH, TABLES = 8 * 1800, 2, 32, 4096, 8
ROWS = 2 * (1 + SLOTS) * DISTINCT * DIM * 4
PER_BATCH = TABLES * BATCH * DIM * 4
BANDWIDTH = {"copy_gbps": 25.0, "numpy_copy_gbps": 25.0, "tf_copy_gbps": 8.0,
             "row_gather_gbps": 5.0}


def _run(median_ms, bandwidth=BANDWIDTH):
  row = {"stack": "tfemb-emb", "optimizer": "adam", "vocab": 5_000_000,
         "status": "ok", "median_ms": median_ms, "peak_rss": None,
         "traffic_bytes_per_step": {"rows": ROWS, "activations": PER_BATCH,
                                    "gradients": PER_BATCH,
                                    "total": ROWS + 2 * PER_BATCH}}
  return {"meta": {}, "bandwidth": bandwidth, "runs": [row]}


def test_bound_is_bytes_over_copy_bandwidth():
  run = _run(2.0)
  b = analysis.traffic_bound(run["runs"], run["bandwidth"], "adam",
                             5_000_000)
  seconds = (ROWS + 2 * PER_BATCH) / 25e9
  assert b["bound_ms"] == pytest.approx(seconds * 1e3)
  assert b["ratio"] == pytest.approx(2.0 / (seconds * 1e3))
  assert b["rows_ratio"] == pytest.approx(2.0 / (ROWS / 25e9 * 1e3))
  # The rows at 5 GB/s (random gathers), the rest at 25 GB/s (copy).
  random_ms = (ROWS / 5e9 + 2 * PER_BATCH / 25e9) * 1e3
  assert b["random_bound_ms"] == pytest.approx(random_ms)
  assert b["random_ratio"] == pytest.approx(2.0 / random_ms)


def test_target_is_judged_on_copy_bandwidth_only():
  bound_ms = (ROWS + 2 * PER_BATCH) / 25e9 * 1e3  # 0.78 ms
  for median, met in ((1.45 * bound_ms, True), (1.55 * bound_ms, False)):
    (target,) = [t for t in analysis.targets(_run(median))
                 if "memory-traffic" in t[0]]
    assert target[2] is met
    assert "random-row rate (5.0 GB/s)" in target[1]


def test_a_run_without_the_random_row_rate_still_reports_the_bound():
  bandwidth = {k: v for k, v in BANDWIDTH.items() if k != "row_gather_gbps"}
  run = _run(1.0, bandwidth)
  b = analysis.traffic_bound(run["runs"], bandwidth, "adam", 5_000_000)
  assert b["ratio"] == pytest.approx(1.0 / ((ROWS + 2 * PER_BATCH) / 25e9
                                            * 1e3))
  assert "random_ratio" not in b
  (target,) = [t for t in analysis.targets(run) if "memory-traffic" in t[0]]
  assert "random-row" not in target[1] and target[2] is True


def test_bytes_per_step_are_the_sum_of_the_rows_and_the_batch():
  work = workload_lib.Workload(vocab=50, optimizer="adagrad", features=3,
                               dim=4, batch=16, distinct_batches=3)
  batches = work.make_batches()
  traffic = work.traffic_bytes_per_step(batches)
  # Each batch's distinct ids of every table, read and written once, with
  # the accumulator beside; one activation and one gradient per id.
  distinct = np.mean([sum(len(set(ids.tolist())) for ids in f.values())
                      for f, _ in batches])
  assert traffic["rows"] == pytest.approx(2 * 2 * distinct * 4 * 4)
  assert traffic["activations"] == traffic["gradients"] == 3 * 16 * 4 * 4
  assert traffic["total"] == pytest.approx(
      traffic["rows"] + traffic["activations"] + traffic["gradients"])


def test_memory_model_charges_the_smallest_runs_overhead():
  gib = 2**30
  runs = [{"stack": "tfemb", "optimizer": "adam", "vocab": v, "status": "ok",
           "median_ms": 1.0, "peak_rss": rss, "table_and_slot_bytes": tables}
          for v, rss, tables in ((1000, 1.5 * gib, 0.1 * gib),
                                 (5000, 2.8 * gib, 1.0 * gib))]
  small, large = analysis.memory_model(runs, "adam")
  assert small["overhead"] == large["overhead"] == pytest.approx(1.4 * gib)
  assert small["ratio"] == pytest.approx(1.0)
  assert large["ratio"] == pytest.approx(2.8 / 2.4)
  (target,) = [t for t in analysis.targets({"runs": runs})
               if "peak RSS" in t[0]]
  assert "5,000 rows: 2.80 GiB vs 1.00 + 1.40 GiB: 1.17x" in target[1]
  assert target[2] is True


def test_huge_pages_counts_a_region_backed_by_2_mib_pages():
  import mmap  # pylint: disable=g-import-not-at-top
  from benchmarks import procmem  # pylint: disable=g-import-not-at-top
  with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
    thp = f.read()
  before = procmem.huge_pages()
  region = mmap.mmap(-1, 64 << 20,  # private: shared memory has its own THP
                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  try:
    region.madvise(mmap.MADV_HUGEPAGE)
    for at in range(0, len(region), 4096):
      region[at] = 1
    after = procmem.huge_pages()
  finally:
    region.close()
  if "[never]" in thp:  # the machine gives no 2 MiB pages at all
    assert after == before == 0
  else:  # 64 MiB touched in an aligned region: most of it on 2 MiB pages
    assert after - before >= 32 << 20


def test_compare_stops_before_running_when_it_could_not_plot(tmp_path,
                                                             monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
  out = tmp_path / "run"
  with pytest.raises(SystemExit, match=r"pip install -e '\.\[benchmarks\]'"):
    compare.main(["--quick", "--out", str(out)])
  assert not out.exists()  # no child ran, nothing was written
