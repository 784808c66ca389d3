"""Command line: convert a TPUEstimator checkpoint for tfemb.

    python -m tfemb.migrate OLD_CHECKPOINT -o NEW_PREFIX [--table VAR=TABLE]
    python -m tfemb.migrate OLD_CHECKPOINT --list

A refusal exits with status 1 and one line on stderr naming the file and
the reason (`--debug`: the traceback); bad arguments exit with status 2 and
one line. No output checkpoint is left behind by a failure.
"""

import argparse
import sys

from tfemb.migrate import converter
from tfemb.migrate import errors
from tfemb.migrate import estimator_names

_EPILOG = """\
Tables: by default every feature-column table (variables
'<scope>/<column>_embedding/embedding_weights' and
'<scope>/<columns>_shared_embedding'), named as TPUEstimator named them:
'tbl_<column>' and 'tbl_<columns>_shared_embedding', which is what
tfemb.compat.v1.EmbeddingConfigSpec names them. Tables from
table_to_config_dict are variables named like the table: give them with
--table NAME. Slots (Adagrad, Adam, FTRL) are found by TPUEstimator's names
and written as tfemb's (accumulators, momenta/velocities,
accumulators/linears).

Restore with:  tf.train.Checkpoint(embedding=tpu_embedding).restore(NEW)
(use --root if the TPUEmbedding sits elsewhere in the checkpointed object).
The output's directory 'checkpoint' file is written only where there is
none (or it names NEW already): converting into the TPUEstimator's own
model_dir leaves its 'checkpoint' file, and --list, as they were.
"""


class _Parser(argparse.ArgumentParser):
  """argparse, with its usage errors on one line."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message}\n")


def _parse_table(text):
  variable, _, table = text.partition("=")
  if not variable:
    raise argparse.ArgumentTypeError(f"--table {text!r}: expected VAR[=NAME]")
  return variable, table


def parser():
  p = _Parser(
      prog="python -m tfemb.migrate",
      description="Convert a TPUEstimator checkpoint's TPU embedding tables "
      "and optimizer slots into a tf.train.Checkpoint that "
      "tfemb.TPUEmbedding (and tf.tpu.experimental.embedding.TPUEmbedding) "
      "restores. Streams row blocks: a table larger than memory is fine.",
      epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("input", help="TPUEstimator checkpoint prefix or directory")
  p.add_argument("-o", "--output", help="prefix of the checkpoint to write")
  p.add_argument("--table", action="append", type=_parse_table, default=[],
                 metavar="VAR[=NAME]",
                 help="convert checkpoint variable VAR as table NAME "
                 "(repeatable; default NAME: TPUEstimator's table name for "
                 "a feature-column variable, else VAR)")
  p.add_argument("--root", default="embedding",
                 help="path of the TPUEmbedding in the tf.train.Checkpoint "
                 "(default: embedding)")
  p.add_argument("--partition-strategy", choices=("div", "mod"),
                 default="div",
                 help="EmbeddingConfigSpec.partition_strategy (default: div)")
  p.add_argument("--num-hosts", type=int,
                 help="TPU hosts of the run (read from the checkpoint's "
                 "slices if omitted; needed for 'mod' if saved whole)")
  p.add_argument("--block-rows", type=int,
                 help="rows per block (default: about 64 MiB per variable)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an existing output checkpoint")
  p.add_argument("--list", action="store_true",
                 help="list the tables that would be converted, and exit")
  p.add_argument("-q", "--quiet", action="store_true",
                 help="no progress output")
  p.add_argument("--debug", action="store_true",
                 help="on failure, the traceback instead of one line")
  return p


def _tables(args):
  if not args.table:
    return None
  return {var: name or estimator_names.default_table_name(var) or var
          for var, name in args.table}


def main(argv=None) -> int:
  p = parser()
  args = p.parse_args(argv)
  if not args.list and not args.output:
    p.error("--output is required (or --list)")
  try:
    return _run(args)
  except Exception as e:  # pylint: disable=broad-except
    if args.debug:
      raise
    if isinstance(e, errors.ConversionError):
      line = f"{e.path}: {e.reason}"
    else:  # unforeseen: still one line, naming the input
      line = f"{args.input}: {type(e).__name__}: {errors.first_line(e)}"
    print(f"{p.prog}: error: {line}", file=sys.stderr)
    return 1


def _run(args) -> int:
  tables = _tables(args)
  if args.list:
    plan = converter.describe(args.input, tables)
    for variable, p in plan.items():
      print(f"{variable} -> {p.table}  {p.shape[0]} x {p.shape[1]}  "
            f"{p.optimizer}  slots {p.slots}" +
            (f"  (not converted: {p.ignored})" if p.ignored else ""))
    if not plan:
      print("no feature-column tables found; name tables with --table")
    return 0
  converter.convert_checkpoint(
      args.input, args.output, tables=tables, root=args.root,
      partition_strategy=args.partition_strategy, num_hosts=args.num_hosts,
      block_rows=args.block_rows, overwrite=args.overwrite,
      progress=None if args.quiet else converter.print_progress)
  return 0


if __name__ == "__main__":
  sys.exit(main())
