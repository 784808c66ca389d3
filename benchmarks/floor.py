"""The floor under every exact sparse step on this machine, in the same run.

    python -m benchmarks.floor --optimizers sgd,adagrad,adam \
        --sizes 100k,1M,5M --out floor.json

Builds `benchmarks/floor.cc` (plain C++, no TensorFlow) and times the
suite's batches (`Workload.make_batches`, written to a file it reads) in
three kinds, 8 tables on both cores (the last on one thread too), every
table looked up before any is updated as in training:

* the rows alone: each table's distinct rows looked up (the parameters
  copied out), then updated in place by the optimizer's rule (parameters
  and slots side by side). No deduplication, no activations per id, no
  gradient sums: the reads and writes of rows that any exact
  implementation makes, and nothing else.
* the exact step: all of the work tfemb's kernels do and nothing else:
  the ids checked and deduplicated, each distinct row read once and every
  id's activation written, the ids' gradients summed per distinct row, the
  rows updated in place with their old values kept (all or nothing) and
  the new values checked finite. Only TensorFlow is left out.
* the exact step on one thread and on two, in alternating blocks in one
  process: what a second core gives the exact step, beside what it gives
  tfemb (`benchmarks.threads`).

The sizes are timed side by side in one process, as `benchmarks.flatness`
times tfemb. Where they do not all fit in memory together, the smallest and
the largest still run side by side (the growth between them is what
flatness judges), and each other size runs alone.

The report puts these beside the targets that memory decides: the step's
growth from the smallest to the largest size (the flatness) and, at every
size, the embedding part against the memory-traffic bound. A target that
the exact step in C++ already misses is out of reach on this machine.
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
KERNEL_SOURCES = os.path.join(REPO, "tfemb", "kernels", "src")  # its headers
# As tfemb's kernels are built (tfemb/kernels/build.py), for this machine:
# without -fno-math-errno the compiler keeps sqrt scalar (it may have to set
# errno), which made Adam's rows cost twice their memory time.
FLAGS = ["-O3", "-march=native", "-fno-math-errno"]
# floor.cc's kinds, each run on its own, and the timings each prints: the
# rows alone, the exact step, the exact step on one thread and on two in
# alternating blocks.
RUNS = {"rows": ("rows",), "step": ("step",), "threads": ("step1", "step2")}
# Each timing's key in a measured row, {size: ms per step}.
KEYS = {"rows": "ms", "step": "step_ms", "step1": "step_1thread_ms",
        "step2": "step_2thread_ms"}
_LINE = re.compile(r"^(\w+) (rows|step1|step2|step), (\d+) rows x \d+ "
                   r"tables: ([\d.]+) ms per step \((\d+) distinct rows")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizers", default=",".join(workload_lib.OPTIMIZERS))
  p.add_argument("--sizes", default="100k,5M",
                 help="rows per table, comma-separated (e.g. 100k,1M,5M)")
  p.add_argument("--timeout", type=float, default=600.0,
                 help="seconds per run of floor.cc")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def build(directory: str) -> str:
  """Compiles floor.cc into `directory`; returns the binary's path."""
  compiler = os.environ.get("CXX", "c++")
  if not shutil.which(compiler):
    raise RuntimeError(f"no C++ compiler ({compiler}) to build the floor")
  binary = os.path.join(directory, "floor")
  subprocess.run([compiler, *FLAGS, "-pthread", f"-I{KERNEL_SOURCES}", SOURCE,
                  "-o", binary],
                 check=True, timeout=300, capture_output=True)
  return binary


def write_ids(path: str, sizes: List[int]):
  """The suite's batches at each size, as floor.cc reads them."""
  parts = []
  for vocab in sizes:
    work = workload_lib.Workload(vocab=vocab, optimizer="sgd")  # any rule
    batches = work.make_batches()
    parts.append([vocab, len(batches), work.features, work.batch])
    for features, _ in batches:
      parts += [features[name] for name in work.names]
  np.concatenate([np.asarray(p, np.int64) for p in parts]).astype(
      "<i8").tofile(path)


def parse(stdout: str) -> Dict[str, Dict[int, dict]]:
  """floor.cc's lines -> {timing: {rows per table: {ms, distinct}}}."""
  out = {}
  for line in stdout.splitlines():
    m = _LINE.match(line.strip())
    if m:
      out.setdefault(m.group(2), {})[int(m.group(3))] = {
          "ms": float(m.group(4)), "distinct": int(m.group(5))}
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
  """One optimizer at `sizes` (ascending), side by side where they fit,
  each kind in a run of its own: {"ms": {size: ms}, "step_ms": ...}."""
  free = procmem.available()
  by_kind = {name: {} for name in KEYS}
  for group in groups(optimizer, sizes, free):
    need = _needs(optimizer, group)
    if free is not None and need > free - procmem.GIB:
      return {"optimizer": optimizer, "status": "skipped",
              "detail": f"{format_size(group[-1])} rows: needs "
                        f"{need / procmem.GIB:.1f} GiB, "
                        f"{free / procmem.GIB:.1f} GiB available"}
    for kind, names in RUNS.items():
      done = subprocess.run(
          [binary, ids, optimizer, kind] + [str(v) for v in group],
          capture_output=True, text=True, timeout=timeout, check=True)
      parsed = parse(done.stdout)
      for name in names:
        timed = parsed.get(name, {})
        if sorted(timed) != group:
          raise RuntimeError(
              f"unexpected output from floor.cc: {done.stdout!r}")
        by_kind[name].update(timed)
  out = {"optimizer": optimizer, "status": "ok"}
  out.update({key: {str(v): by_kind[name][v]["ms"] for v in sizes}
              for name, key in KEYS.items()})
  out["distinct"] = {str(v): by_kind["rows"][v]["distinct"] for v in sizes}
  return out


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
