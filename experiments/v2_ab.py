"""`TPUEmbeddingV2` beside the first generation: the ratio of their steps.

    python -m experiments.v2_ab --api mid --vocab 100000
    python -m experiments.v2_ab --api keras --vocab 100000 --calls 60
    python -m experiments.v2_ab --api mid --vocab 5000000 --rounds 11

The suite's workload (8 tables of width 32, stacked into one by
`TPUEmbeddingV2`, batch 4096, Zipf ids) trained by both generations:
`--api mid` the embedding part of a step through the mid-level API
(stacks `tfemb-emb` and `tfemb-emb-v2`, `TFEMB_STEPS_PER_CALL` steps per
call, 32 by default), `--api keras` the whole Keras training step of the
layer (`tfemb`, and `tfemb-v2`: the layer following the SparseCore).

By default both are built in one process and timed in alternating blocks
of calls, which go first in turn: separate processes of unchanged code
differ by up to 2x on a shared host, and within
one process both see the same state of the host. That holds both
generations' tables in memory at once (with Adagrad at 5M rows, about
21 GB); `--processes` runs each measurement in a child process of its own
instead (`benchmarks.child`), alternating, for tables too big to hold
twice, at the price of the spread between processes. Each round gives the ratio
V2 / V1 of its two medians; the result is the median over the rounds.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import timing
from benchmarks import workload as workload_lib

STACKS = {"mid": ("tfemb-emb", "tfemb-emb-v2"), "keras": ("tfemb", "tfemb-v2")}


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
      times = timing.time_steps(step, tensors, calls, start=r)
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


def parse_args(argv=None, doc=__doc__, api="mid"):
  """The arguments of this tool, and of `experiments.ops_path` (`doc`)."""
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--api", choices=sorted(STACKS), default=api)
  p.add_argument("--optimizer", default="adagrad",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", type=int, default=100_000)
  p.add_argument("--rounds", type=int, default=15)
  p.add_argument("--calls", type=int, default=20,
                 help="calls of each per round (in one process)")
  p.add_argument("--steps", type=int, default=100,
                 help="timed calls per child process (--processes)")
  p.add_argument("--warmup", type=int, default=30,
                 help="untimed calls per child process first (--processes)")
  p.add_argument("--processes", action="store_true",
                 help="one child process per measurement")
  p.add_argument("--out", help="write the rounds and the ratio as JSON")
  return p.parse_args(argv)


def _inline(args, stacks):
  """Rounds of medians, both generations built in this process."""
  from benchmarks import child  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import BY_NAME  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  batches = work.make_batches()
  built = {}
  for name in stacks:
    step, tensors, per_call = child.build(BY_NAME[name], work, batches)
    timing.time_steps(step, tensors, 10)  # trace and warm up
    built[name] = (step, tensors, per_call)
  yield from alternate(built, args.rounds, args.calls)


def _in_processes(args, runs):
  """Rounds of medians, each measured by a child process of its own.

  `runs`: `{key: (stack name, variables added to its environment)}`, in
  the order of the first round; the rounds are keyed alike.
  """
  keys = list(runs)
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      medians = {}
      for i, key in enumerate(keys if r % 2 == 0 else keys[::-1]):
        name, env = runs[key]
        out = os.path.join(tmp, f"{r}-{i}.json")
        subprocess.run(
            [sys.executable, "-m", "benchmarks.child", "--stack", name,
             "--optimizer", args.optimizer, "--vocab", str(args.vocab),
             "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--max-seconds", "600",
             "--out", out], check=True, stdout=subprocess.DEVNULL,
            env=dict(os.environ, **env))
        with open(out) as f:
          medians[key] = json.load(f)["median_ms"]
      yield medians


def main(argv=None):
  args = parse_args(argv)
  stacks = STACKS[args.api]
  rounds = []
  if args.processes:
    measured = _in_processes(args, {s: (s, {}) for s in stacks})
  else:
    measured = _inline(args, stacks)
  for r, medians in enumerate(measured):
    rounds.append(medians)
    v1, v2 = medians[stacks[0]], medians[stacks[1]]
    print(f"round {r + 1}: V1 {v1:.3f} ms, V2 {v2:.3f} ms, V2 / V1 "
          f"{v2 / v1:.3f}", flush=True)
  result = ratio_of_rounds(rounds, stacks[0], stacks[1])
  v1, v2, ratio = result["base_ms"], result["other_ms"], result["ratio"]
  print(f"{args.api} API, {args.optimizer}, {args.vocab:,} rows per table: "
        f"V1 {v1:.3f} ms, V2 {v2:.3f} ms per step, V2 / V1 = {ratio:.3f} "
        f"(median of {len(rounds)} rounds; quartiles "
        "{:.3f}-{:.3f})".format(*result["quartiles"]))
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"api": args.api, "vocab": args.vocab,
                 "optimizer": args.optimizer, "stacks": stacks,
                 "processes": args.processes, "rounds": rounds,
                 "v1_ms": v1, "v2_ms": v2, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
  main()
