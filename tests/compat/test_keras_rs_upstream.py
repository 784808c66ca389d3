"""keras-rs' own TensorFlow tests pass on tfemb's host v5p-8.

keras-rs runs its `DistributedEmbedding` tests on its TPU path where
`TPU_NAME` is set (`placement="sparsecore"`, TensorFlow's
`TPUEmbeddingV2`). Here they run unchanged (tests/compat/keras_rs_upstream)
under `python -m tfemb.run --tpu v5p-8 -m pytest`: TensorFlow's resolver,
`initialize_tpu_system` and `TPUStrategy` give the host strategy, and the
SparseCore engine is tfemb's. Their jit cases are refused with tfemb's
error (the host engines do not compile under XLA); keras-rs skips the jit
cases it does not support itself.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

import helpers

# keras-rs is Keras 3's, and needs TensorFlow's SparseCore classes (2.17).
pytestmark = [pytest.mark.runs_under("keras3"),
              pytest.mark.requires_tensorflow("2.17")]

UPSTREAM = os.path.join(helpers.ROOT, "tests", "compat", "keras_rs_upstream")


def _run_upstream(tmp_path, selection):
  """keras-rs' tests (those matching `selection`, pytest -k, if given):
  each test's outcome and failure message, by name."""
  report = tmp_path / "report.xml"
  env = dict(os.environ, TPU_NAME="local", KERAS_BACKEND="tensorflow",
             TF_USE_LEGACY_KERAS="0")
  env.pop("TFEMB_TPU", None)
  command = [sys.executable, "-m", "tfemb.run", "--tpu", "v5p-8", "-m",
             "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
             f"--junitxml={report}", UPSTREAM] + (
                 ["-k", selection] if selection else [])
  done = subprocess.run(command, cwd=helpers.ROOT, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
  outcomes = {}
  for case in ElementTree.parse(report).iter("testcase"):
    failure = case.find("failure")
    if failure is None:
      failure = case.find("error")
    if failure is not None:
      outcomes[case.get("name")] = (
          "failed", failure.get("message", "") + (failure.text or ""))
    elif case.find("skipped") is not None:
      outcomes[case.get("name")] = ("skipped",
                                    case.find("skipped").get("message", ""))
    else:
      outcomes[case.get("name")] = ("passed", "")
  return outcomes, done


def test_keras_rs_own_tests_pass_on_a_host_v5p_8(tmp_path):
  outcomes, done = _run_upstream(tmp_path, "")
  jit = {n: o for n, o in outcomes.items() if n.endswith("_jit")}
  rest = {n: o for n, o in outcomes.items() if n not in jit}
  failed = {n: m for n, (o, m) in rest.items() if o == "failed"}
  assert not failed, (failed, done.stdout[-4000:])
  passed = [n for n, (o, _) in rest.items() if o == "passed"]
  # Every test of the SparseCore path ran: fit, correctness, shared table,
  # mixed placement (TPU only) and the config conversions. (keras-rs skips
  # its save-and-load test on a TPU: "TODO table reloading".)
  for name in ("test_model_fit_sparse_weights", "test_model_fit_ragged",
               "test_correctness_sqrtn_ragged_2d_weights",
               "test_correctness_mean_sparse_2d", "test_shared_table",
               "test_mixed_placement", "test_basics_sparse_sparsecore",
               "test_optimizer_conversion_ftrl_keras"):
    assert name in passed, (name, outcomes.get(name))
  assert len(passed) >= 50, outcomes
  # What keras-rs skips on a TPU, it skips for its own reasons.
  for name, (outcome, message) in rest.items():
    if outcome == "skipped":
      assert "tfemb" not in message, (name, message)
  # Its jit cases: refused by tfemb's host engine with what to do, or
  # skipped by keras-rs (ragged and sparse are not jit-compilable).
  refused = [n for n, (o, m) in jit.items()
             if o == "failed" and "XLA cannot compile" in m
             and "jit_compile=True" in m]
  skipped = [n for n, (o, _) in jit.items() if o == "skipped"]
  assert len(refused) == 12, jit
  assert sorted(refused + skipped) == sorted(jit), jit
