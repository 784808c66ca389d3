"""Long-run check (docs/performance.md, 'Long runs'): RSS and step time stay flat, no retracing.

    python -m experiments.soak                 # 20,000 steps
    python -m experiments.soak --steps 2000 --every 200

Trains the tfemb Keras layer (the benchmark's model: 8 features, a table
each, Dense(1)) on small tables, cycling through distinct Zipf batches.
Every `--every` steps it samples this process' RSS, the median wall time
of the last window's steps, their CPU time per step (all of the process'
threads: what a step costs, whatever else the machine runs) and the step
function's trace count (a Python counter in the traced body and
`experimental_get_tracing_count()`). After the run: least-squares slopes of
RSS (MB per 1k steps) and of step time (ms per 1k steps) over the samples
after the first `--skip` fraction, and a one-line verdict. The step-time
limit applies to CPU time per step; the wall-time slope is reported too,
with the load average, since on a shared machine other work moves it. Exits 1 if the step was traced again after the first window or a
slope is over its limit.
"""

import argparse
import os
import sys
import time

import numpy as np

from benchmarks import procmem
from benchmarks import timing
from benchmarks import workload as workload_lib


def parse_args(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="\n".join(__doc__.splitlines()[1:]))
  p.add_argument("--steps", type=int, default=20_000)
  p.add_argument("--every", type=int, default=500, help="sample interval")
  p.add_argument("--vocab", type=int, default=10_000, help="rows per table")
  p.add_argument("--batch", type=int, default=1024)
  p.add_argument("--optimizer", default="adagrad",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--skip", type=float, default=0.1,
                 help="fraction of samples left out of the slopes (warm-up)")
  p.add_argument("--max-rss-slope", type=float, default=1.0,
                 help="MB per 1k steps")
  p.add_argument("--max-time-growth", type=float, default=0.15,
                 help="step-time slope x steps, as a fraction of the median")
  return p.parse_args(argv)


def slope_per_1k(steps, values) -> float:
  return float(np.polyfit(np.asarray(steps) / 1000.0, values, 1)[0])


def soak(args):
  from benchmarks.stacks import tfemb_layer  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               batch=args.batch, distinct_batches=64)
  traces = []
  step = tfemb_layer.build(work, on_trace=lambda: traces.append(1))
  tensors = timing.to_tensors(work.make_batches())
  # (step, rss MB, median wall ms, python traces, tf traces, cpu ms, load)
  samples = []
  began, done = time.perf_counter(), 0
  while done < args.steps:
    n = min(args.every, args.steps - done)
    cpu = time.process_time()
    times = timing.time_steps(step, tensors, n, start=done)
    cpu_ms = (time.process_time() - cpu) / n * 1e3
    done += n
    samples.append((done, procmem.rss() / 1e6, 1e3 * float(np.median(times)),
                    len(traces), step.experimental_get_tracing_count(),
                    cpu_ms, os.getloadavg()[0]))
    print(f"step {done:6d}  RSS {samples[-1][1]:8.1f} MB  wall "
          f"{samples[-1][2]:6.2f} ms  cpu {cpu_ms:6.2f} ms  traces "
          f"{len(traces)}  load {samples[-1][6]:.2f}", flush=True)
  return samples, time.perf_counter() - began


def verdict(args, samples, seconds):
  s = np.asarray(samples, dtype=float)
  keep = s[int(len(s) * args.skip):] if len(s) > 3 else s
  rss_slope = slope_per_1k(keep[:, 0], keep[:, 1])
  wall_slope = slope_per_1k(keep[:, 0], keep[:, 2])
  time_slope = slope_per_1k(keep[:, 0], keep[:, 5])
  median = float(np.median(keep[:, 5]))
  growth = time_slope * args.steps / 1000 / median
  retraced = int(s[-1, 3] - s[0, 3]), int(s[-1, 4] - s[0, 4])
  ok = (max(retraced) == 0 and abs(rss_slope) <= args.max_rss_slope and
        growth <= args.max_time_growth)
  line = (f"SOAK {'PASS' if ok else 'FAIL'}: {args.steps} steps in "
          f"{seconds:.0f} s; RSS {s[0, 1]:.0f} -> {s[-1, 1]:.0f} MB, slope "
          f"{rss_slope:+.2f} MB/1k steps (limit {args.max_rss_slope}); CPU "
          f"time per step median {median:.2f} ms, slope {time_slope:+.4f} "
          f"ms/1k steps ({100 * growth:+.1f}% over the run, limit "
          f"{100 * args.max_time_growth:.0f}%); wall step median "
          f"{np.median(keep[:, 2]):.2f} ms, slope {wall_slope:+.4f} ms/1k "
          f"steps (load average {keep[:, 6].min():.1f}-{keep[:, 6].max():.1f})"
          f"; traces {int(s[0, 3])} in the "
          f"first {int(s[0, 0])} steps, {retraced[0]} after (tf count "
          f"{int(s[-1, 4])})")
  return ok, line


def main(argv=None):
  args = parse_args(argv)
  samples, seconds = soak(args)
  ok, line = verdict(args, samples, seconds)
  print(line)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
