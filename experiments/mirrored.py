"""The suite's Keras step under MirroredStrategy, with and without the kernels.

    python -m experiments.mirrored --sizes 100000 1000000 --rounds 2

A script written for TPUStrategy or several GPUs often runs on a CPU host
as `MirroredStrategy()`: one replica, the tables mirrored variables. Each
process, one after another (the modes alternate in every round), times the
suite's tfemb Keras-layer step (`benchmarks.stacks.tfemb_layer`, the
workload of `benchmarks.compare`) in one of these modes:

* `plain`: no strategy, the default (Adagrad's and Adam's slots interleaved
  with the parameters);
* `plain-separate`: no strategy, each table and slot its own variable
  (the option `interleaved_slots=False`), the layout mirrored tables have;
* `mirrored`: under `MirroredStrategy(["/cpu:0"])`, the fused kernels on
  the replica's copy;
* `mirrored-tf-ops`: the same with the option `fused_kernels=False`:
  TensorFlow's ops, as where the kernels cannot be used (tables on GPUs,
  no compiler).

It prints the median step of each and the ratios `mirrored-tf-ops /
mirrored` and `mirrored / plain-separate`, measured in the same minutes.
"""

import argparse
import json

from benchmarks import runner
from benchmarks import timing
from benchmarks import workload as workload_lib

MODES = {  # the `tfemb.options` of each mode's layer
    "plain": {},
    "plain-separate": {"interleaved_slots": False},
    "mirrored": {},
    "mirrored-tf-ops": {"fused_kernels": False},
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizers", nargs="+", default=list(
      workload_lib.OPTIMIZERS), choices=workload_lib.OPTIMIZERS)
  p.add_argument("--sizes", nargs="+", type=workload_lib.parse_size,
                 default=[100_000, 1_000_000])
  p.add_argument("--rounds", type=int, default=1)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--mode", choices=list(MODES), help="(child) which mode")
  p.add_argument("--out", help="(child) where to write its JSON")
  return p.parse_args(argv)


def build_step(mode: str, work):
  """The suite's traced Keras step(features, labels) -> loss in `mode`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_layer  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  with tfemb.options.use(**MODES[mode]):  # taken by the layer's engine
    if not mode.startswith("mirrored"):
      return tfemb_layer.build(work)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
      step = tfemb_layer.build(work)

  @tf.function
  def replicated(features, labels):
    loss = strategy.run(step, args=(features, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

  return replicated


def measure(mode: str, work, steps: int) -> dict:
  """Median ms of the suite's Keras step in `mode`."""
  run = build_step(mode, work)
  tensors = timing.to_tensors(work.make_batches())
  timing.time_steps(run, tensors, 5)
  return timing.summary(timing.time_steps(run, tensors, steps, 5))


def main(argv=None):
  args = parse_args(argv)
  if args.out:  # one process' measurement
    work = workload_lib.Workload(vocab=args.sizes[0],
                                 optimizer=args.optimizers[0])
    with open(args.out, "w") as f:
      json.dump(measure(args.mode, work, args.steps), f)
    return
  print("median ms per step (p10-p90), each mode in its own process")
  print("optimizer | rows | round | " + " | ".join(MODES) +
        " | tf-ops / mirrored | mirrored / plain-separate")
  for opt in args.optimizers:
    for size in args.sizes:
      for r in range(args.rounds):
        modes = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
        got = {}
        for mode in modes:
          got[mode] = runner.result("experiments.mirrored", [
              "--mode", mode, "--optimizers", opt, "--sizes", str(size),
              "--steps", str(args.steps)], f"{opt} {size} {mode}")
        cells = [f"{got[m]['median_ms']:.2f} ({got[m]['p10_ms']:.2f}-"
                 f"{got[m]['p90_ms']:.2f})" for m in MODES]
        med = {m: got[m]["median_ms"] for m in MODES}
        print(f"{opt} | {workload_lib.format_size(size)} | {r + 1} | " +
              " | ".join(cells) +
              f" | {med['mirrored-tf-ops'] / med['mirrored']:.1f}x"
              f" | {med['mirrored'] / med['plain-separate']:.2f}x",
              flush=True)


if __name__ == "__main__":
  main()
