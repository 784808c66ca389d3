"""`python -m tfemb.kernels`: builds the fused CPU kernels now (CI and
install scripts run it so that the first training step does not), for the
options the environment gives (`tfemb.options`)."""

import sys

from tfemb import options
from tfemb.kernels import build


def main() -> int:
  opts = options.get()
  if not opts.fused_kernels:
    print("tfemb fused kernels: disabled (fused_kernels=False, from "
          "TFEMB_FUSED_KERNELS)")
    return 0
  try:
    path = build.build(opts)
  except build.KernelUnavailable as e:
    print(f"tfemb fused kernels: not built ({e}); TensorFlow ops are used")
    return 0
  print(f"tfemb fused kernels: {path}")
  return 0 if build.load(opts) is not None else 1


if __name__ == "__main__":
  sys.exit(main())
