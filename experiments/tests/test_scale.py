"""`python -m experiments.scale` trains, saves, restores, exports and serves
(tiny sizes)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository


def test_scale_saves_and_restores_exactly(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.scale", "--rows", "20000",
       "--compare-rows", "2000", "--steps", "5", "--batch", "256", "--out",
       str(tmp_path)],
      cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=300, check=False)
  out = result.stdout
  assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
  for line in ("restore: rows equal", "restore: accumulators equal",
               "restore: loss continues", "Adagrad: PASS",
               "20,000 / 2,000:", "serve: predictions equal",
               "load (TensorFlow only, tfemb not imported)"):
    assert line in out, out[-3000:]
  summary = (tmp_path / "scale.md").read_text()
  assert "rows equal, accumulators equal" in summary
  assert not list(tmp_path.glob("ckpt*"))  # deleted without --keep
  assert not (tmp_path / "export").exists()
