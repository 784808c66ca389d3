"""The update lock: an engine's updates one at a time, and no deadlock.

Each engine reads, computes and writes its rows under a lock of its own
(TensorFlow's `CriticalSection`), so concurrent steps on one engine (threads,
asynchronous parameter-server workers, replicas) lose no update. An engine
whose tables are updated on their parameter servers takes, instead, its
lock on each server (`run_per_server`), held while that server alone works:
no lock is held across servers.

Two rules make every combination of engines in one program deadlock-free
(docs/architecture.md, "The update lock"):

1. **One mutex per engine** (and server). Each lock has its own
   `shared_name`, numbered in the order engines are created (so every
   worker of a cluster, running the same program, names an engine's lock
   alike), with the server's device for a server's lock. Left unnamed,
   TensorFlow names a mutex after its op, and every engine's lock would be
   the same mutex.
2. **In one traced function, the updates run one after the other, in the
   order they were written.** A lock is taken only once every update
   written before it in the same graph has finished. TensorFlow chains
   stateful ops in program order inside a `tf.function`, so an update
   waits for the ones written before it anyway; without rule 2 it could
   take its lock first and then wait, holding it, for an earlier update
   that needs the same lock (or, in another thread, the other order). With
   rule 2 an update holds its lock only when everything it can wait for
   is finished or takes no lock, so it always finishes and releases it.
"""

import contextlib
import itertools
import threading
import traceback
from typing import Callable, Dict, List, Sequence, Tuple
import weakref

import tensorflow as tf

from tfemb import tf_internals

_numbers = itertools.count()  # the engines' locks, in creation order
_graphs_lock = threading.Lock()
_last_update = weakref.WeakKeyDictionary()  # graph -> its last update's
# tensors


class UpdateLock:
  """One engine's locks: `run(fn)` computes and writes an update under the
  engine's lock; `run_per_server(parts)` each part under the engine's lock
  on the parameter server it reads and writes."""

  def __init__(self, strategy):
    self._strategy = strategy
    self._name = f"tfemb_update_{next(_numbers)}"
    self._section = None
    self._servers = {}  # a parameter server's device -> its lock there

  def run(self, fn) -> tf.Tensor:
    """`fn()` under the engine's lock, after every update written before it
    in this graph; `fn` returns a tensor that waits for every write,
    returned here."""
    if self._section is None:
      with tf.init_scope(), _device(self._strategy):
        self._section = tf.CriticalSection(name="tfemb_update",
                                           shared_name=self._name)
    # What the update computes on no device of its own (whether it is
    # finite, the checks of it) runs beside the lock, not where the step
    # runs: under ParameterServerStrategy the lock is then held while the
    # parameter servers alone work, without a worker in between.
    with _device(self._strategy):
      return in_order(lambda: self._section.execute(fn))

  def run_per_server(self, parts: Sequence[Tuple[str, Callable]]
                     ) -> List[tf.Tensor]:
    """Each `(device, fn)` of `parts`: `fn()`, a scalar that waits for its
    writes, under this engine's lock on parameter server `device` (where
    `fn` reads and writes), with every other part of that server; the
    servers' side by side. Returns each part's scalar.

    A server's lock is held while that server works and waits for nothing
    else meanwhile (every input arrives before the lock is taken), so no
    step holds a lock while it waits for another server. One lock per
    server, not per shard: each lock taken is a thread hand-off
    (TensorFlow's `MutexLock`), which costs a server more CPU than the
    shards' updates it could let run side by side. Call it inside
    `in_order`."""
    by_device: Dict[str, List[int]] = {}
    for i, (device, _) in enumerate(parts):
      by_device.setdefault(device, []).append(i)
    out = [None] * len(parts)
    for device, indices in by_device.items():
      if device not in self._servers:
        with tf.init_scope(), tf.device(device):
          self._servers[device] = tf.CriticalSection(
              name="tfemb_server_update",
              shared_name=f"{self._name}_on_{device}")
      with tf.device(device):
        done = self._servers[device].execute(
            lambda indices=indices: tf.stack([parts[i][1]()
                                              for i in indices]))
      for j, i in enumerate(indices):
        out[i] = done[j]
    return out


def in_order(fn):
  """`fn()` after every update written before it in this graph (rule 2),
  as this graph's last update; `fn` returns a tensor that waits for every
  write, returned here."""
  graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  with _graphs_lock:
    before = [] if graph is None else _last_update.get(graph, [])
  try:
    with tf.control_dependencies(before):
      done = fn()
  except Exception as e:
    # Eagerly the lock is held by a tensor in the frames of the failed
    # call until they are freed: cleared now, so that an error kept by
    # the caller does not keep the lock.
    traceback.clear_frames(e.__traceback__)
    raise
  if graph is not None:
    with _graphs_lock:
      _last_update[graph] = tf.nest.flatten(done)
  return done


def _device(strategy):
  """Where the engine's one lock lives: with the tables, on the first
  parameter server (every worker takes it there), else here. Named in
  full: `ParameterServerStrategy`'s `extended.parameter_devices` names the
  coordinator (TensorFlow 2.21), which would then take part in every
  step's update."""
  if not tf_internals.is_parameter_server_strategy(strategy):
    return contextlib.nullcontext()
  return tf.device("/job:ps/replica:0/task:0/device:CPU:0")
