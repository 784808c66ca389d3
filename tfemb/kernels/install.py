"""Builds the kernels into the package at install (setup.py).

For each CPU target (`targets()`: on x86-64 the levels x86-64-v4, -v3 and
the baseline; elsewhere the compiler's default), the kernels are compiled
through the kernel cache (`tfemb.kernels.build`: a build already there is
reused, a target that fails falls back as there) and copied with a manifest
into the package's `lib/` directory, which `tfemb.kernels.packaged` reads
at run time. Each build's entry is its record (`library_record`: its size
and digest, the TensorFlow it was compiled against), checked before it is
loaded.

A build's requirements are the instruction-set extensions its target
enables (the compiler's predefined macros, e.g. `__AVX2__`), named as
Linux's /proc/cpuinfo names them.
"""

import json
import os
import platform
import re
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from tfemb import atomic_files
from tfemb import options
from tfemb.kernels import build
from tfemb.kernels import compiler
from tfemb.kernels import library_record
from tfemb.kernels import packaged

# Predefined macros whose /proc/cpuinfo flag is not their name in lower case.
_CPUINFO_NAMES = {
    "BMI": "bmi1", "CRC32": "sse4_2", "LAHF_SAHF": "lahf_lm", "LZCNT": "abm",
    "SSE3": "pni", "GCC_HAVE_SYNC_COMPARE_AND_SWAP_16": "cx16",
    "AVX512VNNI": "avx512_vnni", "AVX512BF16": "avx512_bf16",
    "AVX512FP16": "avx512_fp16", "AVX512VBMI2": "avx512_vbmi2",
    "AVX512BITALG": "avx512_bitalg", "AVX512VPOPCNTDQ": "avx512_vpopcntdq",
    "AVXVNNI": "avx_vnni", "SHA": "sha_ni", "PCLMUL": "pclmulqdq",
    "RDRND": "rdrand", "AMX_TILE": "amx_tile", "AMX_INT8": "amx_int8",
    "AMX_BF16": "amx_bf16",
}
_FEATURE_MACRO = re.compile(r"#define __([A-Z0-9_]+?)__ 1$|"
                            r"#define __(GCC_HAVE_SYNC_COMPARE_AND_SWAP_16) 1$")


def is_x86() -> bool:
  return platform.machine().lower() in ("x86_64", "amd64")


def targets() -> List[str]:
  """The `-march` values built into the package, best first:
  `TFEMB_BUILD_TARGETS` (comma-separated; "" for the compiler's default),
  else the x86-64 levels on x86-64 and the compiler's default elsewhere."""
  given = os.environ.get("TFEMB_BUILD_TARGETS")
  if given is not None:
    return [t.strip() for t in given.split(",")]
  return ["x86-64-v4", "x86-64-v3", "x86-64"] if is_x86() else [""]


def _macros(flags: Sequence[str]) -> set:
  done = subprocess.run(
      [compiler.compiler()] + list(flags) + ["-dM", "-E", "-x", "c++",
                                          os.devnull],
      capture_output=True, text=True, timeout=60, check=True)
  found = set()
  for line in done.stdout.splitlines():
    match = _FEATURE_MACRO.match(line.strip())
    if match:
      found.add(match.group(1) or match.group(2))
  return found


def requirements(flags: Sequence[str]) -> List[str]:
  """The CPU flags (as /proc/cpuinfo names them) that code compiled with
  `flags` may use beyond the compiler's default target; [] off x86-64,
  where the packaged build is the default target's."""
  if not is_x86() or not flags:
    return []
  extra = _macros(flags) - _macros([])
  return sorted({_CPUINFO_NAMES.get(m, m.lower()) for m in extra
                 if not m.startswith(("FP_FAST", "OPTIMIZE"))})


def write(directory: str = packaged.DIR, cache: Optional[str] = None,
          march_list: Optional[Sequence[str]] = None) -> Dict[str, object]:
  """Compiles the kernels for each of `march_list` (default `targets()`)
  through the kernel cache `cache` (a build already there is reused) and
  copies them into `directory` with their manifest; returns it. A target
  that does not compile is left out; raises `build.KernelUnavailable` when
  none does."""
  os.makedirs(directory, exist_ok=True)
  entries, failures = [], []
  for march in targets() if march_list is None else march_list:
    opts = options.Options(fused_kernels=True, kernel_march=march,
                           kernel_cache=cache)
    try:
      path = build.build(opts)
    except build.KernelUnavailable as e:
      failures.append(e)
      continue
    record = build.built_with(path)
    flags = record.get("flags", [])
    name = f"tfemb_kernels-{march or 'default'}.so"
    shutil.copyfile(path, os.path.join(directory, name))
    entries.append(library_record.describe(
        os.path.join(directory, name), name, march=march, flags=flags,
        attempts=record.get("attempts", []), requires=requirements(flags)))
  if not entries:
    raise failures[0]
  record = {"tensorflow": tf.__version__, "sources": build.source_digest(),
            "builds": entries}
  atomic_files.write_text(os.path.join(directory, packaged.MANIFEST),
                            json.dumps(record, indent=1))
  return record
