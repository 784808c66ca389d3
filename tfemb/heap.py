"""Keeps a training step's freed buffers in the process (glibc malloc).

Every step allocates and frees the same few hundred KiB buffers (ids,
activations, gradients). glibc's malloc gives freed memory back to the
kernel once more than `M_TRIM_THRESHOLD` of it sits at the top of a heap,
and serves requests of `M_MMAP_THRESHOLD` or more with a fresh `mmap`; a
page it gave back costs a page fault (zeroing included) the next time it
is used. glibc raises both thresholds by itself when a large block is
freed, but only for blocks up to 32 MiB: with tables of a few MB, freeing
a table-sized block (an initial value) does that; with tables above 32 MiB
nothing does, the thresholds stay near the step's buffer size and a step
takes page faults that it does not take with small tables
(`python -m benchmarks.flatness` reports them per step).

`keep_freed_buffers()` sets the thresholds glibc's own rule reaches after
freeing a 32 MiB block (mmap above 32 MiB, trim above 64 MiB), so the step
does not depend on the table size. The host engine calls it when it builds
its tables.

This is process-wide: `mallopt` changes how the whole process allocates,
for every library in it, and it is not undone. Decline it with the option
`malloc_tuning=False` (`tfemb.options`, default from
`TFEMB_MALLOC_TUNING`) for the engines of the process, e.g.
`tfemb.options.set(malloc_tuning=False)` before the first is built.
Nothing is done when:

* the option `malloc_tuning` is off, or
* the C library is not glibc (macOS, musl), or
* the user has set these thresholds already (`MALLOC_MMAP_THRESHOLD_`,
  `MALLOC_TRIM_THRESHOLD_`, or `glibc.malloc.mmap_threshold` /
  `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`).

The process keeps at most 64 MiB of freed memory per malloc arena that it
would otherwise have returned; the next step reuses it, so the peak does
not grow.
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


def keep_freed_buffers(opts=None) -> str:
  """Sets glibc's mmap and trim thresholds once per process (see above),
  unless `opts` (a `tfemb.options.Options`; default: the current options)
  declines it.

  Returns what was done: "set", or why not ("declined" by the option,
  "not glibc", the name of the user's own setting, or "refused" if glibc
  refused a value).
  """
  if opts is None:
    # Here, not above: importing tfemb loads TensorFlow, which this module
    # does not need otherwise.
    from tfemb import options  # pylint: disable=g-import-not-at-top
    opts = options.get()
  if not opts.malloc_tuning:
    return "declined"
  return _set_thresholds()


@functools.lru_cache(maxsize=None)
def _set_thresholds() -> str:
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
