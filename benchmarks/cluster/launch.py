"""The cluster's processes on 127.0.0.1: started, watched and killed.

Every process of a cluster is `python -m benchmarks.cluster --role ...` in
a session of its own, with its output in a log per process under the run's
log directory: a `tf.distribute.Server` per parameter server and worker, then
the coordinator (`ps`) or the workers (`mwms`), whose last line of JSON is
the run's result (benchmarks/cluster/node.py).
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

from benchmarks.stacks import REPO


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


def child_args(args, stack: str, optimizer: str) -> List[str]:
  return ["--stack", stack, "--optimizer", optimizer,
          "--vocab", str(args.vocab), "--batch", str(args.batch),
          "--steps", str(args.steps), "--epochs", str(args.epochs),
          "--warmup-epochs", str(args.warmup_epochs),
          "--id-stride", str(args.id_stride),
          "--min-shard-bytes", str(args.min_shard_bytes),
          "--save", args.save, "--restore", args.restore,
          "--checkpoint-dir", args.checkpoint_dir,
          "--dense-ms", str(args.dense_ms),
          "--steps-per-call", str(args.steps_per_call),
          "--steps-per-execution", str(args.steps_per_execution),
          "--sim-calls", str(args.sim_calls)]


def coordinate(procs: Processes, cluster, args, stack: str, optimizer: str,
               name: str = "coordinator", role: str = "coordinator",
               environment=None) -> dict:
  """Runs a coordinator (`role`) on the cluster's running servers: its
  JSON."""
  pids_file = os.path.join(procs.log_dir, f"{name}.pids.json")
  procs.start(name, ["--role", role, "--cluster", json.dumps(cluster),
                     "--pids-file", pids_file,
                     *child_args(args, stack, optimizer)], environment)
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
