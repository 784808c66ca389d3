"""benchmarks/lab/page_faults.py runs end to end on a tiny workload."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_page_faults_reports_both_settings_and_the_cost(tmp_path):
  out = tmp_path / "faults.json"
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.lab.page_faults", "--vocab", "1000",
       "--rounds", "1", "--steps", "5", "--blocks", "2", "--block-steps",
       "2", "--out", str(out)],
      cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  r = json.loads(out.read_text())
  assert [p["setting"] for p in r["processes"]] == ["glibc", "tfemb"]
  for p in r["processes"]:
    assert p["median_ms"] > 0 and p["page_faults_per_step"] >= 0
  assert set(r["cost"]) == {"trim 64 MiB", "trim 1 MiB", "us_per_fault"}
  assert "| glibc |" in done.stdout and "| tfemb |" in done.stdout
