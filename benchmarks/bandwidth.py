"""The machine's memory bandwidth, measured in the same run as the stacks.

    python -m benchmarks.bandwidth --out bandwidth.json

Copy bandwidth counts the bytes read plus the bytes written (as STREAM's
copy): a 256 MiB float32 array copied by numpy (one thread) and by a
TensorFlow elementwise op (all intra-op threads); the best is the
bandwidth the traffic bound uses. Also measured, for context: random 128-byte
row gathers (the access pattern of an embedding step) from a 256 MiB table.
"""

import argparse
import time

import numpy as np

from benchmarks import cli


def _best_seconds(fn, repeats):
  fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


class Copier:
  """Copy bandwidth, measured again on demand: a `mib` MiB float32 array
  copied by numpy (one thread) and by a TensorFlow elementwise op (all
  intra-op threads), allocated once."""

  def __init__(self, mib: int = 256):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    n = mib * 1024 * 1024 // 4
    self.src = np.random.default_rng(0).random(n, dtype=np.float32)
    self._dst = np.empty_like(self.src)
    self._x = tf.constant(self.src)
    self._scale = tf.function(lambda t: t * 1.0)

  def measure(self, repeats: int) -> dict:
    """GB/s read + written, the best of `repeats` copies each way."""
    moved = 2 * self.src.nbytes
    numpy_s = _best_seconds(lambda: np.copyto(self._dst, self.src), repeats)
    tf_s = _best_seconds(lambda: self._scale(self._x).numpy().shape, repeats)
    numpy_gbps, tf_gbps = moved / numpy_s / 1e9, moved / tf_s / 1e9
    return {"numpy_copy_gbps": numpy_gbps, "tf_copy_gbps": tf_gbps,
            "copy_gbps": max(numpy_gbps, tf_gbps)}


def measure(mib: int = 256, repeats: int = 7) -> dict:
  copier = Copier(mib)
  out = copier.measure(repeats)
  table = copier.src.reshape(-1, 32)  # 128-byte rows
  ids = np.random.default_rng(1).integers(0, len(table), 65536)
  gather_s = _best_seconds(lambda: np.take(table, ids, axis=0), repeats)
  out["row_gather_gbps"] = 2 * ids.size * 128 / gather_s / 1e9
  return out


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def main(argv=None):
  cli.main(parse_args, lambda args: measure(), argv)


if __name__ == "__main__":
  main()
