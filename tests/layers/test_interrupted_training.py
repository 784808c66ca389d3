"""Training killed with SIGKILL (in mid-epoch, or while writing a
checkpoint) and restarted ends with exactly the tables and slots of an
uninterrupted run: Keras' BackupAndRestore (Keras 3 and tf_keras) and a
tf.train.CheckpointManager loop, each in a subprocess."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import helpers

WORKER = helpers.WORKERS / "resume_worker.py"
ROOT = helpers.ROOT
TOTAL_STEPS = 12  # 3 epochs of 4 steps


def run(out, mode, workdir, legacy_keras, **env_extra):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             TF_USE_LEGACY_KERAS="1" if legacy_keras else "0",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
                 "PYTHONPATH", ""))
  env.update({k: str(v) for k, v in env_extra.items()})
  result = subprocess.run([sys.executable, str(WORKER), str(out), mode,
                           str(workdir)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  return result


_REFERENCES = {}


def reference_run(tmp_path_factory, mode, legacy_keras):
  """The uninterrupted run, once per mode and Keras flavour."""
  key = (mode, legacy_keras)
  if key not in _REFERENCES:
    folder = tmp_path_factory.mktemp("reference")
    result = run(folder / "ref.npz", mode, folder / "work", legacy_keras)
    assert result.returncode == 0, result.stderr[-3000:]
    _REFERENCES[key] = np.load(folder / "ref.npz")
  return _REFERENCES[key]


_RUNS = [("fit", False, "BackupAndRestore-keras3", "keras3"),
         ("fit", True, "BackupAndRestore-tf_keras", "tf_keras"),
         ("manager", False, "CheckpointManager", "keras3")]


# tf_keras killed in a save in the long suite (the suite's time): CI kills
# tf_keras at a step, and Keras 3 and the CheckpointManager in a save too.
@pytest.mark.parametrize("mode,legacy_keras,kill", [
    pytest.param(mode, legacy, kill, id=f"{name}-{kill}",
                 marks=[pytest.mark.runs_under(flavour)] + (
                     [pytest.mark.long] if (legacy and kill == "KILL_IN_SAVE")
                     else []))
    for kill in ("KILL_AT_STEP", "KILL_IN_SAVE")
    for mode, legacy, name, flavour in _RUNS])
def test_killed_and_restarted_run_equals_uninterrupted(
    tmp_path, tmp_path_factory, mode, legacy_keras, kill):
  expected = reference_run(tmp_path_factory, mode, legacy_keras)
  # Killed in epoch 2 (after its 3rd step), or in writing the 2nd backup.
  where = {"KILL_AT_STEP": 6, "KILL_IN_SAVE": 1}[kill]
  killed = run(tmp_path / "out.npz", mode, tmp_path / "work", legacy_keras,
               **{kill: where})
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert not (tmp_path / "out.npz").exists()
  resumed = run(tmp_path / "out.npz", mode, tmp_path / "work", legacy_keras)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  steps = json.loads(resumed.stdout.strip().splitlines()[-1])["steps"]
  assert 0 < steps < TOTAL_STEPS  # it resumed, it did not start over
  got = np.load(tmp_path / "out.npz")
  assert sorted(got.files) == sorted(expected.files)
  assert len(expected.files) == 5  # 2 tables, Adagrad and Adam slots
  for key in expected.files:
    np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
