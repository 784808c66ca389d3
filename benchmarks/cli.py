"""The command line of a measurement: its arguments in, its result as JSON.

A measurement runs in a process of its own (`runner.run` starts it) and
hands its result back as a JSON file at `--out`, which the parent reads.
The suite's children (child.py, flatness.py, floor.py, bandwidth.py) and the
experiments' one-process measurements end the same way, so the way they write
that file is written once, here: a parent reads every child's file alike.
"""

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
