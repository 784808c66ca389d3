"""One benchmark run, in its own process (started by `benchmarks.compare`).

    python -m benchmarks.child --stack tfemb --optimizer adam --vocab 100000 \
        --out result.json

Builds the stack's model for the workload, runs warm-up steps (the first
traces), times the next steps and writes a JSON result. The parent measures
the process' peak RSS from outside (`os.wait4`); the child also records its
own VmHWM.
"""

import argparse
import dataclasses
import importlib
import time

from benchmarks import cli
from benchmarks import procmem
from benchmarks import timing
from benchmarks import workload as workload_lib
from benchmarks.stacks import BY_NAME

WARMUP = 5  # untimed steps after building (the first one traces)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--stack", required=True, choices=sorted(BY_NAME))
  p.add_argument("--optimizer", required=True,
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", required=True, type=int)
  p.add_argument("--batch", type=int, default=4096)
  p.add_argument("--features", type=int, default=8)
  p.add_argument("--dim", type=int, default=32)
  p.add_argument("--zipf", type=float, default=1.1)
  p.add_argument("--warmup", type=int, default=WARMUP)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--min-steps", type=int, default=5)
  p.add_argument("--max-seconds", type=float, default=60.0)
  p.add_argument("--threads", type=int, default=0,
                 help="TensorFlow's intra-op and inter-op threads (0: its "
                 "default, one per core)")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def workload_from_args(args) -> workload_lib.Workload:
  return workload_lib.Workload(
      vocab=args.vocab, optimizer=args.optimizer, features=args.features,
      dim=args.dim, batch=args.batch, zipf=args.zipf)


def build(stack, work, batches=None):
  """The stack's traced step for the workload: (step, batches as tensors,
  steps per call). A stack may run several steps per call
  (`STEPS_PER_CALL`); times are divided by it."""
  module = importlib.import_module(f"benchmarks.stacks.{stack.module}")
  step = module.build(work)
  tensors = timing.to_tensors(batches or work.make_batches())
  return step, tensors, getattr(module, "STEPS_PER_CALL", 1)


def build_warm(stack, work, batches=None):
  """`build`, then WARMUP untimed steps (batches 0 to WARMUP - 1)."""
  built = build(stack, work, batches)
  timing.time_steps(built[0], built[1], WARMUP)
  return built


def set_threads(threads: int):
  """TensorFlow's intra-op and inter-op pools of `threads` threads each (0
  leaves its default); before anything runs."""
  if threads:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def run(args) -> dict:
  set_threads(args.threads)
  stack = BY_NAME[args.stack]
  work = workload_from_args(args)
  batches = work.make_batches()
  began = time.perf_counter()
  step, tensors, per_call = build(stack, work, batches)
  first = timing.time_steps(step, tensors, 1)
  setup_s = time.perf_counter() - began
  warm = timing.time_steps(step, tensors, max(args.warmup - 1, 0), start=1)
  faults_before = procmem.minor_faults()
  times = timing.time_steps(step, tensors, args.steps, start=args.warmup,
                            max_seconds=args.max_seconds,
                            min_steps=args.min_steps)
  faults = (procmem.minor_faults() - faults_before) / len(times) / per_call
  result = timing.summary([t / per_call for t in times])
  result.update(
      stack=stack.name, optimizer=work.optimizer, vocab=work.vocab,
      workload=dataclasses.asdict(work), setup_s=setup_s,
      first_step_s=first[0], warmup_steps=1 + len(warm),
      examples_per_s=work.batch / (result["median_ms"] / 1e3),
      table_and_slot_bytes=work.table_and_slot_bytes(),
      traffic_bytes_per_step=work.traffic_bytes_per_step(batches),
      child_vmhwm_bytes=procmem.peak_rss(), rss_after_bytes=procmem.rss(),
      huge_page_bytes=procmem.huge_pages(), page_faults_per_step=faults,
      threads=args.threads)
  return result


def main(argv=None):
  cli.main(parse_args, run, argv)


if __name__ == "__main__":
  main()
