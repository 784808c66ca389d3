"""The command line of a measurement: its arguments in, its result as JSON.

A measurement runs in a process of its own (`runner.run` starts it) and
hands its result back as a JSON file at `--out`, which the parent reads.
The suite's children (child.py, flatness.py, floor.py, bandwidth.py,
bound.py) and the experiments' one-process measurements end the same way,
so the way they write that file is written once, here: a parent reads every
child's file alike.
"""

import argparse
import json
from typing import Any, Callable, Optional, Sequence


def write_json(path: str, result: Any):
  """Writes `result` to `path` as the parent reads it (indented JSON)."""
  with open(path, "w") as f:
    json.dump(result, f, indent=1)


def main(parse_args: Callable, run: Callable,
         argv: Optional[Sequence[str]] = None):
  """Parses `argv`, measures with `run(args)` and writes its result to
  `args.out`: the whole `main()` of a script that only measures."""
  args = parse_args(argv)
  write_json(args.out, run(args))


def embedding_part_parser(doc: str) -> argparse.ArgumentParser:
  """The arguments of a measurement of one stack (default `tfemb-emb`, the
  embedding part) at one optimizer and size; `doc`'s first line describes
  it."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import workload as workload_lib
  from benchmarks.stacks import BY_NAME
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--stack", default="tfemb-emb", choices=sorted(BY_NAME))
  p.add_argument("--optimizer", required=True,
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", type=int, default=100_000)
  return p
