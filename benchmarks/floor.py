"""The floor under every exact sparse step on this machine, in the same run.

    python -m benchmarks.floor --optimizers sgd,adagrad,adam \
        --sizes 100k,1M,5M --out floor.json

Builds `benchmarks/floor.cc` (plain C++, no TensorFlow) and times the
distinct rows of the suite's batches (`Workload.make_batches`, written to a
file it reads) alone: each table's rows looked up (the parameters copied
out), then updated in place by the optimizer's rule (parameters and slots
side by side), every table looked up before any is updated as in training,
8 tables on both cores. No deduplication, no activations per id, no
gradient sums: the reads and writes of rows that any exact implementation
makes, and nothing else. The sizes are timed side by side in one process,
as `benchmarks.flatness` times tfemb. Where they do not all fit in memory
together, the smallest and the largest still run side by side (the growth
between them is what flatness judges), and each other size runs alone.

The report puts these beside the targets that memory decides: the step's
growth from the smallest to the largest size (the flatness) and, at every
size, the embedding part against the memory-traffic bound.
"""

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from typing import Dict, List

import numpy as np

from benchmarks import cli
from benchmarks import procmem
from benchmarks import workload as workload_lib
from benchmarks.workload import format_size, parse_size
from benchmarks.stacks import REPO

SOURCE = os.path.join(REPO, "benchmarks", "floor.cc")
# As tfemb's kernels are built (tfemb/kernels/build.py), for this machine:
# without -fno-math-errno the compiler keeps sqrt scalar (it may have to set
# errno), which made Adam's rows cost twice their memory time.
FLAGS = ["-O3", "-march=native", "-fno-math-errno"]
_LINE = re.compile(r"^(\w+), (\d+) rows x \d+ tables: ([\d.]+) ms per step "
                   r"\((\d+) distinct rows")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizers", default=",".join(workload_lib.OPTIMIZERS))
  p.add_argument("--sizes", default="100k,5M",
                 help="rows per table, comma-separated (e.g. 100k,1M,5M)")
  p.add_argument("--timeout", type=float, default=600.0,
                 help="seconds per optimizer")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def build(directory: str) -> str:
  """Compiles floor.cc into `directory`; returns the binary's path."""
  compiler = os.environ.get("CXX", "c++")
  if not shutil.which(compiler):
    raise RuntimeError(f"no C++ compiler ({compiler}) to build the floor")
  binary = os.path.join(directory, "floor")
  subprocess.run([compiler, *FLAGS, "-pthread", SOURCE, "-o", binary],
                 check=True, timeout=300, capture_output=True)
  return binary


def distinct_rows(batches, names) -> List[List[np.ndarray]]:
  """Per batch and table, the distinct ids in the order they first appear
  (the order tfemb's lookup meets them)."""
  out = []
  for features, _ in batches:
    out.append([])
    for name in names:
      _, first = np.unique(features[name], return_index=True)
      out[-1].append(features[name][np.sort(first)])
  return out


def write_ids(path: str, sizes: List[int]):
  """The suite's batches at each size, as floor.cc reads them."""
  parts = []
  for vocab in sizes:
    work = workload_lib.Workload(vocab=vocab, optimizer="sgd")  # any rule
    rows = distinct_rows(work.make_batches(), work.names)
    parts.append([vocab, len(rows), work.features])
    for per_table in rows:
      for ids in per_table:
        parts += [[len(ids)], ids]
  np.concatenate([np.asarray(p, np.int64) for p in parts]).astype(
      "<i8").tofile(path)


def parse(stdout: str) -> Dict[int, dict]:
  """floor.cc's lines -> {rows per table: {ms, distinct}}."""
  out = {}
  for line in stdout.splitlines():
    m = _LINE.match(line.strip())
    if m:
      out[int(m.group(2))] = {"ms": float(m.group(3)),
                              "distinct": int(m.group(4))}
  return out


def _needs(optimizer: str, sizes: List[int]) -> int:
  """Bytes of the tables and slots of `sizes`, allocated together."""
  return sum(workload_lib.Workload(vocab=v, optimizer=optimizer)
             .table_and_slot_bytes() for v in sizes)


def groups(optimizer: str, sizes: List[int], free) -> List[List[int]]:
  """The runs that time `sizes` (ascending): all side by side if they fit
  in `free` bytes (None: unknown) less a GiB; else the smallest and the
  largest side by side, and each other size alone."""
  if free is None or _needs(optimizer, sizes) <= free - procmem.GIB:
    return [sizes]
  ends = sorted({sizes[0], sizes[-1]})
  return [ends] + [[v] for v in sizes if v not in ends]


def measure(binary: str, ids: str, optimizer: str, sizes: List[int],
            timeout: float) -> dict:
  """One optimizer at `sizes` (ascending), side by side where they fit:
  {"ms": {size: ms}, ...}."""
  free = procmem.available()
  by_size = {}
  for group in groups(optimizer, sizes, free):
    need = _needs(optimizer, group)
    if free is not None and need > free - procmem.GIB:
      return {"optimizer": optimizer, "status": "skipped",
              "detail": f"{format_size(group[-1])} rows: needs "
                        f"{need / procmem.GIB:.1f} GiB, "
                        f"{free / procmem.GIB:.1f} GiB available"}
    done = subprocess.run(
        [binary, ids, optimizer] + [str(v) for v in group],
        capture_output=True, text=True, timeout=timeout, check=True)
    timed = parse(done.stdout)
    if sorted(timed) != group:
      raise RuntimeError(f"unexpected output from floor.cc: {done.stdout!r}")
    by_size.update(timed)
  return {"optimizer": optimizer, "status": "ok",
          "ms": {str(v): by_size[v]["ms"] for v in sizes},
          "distinct": {str(v): by_size[v]["distinct"] for v in sizes}}


def run(args) -> dict:
  sizes = sorted({parse_size(s) for s in args.sizes.split(",")})
  with tempfile.TemporaryDirectory() as tmp:
    binary, ids = build(tmp), os.path.join(tmp, "ids")
    write_ids(ids, sizes)
    rows = [measure(binary, ids, opt, sizes, args.timeout)
            for opt in args.optimizers.split(",")]
  return {"sizes": sizes, "floors": rows}


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
