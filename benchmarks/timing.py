"""Timing a traced step: warm-up, then synchronized per-step wall times."""

import time
from typing import Callable, List, Sequence

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


def alternate(built, rounds: int, calls: int):
  """Rounds of alternating blocks: `built` is `{name: (step, tensors,
  steps per call)}`, already warmed up; each round times `calls` calls of
  each, in the given order on even rounds and reversed on odd ones, and
  yields `{name: median ms per step}` (both see the same minutes of the
  machine)."""
  names = list(built)
  for r in range(rounds):
    medians = {}
    for name in (names if r % 2 == 0 else names[::-1]):
      step, tensors, per_call = built[name]
      times = time_steps(step, tensors, calls, start=r)
      medians[name] = float(np.median(times)) * 1e3 / per_call
    yield medians


def ratio_of_rounds(rounds, base: str, other: str) -> dict:
  """`other / base` over rounds of `alternate`: the median of the rounds'
  ratios, its quartiles, and each one's median ms per step."""
  ratios = [m[other] / m[base] for m in rounds]
  return {"base_ms": float(np.median([m[base] for m in rounds])),
          "other_ms": float(np.median([m[other] for m in rounds])),
          "ratio": float(np.median(ratios)),
          "quartiles": [float(np.quantile(ratios, q)) for q in (.25, .75)]}


def summary(times: Sequence[float]) -> dict:
  t = np.asarray(times) * 1e3
  return {"median_ms": float(np.median(t)), "p10_ms": float(np.quantile(t, .1)),
          "p90_ms": float(np.quantile(t, .9)), "steps_timed": len(t)}
