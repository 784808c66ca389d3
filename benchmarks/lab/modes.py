"""The same step in several fresh processes: how far apart their medians are.

    python -m benchmarks.lab.modes --optimizer sgd --vocab 100000 --processes 6

On the shared 2-core hosts here the median step of unchanged code differs
between processes by up to 2x (benchmarks/README.md, "A second full run").
Each process, one after another, times the tfemb Keras-layer step of the
suite's workload and then the workload's head alone: the 8 activations
(resource gathers of the batch's ids, as any lookup writes them)
concatenated into Dense(1), mean squared error, forward and backward, no
embedding update and no tfemb. If the head alone moves between processes
as the whole step does, the spread is the machine's, not tfemb's.
"""

import argparse
import json

import numpy as np

from benchmarks import child
from benchmarks import runner
from benchmarks import timing
from benchmarks import workload as workload_lib
from benchmarks.stacks import BY_NAME


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizer", default="sgd",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", type=int, default=100_000)
  p.add_argument("--processes", type=int, default=6)
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--out", help="(child) where to write its JSON")
  return p.parse_args(argv)


HEAD_LR = 0.1


def head_step(work):
  """The workload's head alone: (step(features, labels) -> loss, the
  tables it gathers from, the Dense kernel it trains by SGD)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  tables = [tf.Variable(rng.standard_normal((work.vocab, work.dim),
                                            dtype=np.float32) * 0.01)
            for _ in work.names]
  kernel = tf.Variable(rng.standard_normal((len(tables) * work.dim, 1),
                                           dtype=np.float32) * 0.1)

  @tf.function
  def step(features, labels):
    acts = [tf.gather(t, features[n]) for t, n in zip(tables, work.names)]
    with tf.GradientTape() as tape:
      tape.watch(acts)
      pred = tf.reshape(tf.matmul(tf.concat(acts, 1), kernel), [-1])
      loss = tf.reduce_mean(tf.square(labels - pred))
    grads = tape.gradient(loss, [kernel] + acts)
    kernel.assign_sub(HEAD_LR * grads[0])
    # The activations' gradients are computed, as in a training step; this
    # keeps them from being pruned away.
    return loss + 0.0 * tf.add_n([tf.reduce_sum(g[:1]) for g in grads[1:]])

  return step, tables, kernel


def measure(work, steps: int) -> dict:
  """Median ms of the tfemb layer step and of the head alone."""
  out = {}
  tfemb_step, tensors, _ = child.build(BY_NAME["tfemb"], work)
  for name, step in (("tfemb", tfemb_step), ("head", head_step(work)[0])):
    timing.time_steps(step, tensors, 5)
    out[name] = timing.summary(timing.time_steps(step, tensors, steps, 5))
  return out


def main(argv=None):
  args = parse_args(argv)
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  if args.out:  # one process' measurement
    with open(args.out, "w") as f:
      json.dump(measure(work, args.steps), f)
    return
  print(f"{args.optimizer}, {args.vocab:,} rows per table: median ms "
        "(p10-p90) per fresh process")
  print("process | tfemb Keras step | head alone")
  for i in range(args.processes):
    r = runner.result("benchmarks.lab.modes", [
        "--optimizer", args.optimizer, "--vocab", str(args.vocab),
        "--steps", str(args.steps)], f"process {i + 1}")
    cells = [f"{r[k]['median_ms']:.2f} ({r[k]['p10_ms']:.2f}-"
             f"{r[k]['p90_ms']:.2f})" for k in ("tfemb", "head")]
    print(f"{i + 1} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
  main()
