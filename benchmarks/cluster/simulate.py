"""Parameter servers' scaling with workers, simulated on one machine.

    python -m benchmarks.cluster --simulate-workers 1,2,4,8

For each number of workers W it starts a `ParameterServerStrategy` cluster
on 127.0.0.1 (2 parameter servers, W workers) and, on it, a coordinator per
design and round, the designs alternating which goes first:

* `per-server locks`: tfemb's update, each shard's rows updated under the
  engine's lock on the shard's own server;
* `cluster lock`: the whole step's update under one lock on the first
  parameter server (`TFEMB_CLUSTER_UPDATE_LOCK=1`), the baseline.

The coordinator trains the suite's tables (benchmarks/workload.py: 8 tables
x dim 32 of `--vocab` rows, sharded over both servers; Zipf ids in batches
of `--batch`, Adagrad by default) with the mid-level API through
`ClusterCoordinator.schedule`, `--steps-per-call` steps per scheduled
function. In a step the worker looks its batch up, then waits `--dense-ms`
without using its CPU, standing in for the model's dense part on a machine
of its own (a `SleepDataset` between the activations and their gradients),
then sends the update. What the workers' CPUs would do in the dense part
is thus taken out, and the servers, the update's locks and the protocol
are what is measured (each worker still deduplicates its ids and sums its
gradients, on the cores every process shares here).

Steps/s per (W, design) is the median of `--rounds` rounds, each over
`--sim-calls` x W scheduled calls after a warm-up; CPU per step and TCP
bytes per step are of the median round. The last line printed is one JSON
object, `{"steps_per_s": {"1": ..}, "design": "per-shard locks",
"baseline": {"steps_per_s": {..}, "design": "cluster lock"}, ..}`, also
written to `--out` (default benchmarks/results/cluster-simulated.json,
with a table in cluster-simulated.md).
"""

import json
import os
import statistics
import time

from benchmarks import workload as workload_lib
from benchmarks.cluster import launch
from benchmarks.cluster import meter
from benchmarks.cluster import report

# The designs, by the value of the switch between them
# (`tfemb.options.Options.cluster_update_lock`); the first is tfemb's.
DESIGNS = {"per-server locks": "0", "cluster lock": "1"}
NUM_PS = 2


def dense_stand_in(activations, wait_us: int):
  """`activations`, handed back after `wait_us` microseconds in which this
  worker's CPU does nothing (TensorFlow's `SleepDataset`, in the step's
  graph, so it runs where the step runs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.data.experimental.ops import testing  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  # take(1): get_single_element would ask for a second element, which
  # sleeps too before it finds none.
  return tf.data.Dataset.from_tensors(activations).apply(
      testing.sleep(wait_us)).take(1).get_single_element()


def coordinator(args):
  """One design's run on the cluster's running servers: prints its JSON."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               batch=args.batch)
  cluster = json.loads(args.cluster)
  strategy = tf.distribute.experimental.ParameterServerStrategy(
      tf.distribute.cluster_resolver.SimpleClusterResolver(
          tf.train.ClusterSpec(cluster), rpc_layer="grpc"),
      variable_partitioner=(
          tf.distribute.experimental.partitioners.MinSizePartitioner(
              min_shard_bytes=args.min_shard_bytes,
              max_shards=len(cluster["ps"]))))
  coord = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    embedding = tfemb.TPUEmbedding(tfemb_common.feature_config(work),
                                   tfemb_common.optimizer(work))
    embedding.build()

  def dataset_fn():
    batches = work.make_batches()
    return tf.data.Dataset.from_tensor_slices(
        {n: np.concatenate([f[n] for f, _ in batches]) for n in work.names}
    ).batch(work.batch, drop_remainder=True).repeat()

  iterator = iter(coord.create_per_worker_dataset(dataset_fn))
  wait_us = int(args.dense_ms * 1000)

  @tf.function
  def steps(it):
    for _ in range(args.steps_per_call):
      embedding.enqueue(next(it), training=True)
      activations = dense_stand_in(embedding.dequeue(), wait_us)
      # The gradient of 0.5e-3 x the activations' squared norm.
      embedding.apply_gradients(
          {n: 1e-3 * a for n, a in activations.items()})
    return tf.constant(0)

  workers = len(cluster["worker"])
  for _ in range(2 * workers):  # every worker traced and warm
    coord.schedule(steps, args=(iterator,))
  coord.join()
  window = meter.Window(args.pids_file)
  calls = args.sim_calls * workers
  for _ in range(calls):
    coord.schedule(steps, args=(iterator,))
  coord.join()
  result = window.result(calls * args.steps_per_call)
  tables = embedding.embedding_tables
  result["shards"] = {t.name: len(v.variables) for t, v in tables.items()}
  result["finite"] = bool(all(np.isfinite(tf.convert_to_tensor(v).numpy())
                              .all() for v in tables.values()))
  print(json.dumps(result), flush=True)


def run(args) -> int:
  """Every W, round and design; the results and the JSON line."""
  os.makedirs(args.out, exist_ok=True)
  runs = []
  for workers in args.simulate_workers:
    layout = launch.ps_cluster(launch.free_ports(NUM_PS + workers), NUM_PS)
    log_dir = os.path.join(args.logs, f"workers{workers}")
    with launch.Processes(log_dir) as procs:
      launch.start_servers(procs, layout)
      for r in range(args.rounds):
        order = list(DESIGNS) if (r + workers) % 2 else list(DESIGNS)[::-1]
        for design in order:
          kind = "servers" if DESIGNS[design] == "0" else "lock"
          name = f"coordinator-{kind}{r}"
          began = time.monotonic()
          result = launch.coordinate(
              procs, layout, args, "tfemb", args.optimizer, name=name,
              role="simulate", environment=launch.env(
                  TFEMB_CLUSTER_UPDATE_LOCK=DESIGNS[design]))
          runs.append(dict(result, workers=workers, design=design,
                           round=r))
          print(f"{workers} workers, {design}, round {r}: "
                f"{result['steps_per_s']:.2f} steps/s "
                f"({time.monotonic() - began:.0f} s)", flush=True)
  summary, detail = summarize(args, runs)
  with open(os.path.join(args.out, "cluster-simulated.json"), "w") as f:
    json.dump(dict(summary, argv=args.argv, detail=detail, runs=runs), f,
              indent=1)
  text = markdown(args, summary, detail)
  with open(os.path.join(args.out, "cluster-simulated.md"), "w") as f:
    f.write(text)
  print(text)
  print(json.dumps(summary), flush=True)
  return 0 if all(r["finite"] for r in runs) else 1


def summarize(args, runs):
  """`(summary, detail)`: the JSON line (steps/s by W of each design, the
  model's), and by design and W each round's steps/s, CPU and bytes."""
  detail = {d: _detail(args, [r for r in runs if r["design"] == d])
            for d in DESIGNS}
  main, baseline = list(DESIGNS)
  summary = {
      "steps_per_s": _rates(detail[main]), "design": main,
      "baseline": {"steps_per_s": _rates(detail[baseline]),
                   "design": baseline},
      "model": _model(args, detail[main]), "dense_ms": args.dense_ms,
      "batch": args.batch, "optimizer": args.optimizer,
      "cores": os.cpu_count()}
  return summary, detail


def _detail(args, runs) -> dict:
  """By W: steps/s of each round and their median, and the CPU (by group
  of processes) and bytes per step of the median round."""
  out = {}
  for workers in args.simulate_workers:
    mine = sorted((r for r in runs if r["workers"] == workers),
                  key=lambda r: r["steps_per_s"])
    median = mine[len(mine) // 2]
    out[str(workers)] = {
        "steps_per_s": round(statistics.median(
            r["steps_per_s"] for r in mine), 2),
        "rounds": [round(r["steps_per_s"], 2) for r in mine],
        "cpu_ms_per_step": _cpu_by_group(median),
        "bytes_per_step": report.totals(median)["bytes_per_step"]}
  return out


def _rates(detail) -> dict:
  return {w: d["steps_per_s"] for w, d in detail.items()}


def _model(args, detail) -> dict:
  """The sizing model on this machine: W x one worker's steps/s, at most
  the cores over all the processes' CPU per step (one worker's run)."""
  one = detail[str(min(args.simulate_workers))]
  per_worker = one["steps_per_s"] / min(args.simulate_workers)
  cpu_s = sum(one["cpu_ms_per_step"].values()) / 1e3
  return {w: round(min(int(w) * per_worker, os.cpu_count() / cpu_s), 2)
          for w in detail}


def _cpu_by_group(result) -> dict:
  groups = {}
  for name, p in result["per_process"].items():
    group = ("servers" if name.startswith("ps") else
             "workers" if name.startswith("worker") else "coordinator")
    groups[group] = groups.get(group, 0.0) + p["cpu_s_per_step"] * 1e3
  return {g: round(ms, 1) for g, ms in sorted(groups.items())}


def markdown(args, summary, detail) -> str:
  lines = [f"`python -m benchmarks.cluster {' '.join(args.argv)}`", "",
           f"{NUM_PS} parameter servers, 8 tables of {args.vocab} rows x dim "
           f"32 ({args.optimizer}), batch {args.batch}, a wait of "
           f"{args.dense_ms:g} ms per step for the dense part, "
           f"{args.steps_per_call} steps per scheduled call; every process "
           f"on the {os.cpu_count()} cores of one machine. The model: W x "
           "one worker's steps/s, at most the cores over the CPU per step "
           "of all the processes.", "",
           "| workers | design | steps/s (rounds) | x one worker | model | "
           "CPU ms per step: workers / servers / coordinator | "
           "MiB sent per step |",
           "|---|---|---|---|---|---|---|"]
  first = str(min(args.simulate_workers))
  for workers in map(str, args.simulate_workers):
    for design in DESIGNS:
      d = detail[design][workers]
      cpu = d["cpu_ms_per_step"]
      model = (f"{summary['model'][workers]:.1f}"
               if design == summary["design"] else "")
      lines.append(
          f"| {workers} | {design} | {d['steps_per_s']:.1f} "
          f"({', '.join(f'{x:.1f}' for x in d['rounds'])}) | "
          f"{d['steps_per_s'] / detail[design][first]['steps_per_s']:.2f} | "
          f"{model} | {cpu.get('workers', 0):.1f} / "
          f"{cpu.get('servers', 0):.1f} / {cpu.get('coordinator', 0):.1f} | "
          f"{report.mib(d['bytes_per_step'])} |")
  return "\n".join(lines) + "\n"
