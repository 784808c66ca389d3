"""The kernels built into the package when tfemb was installed.

`tfemb/kernels/install.py` (run by setup.py for `pip install
--no-build-isolation .` and `pip wheel --no-build-isolation .`) compiles the
kernels for the TensorFlow installed at that moment, once per CPU target,
into `tfemb/kernels/lib/` with a manifest: per build its file, target,
flags, the CPU flags it needs (as Linux's /proc/cpuinfo names them) and
its record (`library_record`: size, digest, TensorFlow build), which
`tfemb.kernels.build` checks before loading it (else compiles here). At
run time `find()` picks the first build this CPU can run, if the manifest's
TensorFlow version and sources are those of this process: a machine
without a compiler trains on the fused path. Otherwise the kernels are
compiled on first use (`tfemb.kernels.build`). A CPU whose flags cannot be
read runs only builds that need nothing beyond the baseline.
"""

import json
import os
from typing import Dict, Optional

import tensorflow as tf

DIR = os.path.join(os.path.dirname(__file__), "lib")
MANIFEST = "manifest.json"


def cpu_flags() -> Optional[set]:
  """This CPU's flags from /proc/cpuinfo; None where they cannot be read."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("flags", "Features")):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return None


def manifest(directory: str = DIR) -> Dict[str, object]:
  """The manifest of the builds in `directory`; {} when there is none."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def find(sources: str, directory: str = DIR) -> Optional[Dict[str, object]]:
  """The packaged build to load here: the manifest's entry (with its
  `path`) of the first build whose requirements this CPU meets, if they
  were built for this TensorFlow and the sources whose digest is `sources`
  (`build.source_digest()`); else None."""
  found = manifest(directory)
  if (found.get("tensorflow") != tf.__version__ or
      found.get("sources") != sources):
    return None
  have = cpu_flags()
  for entry in found.get("builds", []):
    needs = set(entry.get("requires", []))
    if needs and (have is None or not needs <= have):
      continue
    path = os.path.join(directory, entry["file"])
    if os.path.exists(path):
      return dict(entry, path=path)
  return None
