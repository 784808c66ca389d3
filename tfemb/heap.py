"""Keeps a training step's freed buffers in the process (glibc malloc).

Every step allocates and frees the same few hundred KiB buffers (ids,
activations, gradients). glibc's malloc gives freed memory back to the
kernel once more than `M_TRIM_THRESHOLD` of it sits at the top of a heap,
and serves requests of `M_MMAP_THRESHOLD` or more with a fresh `mmap`; a
page it gave back costs a page fault (about 2 microseconds here, zeroing
included) the next time it is used. glibc raises both thresholds by itself
when a large block is freed, but only for blocks up to 32 MiB: with tables
of a few MB, freeing a table-sized block (an initial value) does that; with
tables of 5M rows (640 MB and up) nothing does, the thresholds stay near
the step's buffer size and
a step takes up to 580 page faults (0-580, depending on the process; up
to 0.9 ms) that it does not take at 100k rows (benchmarks/README.md, "Page
faults at 5M rows").

`keep_freed_buffers()` sets the thresholds glibc's own rule reaches after
freeing a 32 MiB block (mmap above 32 MiB, trim above 64 MiB), so the step
does not depend on the table size. The host engine calls it when it builds
its tables. Nothing is done when:

* the C library is not glibc (macOS, musl), or
* the user has set these thresholds already (`MALLOC_MMAP_THRESHOLD_`,
  `MALLOC_TRIM_THRESHOLD_`, or `glibc.malloc.mmap_threshold` /
  `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`), or
* `TFEMB_MALLOC_TUNING=0`.

The process keeps at most 64 MiB of freed memory per malloc arena that it
would otherwise have returned; peak memory stays the same (benchmarks:
peak RSS at 5M rows unchanged).
"""

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64 bits
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc's dynamic rule sets it


def _user_setting() -> str:
  """The environment variable through which the user set a threshold."""
  for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
    if name in os.environ:
      return name
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  if ("glibc.malloc.mmap_threshold" in tunables or
      "glibc.malloc.trim_threshold" in tunables):
    return "GLIBC_TUNABLES"
  if os.environ.get("TFEMB_MALLOC_TUNING", "1").lower() in (
      "0", "false", "no", "off"):
    return "TFEMB_MALLOC_TUNING"
  return ""


def glibc():
  """The process's C library if it is glibc (`mallopt` typed), else None."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(None)
  except OSError:
    return None
  if not hasattr(libc, "gnu_get_libc_version"):  # only glibc has it
    return None
  libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  libc.mallopt.restype = ctypes.c_int
  return libc


@functools.lru_cache(maxsize=None)
def keep_freed_buffers() -> str:
  """Sets glibc's mmap and trim thresholds once per process (see above).

  Returns what was done: "set", or why not ("not glibc", the name of the
  user's own setting, or "refused" if glibc refused a value).
  """
  outcome = _user_setting()
  if outcome:
    return outcome
  libc = glibc()
  if libc is None:
    return "not glibc"
  if (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and
      libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1):
    return "set"
  return "refused"
