"""The floor under every exact sparse step on this machine, in the same run.

    python -m benchmarks.floor --optimizers sgd,adagrad,adam \
        --small 100000 --large 5000000 --out floor.json

Builds `benchmarks/native/step_order.cc` (plain C++, no TensorFlow) and times
the distinct rows of the suite's batches alone: each table's rows looked up
(the parameters copied out), then updated in place by the optimizer's rule
(parameters and slots side by side), every table looked up before any is
updated as in training, 8 tables on both cores. No deduplication, no
activations per id, no gradient sums: the reads and writes of rows that any
exact implementation makes, and nothing else. Both sizes are timed side by
side in one process, as `benchmarks.flatness` times tfemb.

The report puts these beside the targets that memory decides: the
step's growth from the small to the large size (item 2) and the embedding
part against the memory-traffic bound (item 3).
"""

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from typing import Dict, List

from benchmarks import cli
from benchmarks import procmem
from benchmarks import workload as workload_lib
from benchmarks.stacks import REPO

NATIVE = os.path.join(REPO, "benchmarks", "native")
# As tfemb's kernels are built (tfemb/kernels/build.py), for this machine:
# without -fno-math-errno the compiler keeps sqrt scalar (it may have to set
# errno), which made Adam's rows cost twice their memory time.
FLAGS = ["-O3", "-march=native", "-fno-math-errno"]
_LINE = re.compile(r"^(\w+), (\d+) rows x \d+ tables, lookups-first, "
                   r"2 threads: ([\d.]+) ms per step \((\d+) distinct rows")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizers", default=",".join(workload_lib.OPTIMIZERS))
  p.add_argument("--small", type=int, default=100_000)
  p.add_argument("--large", type=int, default=5_000_000)
  p.add_argument("--timeout", type=float, default=600.0,
                 help="seconds per optimizer")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def build(directory: str) -> str:
  """Compiles step_order.cc into `directory`; returns the binary's path."""
  compiler = os.environ.get("CXX", "c++")
  if not shutil.which(compiler):
    raise RuntimeError(f"no C++ compiler ({compiler}) to build the floor")
  binary = os.path.join(directory, "step_order")
  subprocess.run([compiler, *FLAGS, "-I", NATIVE, "-pthread",
                  os.path.join(NATIVE, "step_order.cc"), "-o", binary],
                 check=True, timeout=300, capture_output=True)
  return binary


def parse(stdout: str) -> Dict[int, dict]:
  """step_order's lines -> {rows per table: {ms, distinct}}."""
  out = {}
  for line in stdout.splitlines():
    m = _LINE.match(line.strip())
    if m:
      out[int(m.group(2))] = {"ms": float(m.group(3)),
                              "distinct": int(m.group(4))}
  return out


def measure(binary: str, optimizer: str, sizes: List[int],
            timeout: float) -> dict:
  """One optimizer at `sizes` (ascending), side by side:
  {"ms": {size: ms}, ...}."""
  need = sum(workload_lib.Workload(vocab=v, optimizer=optimizer)
             .table_and_slot_bytes() for v in sizes)
  free = procmem.available()
  if free is not None and need > free - procmem.GIB:
    return {"optimizer": optimizer, "status": "skipped",
            "detail": f"needs {need / procmem.GIB:.1f} GiB, "
                      f"{free / procmem.GIB:.1f} GiB available"}
  done = subprocess.run(
      [binary, ",".join(str(v) for v in sizes), "lookups-first", "2",
       optimizer], capture_output=True, text=True, timeout=timeout,
      check=True)
  by_size = parse(done.stdout)
  if sorted(by_size) != sizes:
    raise RuntimeError(f"unexpected output from step_order: {done.stdout!r}")
  return {"optimizer": optimizer, "status": "ok",
          "ms": {str(v): by_size[v]["ms"] for v in sizes},
          "distinct": {str(v): by_size[v]["distinct"] for v in sizes}}


def run(args) -> dict:
  sizes = sorted({args.small, args.large})
  with tempfile.TemporaryDirectory() as tmp:
    binary = build(tmp)
    rows = [measure(binary, opt, sizes, args.timeout)
            for opt in args.optimizers.split(",")]
  return {"sizes": sizes, "floors": rows}


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
