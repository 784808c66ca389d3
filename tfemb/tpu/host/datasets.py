"""A host `TPUStrategy`'s distributed datasets: each worker's replicas read
their batches from one iterator of the worker's dataset.

TensorFlow's `experimental_distribute_dataset` (`input_lib`) gives each
iterator a `MultiDeviceIterator`, which traces six functions per replica
and starts a thread that fills a buffer per replica. Keras' `fit` makes a
new iterator at every epoch (two: one as the last epoch ends), so under
`MirroredStrategy` every epoch after the first starts by tracing them
again, 6 x replicas functions, and by tearing the last one down; on a
host of a few cores, where those threads wait for the cores the step
uses, that is seconds per epoch. The replicas of a host TPU are logical
devices of one CPU, so their batches need no copy ahead of the step: here
an iterator is one plain iterator of the (rebatched) dataset, and a step
takes the replicas' batches from it in turn, replica k the k-th, which is
how `MultiDeviceIterator` deals them out. Making one traces nothing.

Everything else is TensorFlow's: the rebatching and sharding, the
partial-batch handling, the `PerReplica` values. `distribute_datasets_
from_function`'s datasets are read so too, and so is an iterator made
inside a `tf.function`: there `MultiDeviceIterator`'s read of each
replica's batch holds a thread of TensorFlow's inter-op pool while it
waits, and with fewer threads than replicas (a thread per core by
default) the thread that fills the buffers never runs, and the program
stops.
"""

from typing import Any, Sequence

import tensorflow as tf

from tfemb.tpu.host import tf_internals


def _copy(value):
  """`value` (any structure) on the current device."""
  return tf.nest.map_structure(tf.identity, value, expand_composites=True)


class ReplicaBatches(tf_internals.CompositeTensor):
  """`MultiDeviceIterator`'s interface over one plain iterator: each call
  takes one element per device, in the devices' order, each placed on its
  device.

  Rebuilt from its components (a `tf.function`'s argument, as Keras passes
  its iterator), it places nothing, as TensorFlow's iterator rebuilt so
  places nothing: its batches name no device, which TensorFlow's TPU
  engine reads as on the host (`tfemb.tpu.host.tpu_rules`)."""

  def __init__(self, dataset=None, devices: Sequence[str] = (),
               components=None, element_spec=None):
    self._devices = tuple(devices)
    self._placed = dataset is not None
    if dataset is not None:
      self._iterator = iter(dataset)
      self._element_spec = dataset.element_spec
    else:
      (self._iterator,), self._element_spec = components, element_spec

  @property
  def iterator(self):
    """The one plain iterator every replica's batch is read from."""
    return self._iterator

  def get_next(self, device=None):
    if device is not None:
      raise ValueError("A host TPUStrategy's input deals one batch to every "
                       "replica at once: call get_next() without a device.")
    batches = []
    for device_name in self._devices:  # in order: replica k gets the k-th
      value = self._iterator.get_next()
      if not self._placed:
        batches.append(value)
        continue
      with tf.device(device_name):
        batches.append(_copy(value))
    return batches

  def get_next_as_optional(self):
    """An optional per device, made on it (as `MultiDeviceIterator`'s
    are): its value is read there."""
    optionals = []
    for device_name in self._devices:
      optional = self._iterator.get_next_as_optional()
      with tf.device(device_name):
        optionals.append(tf.cond(
            optional.has_value(),
            lambda o=optional: tf.experimental.Optional.from_value(
                _copy(o.get_value())),
            lambda o=optional: tf.experimental.Optional.empty(
                o.element_spec)))
    return optionals

  @property
  def element_spec(self):
    return self._element_spec

  @property
  def _type_spec(self):
    return ReplicaBatchesSpec(self._devices, self._element_spec)


class ReplicaBatchesSpec(tf_internals.TypeSpec):
  """The type of `ReplicaBatches`: its devices and element spec, so that an
  iterator of the next epoch passed to a `tf.function` traces nothing."""

  __slots__ = ["_devices", "_element_spec"]

  def __init__(self, devices, element_spec):
    self._devices = tuple(devices)
    self._element_spec = element_spec

  @property
  def value_type(self):
    return ReplicaBatches

  def _serialize(self):
    return (self._devices, self._element_spec)

  @property
  def _component_specs(self):
    return [tf_internals.IteratorSpec(self._element_spec)]

  def _to_components(self, value):
    return [value.iterator]

  def _from_components(self, components):
    return ReplicaBatches(devices=self._devices, components=components,
                          element_spec=self._element_spec)

  @staticmethod
  def from_value(value):
    return value._type_spec  # pylint: disable=protected-access


# TensorFlow's iterator classes, with `ReplicaBatches` where they hold a
# `MultiDeviceIterator`. Their types rebuild them as these classes: each
# takes TensorFlow's own object and changes its class (the fields are
# TensorFlow's, in every supported release), so that no constructor's
# arguments are spelled out here.


def _as(value, cls):
  value.__class__ = cls
  return value


class _Rebuilds:
  """A TensorFlow type spec whose values are rebuilt as `_value`."""
  __slots__ = []
  _value = None

  @property
  def value_type(self):
    return self._value

  def _from_components(self, components):
    return _as(super()._from_components(components), self._value)  # pylint: disable=no-member

  @staticmethod
  def from_value(value):
    return value._type_spec  # pylint: disable=protected-access


class _WorkerIterator(tf_internals.SingleWorkerOwnedDatasetIterator):

  def _create_owned_multi_device_iterator(self):
    with tf.device(self._worker):
      self._iterator = ReplicaBatches(self._dataset, self._devices)

  @property
  def _type_spec(self):
    return _as(super()._type_spec, _WorkerIteratorSpec)


class _WorkerIteratorSpec(_Rebuilds,
                          tf_internals.SingleWorkerDatasetIteratorSpec):
  __slots__ = []
  _value = _WorkerIterator

  def _get_multi_device_iterator_spec(self, specs):
    specs.append(ReplicaBatchesSpec(self._devices, self._element_spec))


class _Iterator(tf_internals.DistributedIterator):

  @property
  def _type_spec(self):
    return _as(super()._type_spec, _IteratorSpec)


class _IteratorSpec(_Rebuilds, tf_internals.DistributedIteratorSpec):
  __slots__ = []
  _value = _Iterator

  @property
  def _component_specs(self):
    return [_as(spec, _WorkerIteratorSpec)
            for spec in super()._component_specs]


def _host_iterator(distributed, datasets) -> "_Iterator":
  """The iterator of `distributed` (TensorFlow's distributed dataset of
  either kind) over its workers' `datasets`, each worker's replicas reading
  one iterator of its dataset: what TensorFlow's `__iter__` builds, with
  `_WorkerIterator`s for its per-worker iterators."""
  workers = distributed._input_workers  # pylint: disable=protected-access
  canonicalize = getattr(distributed._strategy, "_canonicalize_devices", True)  # pylint: disable=protected-access
  iterators = []
  for i, worker in enumerate(workers.worker_devices):
    with tf.device(worker):
      iterators.append(_WorkerIterator(
          dataset=datasets[i], worker=worker,
          devices=workers.compute_devices_for_worker(i),
          options=distributed._options, canonicalize_devices=canonicalize))  # pylint: disable=protected-access
  order = getattr(distributed, "_replica_order", None)  # where TF has it
  iterator = _Iterator(
      workers, iterators, distributed._strategy,  # pylint: disable=protected-access
      cardinality=distributed._cardinality,  # pylint: disable=protected-access
      enable_get_next_as_optional=distributed._enable_get_next_as_optional,  # pylint: disable=protected-access
      options=distributed._options,  # pylint: disable=protected-access
      **({} if order is None else {"replica_order": order}))
  iterator._element_spec = distributed._element_spec  # pylint: disable=protected-access
  return iterator


class _Dataset(tf_internals.DistributedDataset):
  """TensorFlow's `DistributedDataset`, whose iterators, eager or made in
  a `tf.function` (the dataset passed to it as an argument too), are
  `_Iterator`s of `_WorkerIterator`s."""

  def __iter__(self):
    return _host_iterator(self, self._cloned_datasets)

  @property
  def _type_spec(self):
    return _as(super()._type_spec, _DatasetSpec)


class _DatasetSpec(_Rebuilds, tf_internals.DistributedDatasetSpec):
  __slots__ = []
  _value = _Dataset


class _DatasetsFromFunction(tf_internals.DistributedDatasetsFromFunction):
  """TensorFlow's `DistributedDatasetsFromFunction`, iterated as
  `_Dataset`."""

  def __iter__(self):
    return _host_iterator(self, self._datasets)

  @property
  def _type_spec(self):
    return _as(super()._type_spec, _DatasetsFromFunctionSpec)


class _DatasetsFromFunctionSpec(
    _Rebuilds, tf_internals.DistributedDatasetsFromFunctionSpec):
  __slots__ = []
  _value = _DatasetsFromFunction


def distribute(extended: Any, dataset: tf.data.Dataset, options) -> Any:
  """`extended`'s (a `MirroredExtended`'s) `experimental_distribute_dataset`
  of `dataset`, iterated as this module says."""
  if (options is not None and options.experimental_replication_mode ==
      tf_internals.PER_REPLICA):
    raise NotImplementedError(
        "InputReplicationMode.PER_REPLICA is only supported in "
        "`distribute_datasets_from_function`.")
  return _Dataset(
      input_workers=extended._input_workers_with_options(options),  # pylint: disable=protected-access
      strategy=extended._container_strategy(),  # pylint: disable=protected-access
      dataset=dataset,
      num_replicas_in_sync=extended._num_replicas_in_sync,  # pylint: disable=protected-access
      options=options)


def distribute_from_function(extended: Any, dataset_fn, options) -> Any:
  """`extended`'s (a `MirroredExtended`'s)
  `distribute_datasets_from_function` of `dataset_fn`: TensorFlow's,
  iterated as this module says."""
  return _as(tf_internals.mirrored_datasets_from_function(
      extended, dataset_fn, options), _DatasetsFromFunction)
