"""Runs one child process at a time, with a time limit and a memory guard.

The child's peak RSS comes from `os.wait4` (ru_maxrss of that child alone).
While it runs, a watchdog polls its RSS and the machine's MemAvailable and
kills it (SIGKILL, that child only) before it can push the machine into
the kernel's OOM killer, which could pick another process: such a run is
reported as "out of memory".
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from benchmarks import procmem
from benchmarks.stacks import REPO

_OOM_WORDS = ("ResourceExhausted", "MemoryError", "OOM when allocating",
              "std::bad_alloc")


@dataclasses.dataclass
class Limits:
  timeout_s: float = 900.0
  rss_cap: float = 22 * procmem.GIB  # kill the child above this RSS
  reserve: float = 0.75 * procmem.GIB  # ... or when the machine has less


@dataclasses.dataclass
class Outcome:
  result: Optional[dict]  # the child's JSON, None if it failed
  status: str  # "ok", "out of memory", "timeout", "error"
  detail: str  # why, for a failure
  peak_rss: Optional[int]  # bytes (ru_maxrss of the child)
  wall_s: float


def _watch(proc, limits: Limits, began: float):
  """Polls until the child exits; returns (status, rusage, why killed)."""
  killed = None
  while True:
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid:
      return status, usage, killed
    if killed is None:
      rss, free = procmem.rss(proc.pid), procmem.available()
      if time.monotonic() - began > limits.timeout_s:
        killed = ("timeout", f"no result after {limits.timeout_s:.0f} s")
      elif rss and rss > limits.rss_cap:
        killed = ("out of memory", f"RSS {rss / procmem.GIB:.1f} GiB passed "
                  f"the cap of {limits.rss_cap / procmem.GIB:.1f} GiB")
      elif free is not None and free < limits.reserve:
        killed = ("out of memory",
                  f"machine down to {free / procmem.GIB:.2f} GiB available "
                  f"(child RSS {(rss or 0) / procmem.GIB:.1f} GiB)")
      if killed:
        proc.kill()
    time.sleep(0.05)


def run(module: str, args: List[str], python: Optional[str] = None,
        env: Optional[dict] = None, limits: Limits = Limits(),
        log_path: Optional[str] = None) -> Outcome:
  """`python -m module args... --out FILE`; the JSON in FILE is the result."""
  fd, out = tempfile.mkstemp(suffix=".json")
  os.close(fd)
  child_env = dict(os.environ, **(env or {}))
  child_env["PYTHONPATH"] = REPO + os.pathsep + child_env.get("PYTHONPATH", "")
  log = open(log_path or os.devnull, "w")
  began = time.monotonic()
  try:
    proc = subprocess.Popen(
        [python or sys.executable, "-m", module, *args, "--out", out],
        cwd=REPO, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    status, usage, killed = _watch(proc, limits, began)
  finally:
    log.close()
  wall = time.monotonic() - began
  peak = usage.ru_maxrss * 1024
  try:
    with open(out) as f:
      result = json.load(f) if os.path.getsize(out) else None
  finally:
    os.remove(out)
  if killed:
    return Outcome(None, killed[0], killed[1], peak, wall)
  code = os.waitstatus_to_exitcode(status)
  if code == 0 and result is not None:
    return Outcome(result, "ok", "", peak, wall)
  return Outcome(None, *_diagnose(code, log_path), peak, wall)


def result(module: str, args: List[str], what: str,
           env: Optional[dict] = None) -> dict:
  """`run`'s result, or SystemExit naming `what` and why the child failed."""
  outcome = run(module, args, env=env)
  if outcome.result is None:
    raise SystemExit(f"{what}: {outcome.status}: {outcome.detail}")
  return outcome.result


def _diagnose(code: int, log_path: Optional[str]):
  tail = ""
  if log_path and os.path.exists(log_path):
    with open(log_path, errors="replace") as f:
      tail = f.read()[-20000:]
  if any(w in tail for w in _OOM_WORDS):
    return "out of memory", "allocation failed in the child (see its log)"
  if code == -9:
    return "out of memory", "SIGKILL from outside (likely the OOM killer)"
  lines = [l for l in tail.splitlines() if l.strip() and not l.startswith(
      ("I0000", "W0000", "E0000", "WARNING: All log"))]
  return "error", f"exit {code}: {lines[-1] if lines else 'no output'}"
