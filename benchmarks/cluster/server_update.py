"""One parameter server's part of a step's update, timed alone: how long a
server holds its update lock per step (t_s in docs/strategies.md, "Sizing
a cluster").

    python -m benchmarks.cluster.server_update                 # 1 and 2 threads
    python -m benchmarks.cluster.server_update --threads 1,2 --servers 4

The suite's 8 tables (benchmarks/workload.py) as one of `--servers`
parameter servers holds them: the first 1/P of each table's rows, and of
each batch's distinct ids those that fall there, with their summed
gradients. A step's update is what that server runs under the engine's
lock there: each table's shard gathered, updated by the optimizer,
checked and written (`tfemb.host.sharded.shard_updates` under
`UpdateLock.run_per_server`, TensorFlow's ops, as on a server). Each
thread count runs in a process of its own (TensorFlow's inter- and
intra-op pools of that many threads), in alternating rounds; a round times
`--calls` calls of a `tf.function` of the workload's 8 distinct batches'
updates, one after another as under the lock. Prints the median
milliseconds per update for each thread count, and one JSON line, also
written to `--out` (default benchmarks/results/server-update.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import workload as workload_lib
from benchmarks.stacks import REPO

def child(args):
  """Times the updates with `args.child_threads` threads: JSON ms."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_inter_op_parallelism_threads(args.child_threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.child_threads)
  import tfemb  # pylint: disable=g-import-not-at-top
  from tfemb.host import sharded  # pylint: disable=g-import-not-at-top
  from tfemb.host import update_lock  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               batch=args.batch)
  rows = -(-work.vocab // args.servers)  # the first shard's, "div" routing
  opt = {"sgd": tfemb.SGD, "adagrad": tfemb.Adagrad,
         "adam": tfemb.Adam}[work.optimizer](learning_rate=work.learning_rate)
  slots = list(opt._slot_names())  # pylint: disable=protected-access
  tables = [tfemb.TableConfig(work.vocab, work.dim, name=n, optimizer=opt)
            for n in work.names]
  rng = np.random.default_rng(0)
  shards = [{n: tf.Variable(rng.uniform(0.1, 1.0, (rows, work.dim))
                            .astype(np.float32))
             for n in ["parameters"] + slots} for _ in tables]
  steps = []
  for features, _ in work.make_batches():
    step = []
    for name in work.names:
      ids = np.unique(features[name])
      ids = ids[ids < rows]
      step.append((tf.constant(ids), tf.constant(
          1e-3 * rng.standard_normal((len(ids), work.dim), np.float32))))
    steps.append(step)
  lock = update_lock.UpdateLock(tf.distribute.get_strategy())
  device = shards[0]["parameters"].device
  lr = tf.constant(work.learning_rate)

  @tf.function
  def updates():
    for step in steps:  # the workload's distinct batches, one after another
      parts = []
      for table, shard, (ids, grads) in zip(tables, shards, step):
        routes = sharded.Routes([shard], [ids], [grads], [None], tf.size(ids))
        parts += sharded.shard_updates(table, routes, lr)
      assert all(p.device == device for p in parts)
      update_lock.in_order(lambda parts=parts: lock.run_per_server(
          [(p.device, p.apply) for p in parts]))
    return tf.constant(0)

  for _ in range(3):
    updates()
  began = time.perf_counter()
  for _ in range(args.calls):
    updates().numpy()
  seconds = time.perf_counter() - began
  distinct = np.mean([sum(len(ids) for ids, _ in s) for s in steps])
  print(json.dumps({"ms": 1e3 * seconds / (args.calls * len(steps)),
                    "rows": float(distinct)}), flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m benchmarks.cluster.server_update",
                              description=__doc__.splitlines()[0])
  p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")],
                 default=[1, 2])
  p.add_argument("--servers", type=int, default=2)
  p.add_argument("--vocab", type=workload_lib.parse_size, default=100_000)
  p.add_argument("--batch", type=int, default=4096)
  p.add_argument("--optimizer", default="adagrad",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--calls", type=int, default=40)
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--out", default=os.path.join(
      REPO, "benchmarks", "results", "server-update.json"))
  p.add_argument("--child-threads", type=int, default=0)
  args = p.parse_args(argv)
  if args.child_threads:
    child(args)
    return 0
  times = {n: [] for n in args.threads}
  rows = None
  for r in range(args.rounds):
    for n in (args.threads if r % 2 == 0 else args.threads[::-1]):
      out = subprocess.run(
          [sys.executable, "-m", "benchmarks.cluster.server_update",
           *(argv if argv is not None else sys.argv[1:]),
           "--child-threads", str(n)],
          capture_output=True, text=True, check=True)
      result = json.loads(out.stdout.strip().splitlines()[-1])
      times[n].append(result["ms"])
      rows = result["rows"]
      print(f"round {r}, {n} threads: {result['ms']:.2f} ms per update",
            flush=True)
  summary = {"ms_per_update": {str(n): round(statistics.median(t), 3)
                               for n, t in times.items()},
             "rounds": {str(n): [round(x, 3) for x in t]
                        for n, t in times.items()},
             "rows_per_update": rows, "servers": args.servers,
             "optimizer": args.optimizer, "batch": args.batch,
             "argv": argv if argv is not None else sys.argv[1:]}
  with open(args.out, "w") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps(summary), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
