"""The suite's training step, this checkout against another, side by side.

    python -m benchmarks.revision_ab --base ../other-checkout \\
        --stack tfemb --optimizer sgd --vocab 100000 --rounds 4

Runs `benchmarks.child` for the same workload in each checkout (its own
process, its own `PYTHONPATH`), alternating which goes first in each round
so that a drift of the host falls on both, and prints each round's median
step time and the ratio this / base of the medians over all rounds. Use it
to check that a change to the engine leaves the step's speed within noise.
The base checkout needs the same Python environment (e.g. a
`git worktree add ../base <revision>` of this repository).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base", required=True, help="the other checkout's root")
  p.add_argument("--stack", default="tfemb",
                 help="tfemb (the Keras layer) or tfemb-emb (mid-level)")
  p.add_argument("--optimizer", default="sgd")
  p.add_argument("--vocab", type=int, default=100000)
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--out", help="write the results as JSON here")
  return p.parse_args(argv)


def run_child(root: pathlib.Path, args) -> float:
  """The median step time (ms) of one `benchmarks.child` run in `root`."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "result.json")
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.child", "--stack", args.stack,
         "--optimizer", args.optimizer, "--vocab", str(args.vocab),
         "--steps", str(args.steps), "--out", out],
        cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
      return json.load(f)["median_ms"]


def main(argv=None):
  args = parse_args(argv)
  roots = {"this": HERE, "base": pathlib.Path(args.base).resolve()}
  times = {"this": [], "base": []}
  for r in range(args.rounds):
    order = ["this", "base"] if r % 2 == 0 else ["base", "this"]
    for name in order:
      times[name].append(run_child(roots[name], args))
    print(f"round {r + 1}: this {times['this'][-1]:.2f} ms, "
          f"base {times['base'][-1]:.2f} ms", flush=True)
  this, base = (statistics.median(times[k]) for k in ("this", "base"))
  print(f"{args.stack} {args.optimizer} {args.vocab}: this {this:.2f} ms, "
        f"base {base:.2f} ms, ratio {this / base:.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"args": vars(args), "times_ms": times,
                 "ratio": this / base}, f, indent=1)


if __name__ == "__main__":
  main()
