"""tfemb beside Keras `Embedding` on a cluster of processes on 127.0.0.1.

    python -m benchmarks.cluster --quick    # ~6 min: ps and mwms, 100k rows
    python -m benchmarks.cluster            # 1M rows, more steps
    python -m benchmarks.cluster --strategies ps --optimizers adam --vocab 1M

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
"""

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

from benchmarks import procmem
from benchmarks import procnet
from benchmarks import workload as workload_lib
from benchmarks.stacks import REPO

STACKS = ("tfemb", "keras")
STRATEGIES = ("ps", "mwms")


# ---------------------------------------------------------------- the cluster


def env(**extra) -> Dict[str, str]:
  """The environment of every process: tf_keras, this checkout first."""
  out = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out.pop("TF_CONFIG", None)
  out.update(extra)
  return out


def free_ports(n: int) -> List[int]:
  """`n` ports on 127.0.0.1 the kernel has free now (all held open while
  choosing, so they differ)."""
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def ps_cluster(ports: List[int], num_ps: int) -> Dict[str, List[str]]:
  return {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]],
          "worker": [f"127.0.0.1:{p}" for p in ports[num_ps:]]}


class Processes:
  """Processes started in sessions of their own, each killed (its whole
  process group) on exit; stdout and stderr go to a log per process."""

  def __init__(self, log_dir: str):
    self.log_dir = log_dir
    self.procs: Dict[str, subprocess.Popen] = {}
    os.makedirs(log_dir, exist_ok=True)

  def __enter__(self):
    return self

  def start(self, name: str, args: List[str],
            environment=None) -> subprocess.Popen:
    log = open(os.path.join(self.log_dir, f"{name}.log"), "w")  # pylint: disable=consider-using-with
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "benchmarks.cluster", *args], cwd=REPO,
        env=environment or env(), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, text=True)
    proc.log = log
    self.procs[name] = proc
    return proc

  def log(self, name: str) -> str:
    self.procs[name].log.flush()
    with open(os.path.join(self.log_dir, f"{name}.log")) as f:
      return f.read()

  def kill(self, name: str):
    proc = self.procs[name]
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, 9)
    proc.wait()
    proc.log.close()

  def __exit__(self, *exc):
    for name in list(self.procs):
      self.kill(name)


def start_servers(procs: Processes, cluster, memory_margin: int = 0,
                  check_bytes: int = 0, only: Optional[str] = None):
  """A `tf.distribute.Server` per parameter server and worker of `cluster`
  (or only the one named e.g. "ps1"); `memory_margin` caps each parameter
  server's address space (`server`)."""
  for job in ("ps", "worker"):
    for i in range(len(cluster[job])):
      if only not in (None, f"{job}{i}"):
        continue
      args = ["--role", "server", "--cluster", json.dumps(cluster),
              "--job", job, "--index", str(i)]
      environment = None
      if job == "ps" and memory_margin:
        args += ["--memory-margin", str(memory_margin),
                 "--check-bytes", str(check_bytes)]
        # Each malloc arena reserves 64 MiB of address space: 2 at most.
        environment = env(MALLOC_ARENA_MAX="2")
      procs.start(f"{job}{i}", args, environment)


def write_pids(procs: Processes, path: str):
  with open(path + ".tmp", "w") as f:
    json.dump({name: p.pid for name, p in procs.procs.items()
               if p.poll() is None}, f)
  os.replace(path + ".tmp", path)


def wait(procs: Processes, name: str, timeout_s: float) -> int:
  """Waits for `name` to exit; fails early when another process of the
  cluster dies first. Returns the exit code."""
  proc, deadline = procs.procs[name], time.monotonic() + timeout_s
  while True:
    try:
      return proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
      pass
    if time.monotonic() > deadline:
      raise TimeoutError(f"{name}: no result after {timeout_s:.0f} s")


def last_json(text: str) -> Optional[dict]:
  for line in reversed(text.strip().splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  return None


# ------------------------------------------------------------- in the cluster


def server(args):
  stack = 2 << 20
  if args.memory_margin and resource.getrlimit(
      resource.RLIMIT_STACK)[0] != stack:
    # Each thread reserves its stack (the soft limit, read as the process
    # starts: 8 MiB by default) of the capped address space: 2 MiB.
    resource.setrlimit(resource.RLIMIT_STACK,
                       (stack, resource.getrlimit(resource.RLIMIT_STACK)[1]))
    os.execv(sys.executable, sys.orig_argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  srv = tf.distribute.Server(tf.train.ClusterSpec(json.loads(args.cluster)),
                             job_name=args.job, task_index=args.index,
                             protocol="grpc", start=True)
  if args.memory_margin:
    # Address space capped at what the started server has mapped plus the
    # margin; a margin under the tables' total keeps this process from
    # ever holding them all.
    cap = procmem.virtual_size() + args.memory_margin
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(json.dumps({"rlimit_as": cap}), flush=True)
    if args.check_bytes:
      try:
        _ = bytearray(args.check_bytes)
        print(f"cap not effective: {args.check_bytes} bytes allocated",
              flush=True)
      except MemoryError:
        print(f"cap holds: {args.check_bytes} bytes refused", flush=True)
  srv.join()


def workload_of(args) -> workload_lib.Workload:
  return workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               batch=args.batch)


def dataset(work: workload_lib.Workload, id_stride: int = 1):
  """The workload's batches, cycled. With `id_stride` the ids are those of
  a table `id_stride` times smaller, times `id_stride`: the same distinct
  ids per batch, spread over the bigger table."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batches = dataclasses.replace(work, vocab=work.vocab // id_stride
                                ).make_batches()
  x = {n: np.concatenate([f[n] for f, _ in batches]) * id_stride
       for n in work.names}
  y = np.concatenate([labels for _, labels in batches])[:, None]
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(
      work.batch, drop_remainder=True).repeat()


def build_model(stack: str, work: workload_lib.Workload, restore: str = ""):
  """(model, embedding layer or None), compiled; under the current scope.

  With `restore`, tfemb's tables are restored from that checkpoint (of a
  `tf.train.Checkpoint(model=...)`) as they are created: TensorFlow's
  deferred restoration reads one variable at a time, where a restore into
  variables that exist reads all of a parameter server's shards in one op
  and holds them beside the variables (twice the shards)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  keras = tf.keras
  vocab = work.vocab
  inputs = train_step.keras_inputs(keras, work)
  layer = None
  if stack == "tfemb":
    import tfemb.layers  # pylint: disable=g-import-not-at-top
    from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
    layer = tfemb.layers.TPUEmbedding(
        tfemb_common.feature_config(work), tfemb_common.optimizer(work))
    if restore:
      # The layer's place in the functional model's checkpoint.
      tf.train.Checkpoint(model=tf.train.Checkpoint(
          **{"layer_with_weights-0": layer})).restore(restore).expect_partial()
    activations = layer(inputs)
  else:
    activations = {n: keras.layers.Embedding(vocab, work.dim,
                                             name=f"table_{n}")(inputs[n])
                   for n in work.names}
  model = keras.Model(inputs, train_step.concat_head(keras, activations,
                                                     work.names))
  model.compile(optimizer=train_step.keras_optimizer(keras.optimizers, work),
                loss="mse")
  return model, layer


def read_pids(path: str, timeout_s: float = 300) -> Dict[str, int]:
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise TimeoutError(f"no {path}")
    time.sleep(0.1)
  with open(path) as f:
    return json.load(f)


def make_meter(args):
  """A Keras callback that measures epochs 1..: time, TCP bytes and peak
  RSS of every process of the cluster (epoch 0 is the warm-up)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class Meter(tf.keras.callbacks.Callback):
    """Snapshots at the end of the warm-up epoch and of the last."""

    def __init__(self):
      super().__init__()
      self.began = self.before = None
      self.result = {}

    def on_epoch_end(self, epoch, logs=None):
      if epoch == args.warmup_epochs - 1:
        self.pids = read_pids(args.pids_file)
        self.before = procnet.snapshot(self.pids.values())
        self.cpu = {n: procmem.cpu_seconds(pid) for n, pid in self.pids.items()}
        self.began = time.perf_counter()
      elif (epoch == args.warmup_epochs + args.epochs - 1
            and self.began is not None):
        seconds = time.perf_counter() - self.began
        traffic = procnet.delta(self.before,
                                procnet.snapshot(self.pids.values()))
        steps = args.epochs * args.steps
        self.result = {
            "steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
            "per_process": {
                name: {"sent_per_step": traffic[pid]["sent"] / steps,
                       "received_per_step": traffic[pid]["received"] / steps,
                       "cpu_s_per_step": (procmem.cpu_seconds(pid)
                                          - self.cpu[name]) / steps,
                       "peak_rss": procmem.peak_rss(pid)}
                for name, pid in self.pids.items()}}

  return Meter()


def values(layer, model) -> Dict[str, "object"]:
  """The tables (and slots) by name, read whole."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if layer is not None:
    return {f"{t.name}/{n}": tf.convert_to_tensor(v).numpy()
            for t, slots in layer.embedding_variables.items()
            for n, v in slots.items()}
  return {v.name: tf.convert_to_tensor(v).numpy()
          for v in model.trainable_variables if "table_" in v.name}


def train(args):
  """The coordinator (ps) or one worker (mwms): trains and measures."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  work = workload_of(args)
  cluster = json.loads(args.cluster) if args.cluster else None
  if args.role == "coordinator":
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=(
            tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=args.min_shard_bytes,
                max_shards=len(cluster["ps"]))))
    data = tf.keras.utils.experimental.DatasetCreator(
        lambda _: dataset(work, args.id_stride))
  else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = dataset(work, args.id_stride)
  with strategy.scope():
    model, layer = build_model(args.stack, work, args.restore)
  checkpoint = manager = None
  initial_epoch = 0
  if args.checkpoint_dir:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, 2)
    if manager.latest_checkpoint:
      checkpoint.restore(manager.latest_checkpoint)
      initial_epoch = int(manager.latest_checkpoint.rsplit("-", 1)[1])
  if args.restore:
    if layer is None:
      tf.train.Checkpoint(model=model).restore(args.restore).expect_partial()
    np.savez(os.path.join(args.save, "restored.npz"), **values(layer, model))
  meter = make_meter(args) if args.pids_file else None
  callbacks = [meter] if meter else []
  if manager:
    callbacks.append(tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: manager.save(epoch + 1)))
  history = model.fit(data, epochs=args.warmup_epochs + args.epochs,
            initial_epoch=initial_epoch, steps_per_epoch=args.steps,
            callbacks=callbacks, verbose=0)
  out = dict(meter.result if meter else {}, stack=args.stack,
             optimizer=args.optimizer, vocab=args.vocab,
             replicas=strategy.num_replicas_in_sync,
             initial_epoch=initial_epoch,
             losses=[float(x) for x in history.history.get("loss", [])])
  if layer is not None:
    out["shards"] = {t.name: len(getattr(v, "variables", [v]))
                     for t, v in layer.embedding_tables.items()}
  if args.save:
    np.savez(os.path.join(args.save, "final.npz"), **values(layer, model))
    tf.train.Checkpoint(model=model).write(os.path.join(args.save, "ckpt"))
  print(json.dumps(out), flush=True)


def single(args):
  """No cluster: restores `--restore` into one process, saves its tables
  to `--save`/single.npz and writes them back as `--save`/single-ckpt."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model, layer = build_model(args.stack, workload_of(args))
  tf.train.Checkpoint(model=model).restore(args.restore).expect_partial()
  np.savez(os.path.join(args.save, "single.npz"), **values(layer, model))
  tf.train.Checkpoint(model=model).write(
      os.path.join(args.save, "single-ckpt"))
  print(json.dumps({"restored": args.restore}), flush=True)


# ---------------------------------------------------------------- the driver


def child_args(args, stack: str, optimizer: str) -> List[str]:
  return ["--stack", stack, "--optimizer", optimizer,
          "--vocab", str(args.vocab), "--batch", str(args.batch),
          "--steps", str(args.steps), "--epochs", str(args.epochs),
          "--warmup-epochs", str(args.warmup_epochs),
          "--id-stride", str(args.id_stride),
          "--min-shard-bytes", str(args.min_shard_bytes),
          "--save", args.save, "--restore", args.restore,
          "--checkpoint-dir", args.checkpoint_dir]


def coordinate(procs: Processes, cluster, args, stack: str, optimizer: str,
               name: str = "coordinator") -> dict:
  """Runs a coordinator on the cluster's running servers: its JSON."""
  pids_file = os.path.join(procs.log_dir, f"{name}.pids.json")
  procs.start(name, ["--role", "coordinator", "--cluster", json.dumps(cluster),
                     "--pids-file", pids_file,
                     *child_args(args, stack, optimizer)])
  write_pids(procs, pids_file)
  code = wait(procs, name, args.timeout)
  log = procs.log(name)
  if code:
    raise RuntimeError(f"{name} exited {code}:\n{log[-3000:]}")
  return last_json(log)


def run_ps(args, stack: str, optimizer: str, log_dir: str) -> dict:
  """One ParameterServerStrategy cluster: the coordinator's JSON."""
  cluster = ps_cluster(free_ports(args.ps + args.workers), args.ps)
  with Processes(log_dir) as procs:
    start_servers(procs, cluster)
    return dict(coordinate(procs, cluster, args, stack, optimizer),
                logs=log_dir)


def run_mwms(args, stack: str, optimizer: str, log_dir: str) -> dict:
  """One MultiWorkerMirroredStrategy cluster: worker 0's JSON."""
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(args.workers)]}
  pids_file = os.path.join(log_dir, "pids.json")
  with Processes(log_dir) as procs:
    for i in range(args.workers):
      config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
      procs.start(f"worker{i}", ["--role", "mwms-worker", "--pids-file",
                                 pids_file if i == 0 else "",
                                 *child_args(args, stack, optimizer)],
                  env(TF_CONFIG=json.dumps(config)))
    write_pids(procs, pids_file)
    codes = [wait(procs, f"worker{i}", args.timeout)
             for i in range(args.workers)]
    log = procs.log("worker0")
    if any(codes):
      raise RuntimeError(f"workers exited {codes}:\n"
                         + "\n".join(procs.log(f"worker{i}")[-2000:]
                                     for i in range(args.workers)))
    return dict(last_json(log), logs=log_dir)


def totals(result: dict) -> dict:
  per = result["per_process"].values()
  return {"steps_per_s": result["steps_per_s"],
          "bytes_per_step": sum(p["sent_per_step"] for p in per),
          "peak_rss": max(p["peak_rss"] or 0 for p in per),
          "rss_total": sum(p["peak_rss"] or 0 for p in per)}


def ratios(results: List[dict]) -> Dict[str, dict]:
  """{"ps/adam": {"speed": tfemb/keras steps/s, "bytes": .., "rss": ..}}"""
  by = {(r["strategy"], r["optimizer"], r["stack"]): totals(r)
        for r in results if r.get("status") == "ok"}
  out = {}
  for (strategy, optimizer, stack), t in sorted(by.items()):
    k = by.get((strategy, optimizer, "keras"))
    if stack != "tfemb" or k is None:
      continue
    out[f"{strategy}/{optimizer}"] = {
        "speed": t["steps_per_s"] / k["steps_per_s"],
        "bytes": t["bytes_per_step"] / k["bytes_per_step"],
        "rss": t["peak_rss"] / k["peak_rss"]}
  return out


def mib(x) -> str:
  return f"{x / 2**20:.2f}"


def markdown(args, results: List[dict]) -> str:
  lines = [
      f"`python -m benchmarks.cluster {' '.join(args.argv)}`".replace(
          "  ", " ").replace(" `", "`"),
      "",
      f"{args.vocab} rows per table x 8 tables x dim 32, batch "
      f"{args.batch}; ps: 1 coordinator, {args.workers} workers, {args.ps} "
      f"parameter servers; mwms: {args.workers} workers; "
      f"{args.epochs * args.steps} timed steps after "
      f"{args.warmup_epochs * args.steps} warm-up steps.", "",
      "| strategy | optimizer | stack | steps/s | MiB sent/step (all) | "
      "per process: MiB sent / received per step, CPU ms per step, "
      "peak RSS MiB |",
      "|---|---|---|---|---|---|"]
  for r in results:
    if r.get("status") != "ok":
      lines.append(f"| {r['strategy']} | {r['optimizer']} | {r['stack']} | "
                   f"failed: {r.get('error', '')[:80]} | | |")
      continue
    t = totals(r)
    per = ", ".join(f"{n}: {mib(p['sent_per_step'])} / "
                    f"{mib(p['received_per_step'])}, "
                    f"{p['cpu_s_per_step'] * 1e3:.0f}, "
                    f"{(p['peak_rss'] or 0) / 2**20:.0f}"
                    for n, p in r["per_process"].items())
    lines.append(f"| {r['strategy']} | {r['optimizer']} | {r['stack']} | "
                 f"{t['steps_per_s']:.2f} | {mib(t['bytes_per_step'])} | "
                 f"{per} |")
  lines += ["", "| tfemb / Keras | steps/s | bytes/step | peak RSS |",
            "|---|---|---|---|"]
  for key, r in ratios(results).items():
    lines.append(f"| {key} | {r['speed']:.2f} | {r['bytes']:.2f} | "
                 f"{r['rss']:.2f} |")
  return "\n".join(lines) + "\n"


def summary_line(results: List[dict]) -> str:
  parts = [f"{k} speed {r['speed']:.2f}x bytes {r['bytes']:.2f}x "
           f"rss {r['rss']:.2f}x" for k, r in ratios(results).items()]
  failed = [f"{r['strategy']}/{r['optimizer']}/{r['stack']}"
            for r in results if r.get("status") != "ok"]
  return ("cluster: tfemb/Keras " + "; ".join(parts)
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))


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
        brief = (f"{totals(result)['steps_per_s']:.2f} steps/s, "
                 f"{mib(totals(result)['bytes_per_step'])} MiB/step"
                 if result["status"] == "ok" else result["error"][-2000:])
        print(f"{name}: {brief} ({result['wall_s']:.0f} s)", flush=True)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump({"argv": args.argv, "results": results}, f, indent=1)
  report = markdown(args, results)
  with open(os.path.join(args.out, "results.md"), "w") as f:
    f.write(report)
  print(report)
  print(summary_line(results), flush=True)
  return 0 if all(r["status"] == "ok" for r in results) else 1


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--role", default="driver",
                 choices=["driver", "server", "coordinator", "mwms-worker",
                          "single"])
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
  p.add_argument("--id-stride", type=int, default=1)
  p.add_argument("--min-shard-bytes", type=int, default=1 << 20,
                 help="variables under this are not sharded")
  p.add_argument("--timeout", type=float, default=900)
  p.add_argument("--out", default=None)
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
    args.vocab = 100_000 if args.quick else 1_000_000
  if args.steps is None:
    args.steps = 20 if args.quick else 50
  if args.mwms_optimizers is None:
    args.mwms_optimizers = ["adagrad"]
  if args.out is None:
    args.out = ("/tmp/tfemb_cluster_quick" if args.quick
                else os.path.join(REPO, "benchmarks", "results", "cluster"))
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.role == "server":
    server(args)
  elif args.role in ("coordinator", "mwms-worker"):
    train(args)
  elif args.role == "single":
    single(args)
  else:
    return drive(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
