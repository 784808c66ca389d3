"""tfemb.options: the host engine's options, set in code.

Defaults come from the environment; `use` changes them inside a block,
`set` for the process; an engine keeps the options it was constructed
with. Its numbers are the numpy reference's either way.
"""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb import interleaved_tables
from tfemb import options

ROOT = str(helpers.ROOT)
ENV = ("TFEMB_FUSED_KERNELS", "TFEMB_INTERLEAVED_SLOTS", "TFEMB_MALLOC_TUNING",
       "TFEMB_KERNEL_MARCH", "TFEMB_KERNEL_CACHE", "TFEMB_CLUSTER_UPDATE_LOCK")


@pytest.fixture(autouse=True)
def no_process_changes(monkeypatch):
  """Every test starts from the environment's defaults, and a test's
  `options.set` ends with it."""
  for name in ENV:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(options, "_process", {})


def _options_in_a_process(env):
  script = ("import dataclasses, json\nfrom tfemb import options\n"
            "print(json.dumps(dataclasses.asdict(options.get())))")
  done = subprocess.run(
      [sys.executable, "-c", script], cwd=ROOT, capture_output=True,
      text=True, timeout=300, check=False,
      env=dict({k: v for k, v in os.environ.items() if k not in ENV},
               TF_CPP_MIN_LOG_LEVEL="3", **env))
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


def test_defaults_come_from_the_environment():
  assert _options_in_a_process({
      "TFEMB_FUSED_KERNELS": "0", "TFEMB_INTERLEAVED_SLOTS": "off",
      "TFEMB_MALLOC_TUNING": "false", "TFEMB_KERNEL_MARCH": "x86-64",
      "TFEMB_KERNEL_CACHE": "/tmp/somewhere",
      "TFEMB_CLUSTER_UPDATE_LOCK": "1"}) == {
          "fused_kernels": False, "interleaved_slots": False,
          "malloc_tuning": False, "kernel_march": "x86-64",
          "kernel_cache": "/tmp/somewhere", "cluster_update_lock": True}


def test_without_the_environment_the_defaults_apply():
  assert options.get() == options.Options(
      fused_kernels=True, interleaved_slots=True, malloc_tuning=True,
      kernel_march="auto", kernel_cache=None, cluster_update_lock=False)
  assert options.get() == options.Options()


def test_the_environment_is_read_when_options_are_asked_for(monkeypatch):
  monkeypatch.setenv("TFEMB_FUSED_KERNELS", "no")
  assert not options.get().fused_kernels
  monkeypatch.setenv("TFEMB_FUSED_KERNELS", "1")
  assert options.get().fused_kernels


def test_use_nests_and_restores(monkeypatch):
  monkeypatch.setenv("TFEMB_INTERLEAVED_SLOTS", "0")
  with options.use(fused_kernels=False) as outer:
    assert outer == options.get()
    assert not outer.fused_kernels and not outer.interleaved_slots
    with options.use(interleaved_slots=True, fused_kernels=True) as inner:
      assert inner.fused_kernels and inner.interleaved_slots
      assert options.get() == inner
    assert options.get() == outer
    with pytest.raises(ValueError, match="inside"):
      with options.use(malloc_tuning=False):
        raise ValueError("inside")
    assert options.get() == outer
  assert options.get() == options.Options(interleaved_slots=False)


def test_a_block_left_out_of_order_takes_only_its_own_changes():
  # Blocks of two threads: the first entered is left first.
  first = options.use(kernel_march="x86-64")
  first.__enter__()
  second_entered, first_left = threading.Event(), threading.Event()

  def second():
    with options.use(kernel_cache="/tmp/elsewhere"):
      second_entered.set()
      first_left.wait()

  thread = threading.Thread(target=second)
  thread.start()
  second_entered.wait()
  first.__exit__(None, None, None)
  assert options.get().kernel_march == "auto"
  assert options.get().kernel_cache == "/tmp/elsewhere"
  first_left.set()
  thread.join()
  assert options.get() == options.Options()


def test_set_lasts_and_use_wins_over_it():
  options.set(malloc_tuning=False, kernel_march="")
  assert options.get() == options.Options(malloc_tuning=False,
                                          kernel_march="")
  with options.use(malloc_tuning=True):
    assert options.get().malloc_tuning
  assert not options.get().malloc_tuning
  options.set(malloc_tuning=True)
  assert options.get() == options.Options(kernel_march="")


@pytest.mark.parametrize("change", [options.set, options.use,
                                    options.Options])
def test_unknown_names_raise_naming_the_options(change):
  with pytest.raises(TypeError, match="fused_kernel"):
    change(fused_kernel=False)  # a typo
  if change is not options.Options:
    with pytest.raises(TypeError, match=r"fused_kernels.*interleaved_slots"
                       r".*malloc_tuning.*kernel_march.*kernel_cache"):
      change(fused_kernel=False)
  assert options.get() == options.Options()


@pytest.mark.parametrize("change", [options.set, options.use,
                                    options.Options])
@pytest.mark.parametrize("name, value, takes", [
    ("fused_kernels", "off", "True or False"),
    ("fused_kernels", "0", "True or False"),
    ("interleaved_slots", 0, "True or False"),
    ("malloc_tuning", None, "True or False"),
    ("kernel_march", 3, "a str"),
    ("kernel_march", None, "a str"),
    ("kernel_cache", 1, "None or a directory"),
])
def test_values_of_the_wrong_type_raise_naming_the_option(change, name, value,
                                                          takes):
  """Not accepted and ignored: `fused_kernels="off"` would leave the
  kernels on (a non-empty str is true)."""
  with pytest.raises(TypeError, match=f"tfemb option {name} takes {takes}.*"
                     f"got {value!r}"):
    change(**{name: value})
  assert options.get() == options.Options()


def test_a_kernel_cache_may_be_a_path(tmp_path):
  with options.use(kernel_cache=tmp_path) as opts:
    assert opts.kernel_cache == str(tmp_path)


def test_options_are_exported_and_frozen():
  assert tfemb.options is options and tfemb.Options is options.Options
  assert "Options" in tfemb.__all__
  with pytest.raises(AttributeError):
    options.get().fused_kernels = False


# --- per engine ---------------------------------------------------------------

VOCAB, DIM, BATCH, LR = 8, 4, 6, 0.5
START = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 10


def _engine():
  table = tfemb.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(START))
  engine = tfemb.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table)},
      tfemb.Adagrad(LR, initial_accumulator_value=0.5))
  return table, engine


def _train(table, engine, batches):
  """Steps of a traced function; its op types, the table after them."""

  @tf.function
  def step(ids, grads):
    engine.enqueue({"f": ids}, training=True)
    engine.dequeue()
    engine.apply_gradients({"f": grads})

  for ids, grads in batches:
    step(tf.constant(ids), tf.constant(grads))
  graph = step.get_concrete_function(*map(tf.constant, batches[0])).graph
  types = {op.type for op in graph.get_operations()}
  types |= {n.op for f in graph.as_graph_def().library.function
            for n in f.node_def}
  return types, engine.embedding_tables[table].numpy()


def test_an_engine_keeps_the_options_it_was_constructed_with():
  with options.use(fused_kernels=False):
    plain_table, plain = _engine()
  fused_table, fused = _engine()  # the default: the kernels
  with options.use(fused_kernels=False):  # changes neither engine now
    plain.build(BATCH)
    fused.build(BATCH)
  parameters = [plain._variables["t"]["parameters"],  # pylint: disable=protected-access
                fused._variables["t"]["parameters"]]  # pylint: disable=protected-access
  assert not isinstance(parameters[0], interleaved_tables.ColumnView)
  assert isinstance(parameters[1], interleaved_tables.ColumnView)

  rng = np.random.default_rng(0)
  batches = [(rng.integers(0, VOCAB, BATCH),
              rng.normal(size=(BATCH, DIM)).astype(np.float32))
             for _ in range(3)]
  want = reference.Table(START, "adagrad",
                         {"initial_accumulator_value": 0.5})
  for ids, grads in batches:
    summed = {}
    for i, g in zip(ids, grads.astype(np.float64)):
      summed[int(i)] = summed.get(int(i), 0.0) + g
    want.apply(summed, LR)
  with options.use(fused_kernels=False):
    types, table = _train(fused_table, fused, batches)
  assert "TfembApplyTables" in types
  np.testing.assert_allclose(table, want.w, rtol=1e-5, atol=1e-6)
  types, table = _train(plain_table, plain, batches)
  assert not {"TfembApplyRows", "TfembApplyTables",
              "TfembDedupGather"} & set(types)
  np.testing.assert_allclose(table, want.w, rtol=1e-5, atol=1e-6)
