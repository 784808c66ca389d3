"""What the commands of `python -m tfemb.tpu` share: loading `MODULE:ATTR`
(a configuration: `configuration`), checking arguments and output files,
and bad input as one line.

Bad input (an argument, a module, an object of the wrong kind, data, an
output file) ends in one or two lines on stderr, `PROG: error: ARGUMENT:
what was expected`, and exit status 2, before anything is printed or
written; `--debug` gives the traceback instead. An output file is checked
before the work starts and written whole, before the report is printed.
"""

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

from tfemb import atomic_files
from tfemb import optimizers

DEBUG_HINT = "(--debug shows the traceback)"


class UsageError(ValueError):
  """Bad input to a command: `argument` (e.g. "--data"; None if `reason`
  names it) and what was wrong. `hint`: a second line, if any."""

  def __init__(self, argument: Optional[str], reason: str,
               hint: Optional[str] = None):
    super().__init__(f"{argument}: {reason}" if argument else reason)
    self.argument, self.reason, self.hint = argument, reason, hint


class Parser(argparse.ArgumentParser):
  """argparse, with its usage errors on one line (no usage dump), and
  `--debug`."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.add_argument("--debug", action="store_true",
                      help="on bad input, the traceback instead of one line")

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
  """argparse type: an integer >= 1 (0 is not "unset")."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(
        f"expected an integer >= 1, got {text!r}")
  return value


def target(text: str) -> str:
  """argparse type: `MODULE:ATTR`."""
  module_name, sep, attr = text.rpartition(":")
  if not sep or not module_name or not attr:
    raise argparse.ArgumentTypeError(
        f"expected MODULE:ATTR (e.g. my_model:features), got {text!r}")
  return text


def _user_code_error(argument: str, what: str, e: Exception) -> UsageError:
  lines = str(e).strip().splitlines()
  detail = f": {lines[0]}" if lines else ""
  return UsageError(argument, f"{what} raised {type(e).__name__}{detail}",
                    DEBUG_HINT)


def _module(argument: str, name: str):
  if name.endswith(".py"):
    if not os.path.isfile(name):
      raise UsageError(argument, f"no file {name!r}")
    spec = importlib.util.spec_from_file_location(
        os.path.splitext(os.path.basename(name))[0], name)
    module = importlib.util.module_from_spec(spec)
    try:
      spec.loader.exec_module(module)
    except Exception as e:  # pylint: disable=broad-except
      raise _user_code_error(argument, f"loading {name}", e) from e
    return module
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    found = importlib.util.find_spec(name)
  except (ImportError, ValueError):  # a parent package is missing
    found = None
  if found is None:
    raise UsageError(argument, f"no module named {name!r} (a module "
                     "importable from the current directory, or a .py file)")
  try:
    return importlib.import_module(name)
  except Exception as e:  # pylint: disable=broad-except
    raise _user_code_error(argument, f"importing {name}", e) from e


def attribute(argument: str, text: str) -> Any:
  """The object `MODULE:ATTR` names, called if it is a function (of no
  arguments)."""
  try:
    module_name, _, attr = target(text).rpartition(":")
  except argparse.ArgumentTypeError as e:
    raise UsageError(argument, str(e)) from None
  module = _module(argument, module_name)
  if not hasattr(module, attr):
    raise UsageError(argument,
                     f"module {module_name!r} has no attribute {attr!r}")
  obj = getattr(module, attr)
  if callable(obj):
    try:
      obj = obj()
    except Exception as e:  # pylint: disable=broad-except
      raise _user_code_error(argument, f"calling {text}", e) from e
  return obj


def configuration(argument: str, text: str) -> Tuple[Any, Optional[Any]]:
  """`(feature_config, optimizer)` from `MODULE:ATTR` (`attribute`), which
  names a feature config or a pair `(feature_config, optimizer)`; the
  optimizer is None when it names a feature config. Bad input raises a
  `UsageError` naming `argument`."""
  obj = attribute(argument, text)
  if (isinstance(obj, tuple) and len(obj) == 2 and
      (obj[1] is None or optimizers.is_optimizer(obj[1]))):
    return obj
  return obj, None


def check_writable(argument: str, path: str) -> None:
  """Refuses an output file that cannot be written (before any work)."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise UsageError(argument, f"{path!r} is a directory; expected a file")
  if not os.path.isdir(directory):
    raise UsageError(argument, f"cannot write {path!r}: no directory "
                     f"{directory!r}")
  if not os.access(directory, os.W_OK) or (
      os.path.exists(path) and not os.access(path, os.W_OK)):
    raise UsageError(argument, f"cannot write {path!r}: permission denied")


def write_whole(argument: str, path: str, text: str) -> None:
  """Writes `text` to `path` whole or not at all (a file beside it, moved
  into place)."""
  try:
    atomic_files.write_text(path, text)
  except OSError as e:
    raise UsageError(argument, f"cannot write {path!r}: "
                     f"{e.strerror or e}") from e


@contextlib.contextmanager
def iterating(argument: str, what: str) -> Iterator[None]:
  """Errors of the user's code inside (e.g. reading their data) become a
  `UsageError` naming `argument`."""
  try:
    yield
  except UsageError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise _user_code_error(argument, what, e) from e


def run(parser: Parser, argv: Optional[Sequence[str]],
        command: Callable[[argparse.Namespace], int]) -> int:
  """Parses `argv` and runs `command`; a `UsageError` is printed as one
  line (and its hint), with exit status 2, unless `--debug`."""
  args = parser.parse_args(argv)
  try:
    return command(args)
  except UsageError as e:
    if args.debug:
      raise
    print(f"{parser.prog}: error: {e}", file=sys.stderr)
    if e.hint:
      print(e.hint, file=sys.stderr)
    return 2
