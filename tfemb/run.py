"""`python -m tfemb.run [--tpu TYPE] script.py ARGS...` (or `-m
package.module ARGS...`): runs a TPU program unchanged off the TPU, under
`tfemb.patch(tpu=TYPE)` (`tfemb.patching`; without `--tpu`, the type
`TFEMB_TPU` names, if any), as `python script.py ARGS...` (or `python -m ...`)
runs it: `sys.argv` is `[script.py, ARGS...]`, the script's `__file__` is
its absolute path and its directory is `sys.path[0]` (in place of the
working directory `-m` put there); a script that cannot be opened, or a
module that cannot be found, is Python's one line on stderr and its exit
status (2, 1); an exception the program does not catch is printed as
Python prints it, without this launcher's frames, and exits 1.
With `--tpu`, a TPU VM program's preamble (`import libtpu`, the TPU
runtime's environment variables) does not stop it (`tfemb.tpu_vm`).
"""

import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
from typing import List, Optional, Sequence, Tuple

_USAGE = ("usage: python -m tfemb.run [--tpu TYPE] script.py [ARGS...]\n"
          "       python -m tfemb.run [--tpu TYPE] -m package.module "
          "[ARGS...]\n"
          "--tpu TYPE: run the program's TPU on the CPU as that Cloud TPU "
          "type (e.g. v5p-8)")


class _NotFound(ImportError):
  """A module `python -m` would not run (runpy's message)."""


def _program() -> str:
  """The interpreter's name as Python's own messages give it."""
  return getattr(sys, "orig_argv", None) and sys.orig_argv[0] or "python"


def _module_error(name: str) -> Optional[str]:
  """Python's message if `python -m name` would not find it, else None."""
  details = getattr(runpy, "_get_module_details", None)  # python -m's own
  try:
    if details is not None:
      details(name, _NotFound)
    elif importlib.util.find_spec(name) is None:
      return f"No module named {name}"
  except _NotFound as e:
    return str(e)
  return None


def _script(path: str):
  """(code, absolute path) of a script file, or an error line and status
  as Python gives them; a directory or zip goes to runpy (its __main__)."""
  absolute = os.path.abspath(path)
  if os.path.isdir(absolute) and not any(
      os.path.exists(os.path.join(absolute, "__main__" + ext))
      for ext in (".py", ".pyc")):
    return None, (f"{sys.executable}: can't find '__main__' module in "
                  f"{absolute!r}", 1)
  if os.path.isdir(absolute):
    return None, None
  try:
    with io.open_code(absolute) as f:
      source = f.read()
  except OSError as e:
    return None, (f"{_program()}: can't open file {absolute!r}: [Errno "
                  f"{e.errno}] {e.strerror}", 2)
  return compile(source, absolute, "exec", dont_inherit=True), None


def _run_script(code, path: str) -> None:
  """Runs `code` as Python runs a script: module `__main__`, `__file__`
  absolute."""
  main = types.ModuleType("__main__")
  main.__dict__.update(
      __file__=path, __cached__=None,
      __loader__=importlib.machinery.SourceFileLoader("__main__", path))
  saved = sys.modules.get("__main__")
  sys.modules["__main__"] = main
  try:
    exec(code, main.__dict__)  # pylint: disable=exec-used
  finally:
    sys.modules["__main__"] = saved


def _tpu_option(argv: List[str]) -> Tuple[Optional[str], List[str]]:
  """(`--tpu`'s TYPE or None, the arguments after it)."""
  if argv[:1] == ["--tpu"]:
    if len(argv) < 2:
      raise _UsageError("--tpu needs a TPU type, e.g. --tpu v5p-8")
    return argv[1], argv[2:]
  if argv and argv[0].startswith("--tpu="):
    return argv[0][len("--tpu="):], argv[1:]
  return None, argv


class _UsageError(Exception):
  pass


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    tpu, argv = _tpu_option(argv)
    if tpu is not None:
      from tfemb.tpu.host import tpu_types  # pylint: disable=g-import-not-at-top
      tpu_types.lookup(tpu)  # an unknown type fails before the program
  except (_UsageError, ValueError) as e:
    print(f"{_USAGE}\nerror: {e}", file=sys.stderr)
    return 2
  if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
    print(_USAGE, file=sys.stderr)
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2
  if argv[0] == "-m":
    error = _module_error(argv[1])
    if error is not None:
      print(f"{sys.executable}: {error}", file=sys.stderr)
      return 1
  else:
    code, failure = _script(argv[0])
    if failure is not None:
      print(failure[0], file=sys.stderr)
      return failure[1]
  import tfemb  # pylint: disable=g-import-not-at-top
  if tpu is not None:
    tfemb.tpu_vm.provide_libtpu()  # a TPU VM program's `import libtpu`
  with tfemb.patch(tpu=tpu):
    if argv[0] == "-m":
      sys.argv = argv[1:]
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = argv
      path = os.path.abspath(argv[0])
      sys.path[0] = os.path.dirname(path)
      if code is None:  # a directory with a __main__ module
        runpy.run_path(path, run_name="__main__")
      else:
        _run_script(code, path)
  return 0


def _without_launcher(tb: Optional[types.TracebackType]):
  """`tb` without the entries of this module's and runpy's frames, which
  `python script.py` would not show."""
  skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
  kept = []
  while tb is not None:
    if os.path.abspath(tb.tb_frame.f_code.co_filename) not in skip:
      kept.append(tb)
    tb = tb.tb_next
  for entry, after in zip(kept, kept[1:] + [None]):
    entry.tb_next = after
  return kept[0] if kept else None


if __name__ == "__main__":
  try:
    sys.exit(main())
  except Exception as error:  # pylint: disable=broad-except
    # The hook prints the exception's own traceback when it has one.
    trimmed = _without_launcher(error.__traceback__)
    sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
    sys.exit(1)
