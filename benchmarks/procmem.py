"""Memory figures from /proc (Linux): a process's RSS and peak, and what
the machine still has available. Values in bytes; page faults in pages."""

import os
import resource
from typing import Optional


def _kb_field(path: str, field: str) -> Optional[int]:
  try:
    with open(path) as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def rss(pid="self") -> Optional[int]:
  return _kb_field(f"/proc/{pid}/status", "VmRSS")


def virtual_size(pid="self") -> Optional[int]:
  """VmSize: the address space the process has mapped (what RLIMIT_AS
  caps)."""
  return _kb_field(f"/proc/{pid}/status", "VmSize")


def peak_rss(pid="self") -> Optional[int]:
  """VmHWM: the highest RSS the process has had."""
  return _kb_field(f"/proc/{pid}/status", "VmHWM")


def huge_pages(pid="self") -> Optional[int]:
  """AnonHugePages: how much of the process's memory sits on 2 MiB pages
  (tfemb's tables ask for them; a fragmented machine may refuse)."""
  return _kb_field(f"/proc/{pid}/smaps_rollup", "AnonHugePages")


def cpu_seconds(pid="self") -> Optional[float]:
  """User and system CPU time the process has used (/proc/<pid>/stat)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults() -> int:
  """Page faults this process has taken without reading from disk: mostly
  first touches of pages the kernel had to hand out (and zero) again."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def available() -> Optional[int]:
  return _kb_field("/proc/meminfo", "MemAvailable")


GIB = 1024 ** 3
