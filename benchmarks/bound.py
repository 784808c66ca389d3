"""The embedding part against the memory-traffic bound, the bandwidth
measured between its steps.

    python -m benchmarks.bound --optimizer adam --vocab 5000000 --out b.json

The bound is the bytes a step must move over the machine's copy bandwidth
(docs/performance.md, 'Method'). A step timed in one process and the
bandwidth timed in another, minutes apart, put whatever the machine's
neighbours did in between into their ratio: on the shared hosts here
either can move by 30% from one minute to the next. This child builds the
stack once and alternates: the copy bandwidth (bandwidth.Copier, the best
of a few copies), then a block of steps (untimed steps first, which bring
the tables' hot rows back into the caches after the copy). Each block's
ratio is its median step over the bound at the bandwidth measured just
before it; the ratio reported is the median of the blocks'. Each block
also records the CPU time the hypervisor gave to other machines meanwhile
(/proc/stat's steal, where the host reports it): a slow block with steal
was the neighbours', not the step's.
"""

import dataclasses
import time

import numpy as np

from benchmarks import bandwidth
from benchmarks import child
from benchmarks import cli
from benchmarks import timing
from benchmarks import workload as workload_lib
from benchmarks.stacks import BY_NAME


def parse_args(argv=None):
  p = cli.embedding_part_parser(__doc__)
  p.add_argument("--blocks", type=int, default=24)
  p.add_argument("--block-steps", type=int, default=10,
                 help="timed steps per block")
  p.add_argument("--rewarm", type=int, default=2,
                 help="untimed steps at the start of each block")
  p.add_argument("--copies", type=int, default=3,
                 help="copies each way per bandwidth measurement (the best "
                 "counts)")
  p.add_argument("--max-seconds", type=float, default=60.0,
                 help="stop after this long (at least 2 blocks)")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def run(args) -> dict:
  stack = BY_NAME[args.stack]
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  batches = work.make_batches()
  traffic = work.traffic_bytes_per_step(batches)
  step, tensors, per_call = child.build_warm(stack, work, batches)
  copier = bandwidth.Copier()
  cursor, times, blocks = child.WARMUP, [], []
  began = time.perf_counter()
  for b in range(args.blocks):
    gbps = copier.measure(args.copies)["copy_gbps"]
    t, cursor, stolen = timing.time_block(
        step, tensors, args.block_steps, cursor, args.rewarm, per_call,
        timing.stolen_seconds)
    times.extend(t)
    bound_ms = traffic["total"] / (gbps * 1e6)
    blocks.append({"copy_gbps": gbps, "bound_ms": bound_ms,
                   "median_ms": float(np.median(t)),
                   "ratio": float(np.median(t)) / bound_ms,
                   "stolen_ms_per_step": stolen * 1e3 / len(t) / per_call})
    if b >= 1 and time.perf_counter() - began > args.max_seconds:
      break
  ratios = [x["ratio"] for x in blocks]
  return {
      "stack": stack.name, "optimizer": args.optimizer, "vocab": args.vocab,
      "bytes": traffic["total"], "traffic_bytes_per_step": traffic,
      "median_ms": float(np.median(times)),
      "copy_gbps": float(np.median([x["copy_gbps"] for x in blocks])),
      "bound_ms": float(np.median([x["bound_ms"] for x in blocks])),
      "ratio": float(np.median(ratios)),
      "ratio_p10": float(np.quantile(ratios, .1)),
      "ratio_p90": float(np.quantile(ratios, .9)),
      "block_steps": args.block_steps, "blocks": blocks,
      "workload": dataclasses.asdict(work),
  }


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
