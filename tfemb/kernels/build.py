"""Compiles the fused CPU kernels once per machine and loads them.

`embedding_kernels.cc` and `column_split.cc` are compiled with the
machine's C++ compiler against the installed TensorFlow's headers
(`tf.sysconfig`) into one library for the machine's own CPU
(`-march=native`: the rows' loops use AVX2 where it has it), in a cache
directory keyed by the sources, the rule table generated from the
optimizers' declarations (`rule_table`), TensorFlow's version, the flags
and the CPU the compiler sees, so each machine and TensorFlow version
builds it once and machines sharing a cache directory each get their own
build. Without a compiler, or with the option
`fused_kernels=False`, `load()` returns None and the host engine uses
TensorFlow's own ops: the same numbers, slower.

Options (`tfemb.options`): `fused_kernels`, `kernel_march` (the `-march`
to compile for; "": the compiler's default target), `kernel_cache` (the
cache directory; None: `$XDG_CACHE_HOME/tfemb` or `~/.cache/tfemb`, or a
per-user temporary directory where those cannot be written). Environment:
`CXX` (the compiler, default `c++`).

A process loads one build: the kernels' ops have fixed names, so the first
`load()` that finds a library is the one every later call returns.
"""

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfemb import options
from tfemb.kernels import rule_table

_HERE = os.path.dirname(__file__)
SOURCES = [os.path.join(_HERE, name) for name in
           ("embedding_kernels.cc", "column_split.cc")]
HEADERS = [os.path.join(_HERE, "column_split.h")]
# -ffp-contract=off: no fused multiply-adds, so every float operation rounds
# as TensorFlow's own kernels round it (also with -march's FMA units).
# -fno-math-errno lets sqrt vectorize. Every vector width computes the same
# floats: the rows' loops are element by element, sqrt and division are
# correctly rounded, pow is libm's call.
CXXFLAGS = ["-shared", "-fPIC", "-O3", "-fno-math-errno", "-ffp-contract=off",
            "-w"]


class KernelUnavailable(RuntimeError):
  pass


def _usable_dir(path: str) -> bool:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    return False
  return os.access(path, os.W_OK)


def cache_dir(opts: Optional[options.Options] = None) -> str:
  """`kernel_cache`, else the user's cache directory, else (when that
  cannot be written, e.g. a read-only home) a per-user temporary one."""
  opts = options.get() if opts is None else opts
  if opts.kernel_cache:
    return opts.kernel_cache
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  path = os.path.join(base, "tfemb")
  if _usable_dir(path):
    return path
  return os.path.join(tempfile.gettempdir(), f"tfemb-{os.getuid()}")


def compiler() -> str:
  return os.environ.get("CXX", "c++")


def target(march: str) -> Tuple[List[str], str]:
  """The `-march` flags to compile for, and what the compiler makes of
  them, for the cache key: `native` names a different CPU on each machine.
  No flags where the compiler refuses them."""
  return _resolve(compiler(), march)


@functools.lru_cache(maxsize=None)
def _resolve(cxx: str, march: str) -> Tuple[List[str], str]:
  if not march:
    return [], ""
  flags = [f"-march={march}"]
  try:
    done = subprocess.run(
        [cxx] + flags + ["-E", "-v", "-x", "c++", os.devnull, "-o",
                         os.devnull],
        capture_output=True, text=True, timeout=60, check=False)
  except (OSError, subprocess.SubprocessError):
    return [], ""
  if done.returncode != 0:
    return [], ""
  return flags, done.stderr


def cache_key(texts: Sequence[str], march: str) -> str:
  """A digest of sources `texts` as compiled here: TensorFlow's version,
  the flags and the CPU target (`march`, as `target`)."""
  key = hashlib.sha256()
  for text in texts:
    key.update(text.encode())
  key.update(tf.__version__.encode())
  key.update(" ".join(CXXFLAGS + tf.sysconfig.get_compile_flags()).encode())
  key.update(target(march)[1].encode())
  return key.hexdigest()[:16]


def compile_library(path: str, sources: Sequence[str],
                    include_dirs: Sequence[str], march: str) -> str:
  """Compiles `sources` into the shared library `path` unless it exists;
  returns `path`. One process compiles; others wait for it and find the
  file."""
  if os.path.exists(path):
    return path
  cxx = compiler()
  if shutil.which(cxx) is None:
    raise KernelUnavailable(f"no C++ compiler ({cxx!r} not found)")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):
      return path
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
      command = ([cxx] + CXXFLAGS + target(march)[0] +
                 [f"-I{d}" for d in include_dirs] +
                 tf.sysconfig.get_compile_flags() + list(sources) +
                 ["-o", tmp] + tf.sysconfig.get_link_flags())
      done = subprocess.run(command, capture_output=True, text=True,
                            timeout=600, check=False)
      if done.returncode != 0:
        raise KernelUnavailable(
            f"compiling {os.path.basename(path)} failed:\n" +
            done.stderr[-2000:])
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return path


def write_file(path: str, text: str) -> str:
  """`text` into `path` unless it is there already (written whole, so a
  process reading it never sees a part)."""
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
      f.write(text)
    os.replace(partial, path)
  return path


def _key(opts: options.Options) -> str:
  texts = []
  for source in SOURCES + HEADERS:
    with open(source) as f:
      texts.append(f.read())
  return cache_key(texts + [rule_table.header()], opts.kernel_march)


def library_path(opts: Optional[options.Options] = None) -> str:
  """Where tfemb's kernels compile to under `opts` (default: the current
  options)."""
  opts = options.get() if opts is None else opts
  return os.path.join(cache_dir(opts), f"tfemb_kernels-{_key(opts)}.so")


def build(opts: Optional[options.Options] = None) -> str:
  """Compiles the kernels unless they are in the cache; returns the path."""
  opts = options.get() if opts is None else opts
  path = library_path(opts)
  generated = os.path.join(cache_dir(opts), f"include-{_key(opts)}")
  write_file(os.path.join(generated, rule_table.FILE_NAME),
             rule_table.header())
  return compile_library(path, SOURCES, [generated], opts.kernel_march)


_lock = threading.Lock()
_loaded: List[Optional[object]] = []  # the process's one load, once tried


def load(opts: Optional[options.Options] = None) -> Optional[object]:
  """The kernels' op module, or None (`fused_kernels` off in `opts`,
  default the current options, or the kernels cannot be built)."""
  opts = options.get() if opts is None else opts
  if not opts.fused_kernels:
    return None
  with _lock:
    if not _loaded:
      try:
        _loaded.append(tf.load_op_library(build(opts)))
      except (KernelUnavailable, OSError, subprocess.SubprocessError,
              tf.errors.NotFoundError) as e:
        logging.warning(
            "tfemb: fused CPU kernels unavailable (%s); the host engine uses "
            "TensorFlow ops instead (same numbers, slower).", e)
        _loaded.append(None)
    return _loaded[0]
