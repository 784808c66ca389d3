"""Step time at two vocabulary sizes, measured side by side in one process.

    python -m benchmarks.flatness --stack tfemb --optimizer adam \
        --small 100000 --large 5000000 --out flat.json

Issue 6 item 2 asks for a ratio of two step times. Timed in two processes
minutes apart, that ratio carries whatever the machine's neighbours did in
between (on the shared hosts here one run's median moves by 30% from one
minute to the next). This child builds the same stack at both sizes in one
process and alternates between them: blocks of steps, small then large,
then large then small (so neither always follows the other), each block
starting with untimed steps that bring its tables' hot rows back into the
caches. Both sizes see the same machine at the same minutes; the ratio of
their medians is the flatness the suite reports.
"""

import argparse
import dataclasses
import time

import numpy as np

from benchmarks import child
from benchmarks import cli
from benchmarks import procmem
from benchmarks import timing
from benchmarks import workload as workload_lib
from benchmarks.stacks import BY_NAME


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--stack", default="tfemb", choices=sorted(BY_NAME))
  p.add_argument("--optimizer", required=True,
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--small", type=int, default=100_000)
  p.add_argument("--large", type=int, default=5_000_000)
  p.add_argument("--blocks", type=int, default=24,
                 help="blocks per size (alternating)")
  p.add_argument("--block-steps", type=int, default=10,
                 help="timed steps per block")
  p.add_argument("--rewarm", type=int, default=2,
                 help="untimed steps at the start of each block")
  p.add_argument("--max-seconds", type=float, default=120.0,
                 help="stop after this long (at least 2 blocks per size)")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def run(args) -> dict:
  stack = BY_NAME[args.stack]
  sizes = {"small": args.small, "large": args.large}
  built = {k: child.build_warm(stack, workload_lib.Workload(
      vocab=v, optimizer=args.optimizer)) for k, v in sizes.items()}
  times = {k: [] for k in sizes}
  faults = {k: 0.0 for k in sizes}  # while timed
  block_ratios = []
  began = time.perf_counter()
  cursor = {k: child.WARMUP for k in sizes}  # each size's next batch
  for b in range(args.blocks):
    order = ("small", "large") if b % 2 == 0 else ("large", "small")
    medians = {}
    for k in order:
      step, tensors, per_call = built[k]
      t, cursor[k], grew = timing.time_block(
          step, tensors, args.block_steps, cursor[k], args.rewarm, per_call,
          procmem.minor_faults)
      faults[k] += grew / per_call
      times[k].extend(t)
      medians[k] = float(np.median(t))
    block_ratios.append(medians["large"] / medians["small"])
    if b >= 1 and time.perf_counter() - began > args.max_seconds:
      break
  small, large = (float(np.median(times[k])) for k in ("small", "large"))
  return {
      "stack": stack.name, "optimizer": args.optimizer,
      "small": args.small, "large": args.large,
      "small_ms": small, "large_ms": large, "ratio": large / small,
      "blocks": len(block_ratios), "block_steps": args.block_steps,
      "block_ratio_p10": float(np.quantile(block_ratios, .1)),
      "block_ratio_median": float(np.median(block_ratios)),
      "block_ratio_p90": float(np.quantile(block_ratios, .9)),
      "small_p10_p90_ms": [float(np.quantile(times["small"], q))
                           for q in (.1, .9)],
      "large_p10_p90_ms": [float(np.quantile(times["large"], q))
                           for q in (.1, .9)],
      "page_faults_per_step": {k: faults[k] / len(times[k]) for k in sizes},
      "workload": dataclasses.asdict(
          workload_lib.Workload(vocab=args.large, optimizer=args.optimizer)),
  }


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
