"""Page faults in a tfemb step, with and without `tfemb.heap`'s thresholds.

    python -m benchmarks.lab.page_faults --optimizer sgd --vocab 5000000
    python -m benchmarks.lab.page_faults --optimizer adam --vocab 100000 \
        --rounds 3

Two measurements of the suite's tfemb Keras step (`benchmarks.child`):

1. Faults per step: child processes alternating between glibc's own
   thresholds (`TFEMB_MALLOC_TUNING=0`) and tfemb's (the default), each
   printing its median step, its p10 and the minor page faults per timed
   step. The medians carry the host's minute-to-minute spread; the fault
   counts do not.
2. What a fault costs inside the step: one process (tfemb's thresholds),
   alternating blocks of steps between a trim threshold of 64 MiB (tfemb's)
   and of 1 MiB (about where glibc's own rule leaves it at 5M rows), so
   that both see the same minutes of the host: (median step difference) /
   (fault difference per step).
"""

import argparse

import numpy as np

from benchmarks import cli
from benchmarks import runner
from benchmarks import workload as workload_lib

TRIMS = {"64 MiB": 64 << 20, "1 MiB": 1 << 20}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizer", default="sgd",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", type=int, default=5_000_000)
  p.add_argument("--rounds", type=int, default=3,
                 help="processes per setting (alternating)")
  p.add_argument("--steps", type=int, default=30,
                 help="timed steps per process")
  p.add_argument("--blocks", type=int, default=24,
                 help="blocks per trim threshold in the cost measurement")
  p.add_argument("--block-steps", type=int, default=10)
  p.add_argument("--cost-child", action="store_true",
                 help="(child) run measurement 2 in this process")
  p.add_argument("--out", help="(child) where to write its JSON; (parent) "
                 "where to write every result")
  return p.parse_args(argv)


def cost_per_fault(args) -> dict:
  """Measurement 2, in this process."""
  from benchmarks import child  # pylint: disable=g-import-not-at-top
  from benchmarks import procmem  # pylint: disable=g-import-not-at-top
  from benchmarks import timing  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import BY_NAME  # pylint: disable=g-import-not-at-top
  from tfemb import heap  # pylint: disable=g-import-not-at-top

  libc = heap.glibc()
  if libc is None:
    raise SystemExit("the cost measurement needs glibc's malloc")
  # tfemb's mmap threshold whatever the environment says: a trim threshold
  # set alone would also fix the mmap threshold at glibc's initial 128 KiB.
  if libc.mallopt(heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD) != 1:
    raise SystemExit("mallopt refused the mmap threshold")
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  step, tensors, per_call = child.build(BY_NAME["tfemb"], work)
  timing.time_steps(step, tensors, 10)
  times = {k: [] for k in TRIMS}
  faults = {k: 0 for k in TRIMS}
  cursor = 10
  for b in range(args.blocks):
    for k in (list(TRIMS) if b % 2 == 0 else list(TRIMS)[::-1]):
      if libc.mallopt(heap.M_TRIM_THRESHOLD, TRIMS[k]) != 1:
        raise SystemExit("mallopt refused the trim threshold")
      timing.time_steps(step, tensors, 2, start=cursor)  # settles
      before = procmem.minor_faults()
      t = timing.time_steps(step, tensors, args.block_steps, start=cursor + 2)
      faults[k] += procmem.minor_faults() - before
      cursor += 2 + args.block_steps
      times[k].extend(x / per_call * 1e3 for x in t)
  out = {f"trim {k}": {"median_ms": float(np.median(times[k])),
                       "faults_per_step": faults[k] / len(times[k])}
         for k in TRIMS}
  kept, trimmed = out["trim 64 MiB"], out["trim 1 MiB"]
  extra = trimmed["faults_per_step"] - kept["faults_per_step"]
  out["us_per_fault"] = ((trimmed["median_ms"] - kept["median_ms"]) * 1e3 /
                         extra if extra > 0 else None)
  return out


def _parent(args):
  print(f"tfemb's Keras step, {args.optimizer}, {args.vocab:,} rows per "
        f"table: each process's median / p10 ms and minor page faults per "
        f"step\n")
  print("| thresholds | median ms | p10 ms | page faults per step |")
  print("|---|---:|---:|---:|")
  results = {"processes": []}
  for r in range(args.rounds):
    for setting in (("glibc", "tfemb") if r % 2 == 0 else ("tfemb", "glibc")):
      res = runner.result("benchmarks.child", [
          "--stack", "tfemb", "--optimizer", args.optimizer, "--vocab",
          str(args.vocab), "--steps", str(args.steps)], setting,
          env={"TFEMB_MALLOC_TUNING": "1" if setting == "tfemb" else "0"})
      results["processes"].append(dict(setting=setting, **{
          k: res[k] for k in ("median_ms", "p10_ms", "page_faults_per_step")}))
      print(f"| {setting} | {res['median_ms']:.2f} | {res['p10_ms']:.2f} | "
            f"{res['page_faults_per_step']:.0f} |", flush=True)
  cost = results["cost"] = runner.result("benchmarks.lab.page_faults", [
      "--cost-child", "--optimizer", args.optimizer, "--vocab",
      str(args.vocab), "--blocks", str(args.blocks), "--block-steps",
      str(args.block_steps)], "cost")
  print("\nOne process, trim threshold alternating per block of steps:\n")
  for k in TRIMS:
    c = cost[f"trim {k}"]
    print(f"- trim {k}: median {c['median_ms']:.2f} ms, "
          f"{c['faults_per_step']:.0f} page faults per step")
  per = cost["us_per_fault"]
  print(f"- a page fault costs the step {per:.2f} us" if per else
        "- no more faults with the lower threshold: no cost measured")
  if args.out:
    cli.write_json(args.out, results)


def main(argv=None):
  args = parse_args(argv)
  if not args.cost_child:
    _parent(args)
    return
  cli.write_json(args.out, cost_per_fault(args))


if __name__ == "__main__":
  main()
