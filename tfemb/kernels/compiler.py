"""How the fused kernels are compiled: their sources, the flags, the CPU
target, the compiler's command, and the safer targets to try when a
compile fails. `tfemb.kernels.build` decides when to compile and caches
and loads what this compiles."""

import functools
import os
import subprocess
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

SOURCE_DIR = os.path.join(os.path.dirname(__file__), "src")
# One file per kernel (or pair of kernels), with its op's registration; a
# build compiles them as one translation unit (`compile_command`).
SOURCES = [os.path.join(SOURCE_DIR, name) for name in (
    "apply_rows.cc",          # TfembApplyRows, TfembRestoreRows
    "apply_tables.cc",        # TfembApplyTables
    "column_split.cc",        # TfembSplitColumns, TfembRejoinColumns
    "dedup_gather.cc",        # TfembDedupGather
    "huge_pages.cc",          # TfembAdviseHugePages
    "id_counts.cc",           # TfembIdCounts
    "read_write_columns.cc",  # TfembReadColumns, TfembWriteColumns
    "row_gradients.cc",       # TfembRowGradients
)]
# What the sources include: part of the cache key and of the packaged
# build's source digest (`source_texts`), as the sources are.
HEADERS = [os.path.join(SOURCE_DIR, name) for name in (
    "column_split.h",   # an interleaved table's rows put back after a save
    "dedup.h",          # a step's distinct ids (benchmarks/floor.cc's too)
    "huge_pages.h",     # tables backed by 2 MiB pages
    "input_checks.h",   # a variable checked before it is read as floats
    "row_loops.h",      # a row's loops, compiled for the common widths
    "row_sums.h",       # per-id gradients summed per distinct id
    "tf_kernel.h",      # TensorFlow's kernel framework and names, once
    "update_kernel.h",  # what the update kernels share: locks, parts, rule
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


def compiler() -> str:
  return os.environ.get("CXX", "c++")


def march_flag_value(march: str) -> str:
  return "native" if march == AUTO else march


def target(march: str) -> Tuple[List[str], str]:
  """The `-march` flags to compile for, and what the compiler makes of
  them, for the cache key: `native` names a different CPU on each machine.
  No flags where the compiler refuses them."""
  return _resolve(compiler(), march_flag_value(march))


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


def safer(flags: List[str], output: str) -> Optional[List[str]]:
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


def run(cxx: str, flags: List[str], sources: Sequence[str],
             include_dirs: Sequence[str], out: str) -> Tuple[bool, str, str]:
  """Runs the compiler: whether it succeeded, its messages, its command."""
  command = compile_command(cxx, flags, sources, include_dirs, out)
  try:
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=900, check=False)
  except (OSError, subprocess.SubprocessError) as e:
    return False, f"error: {e}\n", " ".join(command)
  return done.returncode == 0, done.stderr, " ".join(command)
