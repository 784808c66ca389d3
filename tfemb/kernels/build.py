"""Compiles the fused CPU kernels, and loads the build this process uses.

Where the kernels come from, in order (`load`):

1. The package's own build for this CPU (`tfemb.kernels.packaged`, made
   at install by `tfemb.kernels.install`), if made for this TensorFlow and
   these sources. No compiler is needed.
2. A build compiled here on first use against the installed TensorFlow's
   headers (after a TensorFlow upgrade, in a source checkout, or when
   `kernel_march` names a target), in a cache keyed by the sources
   (`src/`, compiled as one translation unit: `compile_command`), the
   rule table (`rule_table`), TensorFlow's version, the flags and what the
   compiler makes of the target.
3. None: TensorFlow's own ops (the same numbers, slower), after one
   warning line with the cause and the remedy, the compiler's whole output
   in a log file the line names.

A compile that fails tries safer targets (`_safer`): without the
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
import functools
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
from tfemb.kernels import library_record
from tfemb.kernels import packaged
from tfemb.kernels import rule_table
from tfemb.kernels.unavailable import first_error
from tfemb.kernels.unavailable import KernelUnavailable

SOURCE_DIR = os.path.join(os.path.dirname(__file__), "src")
# One file per kernel (or pair of kernels), with its op's registration; a
# build compiles them as one translation unit (`compile_command`).
SOURCES = [os.path.join(SOURCE_DIR, name) for name in (
    "apply_rows.cc",          # TfembApplyRows
    "check_rows.cc",          # TfembCheckRows
    "column_split.cc",        # TfembSplitColumns, TfembRejoinColumns
    "dedup_gather.cc",        # TfembDedupGather
    "huge_pages.cc",          # TfembAdviseHugePages
    "read_write_columns.cc",  # TfembReadColumns, TfembWriteColumns
    "row_gradients.cc",       # TfembRowGradients
)]
# What the sources include: part of the cache key and of the packaged
# build's source digest (`source_texts`), as the sources are.
HEADERS = [os.path.join(SOURCE_DIR, name) for name in (
    "apply_rows.h",     # TfembApplyRows' kernel, which TfembCheckRows' extends
    "column_split.h",   # an interleaved table's rows put back after a save
    "huge_pages.h",     # tables backed by 2 MiB pages
    "input_checks.h",   # a variable checked before it is read as floats
    "row_loops.h",      # a row's loops, compiled for the common widths
    "update_rules.h",   # the optimizers' row rules and the whole update
)]
# -ffp-contract=off: no fused multiply-adds, so every float operation rounds
# as TensorFlow's own kernels round it (also with -march's FMA units).
# -fno-math-errno lets sqrt vectorize. Every vector width computes the same
# floats: the rows' loops are element by element, sqrt and division are
# correctly rounded, pow is libm's call. -Wfatal-errors: a target the
# headers cannot take fails at its first error, in seconds.
CXXFLAGS = ["-shared", "-fPIC", "-O3", "-fno-math-errno", "-ffp-contract=off",
            "-w", "-Wfatal-errors"]
AUTO = "auto"  # kernel_march: the package's build, else compiled for native
# Defined (empty, as the sources that use Eigen's ThreadPoolDevice define
# it) before any header of a translation unit of several sources, whose
# first source may not define it.
_EIGEN_THREADS = "EIGEN_USE_THREADS"

# Eigen headers that only a target with an instruction-set extension
# compiles, and the flag that leaves the extension out.
_EXTENSION_HEADERS = {
    "PacketMathFP16.h": "-mno-avx512fp16",
    "TypeCastingFP16.h": "-mno-avx512fp16",
}


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


def compiler() -> str:
  return os.environ.get("CXX", "c++")


def _march(march: str) -> str:
  return "native" if march == AUTO else march


def target(march: str) -> Tuple[List[str], str]:
  """The `-march` flags to compile for, and what the compiler makes of
  them, for the cache key: `native` names a different CPU on each machine.
  No flags where the compiler refuses them."""
  return _resolve(compiler(), _march(march))


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


def _safer(flags: List[str], output: str) -> Optional[List[str]]:
  """The flags to try after a compile with `flags` failed with `output`:
  the extension named by the header that broke it left out, else the
  compiler's default target; None when nothing safer is left."""
  for header, flag in _EXTENSION_HEADERS.items():
    if header in output and flags and flag not in flags:
      return flags + [flag]
  return [] if flags else None


def compile_command(cxx: str, flags: Sequence[str], sources: Sequence[str],
                    include_dirs: Sequence[str], out: str,
                    link: bool = True) -> List[str]:
  """The command that compiles `sources` into the library `out` (`link`
  False: into the object file `out`, e.g. for another CPU whose TensorFlow
  library is not here to link against).

  Several sources are one translation unit: each but the last included
  ahead of the last (`-include`, in order). TensorFlow's headers take most
  of a compile (some 15 s a unit), so one unit compiles in a fraction of
  the time of one per source, and the compiler sees every kernel at once,
  inlining as within one file. Each source also compiles alone."""
  *ahead, last = sources
  unit = ([f"-D{_EIGEN_THREADS}="] if ahead else []) + [
      a for source in ahead for a in ("-include", source)] + [last]
  command = ([cxx] + CXXFLAGS + list(flags) +
             [f"-I{d}" for d in include_dirs] +
             tf.sysconfig.get_compile_flags() + unit + ["-o", out])
  if not link:
    return [a if a != "-shared" else "-c" for a in command]
  return command + tf.sysconfig.get_link_flags()


def generated_include_dir(opts: Optional[options.Options] = None) -> str:
  """The directory of the generated rule table, written if it is not."""
  opts = options.get() if opts is None else opts
  generated = os.path.join(cache_dir(opts), f"include-{_key(opts)}")
  write_file(os.path.join(generated, rule_table.FILE_NAME),
             rule_table.header())
  return generated


def _compile(cxx: str, flags: List[str], sources: Sequence[str],
             include_dirs: Sequence[str], out: str) -> Tuple[bool, str, str]:
  """Runs the compiler: whether it succeeded, its messages, its command."""
  command = compile_command(cxx, flags, sources, include_dirs, out)
  try:
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=900, check=False)
  except (OSError, subprocess.SubprocessError) as e:
    return False, f"error: {e}\n", " ".join(command)
  return done.returncode == 0, done.stderr, " ".join(command)


def built_with(path: str) -> Dict[str, object]:
  """What a library at `path` was compiled with (`flags`, and the
  `attempts` that failed first), from its record (`library_record`)."""
  return library_record.read(path)


def compile_library(path: str, sources: Sequence[str],
                    include_dirs: Sequence[str], march: str) -> str:
  """Compiles `sources` into the shared library `path` unless it is there
  as its record describes it (`library_record`; else it is compiled
  again); returns `path`. Tries safer targets when a compile fails
  (`_safer`); raises `KernelUnavailable` when none compiles, with the
  compiler's output in `<path>.log`. One process compiles; others wait for
  it and find the library and its record."""
  problem = library_record.problem(path)
  if problem is None:
    return path
  cxx = compiler()
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
    flags: Optional[List[str]] = target(march)[0]
    if _march(march) and not flags:
      attempts.append({"flags": [f"-march={_march(march)}"],
                       "error": _REFUSED.format(cxx)})
    try:
      while flags is not None:
        ok, output, command = _compile(cxx, flags, sources, include_dirs,
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
        flags = _safer(flags, output)
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
  for source in SOURCES + HEADERS:
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
  return compile_library(library_path(opts), SOURCES, [generated],
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
  if opts.kernel_march == AUTO:
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
