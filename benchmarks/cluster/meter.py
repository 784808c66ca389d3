"""The measurement: over the timed steps, the coordinator's (or worker
0's) time, and every process's TCP bytes (`ss`, benchmarks/procnet.py), CPU
time and peak RSS (/proc)."""

import json
import os
import time
from typing import Dict

from benchmarks import procmem
from benchmarks import procnet


def read_pids(path: str, timeout_s: float = 300) -> Dict[str, int]:
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise TimeoutError(f"no {path}")
    time.sleep(0.1)
  with open(path) as f:
    return json.load(f)


class Window:
  """From its creation to `result`: the time, and every process's TCP
  bytes, CPU time and peak RSS (the processes of `pids_file`)."""

  def __init__(self, pids_file: str):
    self.pids = read_pids(pids_file)
    self.before = procnet.snapshot(self.pids.values())
    self.cpu = {n: procmem.cpu_seconds(pid) for n, pid in self.pids.items()}
    self.began = time.perf_counter()

  def result(self, steps: int) -> dict:
    seconds = time.perf_counter() - self.began
    traffic = procnet.delta(self.before, procnet.snapshot(self.pids.values()))
    return {
        "steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
        "per_process": {
            name: {"sent_per_step": traffic[pid]["sent"] / steps,
                   "received_per_step": traffic[pid]["received"] / steps,
                   "cpu_s_per_step": (procmem.cpu_seconds(pid)
                                      - self.cpu[name]) / steps,
                   "peak_rss": procmem.peak_rss(pid)}
            for name, pid in self.pids.items()}}


def make_meter(args):
  """A Keras callback that measures epochs 1..: time, TCP bytes and peak
  RSS of every process of the cluster (epoch 0 is the warm-up)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class Meter(tf.keras.callbacks.Callback):
    """A `Window` from the end of the warm-up epoch to the end of the
    last."""

    def __init__(self):
      super().__init__()
      self.window = None
      self.result = {}

    def on_epoch_end(self, epoch, logs=None):
      if epoch == args.warmup_epochs - 1:
        self.window = Window(args.pids_file)
      elif (epoch == args.warmup_epochs + args.epochs - 1
            and self.window is not None):
        self.result = self.window.result(args.epochs * args.steps)

  return Meter()
