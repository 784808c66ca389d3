"""The embedding step with the slots beside the parameters, or apart.

    python -m experiments.layout                       # Adam, 100k and 5M
    python -m experiments.layout --optimizer adagrad --sizes 5000000
    python -m experiments.layout --order lookups-first \
        --sizes 1000000 5000000

Times the suite's embedding-only step (its 8 tables and Zipf batches, 8
batches per call) on tfemb's fused kernels called directly, with each
table's parameters and slots in

  separate     one [rows, dim] variable each (TensorFlow's layout, and
               tfemb's with the option `interleaved_slots=False`)
  interleaved  one [rows, (1 + slots) x dim] variable (tfemb's default,
               `tfemb.interleaved_tables`; the kernels' `row_width` /
               `interleaved`)

Each (layout, size) runs in its own process, one after another, the two
layouts alternating over `--rounds` (at 5M rows with Adam one layout fills
15 GB, so both cannot share a process). Prints a markdown table: median
step per run, and interleaved / separate of the medians of the runs.
The step is lookup, row-gradient sum and update per table, with a fixed
stand-in gradient: the part of a training step that the layout changes.

`--order` is when a table's update comes:

  per-table      right after that table's own lookup (the default)
  lookups-first  after the lookups of all 8 tables, as in a training step,
                 where a table's gradient needs the whole forward and
                 backward pass: the rows a lookup touched are no longer in
                 the caches (and the address translations) when they are
                 updated
"""

import argparse
import time

import numpy as np

from benchmarks import cli
from benchmarks import runner
from benchmarks import workload as workload_lib

LAYOUTS = ("separate", "interleaved")
ORDERS = ("per-table", "lookups-first")
WARMUP_CALLS = 3  # the first traces and backs the tables with huge pages


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizer", default="adam",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--sizes", type=int, nargs="+",
                 default=[100_000, 5_000_000])
  p.add_argument("--rounds", type=int, default=2,
                 help="processes per layout and size (alternating)")
  p.add_argument("--calls", type=int, default=40,
                 help="timed calls of 8 steps per process")
  p.add_argument("--order", choices=ORDERS, default=ORDERS[0],
                 help="when a table's update comes (see above)")
  p.add_argument("--layout", choices=LAYOUTS,
                 help="(child) time this layout at --sizes[0]")
  p.add_argument("--out", help="(child) where to write its JSON")
  return p.parse_args(argv)


def make_steps(tables, variables, batches, names, lr, row_width: int,
               order: str, library=None):
  """A `tf.function` running the embedding step on every batch.

  `batches`: (ids, stand-in gradients) per batch, one tensor per table;
  `row_width` > 0: the tables hold their slots beside the parameters.
  With `order` "per-table" each table is updated right after its own
  lookup; with "lookups-first" every update of a batch waits for every
  lookup of it (through the sum of one value of each). `library`: another
  build of the kernels (experiments/kernel_ab.py); by default tfemb's.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from experiments import kernel_calls  # pylint: disable=g-import-not-at-top

  library = library or kernel_calls.default_library()

  def update(t, unique, positions, grads):
    row_grads, _ = kernel_calls.row_gradients(library, tables[t], grads,
                                              positions, unique)
    kernel_calls.apply_rows(library, tables[t], variables[t], unique,
                            row_grads, lr, interleaved=row_width > 0)

  @tf.function
  def steps():
    total = tf.constant(0.0)
    for ids, grads in batches:
      looked_up = []
      for t, table in enumerate(tables):
        unique, positions, rows = kernel_calls.dedup_gather(
            library, table, variables[t]["parameters"], [ids[t]],
            [names[t]], row_width=row_width)
        total += rows[0, 0]
        if order == "per-table":
          update(t, unique, positions, grads[t])
        else:
          looked_up.append((unique, positions))
      with tf.control_dependencies([total]):  # every lookup of the batch
        for t, (unique, positions) in enumerate(looked_up):
          update(t, unique, positions, grads[t])
    return total

  return steps


def _child(args) -> dict:
  """Builds the tables in one layout and times the embedding step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top

  work = workload_lib.Workload(vocab=args.sizes[0], optimizer=args.optimizer)
  interleaved = args.layout == "interleaved"
  columns = (1 + work.slots) if interleaved else 1
  tables, variables = [], []
  for name in work.names:
    table = tfemb.TableConfig(work.vocab, work.dim, name=f"table_{name}",
                              optimizer=tfemb_common.optimizer(work))
    tables.append(table)
    with tf.device("/CPU:0"):
      if interleaved:
        variables.append({"parameters": tf.Variable(
            tf.zeros([work.vocab, columns * work.dim]))})
      else:
        variables.append({n: tf.Variable(tf.zeros([work.vocab, work.dim]))
                          for n in ["parameters"] +
                          table.optimizer._slot_names()})  # pylint: disable=protected-access
  rng = np.random.default_rng(work.seed)
  batches = [([tf.constant(features[n]) for n in work.names],
              [tf.constant(1e-3 * rng.standard_normal(
                  (work.batch, work.dim), dtype=np.float32))
               for _ in work.names])
             for features, _ in work.make_batches()]
  lr = tf.constant(work.learning_rate)
  steps = make_steps(tables, variables, batches, work.names, lr,
                     columns * work.dim if interleaved else 0, args.order)

  for _ in range(WARMUP_CALLS):
    steps().numpy()
  times = []
  for _ in range(args.calls):
    t0 = time.perf_counter()
    steps().numpy()
    times.append((time.perf_counter() - t0) / len(batches) * 1e3)
  return {"layout": args.layout, "order": args.order, "vocab": work.vocab,
          "optimizer": args.optimizer, "median_ms": float(np.median(times)),
          "p10_ms": float(np.quantile(times, .1)),
          "p90_ms": float(np.quantile(times, .9))}


def _parent(args):
  print(f"Embedding step ({args.optimizer}, 8 tables, batch 4096, updates "
        f"{args.order}), median ms per step of each process:\n")
  print("| rows per table | separate | interleaved | interleaved / separate |")
  print("|---:|---|---|---:|")
  for size in args.sizes:
    medians = {k: [] for k in LAYOUTS}
    for r in range(args.rounds):
      for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
        result = runner.result("experiments.layout", [
            "--layout", layout, "--sizes", str(size), "--optimizer",
            args.optimizer, "--calls", str(args.calls), "--order",
            args.order], f"{layout} at {size}")
        medians[layout].append(result["median_ms"])
    ratio = np.median(medians["interleaved"]) / np.median(medians["separate"])
    cells = [" / ".join(f"{m:.2f}" for m in medians[k]) for k in LAYOUTS]
    print(f"| {size:,} | {cells[0]} | {cells[1]} | {ratio:.2f} |", flush=True)


def main(argv=None):
  args = parse_args(argv)
  if args.layout is None:
    _parent(args)
    return
  cli.write_json(args.out, _child(args))


if __name__ == "__main__":
  main()
