"""Memory of a checkpoint save and restore, per table layout.

`python -m benchmarks.lab.save_memory [--tables 8 --rows 1000000 --dim 32]`
runs, each in its own process, the same Adam tables with the slots in
variables of their own (the option `interleaved_slots=False`) and beside
the parameters (`True`): build, 3 training steps, `tf.train.Checkpoint.write`,
then a restore into the same tables. For each it prints RSS before the save,
the peak (VmHWM) during the save and during the restore, and the seconds,
and checks that the tables are unchanged by the save and equal after the
restore. The peaks are what the layouts cost beyond the tables and slots;
the machine's noise does not touch them.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import procmem

GIB = procmem.GIB


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tables", type=int, default=8)
  p.add_argument("--rows", type=int, default=1_000_000)
  p.add_argument("--dim", type=int, default=32)
  p.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
  p.add_argument("--out", help=argparse.SUPPRESS)
  return p.parse_args(argv)


def reset_peak():
  """Starts VmHWM again from the current RSS (Linux >= 4.0)."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


def child(args):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  names = [f"t{i}" for i in range(args.tables)]
  with tfemb.options.use(interleaved_slots=args.child == "1"):
    embedding = tfemb.TPUEmbedding(
        {n: tfemb.FeatureConfig(tfemb.TableConfig(args.rows, args.dim,
                                                  name=n))
         for n in names}, tfemb.Adam(learning_rate=0.01))
  embedding.build()
  rng = np.random.default_rng(0)
  for _ in range(3):
    features = {n: tf.constant(rng.integers(0, args.rows, 4096)) for n in names}
    embedding.enqueue(features, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients(tf.nest.map_structure(tf.ones_like, activations))
  sample = rng.integers(0, args.rows, 1000)

  def rows():
    return {(t, k): tf.gather(v, sample).numpy()
            for t, slots in embedding._variables.items()  # pylint: disable=protected-access
            for k, v in slots.items()}

  before, result = rows(), {"rss_before": procmem.rss()}
  prefix = os.path.join(args.out, f"ckpt{args.child}")
  checkpoint = tf.train.Checkpoint(embedding=embedding)
  reset_peak()
  began = time.perf_counter()
  checkpoint.write(prefix)
  result.update(save_s=time.perf_counter() - began,
                save_peak=procmem.peak_rss(), rss_after_save=procmem.rss())
  unchanged = all(np.array_equal(before[k], v) for k, v in rows().items())
  for slots in embedding._variables.values():  # pylint: disable=protected-access
    for v in slots.values():
      v.assign(tf.zeros_like(v))
  reset_peak()
  began = time.perf_counter()
  checkpoint.read(prefix).assert_consumed()
  result.update(restore_s=time.perf_counter() - began,
                restore_peak=procmem.peak_rss())
  result["ok"] = unchanged and all(
      np.array_equal(before[k], v) for k, v in rows().items())
  print(json.dumps(result))


def main(argv=None):
  args = parse(argv if argv is not None else sys.argv[1:])
  if args.child:
    return child(args)
  bytes_ = args.tables * args.rows * args.dim * 4 * 3  # parameters, 2 slots
  print(f"{args.tables} Adam tables of {args.rows:,} x {args.dim}: tables "
        f"and slots {bytes_ / GIB:.2f} GiB\n")
  print("| layout | RSS before | peak saving | save | peak restoring | "
        "restore | tables equal |\n|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as out:
    for flag, layout in (("0", "separate"), ("1", "interleaved")):
      done = subprocess.run(
          [sys.executable, "-m", "benchmarks.lab.save_memory", "--child", flag,
           "--out", out, "--tables", str(args.tables), "--rows",
           str(args.rows), "--dim", str(args.dim)],
          capture_output=True, text=True, check=False)
      if done.returncode != 0:
        print(f"| {layout} | failed: {done.stderr[-500:]!r} |")
        continue
      r = json.loads(done.stdout.strip().splitlines()[-1])
      print(f"| {layout} | {r['rss_before'] / GIB:.2f} GiB | "
            f"{r['save_peak'] / GIB:.2f} GiB | {r['save_s']:.1f} s | "
            f"{r['restore_peak'] / GIB:.2f} GiB | {r['restore_s']:.1f} s | "
            f"{'yes' if r['ok'] else 'NO'} |", flush=True)
      for name in os.listdir(out):
        os.remove(os.path.join(out, name))
  return 0


if __name__ == "__main__":
  sys.exit(main())
