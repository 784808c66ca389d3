"""Timing a traced step: warm-up, then synchronized per-step wall times."""

import os
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np


def to_tensors(batches):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [({n: tf.constant(ids) for n, ids in features.items()},
           tf.constant(labels)) for features, labels in batches]


def time_steps(step: Callable, tensors: Sequence, steps: int,
               start: int = 0, max_seconds: float = float("inf"),
               min_steps: int = 1) -> List[float]:
  """Runs `step` on the cycled batches; each step's seconds, waiting for
  its result (`.numpy()`), so queued work is not hidden."""
  times = []
  began = time.perf_counter()
  for i in range(steps):
    features, labels = tensors[(start + i) % len(tensors)]
    t0 = time.perf_counter()
    step(features, labels).numpy()
    times.append(time.perf_counter() - t0)
    if len(times) >= min_steps and time.perf_counter() - began > max_seconds:
      break
  return times


def time_block(step: Callable, tensors: Sequence, steps: int, start: int,
               rewarm: int, per_call: int,
               count: Optional[Callable[[], float]] = None
               ) -> Tuple[List[float], int, float]:
  """One block of a step timed between other work (flatness.py, bound.py):
  `rewarm` untimed steps from batch `start`, which bring the tables' hot
  rows back into the caches, then `steps` timed ones. Returns the timed
  steps' ms, each call's divided by its `per_call` steps; the batch the
  next block starts at; and how much `count()` grew over the timed steps
  (0 without it)."""
  time_steps(step, tensors, rewarm, start=start)
  start += rewarm
  before = count() if count else 0.0
  times = time_steps(step, tensors, steps, start=start)
  grew = count() - before if count else 0.0
  return [t / per_call * 1e3 for t in times], start + steps, grew


def summary(times: Sequence[float]) -> dict:
  t = np.asarray(times) * 1e3
  return {"median_ms": float(np.median(t)), "p10_ms": float(np.quantile(t, .1)),
          "p90_ms": float(np.quantile(t, .9)), "steps_timed": len(t)}


def stolen_seconds(stat: str = "/proc/stat") -> float:
  """CPU time the hypervisor gave to other machines, summed over this
  machine's CPUs since boot (`steal`, the 8th number of /proc/stat's first
  line); 0 where not reported."""
  try:
    with open(stat) as f:
      fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")
  except (OSError, IndexError, ValueError):
    return 0.0
