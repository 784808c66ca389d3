"""The tutorials run as documented and learn (on a smaller click log)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(script, *args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, str(ROOT / "tutorials" / script), *args],
      cwd=ROOT / "tutorials", env=env, capture_output=True, text=True,
      timeout=600, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout


def aucs(output):
  before = float(re.search(r"AUC before training: ([0-9.]+)", output)[1])
  after = float(re.search(r"AUC after training: ([0-9.]+)", output)[1])
  return before, after


def test_quickstart_fits_and_saves_a_checkpoint(tmp_path):
  out = run("quickstart.py", "--examples", "100000", "--epochs", "3",
            "--output", str(tmp_path))
  assert "Epoch 3/3" in out
  before, after = aucs(out)
  assert after > max(0.58, before + 0.05), out[-2000:]
  assert list(tmp_path.glob("ckpt-1.index"))


def test_custom_training_loop(tmp_path):
  out = run("custom_training_loop.py", "--examples", "60000", "--epochs",
            "3", "--output", str(tmp_path))
  losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", out)]
  assert losses == sorted(losses, reverse=True) and len(losses) == 3
  assert list(tmp_path.glob("ckpt-1.index"))


# The tutorial sets tf_keras itself: the same work in both passes, so it
# runs in one (`runs_under`).
@pytest.mark.runs_under("tf_keras")
@pytest.mark.parametrize("script", ["tfrs_ranking.py"])
def test_tfrs_tutorial_under_keras_2(script):
  out = run(script, "--examples", "100000", "--epochs", "3")
  before, after = aucs(out)
  assert after > max(0.58, before + 0.05), out[-2000:]


@pytest.mark.long  # a two-process run; CI's tests/strategies/test_multi_worker.py
def test_multi_worker_tutorial_launches_two_workers(tmp_path):
  out = run("multi_worker.py", "--launch", "2", "--examples", "40000",
            "--epochs", "1", "--output", str(tmp_path))
  aucs_by_worker = dict(re.findall(
      r"worker (\d) of 2: test AUC after training: ([0-9.]+)", out))
  assert set(aucs_by_worker) == {"0", "1"}
  # Both workers hold the same tables, so they score the test set alike.
  assert aucs_by_worker["0"] == aucs_by_worker["1"]
  assert list(tmp_path.glob("ckpt-1.index"))


@pytest.mark.runs_under("keras3")  # keras-rs is Keras 3's
@pytest.mark.requires_tensorflow("2.17")  # and needs TF's SparseCore classes
def test_keras_rs_tutorial_trains_as_on_a_v5p_8():
  """Run as documented: `python -m tfemb.run --tpu v5p-8 ...`."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "tfemb.run", "--tpu", "v5p-8",
       str(ROOT / "tutorials" / "keras_rs_on_cpu.py"), "--examples",
       "60000", "--epochs", "3"], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "4 replicas, embedding hardware V2" in out
  assert "SparseCore engine: tfemb.sparsecore.engine.TPUEmbeddingV2" in out
  losses = [float(v) for v in re.search(
      r"Training loss by epoch: (.*)", out)[1].split(", ")]
  assert losses == sorted(losses, reverse=True) and len(losses) == 3
  before = float(re.search(r"Test loss before training: ([0-9.]+)", out)[1])
  after = float(re.search(r"Test loss after training: ([0-9.]+)", out)[1])
  assert after < before - 0.03, out[-2000:]
