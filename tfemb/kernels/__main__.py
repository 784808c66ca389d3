"""`python -m tfemb.kernels`: builds the fused CPU kernels now (CI and
install scripts run it so that the first training step does not)."""

import sys

from tfemb.kernels import build


def main() -> int:
  if not build.enabled():
    print("tfemb fused kernels: disabled by TFEMB_FUSED_KERNELS")
    return 0
  try:
    path = build.build()
  except build.KernelUnavailable as e:
    print(f"tfemb fused kernels: not built ({e}); TensorFlow ops are used")
    return 0
  print(f"tfemb fused kernels: {path}")
  return 0 if build.load() is not None else 1


if __name__ == "__main__":
  sys.exit(main())
