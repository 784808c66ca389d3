"""The package's import surface: what `import tfemb` gives a user."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

_SCRIPT = """
import tfemb
assert "tfemb.layers" not in __import__("sys").modules
print(tfemb.layers.TPUEmbedding.__module__, tfemb.migrate.__name__)
try:
  tfemb.no_such_name
except AttributeError as e:
  print(e)
"""


def test_subpackages_load_on_first_use():
  """`import tfemb` then `tfemb.layers.TPUEmbedding` (as the README names it)
  works without `import tfemb.layers`; unknown names stay AttributeErrors."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                ""))
  result = subprocess.run([sys.executable, "-c", _SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-2:] == [
      "tfemb.layers.embedding_layer tfemb.migrate",
      "module 'tfemb' has no attribute 'no_such_name'"]
