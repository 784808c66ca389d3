"""`python -m benchmarks.host_tpu`: a TPU program's Keras step on the host
TPU against the same model on the CPU branch (docs/performance.md, "The
host TPU").

The model: Keras 3, `tfemb.layers.TPUEmbedding` over 8 tables of 100k x 32
(Adagrad 0.1), `Dense(1)` over the concatenated activations, a mean squared
error, Adagrad 0.1 for the head; a global batch of 4096 Zipf ids per
feature (`benchmarks.workload`), `steps_per_execution=10`, `fit`. Under a
host TPU type (`tfemb.patch(tpu=TYPE)`) the inputs and the features take
the per-replica batch (`Input(batch_size=4096 // replicas)`,
`FeatureConfig(output_shape=[4096 // replicas])`), as on that TPU.

Each kind runs in a process of its own (a process emulates one type), in
alternating rounds, and reports:

* `step_ms`: a step of the steady state (the epochs after the first, from
  their first execution's end to their last's, over the steps between);
* `first_step_s`: from `fit`'s start to the end of the first execution of
  the first epoch (tracing and building included);
* `epoch_start_ms`: in a later epoch, from its start to the end of its
  first execution, less one execution's steady time: what starting an
  epoch costs (a retrace or rebuild would show here);
* `traces_later_epochs`: how many times the train step was traced in the
  epochs after the first (fit called again: none is expected).

Beside the host TPU types, the dense part alone: the model's head (Keras'
`Concatenate` of the 8 features' activations, `Dense(1)`) on precomputed
activations, given as the layer would give them. TensorFlow alone,
without tfemb: `dense-cpu` on the default strategy and `dense-mirrored-N`
under `MirroredStrategy` over N logical CPU devices; and `dense-v3-8`,
`dense-v5p-8`: the head as that TPU type (the host TPU's strategy and
datasets, no embedding). A type's floor is the CPU branch's step plus
what the replicas add to the head alone on as many replicas, in the same
round (`_summary`): the replicas' own cost, which no embedding engine can
remove. The report puts each kind's step beside the CPU branch's of the
same round, and each type's beside its floors.

    python -m benchmarks.host_tpu                  # 3 rounds, every kind
    python -m benchmarks.host_tpu --rounds 1 --kinds cpu,v3-8
    python -m benchmarks.host_tpu --steps 30 --vocab 10k    # a quick look

Its last line is the JSON summary, also written to `--out`.
"""

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

from benchmarks import cli
from benchmarks import runner
from benchmarks import workload as workload_lib

TPU_KINDS = ("v3-8", "v6e-8", "v5p-8")
# The head alone as a TPU type of 8 and of 4 replicas (`_summary`).
DENSE_TPU_KINDS = {8: "dense-v3-8", 4: "dense-v5p-8"}
KINDS = ("cpu",) + TPU_KINDS + ("dense-cpu", "dense-mirrored-8",
                                "dense-mirrored-4") + tuple(
                                    DENSE_TPU_KINDS.values())
REPLICAS = {"v3-8": 8, "v6e-8": 8, "v5p-8": 4, "dense-mirrored-8": 8,
            "dense-mirrored-4": 4, "dense-v3-8": 8, "dense-v5p-8": 4}


def _tpu_type(kind: str) -> Optional[str]:
  """The TPU type a kind runs as (its head alone, for a dense one)."""
  tpu = kind[len("dense-"):] if kind.startswith("dense-") else kind
  return tpu if tpu in TPU_KINDS else None
STEPS_PER_EXECUTION = 10


def _workload(vocab: int) -> workload_lib.Workload:
  return workload_lib.Workload(vocab=vocab, optimizer="adagrad")


def _child_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description="one kind's measurement")
  p.add_argument("--child", required=True, choices=KINDS)
  p.add_argument("--vocab", type=workload_lib.parse_size, default=100_000)
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--epochs", type=int, default=4)
  p.add_argument("--out", required=True)
  return p


class _Clock:
  """A Keras callback: when each epoch began, when each execution ended."""

  def __init__(self, keras):
    clock = self

    class Callback(keras.callbacks.Callback):
      def on_epoch_begin(self, epoch, logs=None):
        clock.epochs.append((time.perf_counter(), []))

      def on_train_batch_end(self, batch, logs=None):
        clock.epochs[-1][1].append(time.perf_counter())

    self.epochs = []
    self.callback = Callback()


def _model(keras, work, kind: str):
  """The benchmark's model (`kind`: "cpu", a TPU type, or a dense-only
  kind), compiled."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  import tfemb.layers  # pylint: disable=g-import-not-at-top
  per_replica = work.batch // REPLICAS.get(kind, 1)
  batch_size = per_replica if _tpu_type(kind) else None
  if kind.startswith("dense"):  # the activations the layer would give
    inputs = {n: keras.Input(shape=(work.dim,), batch_size=batch_size,
                             name=n) for n in work.names}
    activations = inputs
  else:
    shape = [per_replica] if kind in TPU_KINDS else None
    features = {
        n: tfemb.FeatureConfig(
            tfemb.TableConfig(work.vocab, work.dim, name=f"table_{n}",
                              combiner="sum"), name=n, output_shape=shape)
        for n in work.names}
    layer = tfemb.layers.TPUEmbedding(features, tfemb.Adagrad(0.1))
    inputs = {n: keras.Input(shape=(), batch_size=batch_size, dtype="int64",
                             name=n) for n in work.names}
    activations = layer(inputs)
  head = keras.layers.Dense(1)(keras.layers.Concatenate()(
      [activations[n] for n in work.names]))
  model = keras.Model(inputs, head)
  model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse",
                steps_per_execution=STEPS_PER_EXECUTION, jit_compile=False)
  del tf
  return model


def _dataset(work, kind: str):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batches = work.make_batches()
  if kind.startswith("dense"):
    rng = np.random.default_rng(work.seed)
    x = [{n: rng.standard_normal((work.batch, work.dim), dtype=np.float32)
          for n in work.names} for _ in batches]
  else:
    x = [features for features, _ in batches]
  y = [labels for _, labels in batches]
  data = tf.data.Dataset.from_tensor_slices(
      ({n: np.stack([b[n] for b in x]) for n in work.names}, np.stack(y)))
  return data.repeat()


def _strategy(kind: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if _tpu_type(kind):
    import tfemb  # pylint: disable=g-import-not-at-top
    tfemb.patch(tpu=_tpu_type(kind))
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  if kind.startswith("dense-mirrored"):
    n = REPLICAS[kind]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{k}" for k in range(n)],
        cross_device_ops=tf.distribute.ReductionToOneDevice())
  return tf.distribute.get_strategy()


def measure(args) -> dict:
  """One kind: the model trained for `args.epochs` epochs of `args.steps`
  steps; its times (see the module's docstring)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  began = time.perf_counter()
  kind, work = args.child, _workload(args.vocab)
  strategy = _strategy(kind)  # before any tensor: a type splits the CPU
  import keras  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    model = _model(keras, work, kind)
  data = _dataset(work, kind)
  clock = _Clock(keras)
  traced = _count_traces(model)
  fit_began = time.perf_counter()
  model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
            callbacks=[clock.callback])
  first_epoch_traces = traced()
  model.fit(data, epochs=args.epochs - 1, steps_per_epoch=args.steps,
            verbose=0, callbacks=[clock.callback])
  executions = [ends for _, ends in clock.epochs]
  steady = [(e[-1] - e[0]) / (args.steps - STEPS_PER_EXECUTION)
            for e in executions[1:]]
  step = statistics.median(steady)
  starts = [(ends[0] - start) - step * STEPS_PER_EXECUTION
            for start, ends in clock.epochs[1:]]
  return {"kind": kind, "replicas": strategy.num_replicas_in_sync,
          "step_ms": 1e3 * step, "steady_ms_per_epoch": [1e3 * s for s in
                                                        steady],
          "first_step_s": executions[0][0] - fit_began,
          "process_to_first_step_s": executions[0][0] - began,
          "epoch_start_ms": [1e3 * s for s in starts],
          "traces_first_epoch": first_epoch_traces,
          "traces_later_epochs": traced() - first_epoch_traces,
          "vocab": work.vocab, "steps": args.steps}


def _count_traces(model):
  """Counts the traces of `model`'s train step (Keras traces it once per
  replica each time it traces its train function)."""
  calls = [0]
  train_step = model.train_step

  def counted(data):
    calls[0] += 1
    return train_step(data)

  model.train_step = counted
  replicas = model.distribute_strategy.num_replicas_in_sync
  return lambda: calls[0] // replicas


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--kinds", default=",".join(KINDS),
                 help=f"comma-separated, of {', '.join(KINDS)}")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--vocab", default="100k")
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--epochs", type=int, default=4)
  p.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results", "host_tpu.json"))
  p.add_argument("--logs", default="/tmp/tfemb_host_tpu_logs")
  return p


def _summary(rows: List[dict], kinds: List[str]) -> dict:
  """Per kind, the median step and its ratio to the CPU branch's step of
  the same round (the median ratio). For a TPU type, its floors: the CPU
  branch's step plus what the replicas add to the head alone, as a ratio
  to the CPU branch's step, under TensorFlow's `MirroredStrategy`
  (`mirrored_floor_ratio`) and as a TPU type of as many replicas
  (`type_floor_ratio`), and the type's step above the latter
  (`above_type_floor_ms`): what the embedding costs beyond the CPU
  branch's. Each is the median of each round's where the kinds it takes
  ran."""
  by_kind: Dict[str, List[dict]] = {k: [r for r in rows if r["kind"] == k]
                                    for k in kinds}
  cpu = {r["round"]: r["step_ms"] for r in by_kind.get("cpu", [])}
  dense = {r["round"]: r["step_ms"] for r in by_kind.get("dense-cpu", [])}
  out = {}
  for kind in TPU_KINDS:
    for name, head in (
        ("mirrored", f"dense-mirrored-{REPLICAS[kind]}"),
        ("type", DENSE_TPU_KINDS[REPLICAS[kind]])):
      replicated = {r["round"]: r["step_ms"] for r in by_kind.get(head, [])}
      floors = {k: cpu[k] + replicated[k] - dense[k]
                for k in set(cpu) & set(dense) & set(replicated)}
      runs = [r for r in by_kind.get(kind, []) if r["round"] in floors]
      if not runs:
        continue
      out.setdefault(kind, {})[f"{name}_floor_ratio"] = statistics.median(
          floors[r["round"]] / cpu[r["round"]] for r in runs)
      if name == "type":
        out[kind]["above_type_floor_ms"] = statistics.median(
            r["step_ms"] - floors[r["round"]] for r in runs)
  for kind, runs in by_kind.items():
    if not runs:
      continue
    base = dense if kind.startswith("dense") else cpu
    ratios = [r["step_ms"] / base[r["round"]] for r in runs
              if r["round"] in base]
    out.setdefault(kind, {}).update({
        "step_ms": statistics.median(r["step_ms"] for r in runs),
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_to": "dense-cpu" if kind.startswith("dense") else "cpu",
        "first_step_s": statistics.median(r["first_step_s"] for r in runs),
        "epoch_start_ms": statistics.median(
            s for r in runs for s in r["epoch_start_ms"]),
        "traces_later_epochs": max(r["traces_later_epochs"] for r in runs),
        "replicas": runs[0]["replicas"]})
  return out


def parse_kinds(text: str) -> List[str]:
  """The kinds of a comma-separated `--kinds`; exits naming unknown ones."""
  kinds = [k for k in text.split(",") if k]
  unknown = sorted(set(kinds) - set(KINDS))
  if unknown:
    raise SystemExit(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
  return kinds


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--child" in argv:
    cli.main(lambda a: _child_parser().parse_args(a), measure, argv)
    return 0
  args = _parser().parse_args(argv)
  kinds = parse_kinds(args.kinds)
  os.makedirs(args.logs, exist_ok=True)
  rows = []
  for round_ in range(args.rounds):
    for kind in kinds:  # alternating: each round runs every kind once
      outcome = runner.run(
          "benchmarks.host_tpu",
          ["--child", kind, "--vocab", args.vocab, "--steps",
           str(args.steps), "--epochs", str(args.epochs)],
          log_path=os.path.join(args.logs, f"{kind}-{round_}.log"))
      if outcome.result is None:
        raise SystemExit(f"{kind} (round {round_}): {outcome.status}: "
                         f"{outcome.detail}")
      rows.append(dict(outcome.result, round=round_,
                       peak_rss=outcome.peak_rss))
      print(f"round {round_} {kind}: {outcome.result['step_ms']:.2f} ms "
            f"per step", flush=True)
  result = {"summary": _summary(rows, kinds), "runs": rows,
            "command": "python -m benchmarks.host_tpu " + " ".join(argv)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  cli.write_json(args.out, result)
  print(json.dumps(result["summary"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
