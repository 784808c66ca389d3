"""tfemb beside Keras `Embedding` on a cluster of processes on 127.0.0.1.

    python -m benchmarks.cluster --quick    # ~6 min: ps and mwms, 100k rows
    python -m benchmarks.cluster            # 1M rows, more steps
    python -m benchmarks.cluster --strategies ps --optimizers adam --vocab 1M
    python -m benchmarks.cluster --simulate-workers 1,2,4,8   # scaling

With `--simulate-workers` it measures instead how parameter servers scale
with workers, tfemb's update beside the cluster-wide lock it replaced
(benchmarks/cluster/simulate.py).

For each strategy, stack and optimizer it starts a fresh cluster:

* `ps`: `ParameterServerStrategy`: a coordinator, `--workers` workers and
  `--ps` parameter servers, each its own process. The coordinator trains
  with tf_keras `model.fit` and a `DatasetCreator`; every variable over
  `--min-shard-bytes` (1 MiB: the tables) is sharded over the parameter servers
  (`MinSizePartitioner`).
* `mwms`: `MultiWorkerMirroredStrategy`: `--workers` worker processes, each
  with every table, `model.fit` on the global batch.

The workload is the suite's (benchmarks/workload.py: 8 tables x dim 32,
batch 4096 of Zipf ids, `Dense(1)` head, mean squared error). The stacks
are `tfemb` (tfemb's Keras layer, tables trained by tfemb.SGD / Adagrad /
Adam) and `keras` (`tf.keras.layers.Embedding` per feature, trained by the
Keras optimizer of the same kind, which applies the sparse `IndexedSlices`
updates where the variables are). The head is trained by that Keras
optimizer in both. All of it runs under tf_keras (`TF_USE_LEGACY_KERAS=1`):
Keras 3's `fit` supports neither strategy.

One process (the coordinator; worker 0 under `mwms`) times `--epochs`
epochs of `--steps` steps after a warm-up epoch, and reads for every
process of the cluster the TCP bytes its sockets sent and received over
those epochs (`ss -tinpHe`, benchmarks/procnet.py) and its peak RSS
(VmHWM). A step is one batch of 4096 examples: on one worker under `ps`,
over all workers under `mwms`. Writes `results.json` and `results.md` to
`--out`; the last line printed is `cluster: ...` with the ratios
tfemb / Keras. Exits 1 when a run fails.

The modules: `launch` starts and watches the cluster's processes, `node` is
what each of them runs, `meter` measures the timed epochs, `report` writes
the tables and the ratios; this one is the command line and the driver.
"""

import argparse
import json
import os
import sys
import time

from benchmarks import workload as workload_lib
from benchmarks.cluster import node
from benchmarks.cluster import report
from benchmarks.cluster import simulate
from benchmarks.cluster.launch import (Processes, coordinate, last_json,
                                       ps_cluster, run_mwms, run_ps,
                                       start_servers, wait)
from benchmarks.stacks import REPO

# The command line, and what a test starts a cluster of its own with.
__all__ = ["main", "parse_args", "Processes", "coordinate", "last_json",
           "ps_cluster", "start_servers", "wait"]
STACKS = ("tfemb", "keras")
STRATEGIES = ("ps", "mwms")


def drive(args) -> int:
  os.makedirs(args.out, exist_ok=True)
  results = []
  for strategy in args.strategies:
    optimizers = args.optimizers if strategy == "ps" else args.mwms_optimizers
    for optimizer in optimizers:
      for stack in args.stacks:
        name = f"{strategy}-{optimizer}-{stack}"
        log_dir = os.path.join(args.out, name)
        began = time.monotonic()
        try:
          run = run_ps if strategy == "ps" else run_mwms
          result = dict(run(args, stack, optimizer, log_dir), status="ok")
        except Exception as e:  # pylint: disable=broad-except
          result = {"status": "failed", "error": str(e), "logs": log_dir,
                    "stack": stack, "optimizer": optimizer}
        result.update(strategy=strategy, wall_s=time.monotonic() - began)
        results.append(result)
        brief = (f"{report.totals(result)['steps_per_s']:.2f} steps/s, "
                 f"{report.mib(report.totals(result)['bytes_per_step'])} "
                 "MiB/step"
                 if result["status"] == "ok" else result["error"][-2000:])
        print(f"{name}: {brief} ({result['wall_s']:.0f} s)", flush=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"argv": args.argv, "results": results}, f, indent=1)
  text = report.markdown(args, results)
  with open(os.path.join(args.out, "results.md"), "w") as f:
    f.write(text)
  print(text)
  print(report.summary_line(results), flush=True)
  return 0 if all(r["status"] == "ok" for r in results) else 1


def parse_args(argv=None):
  p = argparse.ArgumentParser(prog="python -m benchmarks.cluster",
                              description=__doc__.splitlines()[0])
  p.add_argument("--role", default="driver",
                 choices=["driver", "server", "coordinator", "mwms-worker",
                          "single", "simulate"])
  p.add_argument("--quick", action="store_true",
                 help="small tables, few steps (a few minutes)")
  p.add_argument("--strategies", type=lambda s: s.split(","),
                 default=list(STRATEGIES))
  p.add_argument("--stacks", type=lambda s: s.split(","), default=list(STACKS))
  p.add_argument("--optimizers", type=lambda s: s.split(","),
                 default=list(workload_lib.OPTIMIZERS))
  p.add_argument("--mwms-optimizers", type=lambda s: s.split(","),
                 default=None, help="default: adagrad")
  p.add_argument("--vocab", type=workload_lib.parse_size, default=None,
                 help="rows per table (default 1M; --quick 100k)")
  p.add_argument("--batch", type=int, default=4096)
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--ps", type=int, default=2)
  p.add_argument("--steps", type=int, default=None,
                 help="steps per epoch (default 50; --quick 20)")
  p.add_argument("--epochs", type=int, default=2, help="timed epochs")
  p.add_argument("--warmup-epochs", type=int, default=1)
  p.add_argument("--steps-per-execution", type=int, default=1,
                 help="tf_keras fit's steps per scheduled function")
  p.add_argument("--id-stride", type=int, default=1)
  p.add_argument("--min-shard-bytes", type=int, default=1 << 20,
                 help="variables under this are not sharded")
  p.add_argument("--timeout", type=float, default=900)
  p.add_argument("--out", default=None)
  # The simulation of workers (simulate.py):
  p.add_argument("--simulate-workers", default=None,
                 type=lambda s: [int(w) for w in s.split(",")],
                 help="numbers of workers, e.g. 1,2,4,8: measure scaling")
  p.add_argument("--dense-ms", type=float, default=200.0,
                 help="the wait standing in for a step's dense part")
  p.add_argument("--steps-per-call", type=int, default=4,
                 help="steps per scheduled function")
  p.add_argument("--sim-calls", type=int, default=12,
                 help="timed calls per worker")
  p.add_argument("--rounds", type=int, default=2,
                 help="rounds of both designs per number of workers")
  # In the cluster:
  p.add_argument("--stack", choices=STACKS)
  p.add_argument("--optimizer", choices=workload_lib.OPTIMIZERS)
  p.add_argument("--cluster")
  p.add_argument("--job")
  p.add_argument("--index", type=int)
  p.add_argument("--pids-file", default="")
  p.add_argument("--memory-margin", type=int, default=0)
  p.add_argument("--check-bytes", type=int, default=0)
  p.add_argument("--save", default="")
  p.add_argument("--restore", default="")
  p.add_argument("--checkpoint-dir", default="")
  args = p.parse_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)
  if args.vocab is None:
    args.vocab = (100_000 if args.quick or args.simulate_workers
                  else 1_000_000)
  if args.steps is None:
    args.steps = 20 if args.quick else 50
  if args.mwms_optimizers is None:
    args.mwms_optimizers = ["adagrad"]
  if args.simulate_workers:
    args.optimizer = args.optimizer or "adagrad"
    args.logs = os.path.join(args.out or "/tmp", "tfemb_cluster_simulated")
    args.out = args.out or os.path.join(REPO, "benchmarks", "results")
  if args.out is None:
    args.out = ("/tmp/tfemb_cluster_quick" if args.quick
                else os.path.join(REPO, "benchmarks", "results", "cluster"))
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.role == "server":
    node.server(args)
  elif args.role in ("coordinator", "mwms-worker"):
    node.train(args)
  elif args.role == "single":
    node.single(args)
  elif args.role == "simulate":
    simulate.coordinator(args)
  elif args.simulate_workers:
    return simulate.run(args)
  else:
    return drive(args)
  return 0
