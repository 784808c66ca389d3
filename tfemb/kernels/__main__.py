"""`python -m tfemb.kernels`: loads the fused CPU kernels as a training
process would (compiling them first if that is where they come from, so
that the first training step does not) and says which build was loaded,
for which target, or why none. Exits 1 when none can be had.

Options come from the environment (`tfemb.options`), e.g.
`TFEMB_KERNEL_MARCH=x86-64-v3 python -m tfemb.kernels`; `--verbose` adds
the compiler's first error for each target that did not compile.
"""

import argparse
import sys

from tfemb import options
from tfemb.kernels import build
from tfemb.kernels import packaged


def describe(result: build.Loaded, verbose: bool = False) -> str:
  """One line on what `build.loaded` gave; with `verbose`, a line more for
  each target that did not compile, with the compiler's first error."""
  if result.error is not None:
    return result.error.warning()
  if result.module is None:
    return ("tfemb fused kernels: off (fused_kernels=False, e.g. "
            "TFEMB_FUSED_KERNELS=0): TensorFlow's ops are used")
  origin = {"package": "the package's build",
            "cache": "compiled here, from the kernel cache"}[result.origin]
  target = " ".join(result.flags) or "the compiler's default target"
  text = f"tfemb fused kernels: {origin}, for {target}: {result.path}"
  tried = [" ".join(a["flags"]) or "the default target"
           for a in result.attempts]
  if tried and not verbose:
    text += (f" ({', '.join(tried)} did not compile: python -m "
             "tfemb.kernels --verbose says why)")
  for flags, attempt in zip(tried, result.attempts if verbose else []):
    text += f"\n  {flags} did not compile: {attempt['error']}"
  return text


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m tfemb.kernels",
      description="Loads tfemb's fused CPU kernels (compiling them if "
      "needed) and says which build is used, or why none.")
  parser.add_argument("-v", "--verbose", action="store_true",
                      help="the compiler's first error for each target "
                      "that did not compile")
  args = parser.parse_args(argv)
  opts = options.get()
  found = packaged.manifest()
  if found:
    print(f"packaged builds: for TensorFlow {found.get('tensorflow')}: " +
          ", ".join(b["march"] or "default" for b in found.get("builds", [])))
  else:
    print("packaged builds: none (a source checkout, or installed without "
          "TensorFlow in the build environment)")
  result = build.loaded(opts)
  print(describe(result, args.verbose))
  return 1 if result.error is not None else 0


if __name__ == "__main__":
  sys.exit(main())
