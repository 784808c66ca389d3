"""Scale check (docs/performance.md, 'Big tables'): a 100M-row table
trains, saves, restores.

    python -m experiments.scale        # 100M x 16: 12.8 GB of table + slot
    python -m experiments.scale --rows 2000000 --compare-rows 200000 \
        --steps 30

The model: the tfemb Keras layer with Adagrad(0.1), one big table (`--rows`
x 16) and 3 of 100k x 16, a feature each with Zipf ids, concat + Dense(1),
MSE, the benchmarks' `tf.function` train step. This process never imports
TensorFlow; each part runs in a new process, so memory is returned between
parts and each part's peak RSS (VmHWM) is its own:
  1. compare: the same training at `--compare-rows` rows (0: skipped);
  2. save: build, 5 warm-up and `--steps` timed steps, `tf.train.Checkpoint
     (...).write` to `--out`/ckpt; keeps the rows and accumulators of the
     1000 most touched and 1000 random ids per table and the next 5 losses;
  3. restore: a fresh model restores the checkpoint; those rows,
     accumulators and losses must be equal ("restore: rows equal"), else
     everything exits 1. Then it exports the model for serving
     (`tfemb.export_for_serving` to `--out`/export/1), timing it, with the
     RSS it adds while exporting (its peak over the RSS before);
  4. serve: a process that imports TensorFlow only loads the export and
     serves 8 examples, which must equal the restored model's predictions
     ("serve: predictions equal").
The restore reads the checkpoint before the model is built, so each table is
created from its saved value, one at a time: restoring into a built model
reads every tensor in one `RestoreV2` beside the existing tables, twice the
tables' memory (more than a 24 GiB machine has at 100M). The summary is
printed and written to `--out`/scale.md; the checkpoint and the export are
deleted unless `--keep`.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

from benchmarks import procmem
from benchmarks import timing
from benchmarks import workload as workload_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the repository
GB = 1e9
DIM, SMALL_TABLES, SMALL_ROWS = 16, 3, 100_000
WARMUP, MORE_STEPS, SAMPLE, DISTINCT_BATCHES = 5, 5, 1000, 16
SERVED = 8  # examples served from the export


def parse_args(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="\n".join(__doc__.splitlines()[1:]))
  p.add_argument("--rows", type=int, default=100_000_000,
                 help="rows of the big table")
  p.add_argument("--compare-rows", type=int, default=1_000_000,
                 help="the big table's rows in the comparison (0: none)")
  p.add_argument("--batch", type=int, default=4096)
  p.add_argument("--steps", type=int, default=200, help="timed steps")
  p.add_argument("--out", default="/tmp/tfemb_scale")
  p.add_argument("--keep", action="store_true", help="keep the checkpoint")
  p.add_argument("--child", choices=("compare", "save", "restore", "serve"),
                 help=argparse.SUPPRESS)
  return p.parse_args(argv)


def table_sizes(args) -> dict:
  return {"big": args.rows,
          **{f"small{i}": SMALL_ROWS for i in range(SMALL_TABLES)}}


def make_batches(args):
  """Zipf ids for every table (`Workload.zipf_ids`), and labels."""
  rng = np.random.default_rng(0)
  works = [workload_lib.Workload(vocab=rows, optimizer="adagrad", features=1,
                                 batch=args.batch)
           for rows in table_sizes(args).values()]
  return [({name: w.zipf_ids(rng, i)
            for i, (name, w) in enumerate(zip(table_sizes(args), works))},
           rng.random(args.batch, np.float32))
          for _ in range(DISTINCT_BATCHES)]


def build(args):
  """The checkpointed parts (layer, Dense head, Keras optimizer) and the
  train step; with `--child restore`, restored from `--out`/ckpt."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  import tfemb.layers  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  keras, names = tf.keras, list(table_sizes(args))
  layer = tfemb.layers.TPUEmbedding(
      {n: tfemb.FeatureConfig(tfemb.TableConfig(rows, DIM, name=n), name=n)
       for n, rows in table_sizes(args).items()},
      tfemb.Adagrad(learning_rate=0.1))
  if args.child == "restore":  # before the tables exist: created from it
    status = tf.train.Checkpoint(embedding=layer).read(prefix(args))
  inputs = {n: keras.Input(shape=(), dtype="int64", name=n) for n in names}
  model = keras.Model(inputs, train_step.concat_head(keras, layer(inputs),
                                                     names))
  optimizer = keras.optimizers.Adagrad(learning_rate=0.1)
  optimizer.build(model.trainable_variables)
  head = model.layers[-1]
  if args.child == "restore":
    status.assert_existing_objects_matched().expect_partial()
    tf.train.Checkpoint(head=head, optimizer=optimizer).read(
        prefix(args)).assert_existing_objects_matched().expect_partial()
  return (dict(embedding=layer, head=head, optimizer=optimizer),
          train_step.keras_train_step(model, optimizer), model)


def prefix(args):
  return os.path.join(args.out, "ckpt")


def export_dir(args):
  return os.path.join(args.out, "export", "1")  # TF Serving's layout


def served_features(batches):
  return {name: ids[:SERVED] for name, ids in batches[0][0].items()}


def reset_peak_rss():
  """Linux: VmHWM starts again from the current RSS."""
  try:
    pathlib.Path("/proc/self/clear_refs").write_text("5")
  except OSError:
    pass


def export(args, model, batches) -> dict:
  """The restored model, exported for serving; its predictions of the
  served examples for the serve part to compare."""
  import tfemb  # pylint: disable=g-import-not-at-top
  features = served_features(batches)
  predictions = model.predict(features, verbose=0).ravel()
  reset_peak_rss()
  result = {"rss_before": procmem.rss()}
  began = time.perf_counter()
  tfemb.export_for_serving(model, export_dir(args))
  phase(result, "export", began)
  result["peak_rss"] = procmem.peak_rss()
  result["bytes"] = sum(p.stat().st_size
                        for p in pathlib.Path(export_dir(args)).rglob("*")
                        if p.is_file())
  result["predictions"] = predictions.tolist()
  return result


def serve(args) -> int:
  """Loads the export with TensorFlow alone and serves `SERVED` examples."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  result = {"rss_start": procmem.rss()}
  began = time.perf_counter()
  signature = tf.saved_model.load(export_dir(args)).signatures[
      "serving_default"]
  phase(result, "load", began)
  features = served_features(make_batches(args))
  out = signature(**{k: tf.constant(v) for k, v in features.items()})
  result["predictions"] = list(out.values())[0].numpy().ravel().tolist()
  result["tfemb_imported"] = any(m.split(".")[0] == "tfemb"
                                 for m in sys.modules)
  result["peak_rss"] = procmem.peak_rss()
  pathlib.Path(args.out, "serve.json").write_text(json.dumps(result))
  return 0


def phase(result, name, began):
  seconds, rss = time.perf_counter() - began, procmem.rss()
  result[name] = {"seconds": seconds, "rss": rss}
  print(f"{name:8s} {seconds:8.1f} s   RSS {rss / GB:6.2f} GB", flush=True)


def sample_rows(layer, batches):
  """{"<table>/<parameters|accumulators>": rows} of the `SAMPLE` most
  touched and `SAMPLE` random ids of each table."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for table, variables in layer.embedding_variables.items():
    ids, counts = np.unique(np.concatenate([f[table.name] for f, _ in batches]),
                            return_counts=True)
    ids = np.unique(np.concatenate([
        ids[np.argsort(-counts, kind="stable")[:SAMPLE]],
        np.random.default_rng(1).integers(0, table.vocabulary_size, SAMPLE)]))
    for kind, variable in variables.items():
      out[f"{table.name}/{kind}"] = tf.gather(variable, ids).numpy()
  return out


def more_steps(args, step, tensors):
  return [float(step(*tensors[(WARMUP + args.steps + i) % len(tensors)]))
          for i in range(MORE_STEPS)]


def check_restored(args, result, parts, step, batches, tensors):
  """Sampled rows, accumulators and the next losses against the save's."""
  ref = np.load(os.path.join(args.out, "reference.npz"))
  got = sample_rows(parts["embedding"], batches)
  for kind, what in (("parameters", "rows"), ("accumulators",) * 2):
    keys = [k for k in ref.files if k.endswith("/" + kind)]
    differ = [k for k in keys if not np.array_equal(ref[k], got[k])]
    result[what + "_equal"] = not differ
    print(f"restore: {what} "
          f"{'DIFFER in ' + ', '.join(differ) if differ else 'equal'} "
          f"({sum(len(ref[k]) for k in keys)} sampled rows of {len(keys)} "
          "tables)", flush=True)
  result["losses"] = more_steps(args, step, tensors)
  result["saved_losses"] = ref["losses"].tolist()
  result["losses_equal"] = bool(np.allclose(result["losses"], ref["losses"],
                                            rtol=1e-5, atol=0))
  print(f"restore: loss {'continues' if result['losses_equal'] else 'DIFFERS'}"
        f": {fmt(result['losses'])} (save process: "
        f"{fmt(result['saved_losses'])})", flush=True)
  return all(result[k + "_equal"] for k in ("rows", "accumulators", "losses"))


def run_child(args) -> int:
  """One part, in this process; writes `--out`/<part>.json."""
  if args.child == "serve":
    return serve(args)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb.layers  # pylint: disable=g-import-not-at-top,unused-import
  result = {"rows": args.rows, "rss_start": procmem.rss(),  # after imports
            "tables_and_slots": 2 * sum(table_sizes(args).values()) * DIM * 4}
  batches = make_batches(args)
  tensors = timing.to_tensors(batches)
  began = time.perf_counter()
  parts, step, model = build(args)
  phase(result, "restore" if args.child == "restore" else "build", began)
  ok = True
  if args.child == "restore":
    ok = check_restored(args, result, parts, step, batches, tensors)
    result["export"] = export(args, model, batches)
  else:
    began = time.perf_counter()
    result["first_loss"] = float(step(*tensors[0]))
    timing.time_steps(step, tensors, WARMUP - 1, start=1)
    result.update(timing.summary(
        timing.time_steps(step, tensors, args.steps, start=WARMUP)))
    phase(result, "train", began)
  if args.child == "save":
    began = time.perf_counter()
    tf.train.Checkpoint(**parts).write(prefix(args))
    phase(result, "save", began)
    result["checkpoint_bytes"] = sum(
        p.stat().st_size for p in pathlib.Path(args.out).glob("ckpt.*"))
    reference = sample_rows(parts["embedding"], batches)  # before steps
    np.savez(os.path.join(args.out, "reference.npz"),
             losses=more_steps(args, step, tensors), **reference)
  result["ok"], result["peak_rss"] = ok, procmem.peak_rss()
  pathlib.Path(args.out, f"{args.child}.json").write_text(json.dumps(result))
  return 0 if ok else 1


def fmt(losses):
  return " ".join(f"{x:.6f}" for x in losses)


def spawn(argv, child, rows):
  """Runs part `child` in a new process: `argv`'s options, then overrides."""
  print(f"--- {child}: big table {rows:,} rows", flush=True)
  path = pathlib.Path(parse_args(argv).out, f"{child}.json")
  path.unlink(missing_ok=True)
  code = subprocess.run(
      [sys.executable, "-m", "experiments.scale", *argv, "--child", child,
       "--rows", str(rows)], cwd=ROOT, check=False).returncode
  if not path.exists():
    raise SystemExit(f"{child} process failed (exit code {code})")
  return json.loads(path.read_text())


def summary(argv, args, compare, saved, restored):
  def equal(k):
    return "equal" if restored[k + "_equal"] else "DIFFER"
  lines = [
      f"## tfemb at scale: {args.rows:,} x {DIM} rows, Adagrad: "
      f"{'PASS' if restored['ok'] else 'FAIL'}", "",
      f"`python -m experiments.scale {' '.join(argv)}` (batch {args.batch}; "
      f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})", "",
      "- seconds (RSS after, GB): " + ", ".join(
          f"{name} {r[name]['seconds']:.1f} ({r[name]['rss'] / GB:.2f})"
          for name, r in (("build", saved), ("train", saved), ("save", saved),
                          ("restore", restored))),
      f"- step: median {saved['median_ms']:.2f} ms (p10 "
      f"{saved['p10_ms']:.2f}, p90 {saved['p90_ms']:.2f}) over {args.steps} "
      f"steps, {args.batch / saved['median_ms'] * 1e3:,.0f} examples/s"]
  if compare:
    lines.append(
        f"- flat in the vocabulary: {compare['median_ms']:.2f} ms at "
        f"{compare['rows']:,} rows; {args.rows:,} / {compare['rows']:,}: "
        f"{saved['median_ms'] / compare['median_ms']:.2f}x")
  lines += [
      f"- checkpoint: {saved['checkpoint_bytes'] / GB:.2f} GB on disk",
      f"- restore: rows {equal('rows')}, accumulators "
      f"{equal('accumulators')} ({SAMPLE} most touched + {SAMPLE} random ids"
      f" per table); losses {equal('losses')}: the next {MORE_STEPS} steps "
      f"{fmt(restored['losses'])} after restoring, "
      f"{fmt(restored['saved_losses'])} without (first step "
      f"{saved['first_loss']:.6f})", "",
      "| process | big table rows | tables + slots (GB) | RSS at start (GB) "
      "| peak RSS (GB) | (peak - start) / (tables + slots) |",
      "|---|---:|---:|---:|---:|---:|"]
  for name, r in (("save", saved), ("restore", restored), ("compare", compare)):
    if r:
      tables, start, peak = r["tables_and_slots"], r["rss_start"], r["peak_rss"]
      lines.append(f"| {name} | {r['rows']:,} | {tables / GB:.2f} | "
                   f"{start / GB:.2f} | {peak / GB:.2f} | "
                   f"{(peak - start) / tables:.2f}x |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.child:
    return run_child(args)
  try:
    compare = (spawn(argv, "compare", args.compare_rows)
               if args.compare_rows else None)
    saved = spawn(argv, "save", args.rows)
    restored = spawn(argv, "restore", args.rows)
    served = spawn(argv, "serve", args.rows)
  finally:
    if not args.keep:
      for path in [*pathlib.Path(args.out).glob("ckpt*"),
                   pathlib.Path(args.out, "reference.npz")]:
        path.unlink(missing_ok=True)
      shutil.rmtree(pathlib.Path(args.out, "export"), ignore_errors=True)
  served["equal"] = bool(np.allclose(served["predictions"],
                                     restored["export"]["predictions"],
                                     rtol=1e-5, atol=1e-6))
  print(f"serve: predictions {'equal' if served['equal'] else 'DIFFER'}",
        flush=True)
  text = summary(argv, args, compare, saved, restored) + serving_summary(
      args, restored["export"], served)
  print(text)
  pathlib.Path(args.out, "scale.md").write_text(text)
  return 0 if restored["ok"] and served["equal"] else 1


def serving_summary(args, exported, served) -> str:
  big_table = args.rows * DIM * 4
  added = exported["peak_rss"] - exported["rss_before"]
  return "\n".join([
      "", f"### Serving export ({SERVED} examples served)", "",
      f"- export: {exported['export']['seconds']:.1f} s, "
      f"{exported['bytes'] / GB:.2f} GB on disk (tables "
      f"{sum(table_sizes(args).values()) * DIM * 4 / GB:.2f} GB); RSS added "
      f"while exporting {added / GB:.2f} GB = {added / big_table:.2f}x the "
      "big table",
      f"- load (TensorFlow only, tfemb "
      f"{'imported' if served['tfemb_imported'] else 'not imported'}): "
      f"{served['load']['seconds']:.1f} s, peak RSS "
      f"{served['peak_rss'] / GB:.2f} GB (at start "
      f"{served['rss_start'] / GB:.2f})",
      f"- served predictions {'equal' if served['equal'] else 'DIFFER'} to "
      f"the model's: {fmt(served['predictions'][:4])} ...", ""])


if __name__ == "__main__":
  sys.exit(main())
