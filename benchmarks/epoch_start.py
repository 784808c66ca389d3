"""How long an epoch after the first takes to start: Keras 3's `fit` of a
subclassed model with tfemb's layer on the CPU branch (no strategy) and on
host TPUs, in alternating rounds.

    python -m benchmarks.epoch_start
    python -m benchmarks.epoch_start --rounds 7 --epochs 8 --out start.json
    python -m benchmarks.epoch_start --tree ../other-checkout  # its tfemb

Each run is a process of its own (a host TPU's type is fixed per process):
tests/workers/subclassed_fit_worker.py, under `python -m tfemb.run --tpu
TYPE` for a TPU type, plainly for the CPU branch. Its callback times each
epoch from its start to the end of its first batch (one step of a global
batch of 16). A run's figure is the median over its epochs after the first;
a round runs every mode once, in an order that turns each round; each
round gives each TPU type's ratio to that round's CPU branch. Prints one
JSON line: per mode the runs' figures, per TPU type the median ratio over
the rounds with its quartiles, and the functions traced per epoch.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "workers" / "subclassed_fit_worker.py"
MODES = ("cpu", "v5p-8", "v6e-8")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--modes", default=",".join(MODES),
                 help="comma-separated: cpu (no strategy) and TPU types")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--epochs", type=int, default=6)
  p.add_argument("--tree", default=str(REPO),
                 help="the checkout whose tfemb the runs import")
  p.add_argument("--out", help="also write the JSON here")
  return p.parse_args(argv)


def run(mode, epochs, tree):
  """One process's `fit`: its per-epoch seconds to the first batch's end
  and the functions it traced per epoch."""
  if mode == "cpu":
    command = [sys.executable, str(WORKER), "tfemb", str(epochs), "cpu"]
  else:
    command = [sys.executable, "-m", "tfemb.run", "--tpu", mode, str(WORKER),
               "tfemb", str(epochs), "tpu"]
  done = subprocess.run(
      command, cwd=tree, capture_output=True, text=True, timeout=1800,
      env=dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2",
               TF_USE_LEGACY_KERAS="0"), check=False)
  if done.returncode:
    raise RuntimeError(f"{mode}: {done.stderr[-3000:]}")
  result = json.loads(done.stdout.strip().splitlines()[-1])
  return result["first_batch"], [len(t) for t in result["traced"]]


def main(argv=None):
  args = parse_args(argv)
  modes = args.modes.split(",")
  runs = {m: [] for m in modes}
  traced = {}
  for r in range(args.rounds):
    for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
      times, traced[mode] = run(mode, args.epochs, args.tree)
      runs[mode].append(float(np.median(times[1:])))
  result = {
      "command": "python -m benchmarks.epoch_start " + " ".join(
          sys.argv[1:] if argv is None else argv),
      "epochs": args.epochs, "rounds": args.rounds,
      "seconds_to_first_batch": runs,
      "functions_traced_per_epoch": traced}
  if "cpu" in modes:
    cpu = np.asarray(runs["cpu"])
    result["ratio_to_cpu"] = {
        m: dict(zip(("q1", "median", "q3"), np.percentile(
            np.asarray(runs[m]) / cpu, [25, 50, 75]).round(2).tolist()))
        for m in modes if m != "cpu"}
  line = json.dumps(result)
  print(line)
  if args.out:
    pathlib.Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
  main()
