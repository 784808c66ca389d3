"""The cluster benchmark's figures (benchmarks/cluster/report.py): a run's
totals over its processes, and the ratios tfemb / Keras of those totals."""

import argparse

import pytest

from benchmarks.cluster import report

MIB = 2**20


def _result(stack, steps_per_s, sent, rss, strategy="ps", status="ok"):
  """A run whose processes sent `sent[i]` bytes per step with peak RSS
  `rss[i]`."""
  return {"strategy": strategy, "optimizer": "adam", "stack": stack,
          "status": status, "steps_per_s": steps_per_s,
          "per_process": {
              f"p{i}": {"sent_per_step": s, "received_per_step": s / 2,
                        "cpu_s_per_step": 0.004, "peak_rss": r}
              for i, (s, r) in enumerate(zip(sent, rss))}}


RESULTS = [
    _result("tfemb", 8.0, [1 * MIB, 2 * MIB, 3 * MIB], [300 * MIB, 900 * MIB,
                                                          None]),
    _result("keras", 2.0, [4 * MIB, 8 * MIB, 12 * MIB], [600 * MIB,
                                                          1200 * MIB,
                                                          400 * MIB]),
    _result("tfemb", 5.0, [MIB], [MIB], strategy="mwms"),
    {"strategy": "mwms", "optimizer": "adam", "stack": "keras",
     "status": "failed", "error": "worker1 exited 1"},
]


def test_totals_sum_the_bytes_and_take_the_largest_process():
  t = report.totals(RESULTS[0])
  assert t["steps_per_s"] == 8.0
  assert t["bytes_per_step"] == 6 * MIB  # 1 + 2 + 3 MiB sent
  assert t["peak_rss"] == 900 * MIB  # a process without a reading counts 0
  assert t["rss_total"] == 1200 * MIB


def test_ratios_are_the_quotients_of_tfembs_totals_over_keras():
  ratios = report.ratios(RESULTS)
  # mwms's Keras run failed: no ratio there, and the line names the run.
  assert list(ratios) == ["ps/adam"]
  r = ratios["ps/adam"]
  assert r["speed"] == pytest.approx(8.0 / 2.0)
  assert r["bytes"] == pytest.approx(6 / 24)
  assert r["rss"] == pytest.approx(900 / 1200)
  assert report.summary_line(RESULTS) == (
      "cluster: tfemb/Keras ps/adam speed 4.00x bytes 0.25x rss 0.75x; "
      "FAILED: mwms/adam/keras")
  args = argparse.Namespace(argv=["--quick"], vocab=100_000, batch=4096,
                            workers=2, ps=2, epochs=2, steps=20,
                            warmup_epochs=1)
  text = report.markdown(args, RESULTS)
  assert "| ps | adam | tfemb | 8.00 | 6.00 |" in text
  assert "| ps/adam | 4.00 | 0.25 | 0.75 |" in text
  assert "| mwms | adam | keras | failed: worker1 exited 1 |" in text
