"""The cluster benchmark's figures (benchmarks/cluster/report.py): a run's
totals over its processes, and the ratios tfemb / Keras of those totals."""

import argparse
import json
import os

import pytest

from benchmarks.cluster import report
from benchmarks.cluster import simulate

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


def _simulated(workers, design, steps_per_s, cpu_ms):
  """A simulation run: `cpu_ms` by process per step, 1 MiB sent by each."""
  return {"workers": workers, "design": design, "steps_per_s": steps_per_s,
          "per_process": {name: {"sent_per_step": MIB,
                                 "received_per_step": MIB,
                                 "cpu_s_per_step": ms / 1e3, "peak_rss": MIB}
                          for name, ms in cpu_ms.items()}}


def test_the_simulation_takes_the_median_round_and_the_model():
  """`--simulate-workers`: per design and W the median of the rounds'
  steps/s and the median round's CPU by group of processes; the model is W
  times one worker's steps/s, at most the cores over one worker's CPU per
  step; the JSON line has steps/s by W of both designs."""
  ours, baseline = list(simulate.DESIGNS)
  cpu = {"ps0": 10.0, "ps1": 12.0, "worker0": 30.0, "coordinator": 1.0}
  runs = [_simulated(1, ours, x, cpu) for x in (4.0, 5.0, 4.5)]
  runs += [_simulated(1, baseline, x, cpu) for x in (4.0, 4.2, 4.1)]
  runs += [_simulated(8, ours, x, dict(cpu, worker1=20.0))
           for x in (30.0, 25.0, 27.0)]
  runs += [_simulated(8, baseline, x, cpu) for x in (20.0, 22.0, 21.0)]
  args = argparse.Namespace(simulate_workers=[1, 8], dense_ms=200.0,
                            batch=4096, optimizer="adagrad", vocab=100_000,
                            steps_per_call=4, argv=[])
  summary, detail = simulate.summarize(args, runs)
  assert summary["steps_per_s"] == {"1": 4.5, "8": 27.0}
  assert summary["baseline"] == {"steps_per_s": {"1": 4.1, "8": 21.0},
                                 "design": baseline}
  assert summary["design"] == ours
  cores = os.cpu_count()
  assert summary["model"] == {
      "1": round(min(4.5, cores / 0.053), 2),
      "8": round(min(8 * 4.5, cores / 0.053), 2)}
  assert detail[ours]["8"]["rounds"] == [25.0, 27.0, 30.0]
  assert detail[ours]["8"]["cpu_ms_per_step"] == {
      "coordinator": 1.0, "servers": 22.0, "workers": 50.0}
  assert detail[ours]["8"]["bytes_per_step"] == 5 * MIB
  assert json.loads(json.dumps(summary)) == summary
  text = simulate.markdown(args, summary, detail)
  assert f"| 8 | {ours} | 27.0 (25.0, 27.0, 30.0) | 6.00 |" in text
