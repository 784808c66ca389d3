"""The embedding part on one thread and on every core, side by side.

    python -m benchmarks.threads --optimizer adagrad --vocab 5000000 \
        --rounds 4 --out threads.json

A step's tables are independent: the fused kernels of one table run on
one thread, and TensorFlow's inter-op pool runs the tables side by side.
This measures what the second core (and any further one) buys. It runs
`benchmarks.child` for a stack (default `tfemb-emb`, the embedding part
alone) once with TensorFlow's intra-op and inter-op pools of one thread
each, and once at TensorFlow's default (one thread per core), each in a
process of its own, alternating which goes first in each round so that a
drift of the host falls on both. The speedup is the ratio of the medians
over the rounds, one thread / every core: at most the number of cores,
below 1 if more threads make it slower.
"""

import os
import statistics
import tempfile

from benchmarks import cli
from benchmarks import runner
from benchmarks.stacks import BY_NAME


def parse_args(argv=None):
  p = cli.embedding_part_parser(__doc__)
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def _median_ms(args, threads: int, tmp: str) -> float:
  stack = BY_NAME[args.stack]
  out = runner.run(
      "benchmarks.child",
      ["--stack", args.stack, "--optimizer", args.optimizer,
       "--vocab", str(args.vocab), "--steps", str(args.steps),
       "--threads", str(threads)],
      python=stack.python, env=stack.env,
      log_path=os.path.join(tmp, f"threads-{threads}.log"))
  if out.result is None:
    raise RuntimeError(f"the {threads}-thread run failed: {out.status} "
                       f"{out.detail}")
  return out.result["median_ms"]


def run(args) -> dict:
  cores = os.cpu_count() or 1
  times = {"one": [], "all": []}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      order = ("one", "all") if r % 2 == 0 else ("all", "one")
      for name in order:
        times[name].append(_median_ms(args, 1 if name == "one" else 0, tmp))
      print(f"round {r + 1}: 1 thread {times['one'][-1]:.2f} ms, "
            f"{cores} cores {times['all'][-1]:.2f} ms", flush=True)
  one, every = (statistics.median(times[k]) for k in ("one", "all"))
  print(f"{args.stack} {args.optimizer} {args.vocab}: 1 thread {one:.2f} ms,"
        f" {cores} cores {every:.2f} ms, speedup {one / every:.2f}")
  return {"stack": args.stack, "optimizer": args.optimizer,
          "vocab": args.vocab, "cores": cores, "times_ms": times,
          "one_thread_ms": one, "all_cores_ms": every,
          "speedup": one / every}


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
