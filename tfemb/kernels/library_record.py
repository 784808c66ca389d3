"""The record of a build of the fused kernels, checked before it is loaded.

`tf.load_op_library` trusts the file it is given: a library cut short (a
copy interrupted, a full disk) kills the process with SIGBUS when it is
mapped, and another shared library at its path loads and fails at its
first op. So each build has a record: `<library>.json` beside a library in
the kernel cache (`tfemb.kernels.build`, written after the library), and
its entry in the manifest of the package's builds (`tfemb.kernels.install`).
A record holds the library's `file` name (in the cache, its cache key: a
digest of the sources and the target), its size and SHA-256 digest, the
TensorFlow it was compiled against (`tensorflow`: the version;
`tensorflow_build`: the commit and the flags that fix the ABI), and the
`flags` it was compiled with (with the `attempts` that failed first).
`problem()` says why a library cannot be loaded here, or nothing.

Files are written whole (`tfemb.atomic_files`: a temporary file in the same
directory, then renamed over the file), so no process reads a part.
"""

import functools
import hashlib
import json
import os
from typing import Dict, Optional

import tensorflow as tf

from tfemb import atomic_files


@functools.lru_cache(maxsize=None)
def tensorflow_build() -> str:
  """A digest of this TensorFlow's build: its commit, and the compile and
  link flags that are not paths (the C++ ABI and standard, Eigen's
  alignment, the framework library's name)."""
  flags = [f for f in tf.sysconfig.get_compile_flags() +
           tf.sysconfig.get_link_flags() if not f.startswith(("-I", "-L"))]
  text = "\0".join([tf.version.GIT_VERSION] + flags)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def digest(path: str) -> str:
  """The SHA-256 digest of the file at `path`."""
  found = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      found.update(block)
  return found.hexdigest()


def describe(path: str, file: str, **fields) -> Dict[str, object]:
  """The record of the library at `path`, compiled here, to be kept as
  `file` (a name), with `fields` (e.g. `flags`)."""
  return dict(fields, file=file, size=os.path.getsize(path),
              sha256=digest(path), tensorflow=tf.__version__,
              tensorflow_build=tensorflow_build())


def problem(library: str,
            record: Optional[Dict[str, object]] = None) -> Optional[str]:
  """Why the file at `library` is not the build `record` (default: the
  record beside it) describes, made for this TensorFlow, in a few words;
  None when it is, and may be loaded."""
  record = read(library) if record is None else record
  if not os.path.exists(library):
    return "it is missing"
  if "sha256" not in record:
    return "it has no record of its build"
  if record.get("file") != os.path.basename(library):
    return f"its record is that of {record.get('file')}"
  if (record.get("tensorflow"), record.get("tensorflow_build")) != (
      tf.__version__, tensorflow_build()):
    return (f"it was compiled for TensorFlow {record.get('tensorflow')} "
            f"(build {record.get('tensorflow_build')}), this is "
            f"{tf.__version__} (build {tensorflow_build()})")
  size = os.path.getsize(library)
  if size != record.get("size"):
    return f"it is {size} bytes, its record says {record.get('size')}"
  if digest(library) != record["sha256"]:
    return "its contents are not those its record names"
  return None


def read(library: str) -> Dict[str, object]:
  """The record beside the library at `library`; {} if there is none."""
  try:
    with open(library + ".json") as f:
      found = json.load(f)
  except (OSError, ValueError):
    return {}
  return found if isinstance(found, dict) else {}


def write(library: str, record: Dict[str, object]) -> None:
  """`record` beside the library at `library` (once the library is in
  place: a reader that finds the record finds its library)."""
  atomic_files.write_text(library + ".json", json.dumps(record))
