"""Where a step's time goes (benchmarks/profile.py): the parts of the step
the summary files tfemb's fused kernels under, and a traced embedding-part
step read back per step."""

import json
import os
import subprocess
import sys

import helpers
from benchmarks import profile
from benchmarks.stacks import tfemb_common
from tfemb.kernels import build

LOOKUP = "embedding lookup (dedup, gather, combine, input checks)"
UPDATE = "embedding update (row gradients, slots, scatters, checks)"


def test_fused_kernels_are_filed_by_type_whatever_their_name():
  # The embedding part's ops carry no Keras name scope.
  assert profile.category("TfembDedupGather_3", "TfembDedupGather") == LOOKUP
  assert profile.category("TfembIdCounts", "TfembIdCounts") == LOOKUP
  for op in ("TfembRowGradients", "TfembApplyRows", "TfembRestoreRows",
             "TfembApplyTables"):
    assert profile.category(f"critical_section_execute/{op}_1", op) == UPDATE
  # The Keras layer's ops keep being filed by name.
  assert profile.category("functional/tpu_embedding/Unique", "Unique") == \
      LOOKUP
  assert profile.category("adam/Sqrt", "Sqrt") == \
      "dense head, loss, Keras optimizer"
  assert profile.category("ExecutorState", "Process") == \
      "TF executor scheduling"


def test_embedding_part_is_profiled_per_step(tmp_path):
  """Two calls of the embedding part, `steps_per_call` steps each,
  traced: every step runs each of the workload's 8 tables through the fused
  lookup, and one fused update sums their gradients and takes them all."""
  assert build.load() is not None, "the fused kernels did not build"
  env = dict(os.environ, PYTHONPATH=str(helpers.ROOT))
  env.pop("TFEMB_FUSED_KERNELS", None)  # the default: the fused kernels
  out = tmp_path / "profile.json"
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile", "--stack", "tfemb-emb",
       "--optimizer", "adagrad", "--vocab", "1000", "--warmup", "2",
       "--steps", "2", "--logdir", str(tmp_path / "logs"), "--out",
       str(out)],
      cwd=helpers.ROOT, env=env,
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  s = json.loads(out.read_text())
  assert s["stack"] == "tfemb-emb"
  # calls x the steps each runs
  assert s["steps"] == 2 * tfemb_common.steps_per_call()
  parts = {name for name, _, _ in s["by_part"]}
  assert LOOKUP in parts and UPDATE in parts
  types = {name for name, _, _ in s["by_type"]}
  assert {"TfembDedupGather", "TfembApplyTables"} <= types
  assert "TfembRowGradients" not in types
  assert s["unprofiled_median_ms"] > 0
  # The wall time of each traced call, per step.
  assert len(s["step_wall_ms"]) == 2 and min(s["step_wall_ms"]) > 0


def test_summary_leaves_out_the_wall_time_it_did_not_record():
  s = {"trace": "t", "steps": 40, "step_wall_ms": [], "ops_per_step": 35.0,
       "op_self_ms_per_step": 1.4, "by_part": [], "by_type": [],
       "by_op": []}
  text = profile.format_summary(s, "x")
  assert "40 steps; 35 ops per step; op self time 1.4 ms per step" in text
  s["step_wall_ms"] = [1.25, 1.5]
  assert "40 steps; wall per step (profiled): 1.2, 1.5 ms; 35 ops" in \
      profile.format_summary(s, "x")
