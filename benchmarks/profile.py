"""Where a tfemb training step's time goes: a TensorFlow profiler trace.

    python -m benchmarks.compare --profile [--sizes 1M] [--optimizers adam]
    python -m benchmarks.profile --vocab 1000000 --optimizer adam \
        --logdir /tmp/tfemb_profile
    python -m benchmarks.profile --stack tfemb-emb --optimizer sgd

Warms a tfemb step up (the Keras layer's, or with `--stack tfemb-emb` the
embedding part alone, whose calls of several steps are counted per step),
traces a few steps with
`tf.profiler.experimental.start/stop`, and reads the trace (the XSpace
protobuf under `<logdir>/plugins/profile/<run>/`): op self time by op type
and by op, by part of the step, and ops executed per step; then
`benchmarks.pieces` times the engine's pieces alone. To browse the same trace:
`tensorboard --logdir <logdir>` (pip install tensorboard
tensorboard-plugin-profile), Profile tab, trace_viewer.
"""

import argparse
import collections
import glob
import json
import os
import re

from benchmarks import timing
from benchmarks import workload as workload_lib
from benchmarks.stacks import BY_NAME


_MODEL = re.compile(r"^(sgd|adagrad|adam)/|dense|concatenate|^gradient_tape/"
                    r"|^(Mean|Square|Add|sub)(_\d+)?$")


# The parts of the step an op is filed under (besides the executor's and
# the dense head's).
LOOKUP = "embedding lookup (dedup, gather, combine, input checks)"
UPDATE = "embedding update (row gradients, slots, scatters, checks)"

# tfemb's fused kernels, by the part of the step they do.
_LOOKUP_OPS = {"TfembDedupGather", "TfembIdCounts"}
_UPDATE_OPS = {"TfembRowGradients", "TfembApplyRows", "TfembRestoreRows",
               "TfembApplyTables"}


def category(op_name: str, op_type: str = "") -> str:
  """Which part of the step an op belongs to: tfemb's fused kernels by
  their type, the rest by name (a heuristic: the engine's update ops carry
  no name scope)."""
  if op_name == "ExecutorState":
    return "TF executor scheduling"
  if op_type in _LOOKUP_OPS or re.match(r"^functional(_\d+)?/tpu_embedding",
                                        op_name):
    return LOOKUP
  if op_type in _UPDATE_OPS:  # before the names: in a Keras optimizer's scope
    return UPDATE
  if _MODEL.search(op_name):
    return "dense head, loss, Keras optimizer"
  return UPDATE


def _op_events(space):
  """(op name, op type, self picoseconds) of every op executed on a host
  thread; self time excludes ops nested inside it on the same thread."""
  for plane in space.planes:
    if not plane.name.startswith("/host:"):
      continue
    for line in plane.lines:
      ops = []
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if (":" in name and " " not in name and event.duration_ps and
            ("::" not in name or name == "ExecutorState::Process")):
          ops.append((event.offset_ps, event.offset_ps + event.duration_ps,
                      name))
      ops.sort()
      stack = []  # [end, name, self]
      for begin, end, name in ops:
        while stack and stack[-1][0] <= begin:
          yield _finish(stack.pop())
        if stack:
          stack[-1][2] -= end - begin
        stack.append([end, name, end - begin])
      while stack:
        yield _finish(stack.pop())


def _finish(entry):
  _, name, self_ps = entry
  op_name, op_type = name.replace("::", ":").rsplit(":", 1)
  return op_name, op_type, max(self_ps, 0)


def summarize(logdir: str, steps: int, top: int = 15) -> dict:
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                          recursive=True), key=os.path.getmtime)[-1]
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  by_type, by_op, by_part = (collections.Counter() for _ in range(3))
  count = 0
  for op_name, op_type, self_ps in _op_events(space):
    by_type[op_type] += self_ps
    by_op[f"{op_name} ({op_type})"] += self_ps
    by_part[category(op_name, op_type)] += self_ps
    count += op_type != "Process"
  total = sum(by_type.values())
  ms = lambda ps: ps / steps / 1e9  # per step  # pylint: disable=unnecessary-lambda-assignment
  return {
      "trace": path, "steps": steps,
      "step_wall_ms": [],  # the caller's, if it timed the steps
      "ops_per_step": count / steps, "op_self_ms_per_step": ms(total),
      "by_part": [(c, ms(ps), ps / total) for c, ps in by_part.most_common()],
      "by_type": [(t, ms(ps), ps / total) for t, ps in by_type.most_common(top)],
      "by_op": [(o, ms(ps), ps / total) for o, ps in by_op.most_common(top)],
  }


def format_summary(s: dict, title: str) -> str:
  lines = [f"## Profile: {title}", "",
           f"Trace: {s['trace']}", "",
           f"{s['steps']} steps; " +
           ("wall per step (profiled): " +
            ", ".join(f"{w:.1f}" for w in s["step_wall_ms"]) + " ms; "
            if s["step_wall_ms"] else "") +
           f"{s['ops_per_step']:.0f} ops per step; op self time "
           f"{s['op_self_ms_per_step']:.1f} ms per step (inter-op threads "
           "overlap, so it can exceed the wall time).", ""]
  for key, head in (("by_part", "part of the step"), ("by_type", "op type"),
                    ("by_op", "op")):
    lines += [f"| {head} | self ms/step | share |", "|---|---:|---:|"]
    lines += [f"| `{n}` | {v:.2f} | {100 * p:.1f}% |" for n, v, p in s[key]]
    lines.append("")
  return "\n".join(lines)


STACKS = ("tfemb", "tfemb-emb")  # the Keras layer, the embedding part


def profile(work, logdir: str, warmup: int, steps: int,
            stack: str = "tfemb") -> dict:
  """`steps` calls of the stack's step traced; per-step figures divide by
  the steps each call runs (the embedding part runs several)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import child  # pylint: disable=g-import-not-at-top
  step, tensors, per_call = child.build(BY_NAME[stack], work)
  timing.time_steps(step, tensors, warmup)
  unprofiled = timing.summary(timing.time_steps(step, tensors, 10, warmup))
  tf.profiler.experimental.start(logdir)
  walls = timing.time_steps(step, tensors, steps, warmup + 10)
  tf.profiler.experimental.stop()
  s = summarize(logdir, steps * per_call)
  s["step_wall_ms"] = [1e3 * w / per_call for w in walls]
  s["unprofiled_median_ms"] = unprofiled["median_ms"] / per_call
  s["stack"] = stack
  return s


def run_from_compare(args):
  """`compare --profile`: one child per optimizer at the first size."""
  from benchmarks import runner  # pylint: disable=g-import-not-at-top
  vocab = workload_lib.parse_size(args.sizes.split(",")[0])
  os.makedirs(args.out, exist_ok=True)
  for opt in args.optimizers.split(","):
    logdir = os.path.join(args.out, "profile", f"{opt}-{vocab}")
    out = runner.run("benchmarks.profile",
                     ["--vocab", str(vocab), "--optimizer", opt,
                      "--logdir", logdir],
                     log_path=os.path.join(args.out, f"profile-{opt}.log"))
    if out.result is None:
      print(f"profile {opt}: {out.status} {out.detail}")
      continue
    title = (f"tfemb Keras layer, {opt}, {vocab:,} rows x 8 tables; "
             f"unprofiled median step {out.result['unprofiled_median_ms']:.1f}"
             " ms")
    text = format_summary(out.result, title)
    pieces_out = runner.run("benchmarks.pieces", ["--vocab", str(vocab)])
    if pieces_out.result:
      from benchmarks import pieces  # pylint: disable=g-import-not-at-top
      text += "\n" + pieces.format_pieces(pieces_out.result)
    with open(os.path.join(args.out, f"profile-{opt}.md"), "w") as f:
      f.write(text)
    print(text, flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--stack", default="tfemb", choices=STACKS)
  p.add_argument("--vocab", type=int, default=100_000)
  p.add_argument("--optimizer", default="adam",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--logdir", default="/tmp/tfemb_profile")
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--out", help="write the summary as JSON here")
  args = p.parse_args(argv)
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  s = profile(work, args.logdir, args.warmup, args.steps, args.stack)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(s, f, indent=1)
  else:
    print(format_summary(s, f"{BY_NAME[args.stack].label}, {args.optimizer}, "
                            f"{args.vocab:,} rows; unprofiled median step "
                            f"{s['unprofiled_median_ms']:.2f} ms"))


if __name__ == "__main__":
  main()
