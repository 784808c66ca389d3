"""Builds tfemb, with its fused CPU kernels compiled into the package.

Everything but the kernels is declared in setup.cfg. When TensorFlow can be
imported by the build (`pip install --no-build-isolation .`, `pip wheel
--no-build-isolation .`), the kernels are compiled against it, once per CPU
target (`tfemb/kernels/install.py`), into `tfemb/kernels/lib/` of the
built package, and the wheel is tagged for this platform; the package then
needs no compiler at run time. Without TensorFlow in the build (pip's
default isolated build) or with `TFEMB_BUILD_KERNELS=0`, the package holds
the sources only and the kernels compile on first use.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install_module():
  """`tfemb.kernels.install` from this source tree, or None (with the
  reason printed) when the kernels are not to be built into the package."""
  if os.environ.get("TFEMB_BUILD_KERNELS", "1").lower() in (
      "0", "false", "no", "off"):
    print("tfemb: TFEMB_BUILD_KERNELS is off: the kernels are not built "
          "into the package", file=sys.stderr)
    return None
  sys.path.insert(0, _HERE)
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    print("tfemb: TensorFlow is not importable in this build (pip's isolated "
          "build: use --no-build-isolation): the kernels are not built into "
          "the package; they compile on first use", file=sys.stderr)
    return None
  from tfemb.kernels import install  # pylint: disable=g-import-not-at-top
  return install


class BuildPyWithKernels(build_py):
  """build_py, then the kernels into the built package (not for an editable
  install, whose kernels compile on first use into the kernel cache)."""

  def run(self):
    super().run()
    if getattr(self, "editable_mode", False):
      return
    install = _install_module()
    if install is None:
      return
    directory = os.path.join(self.build_lib, "tfemb", "kernels", "lib")
    try:
      record = install.write(directory)
    except install.build.KernelUnavailable as e:
      print(f"tfemb: the kernels are not built into the package: {e.reason}"
            f" ({e.log or 'no log'}); they compile on first use",
            file=sys.stderr)
      return
    print("tfemb: kernels built into the package for TensorFlow "
          f"{record['tensorflow']}: " + ", ".join(
              " ".join(b["flags"]) or "default" for b in record["builds"]),
          file=sys.stderr)


class PlatformDistribution(Distribution):
  """A wheel that may hold compiled kernels is tagged for this platform."""

  def has_ext_modules(self):
    return True


setup(cmdclass={"build_py": BuildPyWithKernels},
      distclass=PlatformDistribution)
