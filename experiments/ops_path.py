"""The host engine's TensorFlow-ops path beside its fused kernels.

    python -m experiments.ops_path --optimizer adagrad --vocab 100000
    TF_USE_LEGACY_KERAS=1 python -m experiments.ops_path --optimizer sgd
    python -m experiments.ops_path --api mid --optimizer adam
    python -m experiments.ops_path --optimizer adagrad --vocab 5000000 \
        --processes --rounds 5

The suite's workload trained twice: by an engine built under
`tfemb.options.use(fused_kernels=False)` (TensorFlow's ops, the path of
GPU tables, parameter servers, non-lazy Adam and the fallback without a
compiler) and by one on the fused kernels. `--api keras` (default) times
the Keras layer's whole training step (stack `tfemb`, the suite's
`tf.function` step); `--api mid` the embedding part alone through the
mid-level API (`tfemb-emb`).

As `experiments.v2_ab`: both built in one process and timed in alternating
blocks of calls, and the result is the median over the rounds of
ops / fused; `--processes` runs each measurement in a child process of
its own (`TFEMB_FUSED_KERNELS=0` for the ops path), for tables too big to
hold twice.
"""

import json

from benchmarks import timing
from benchmarks import workload as workload_lib
from experiments import v2_ab

STACKS = {"mid": "tfemb-emb", "keras": "tfemb"}
ENGINES = ("fused", "ops")
# Not work: constants, inputs, forwarded values, control-only nodes.
_NOT_WORK = ("Const", "Placeholder", "Identity", "NoOp")


def ops_per_step(step, tensors, per_call) -> float:
  """The ops a traced step runs per training step, constants, inputs and
  identities aside (the graph of its first batch)."""
  graph = step.get_concrete_function(*tensors[0]).graph
  ops = [op for op in graph.get_operations() if op.type not in _NOT_WORK]
  return len(ops) / per_call


def _inline(args, stack):
  """Rounds of medians, both engines built in this process."""
  from benchmarks import child  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import BY_NAME  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer)
  batches = work.make_batches()
  built = {}
  for engine in ENGINES:
    # Around the first calls too: a Keras layer builds its engine there.
    with tfemb.options.use(fused_kernels=engine == "fused"):
      step, tensors, per_call = child.build(BY_NAME[stack], work, batches)
      timing.time_steps(step, tensors, 10)  # trace and warm up
    built[engine] = (step, tensors, per_call)
    print(f"{engine}: {ops_per_step(step, tensors, per_call):.0f} ops per "
          f"step ({work.features} tables)", flush=True)
  yield from v2_ab.alternate(built, args.rounds, args.calls)


def main(argv=None):
  args = v2_ab.parse_args(argv, __doc__, api="keras")
  stack = STACKS[args.api]
  if args.processes:
    measured = v2_ab._in_processes(  # pylint: disable=protected-access
        args, {"fused": (stack, {"TFEMB_FUSED_KERNELS": "1"}),
               "ops": (stack, {"TFEMB_FUSED_KERNELS": "0"})})
  else:
    measured = _inline(args, stack)
  rounds = []
  for r, medians in enumerate(measured):
    rounds.append(medians)
    print(f"round {r + 1}: fused {medians['fused']:.3f} ms, ops "
          f"{medians['ops']:.3f} ms, ops / fused "
          f"{medians['ops'] / medians['fused']:.3f}", flush=True)
  result = v2_ab.ratio_of_rounds(rounds, "fused", "ops")
  print(f"{args.api} API, {args.optimizer}, {args.vocab:,} rows per table: "
        f"fused {result['base_ms']:.3f} ms, ops {result['other_ms']:.3f} ms "
        f"per step, ops / fused = {result['ratio']:.3f} (median of "
        f"{len(rounds)} rounds; quartiles "
        "{:.3f}-{:.3f})".format(*result["quartiles"]))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(result, api=args.api, vocab=args.vocab,
                     optimizer=args.optimizer, processes=args.processes,
                     rounds=rounds), f, indent=1)


if __name__ == "__main__":
  main()
