"""`tfemb.tpu.plan`: what a configuration needs on a TPU, before renting one.

For TensorFlow's `TPUEmbedding` (embedding hardware V1), per table: rows,
dim, and the float32 bytes of its parameters and of each optimizer slot;
then the bytes on the fullest host and on the fullest chip; and the
`TPUEmbeddingConfiguration` proto TensorFlow would send
(`tfemb.tpu.planner.config_proto`).

How rows are placed: TensorFlow pads a table to `max(vocabulary_size,
num_hosts)` rows and divides them over the hosts, the first
`rows % num_hosts` hosts taking one more row (`DIV_DEFAULT` in the proto,
and the partition of `make_sharded_variable_creator`). Inside a host the TPU
runtime places rows on its chips; TensorFlow does not show how, so per chip
is the host's share split evenly over its chips, rounded up (an estimate).
The engine's own working buffers are not counted.
"""

import dataclasses
import numbers
from typing import Any, Dict, Optional, Tuple

from tfemb import optimizers
from tfemb.tpu.planner import config_proto as config_proto_lib
from tfemb.tpu.planner import report

BYTES_PER_VALUE = 4  # TensorFlow creates TPU tables and slots as float32.


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


@dataclasses.dataclass(frozen=True)
class TablePlan:
  """One table: its size, and its largest share on a host and on a chip."""
  name: str
  rows: int
  dim: int
  optimizer: str
  slots: Tuple[str, ...]
  rows_per_host: int
  rows_per_chip: int

  def _bytes(self, rows: int) -> int:
    """Bytes of `rows` rows of the parameters and every slot."""
    return rows * self.dim * BYTES_PER_VALUE * (1 + len(self.slots))

  @property
  def variable_bytes(self) -> int:
    """Bytes of the parameters, and of each slot (all are rows x dim)."""
    return self.rows * self.dim * BYTES_PER_VALUE

  @property
  def slot_bytes(self) -> Dict[str, int]:
    return {slot: self.variable_bytes for slot in self.slots}

  @property
  def total_bytes(self) -> int:
    return self._bytes(self.rows)

  @property
  def bytes_per_host(self) -> int:
    return self._bytes(self.rows_per_host)

  @property
  def bytes_per_chip(self) -> int:
    return self._bytes(self.rows_per_chip)


@dataclasses.dataclass(frozen=True)
class FeaturePlan:
  path: str
  table: str
  input_shape: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TPUPlan:
  """The plan; `str(plan)` is a readable report, `plan.proto` the proto."""
  tables: Tuple[TablePlan, ...]
  features: Tuple[FeaturePlan, ...]
  num_replicas: int
  num_tensor_cores: int
  num_hosts: int
  chips_per_host: int
  per_replica_batch_size: Optional[int]
  proto: Any  # TPUEmbeddingConfiguration

  @property
  def total_bytes(self) -> int:
    return sum(t.total_bytes for t in self.tables)

  @property
  def bytes_per_host(self) -> int:
    """On the fullest host (the first: it takes the extra row of each table)."""
    return sum(t.bytes_per_host for t in self.tables)

  @property
  def bytes_per_chip(self) -> int:
    return sum(t.bytes_per_chip for t in self.tables)

  def __str__(self) -> str:
    return report.format_plan(self)


def _check_counts(**counts) -> None:
  """Each count an integer >= 1 (None where it may be left out: the
  optional ones' defaults are None, and 0 is not "not given")."""
  for name, value in counts.items():
    optional = name not in ("num_replicas", "num_hosts")
    if (value is None and optional) or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
        and value >= 1):
      continue
    raise ValueError(f"{name}={value!r}: expected an integer >= 1"
                     f"{' or None' if optional else ''}.")


def _topology(num_replicas, num_hosts, chips_per_host, num_cores_per_replica):
  """(TensorCores, chips per host), checked."""
  cores = num_replicas * (num_cores_per_replica or 1)
  if cores % num_hosts:
    raise ValueError(
        f"num_hosts={num_hosts} must be >= 1 and divide the {cores} "
        "TensorCores (num_replicas x num_cores_per_replica).")
  per_host = cores // num_hosts
  chips_per_host = per_host if chips_per_host is None else chips_per_host
  if per_host % chips_per_host:
    raise ValueError(
        f"chips_per_host={chips_per_host} must be >= 1 and divide the "
        f"{per_host} TensorCores of a host.")
  return cores, chips_per_host


def plan(feature_config: Any,
         optimizer: Optional[Any],
         num_replicas: int,
         per_replica_batch_size: Optional[int] = None,
         *,
         num_hosts: int = 1,
         chips_per_host: Optional[int] = None,
         num_cores_per_replica: Optional[int] = None,
         pipeline_execution_with_tensor_core: bool = False) -> TPUPlan:
  """Plans `feature_config` on a TPU slice with embedding hardware V1.

  Args:
    feature_config: a nested structure of `FeatureConfig`s (tfemb's or
      TensorFlow's); nothing in it is changed.
    optimizer: the optimizer of tables without their own (tfemb's or
      TensorFlow's SGD, Adagrad, AdagradMomentum, Adam or FTRL).
    num_replicas: `strategy.num_replicas_in_sync` on the TPU.
    per_replica_batch_size: the batch per replica (`build`'s argument); may be
      None if every feature has a fully defined `output_shape`.
    num_hosts: hosts of the slice.
    chips_per_host: TPU chips per host; default: one TensorCore per chip
      (e.g. 2 TensorCores per chip, as v2/v3: half the host's TensorCores).
    num_cores_per_replica: TensorCores per replica (model parallelism).
    pipeline_execution_with_tensor_core: as for `TPUEmbedding`.

  Returns:
    A `TPUPlan`.
  """
  _check_counts(num_replicas=num_replicas,
                per_replica_batch_size=per_replica_batch_size,
                num_hosts=num_hosts, chips_per_host=chips_per_host,
                num_cores_per_replica=num_cores_per_replica)
  cores, chips_per_host = _topology(num_replicas, num_hosts, chips_per_host,
                                    num_cores_per_replica)
  resolved = config_proto_lib.resolve(feature_config, optimizer)
  shapes = config_proto_lib.output_shapes(resolved, per_replica_batch_size)
  proto = config_proto_lib.config_proto(resolved, shapes, num_replicas,
                                        num_hosts, num_cores_per_replica,
                                        pipeline_execution_with_tensor_core)
  tables = []
  for table, name, opt in zip(resolved.tables, resolved.table_names,
                              resolved.optimizers):
    # The fullest host: the first. (TensorFlow pads a table to
    # max(vocabulary_size, num_hosts) rows, which gives it the same share.)
    rows_per_host = _ceil_div(table.vocabulary_size, num_hosts)
    declaration = optimizers.identify(opt)
    tables.append(TablePlan(
        name=name, rows=table.vocabulary_size, dim=table.dim,
        optimizer=declaration.name, slots=tuple(declaration.slots),
        rows_per_host=rows_per_host,
        rows_per_chip=_ceil_div(rows_per_host, chips_per_host)))
  features = tuple(
      FeaturePlan(path, resolved.table_names[resolved.table_id(f)],
                  tuple(shape.as_list()))
      for path, f, shape in zip(resolved.paths, resolved.features, shapes))
  return TPUPlan(tuple(tables), features, num_replicas, cores, num_hosts,
                 chips_per_host, per_replica_batch_size, proto)
