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


@pytest.mark.parametrize("kill", ["KILL_AT_STEP", "KILL_IN_SAVE"])
@pytest.mark.parametrize("mode,legacy_keras", [
    pytest.param("fit", False, id="BackupAndRestore-keras3",
                 marks=pytest.mark.runs_under("keras3")),
    pytest.param("fit", True, id="BackupAndRestore-tf_keras",
                 marks=pytest.mark.runs_under("tf_keras")),
    pytest.param("manager", False, id="CheckpointManager",
                 marks=pytest.mark.runs_under("keras3"))])
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
