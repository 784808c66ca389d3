"""`python -m tfemb.run script.py ARGS...` (or `-m package.module ARGS...`):
runs a TPU program unchanged off the TPU, under `tfemb.patch()`
(`tfemb.patching`). The program sees `sys.argv` as `[script.py, ARGS...]`,
as `python script.py ARGS...` gives it.
"""

import os
import runpy
import sys
from typing import Optional, Sequence

_USAGE = ("usage: python -m tfemb.run script.py [ARGS...]\n"
          "       python -m tfemb.run -m package.module [ARGS...]")


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
    print(_USAGE, file=sys.stderr)
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2
  import tfemb  # pylint: disable=g-import-not-at-top
  with tfemb.patch():
    if argv[0] == "-m":
      sys.argv = argv[1:]
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = argv
      sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
      runpy.run_path(argv[0], run_name="__main__")
  return 0


if __name__ == "__main__":
  sys.exit(main())
