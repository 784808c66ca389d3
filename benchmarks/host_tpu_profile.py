"""`python -m benchmarks.host_tpu_profile`: where a host TPU step's time goes
(docs/performance.md, "The host TPU").

For each kind of `benchmarks.host_tpu` (its model, data and strategy), in a
process of its own: `fit` warms up, then TensorFlow's profiler records
`--steps` steps, and the ops TensorFlow's executor ran are counted and
timed per step, by what they belong to:

* `dense`: the model's head under each replica (forward, gradient, loss)
  and Keras' optimizer (its update of every replica's copy);
* `keras_concat`: Keras' `Concatenate` of the activations and its gradient
  (one per replica under a TPU type);
* `embedding`: tfemb's layer and engine: the lookup, the global batch's
  merging and splitting, the update;
* `transfers`: `_Send` ops, one per tensor crossing from one replica's
  device to another's (the replicas' ids to the global batch, its
  activations back, the gradients to the update, Keras' all-reduces);
* `input`, `loop`: the iterator and Keras' `steps_per_execution` loop.

`ops` is the number of ops a step runs: the executor's cost is about a few
microseconds each, beside the ops' own work. `op_ms` is the ops' own time
summed; ops on several threads overlap, so it can exceed the step.

    python -m benchmarks.host_tpu_profile --kinds cpu,v3-8,dense-mirrored-8

Its last line is the JSON summary, also written to `--out`.
"""

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile

from benchmarks import cli
from benchmarks import host_tpu
from benchmarks import runner

_PREFIX = re.compile(r"^(while/body/_\d+/while/cond/then/_\d+/while/cond/"
                     r"StatefulPartitionedCall/)")
_REPLICA = re.compile(r"replica_\d+/")


def category(name: str) -> str:
  """The part of a step an executed op (`scope:type`) belongs to."""
  scope, _, op = name.rpartition(":")
  scope = _REPLICA.sub("", _PREFIX.sub("", scope))
  if op == "_Send":
    return "transfers"
  if (op.startswith("Tfemb") or "tpu_embedding" in scope or
      op == "Assert"):  # the engine's input checks
    return "embedding"
  if "concatenate" in scope:
    return "keras_concat"
  if ("dense" in scope or "compile_loss" in scope or "adagrad" in scope or
      scope.startswith(("Add", "mul", "AssignVariableOp", "update", "Cast",
                        "div_no_nan"))):  # the head, Keras' loss metric
    return "dense"
  if "Iterator" in op or "Optional" in op or "Iterator" in scope:
    return "input"
  if scope.startswith("while"):
    return "loop"
  return "embedding" if scope.startswith(("concat", "split")) else "other"


def parse(logdir: str, steps: int) -> dict:
  """Per step, each category's ops and op time, from a profile's xplane."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                   recursive=True)[0]
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  ops, time_ps = collections.Counter(), collections.Counter()
  for plane in space.planes:
    names = plane.event_metadata
    for line in plane.lines:
      if not line.name.startswith("tf_Compute"):
        continue
      for event in line.events:
        name = names[event.metadata_id].name
        if ":" not in name or name.startswith(("Executor",
                                               "ThreadpoolListener")):
          continue  # the executor's and the profiler's own events
        part = category(name)
        ops[part] += 1
        time_ps[part] += event.duration_ps
  return {"ops": {k: v / steps for k, v in ops.items()},
          "op_ms": {k: v / 1e9 / steps for k, v in time_ps.items()},
          "ops_per_step": sum(ops.values()) / steps}


def measure(args) -> dict:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  kind, work = args.child, host_tpu._workload(args.vocab)  # pylint: disable=protected-access
  strategy = host_tpu._strategy(kind)  # pylint: disable=protected-access
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    model = host_tpu._model(keras, work, kind)  # pylint: disable=protected-access
  data = host_tpu._dataset(work, kind)  # pylint: disable=protected-access
  model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0)
  logdir = tempfile.mkdtemp(prefix=f"tfemb_profile_{kind}_")
  tf.profiler.experimental.start(logdir)
  model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0)
  tf.profiler.experimental.stop()
  return dict(parse(logdir, args.steps), kind=kind,
              replicas=strategy.num_replicas_in_sync)


def _child_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description="one kind's profile")
  p.add_argument("--child", required=True, choices=host_tpu.KINDS)
  p.add_argument("--vocab", type=int, default=100_000)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--out", required=True)
  return p


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--kinds", default=",".join(host_tpu.KINDS))
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--vocab", default="100000")
  p.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results",
      "host_tpu_profile.json"))
  return p


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--child" in argv:
    cli.main(lambda a: _child_parser().parse_args(a), measure, argv)
    return 0
  args = _parser().parse_args(argv)
  result = {}
  for kind in host_tpu.parse_kinds(args.kinds):
    outcome = runner.run("benchmarks.host_tpu_profile",
                         ["--child", kind, "--steps", str(args.steps),
                          "--vocab", args.vocab])
    if outcome.result is None:
      raise SystemExit(f"{kind}: {outcome.status}: {outcome.detail}")
    result[kind] = outcome.result
    parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(
        outcome.result["ops"].items()))
    print(f"{kind}: {outcome.result['ops_per_step']:.0f} ops per step "
          f"({parts})", flush=True)
  result = {"profiles": result,
            "command": "python -m benchmarks.host_tpu_profile " +
                       " ".join(argv)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  cli.write_json(args.out, result)
  print(json.dumps(result["profiles"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
