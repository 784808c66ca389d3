"""Compiles the fused CPU kernels, and loads the build this process uses.

Where the kernels come from, in order (`load`):

1. The package's own build for this CPU (`tfemb.kernels.packaged`, made
   at install by `tfemb.kernels.install`), if made for this TensorFlow and
   these sources. No compiler is needed.
2. A build compiled here on first use against the installed TensorFlow's
   headers (after a TensorFlow upgrade, in a source checkout, or when
   `kernel_march` names a target), in a cache keyed by the sources
   (`src/`, compiled as one translation unit: `compiler.compile_command`), the
   rule table (`rule_table`), TensorFlow's version, the flags and what the
   compiler makes of the target.
3. None: TensorFlow's own ops (the same numbers, slower), after one
   warning line with the cause and the remedy, the compiler's whole output
   in a log file the line names.

A compile that fails tries safer targets (`compiler.safer`): without the
instruction-set extension whose header broke it (GCC 12 rejects the
AVX512-FP16 code of the Eigen TensorFlow bundles), then the compiler's
default target. Each library has a record (`library_record`: its size and
digest, the TensorFlow it was compiled against, its flags), checked before
it is loaded: a library cut short, another file at its path or a build
for another TensorFlow is compiled again, or passed over with the warning
line. Options: `tfemb.options` (`fused_kernels`, `kernel_march`,
`kernel_cache`); environment: `CXX` (default `c++`).

A process loads one build: the kernels' ops have fixed names, so the first
`load()` that finds a library is the one every later call returns.
"""

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfemb import atomic_files
from tfemb import options
from tfemb.kernels import compiler
from tfemb.kernels import library_record
from tfemb.kernels import packaged
from tfemb.kernels import rule_table
from tfemb.kernels.unavailable import first_error
from tfemb.kernels.unavailable import KernelUnavailable

_REFUSED = "{} does not know this target"


def _usable_dir(path: str) -> bool:
  try:
    os.makedirs(path, exist_ok=True)
    return os.access(path, os.W_OK)
  except OSError:
    return False


def cache_dir(opts: Optional[options.Options] = None) -> str:
  """`kernel_cache`, else the user's cache directory; a per-user temporary
  one where that cannot be written (a read-only home or cache)."""
  opts = options.get() if opts is None else opts
  path = opts.kernel_cache
  if not path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "tfemb")
  if _usable_dir(path):
    return path
  return os.path.join(tempfile.gettempdir(), f"tfemb-{os.getuid()}")


def cache_key(texts: Sequence[str], march: str) -> str:
  """A digest of sources `texts` as compiled here: TensorFlow's version,
  the flags and the CPU target (`march`, as `target`)."""
  key = hashlib.sha256()
  for text in texts:
    key.update(text.encode())
  key.update(tf.__version__.encode())
  key.update(" ".join(compiler.CXXFLAGS + tf.sysconfig.get_compile_flags()).encode())
  key.update(compiler.target(march)[1].encode())
  return key.hexdigest()[:16]


def generated_include_dir(opts: Optional[options.Options] = None) -> str:
  """The directory of the generated rule table, written if it is not."""
  opts = options.get() if opts is None else opts
  generated = os.path.join(cache_dir(opts), f"include-{_key(opts)}")
  write_file(os.path.join(generated, rule_table.FILE_NAME),
             rule_table.header())
  return generated


def built_with(path: str) -> Dict[str, object]:
  """What a library at `path` was compiled with (`flags`, and the
  `attempts` that failed first), from its record (`library_record`)."""
  return library_record.read(path)


def compile_library(path: str, sources: Sequence[str],
                    include_dirs: Sequence[str], march: str) -> str:
  """Compiles `sources` into the shared library `path` unless it is there
  as its record describes it (`library_record`; else it is compiled
  again); returns `path`. Tries safer targets when a compile fails
  (`compiler.safer`); raises `KernelUnavailable` when none compiles, with the
  compiler's output in `<path>.log`. One process compiles; others wait for
  it and find the library and its record."""
  problem = library_record.problem(path)
  if problem is None:
    return path
  cxx = compiler.compiler()
  if shutil.which(cxx) is None:
    unusable = (f"{path} in the kernel cache cannot be loaded ({problem}) "
                "and there is " if os.path.exists(path) else "")
    raise KernelUnavailable(
        f"{unusable}no C++ compiler ({cxx!r} not found)",
        "Install g++ (or set CXX), or install tfemb from a wheel built for "
        "this TensorFlow (docs/performance.md, 'Where the fused kernels "
        "run').")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    problem = library_record.problem(path)
    if problem is None:
      return path
    if os.path.exists(path):
      logging.info("tfemb: compiling the fused kernels again: %s cannot be "
                   "loaded (%s)", path, problem)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    attempts, outputs = [], []
    flags: Optional[List[str]] = compiler.target(march)[0]
    if compiler.march_flag_value(march) and not flags:
      attempts.append({"flags": [f"-march={compiler.march_flag_value(march)}"],
                       "error": _REFUSED.format(cxx)})
    try:
      while flags is not None:
        ok, output, command = compiler.run(cxx, flags, sources, include_dirs,
                                       tmp)
        if ok:
          record = library_record.describe(
              tmp, os.path.basename(path), flags=flags, attempts=attempts)
          os.replace(tmp, path)
          library_record.write(path, record)
          if attempts:
            logging.info("tfemb: fused kernels compiled with %r (%s)",
                         " ".join(flags) or "the compiler's default target",
                         "; ".join(f"{' '.join(a['flags']) or 'default'} "
                                   f"failed: {a['error']}" for a in attempts))
          return path
        outputs.append(f"$ {command}\n{output}")
        attempts.append({"flags": flags, "error": first_error(output)})
        flags = compiler.safer(flags, output)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  log = path[:-len(".so")] + ".log"
  try:
    atomic_files.write_text(log, "\n\n".join(outputs))
  except OSError:
    log = None
  first = next(a for a in attempts if a["error"] != _REFUSED.format(cxx))
  raise KernelUnavailable(
      f"compiling them with {cxx} failed: {first['error']}",
      "Install tfemb from a wheel built for this TensorFlow, or set CXX to "
      "another compiler (docs/performance.md, 'Where the fused kernels "
      "run').", log)


def write_file(path: str, text: str) -> str:
  """`text` into `path` unless it is there already (written whole, so a
  process reading it never sees a part)."""
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_files.write_text(path, text)
  return path


def source_texts() -> List[str]:
  """The texts a build compiles: the sources, the headers, the rule table."""
  texts = []
  for source in compiler.SOURCES + compiler.HEADERS:
    with open(source) as f:
      texts.append(f.read())
  return texts + [rule_table.header()]


def source_digest() -> str:
  """A digest of `source_texts()` alone, to tell a packaged build of other
  sources."""
  return hashlib.sha256("\0".join(source_texts()).encode()).hexdigest()[:16]


def _key(opts: options.Options) -> str:
  return cache_key(source_texts(), opts.kernel_march)


def library_path(opts: Optional[options.Options] = None) -> str:
  """Where tfemb's kernels compile to under `opts` (default: the current
  options)."""
  opts = options.get() if opts is None else opts
  return os.path.join(cache_dir(opts), f"tfemb_kernels-{_key(opts)}.so")


def build(opts: Optional[options.Options] = None) -> str:
  """Compiles the kernels unless they are in the cache; returns the path."""
  opts = options.get() if opts is None else opts
  try:
    generated = generated_include_dir(opts)
  except OSError as e:
    raise KernelUnavailable(
        f"the kernel cache {cache_dir(opts)} cannot be written ({e})",
        "Set TFEMB_KERNEL_CACHE to a writable directory.") from e
  return compile_library(library_path(opts), compiler.SOURCES, [generated],
                         opts.kernel_march)


@dataclasses.dataclass(frozen=True)
class Loaded:
  """The build this process loaded: `module` (its ops), `path`, `origin`
  ("package" or "cache"), its `flags` and the `attempts` that failed
  first (flags, first error line); or why none: `error`."""
  module: Optional[object] = None
  path: Optional[str] = None
  origin: Optional[str] = None
  flags: Tuple[str, ...] = ()
  attempts: Tuple[Dict[str, object], ...] = ()
  error: Optional[KernelUnavailable] = None


_lock = threading.Lock()
_loaded: List[Loaded] = []  # the process's one load, once tried


def _load_library(path: str, origin: str, record: Dict[str, object]) -> Loaded:
  """Loads the library at `path` if it is the build `record` describes:
  never a file cut short (SIGBUS) or another library."""
  problem = library_record.problem(path, record)
  if problem is not None:
    raise OSError(f"{path} cannot be loaded ({problem})")
  return Loaded(tf.load_op_library(path), path, origin,
                tuple(record.get("flags", ())),
                tuple(record.get("attempts", ())))


def _try_load(opts: options.Options) -> Loaded:
  failure = None
  if opts.kernel_march == compiler.AUTO:
    entry = packaged.find(source_digest())
    if entry is not None:
      try:
        return _load_library(entry["path"], "package", entry)
      except (OSError, tf.errors.NotFoundError) as e:
        failure = e  # e.g. damaged: compiled here instead
  try:
    path = build(opts)
    return _load_library(path, "cache", built_with(path))
  except KernelUnavailable as e:
    if failure is not None:  # nor the package's build
      e = KernelUnavailable(f"{e.reason}; the package's build: "
                            f"{first_error(str(failure))}", e.remedy, e.log)
    return Loaded(error=e)
  except (OSError, subprocess.SubprocessError,
          tf.errors.NotFoundError) as e:
    reason = failure or e
    return Loaded(error=KernelUnavailable(
        f"loading them failed: {first_error(str(reason))}",
        "Reinstall tfemb for this TensorFlow (docs/performance.md, 'Where "
        "the fused kernels run')."))


def loaded(opts: Optional[options.Options] = None) -> Loaded:
  """The process's build of the kernels under `opts` (default: the current
  options), loaded on the first call; `Loaded()` when `fused_kernels` is
  off."""
  opts = options.get() if opts is None else opts
  if not opts.fused_kernels:
    return Loaded()
  with _lock:
    if not _loaded:
      result = _try_load(opts)
      if result.error is not None:
        logging.warning("%s", result.error.warning())
      _loaded.append(result)
    return _loaded[0]


def load(opts: Optional[options.Options] = None) -> Optional[object]:
  """The kernels' op module, or None (`fused_kernels` off in `opts`,
  default the current options, or no build can be had)."""
  return loaded(opts).module
