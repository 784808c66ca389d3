"""What a Cloud TPU VM program brings that a CPU machine lacks, made
harmless under `python -m tfemb.run --tpu TYPE` (docs/tpu.md, "A TPU VM
program's preamble"). Nothing here imports TensorFlow: `prepare` runs
before TensorFlow loads.

Cloud TPU's TensorFlow guides start a program, or its shell, with the TPU
runtime's settings:

* `TF_PLUGGABLE_DEVICE_LIBRARY_PATH` naming libtpu: TensorFlow loads that
  library when it is imported, and fails where it is missing. In a process
  that emulates a TPU (`python -m tfemb.run --tpu`, or `TFEMB_TPU` set)
  and imports tfemb before TensorFlow, tfemb takes it out of the
  environment first: the host TPU is the CPU. (Set by the program itself,
  after tfemb.run has loaded TensorFlow, it changes nothing.)
* `import libtpu` (for its `get_library_path()`): where the libtpu
  package is not installed, `python -m tfemb.run --tpu` gives a stand-in
  module whose `get_library_path()` is `""` (no library to load: TensorFlow
  ignores an empty path) and whose `configure_library_path()` does nothing.
* `PJRT_DEVICE`, `NEXT_PLUGGABLE_DEVICE_USE_C_API`, `TF_XLA_FLAGS`: left as
  they are. TensorFlow on the CPU does not act on the first two, and the
  host TPU compiles nothing with XLA.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Optional, Sequence

LIBRARY_PATH = "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
_TPU_TYPE_VARIABLE = "TFEMB_TPU"  # tfemb.tpu.host.tpu_types.ENVIRONMENT


def _emulating_a_tpu(argv: Optional[Sequence[str]]) -> bool:
  """Whether this process emulates a TPU: `python -m tfemb.run --tpu ...`
  (`argv`: the interpreter's own arguments), or `TFEMB_TPU` set."""
  if os.environ.get(_TPU_TYPE_VARIABLE, "").strip():
    return True
  argv = list(argv or [])[1:]
  while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
    # The interpreter's own options; -W and -X take the next argument.
    argv = argv[2:] if argv[0] in ("-W", "-X") else argv[1:]
  return (argv[:2] == ["-m", "tfemb.run"] and len(argv) > 2 and
          (argv[2] == "--tpu" or argv[2].startswith("--tpu=")))


def _names_libtpu(path: str) -> bool:
  return os.path.basename(path.rstrip(os.sep)).startswith("libtpu")


def prepare(argv: Optional[Sequence[str]] = None) -> None:
  """Before TensorFlow loads, in a process that emulates a TPU: the TPU
  runtime's library out of TensorFlow's way (`argv`: default, the
  interpreter's arguments, `sys.orig_argv`)."""
  if argv is None:
    argv = getattr(sys, "orig_argv", None)
  path = os.environ.get(LIBRARY_PATH, "")
  if path and _names_libtpu(path) and _emulating_a_tpu(argv):
    del os.environ[LIBRARY_PATH]


class _LibtpuStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds `libtpu` when nothing else on the path does."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname != "libtpu":
      return None
    return importlib.machinery.ModuleSpec(fullname, self)

  def create_module(self, spec):
    del spec
    return None  # the default module

  def exec_module(self, module: types.ModuleType) -> None:
    module.__doc__ = ("tfemb's stand-in for the libtpu package under the "
                      "host TPU (tfemb/tpu_vm.py): no TPU runtime to load.")
    module.get_library_path = lambda: ""
    module.configure_library_path = lambda: None


_STAND_IN = _LibtpuStandIn()


def provide_libtpu() -> None:
  """`import libtpu` gives the stand-in where the package is not
  installed (the finder comes last: an installed libtpu wins)."""
  if _STAND_IN not in sys.meta_path and importlib.util.find_spec(
      "libtpu") is None:
    sys.meta_path.append(_STAND_IN)
