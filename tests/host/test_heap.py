"""tfemb.heap: a step's freed buffers stay in the process.

The thresholds are checked through a stand-in C library (which calls are
made, and when none are); the effect itself in a fresh process with the
real glibc, by the page faults of a step-like pattern of allocations.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tfemb import heap
from tfemb import options

HEAP_PY = os.path.abspath(heap.__file__)
MiB = 1 << 20


class FakeLibc:

  def __init__(self, accept=True):
    self.calls = []
    self.accept = accept

  def mallopt(self, param, value):
    self.calls.append((param, value))
    return 1 if self.accept else 0


ON = options.Options(malloc_tuning=True)


@pytest.fixture
def clean(monkeypatch):
  """heap as in a new process, with no user setting."""
  heap._set_thresholds.cache_clear()  # pylint: disable=protected-access
  for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
               "GLIBC_TUNABLES", "TFEMB_MALLOC_TUNING"):
    monkeypatch.delenv(name, raising=False)
  yield
  heap._set_thresholds.cache_clear()  # pylint: disable=protected-access


@pytest.fixture
def fresh(clean, monkeypatch):  # pylint: disable=redefined-outer-name,unused-argument
  """... and a stand-in glibc."""
  libc = FakeLibc()
  monkeypatch.setattr(heap, "glibc", lambda: libc)
  return libc


def test_sets_both_thresholds_once(fresh):
  assert heap.keep_freed_buffers(ON) == "set"
  # glibc's <malloc.h>: M_MMAP_THRESHOLD -3, M_TRIM_THRESHOLD -1.
  assert fresh.calls == [(-3, 32 * MiB), (-1, 64 * MiB)]
  assert heap.keep_freed_buffers(ON) == "set"
  assert len(fresh.calls) == 2


def test_the_option_declines_it(fresh):
  assert heap.keep_freed_buffers(options.Options(malloc_tuning=False)) == (
      "declined")
  with options.use(malloc_tuning=False):
    assert heap.keep_freed_buffers() == "declined"
  assert fresh.calls == []
  assert heap.keep_freed_buffers() == "set"  # the default: on
  assert len(fresh.calls) == 2


def test_the_environment_gives_the_default(fresh, monkeypatch):
  for value in ("0", "off"):
    monkeypatch.setenv("TFEMB_MALLOC_TUNING", value)
    assert heap.keep_freed_buffers() == "declined"
  assert fresh.calls == []
  with options.use(malloc_tuning=True):  # code wins over the environment
    assert heap.keep_freed_buffers() == "set"


@pytest.mark.parametrize("name,value", [
    ("MALLOC_MMAP_THRESHOLD_", "1048576"),
    ("MALLOC_TRIM_THRESHOLD_", "0"),
    ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=4096"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4096"),
])
def test_leaves_a_users_setting_alone(fresh, monkeypatch, name, value):
  monkeypatch.setenv(name, value)
  expected = "GLIBC_TUNABLES" if name == "GLIBC_TUNABLES" else name
  assert heap.keep_freed_buffers(ON) == expected
  assert fresh.calls == []


def test_other_tunables_do_not_count(fresh, monkeypatch):
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
  monkeypatch.setenv("TFEMB_MALLOC_TUNING", "1")
  assert heap.keep_freed_buffers() == "set"
  assert len(fresh.calls) == 2


def test_a_refused_mmap_threshold_sets_nothing_else(fresh):
  # A trim threshold alone would switch off glibc's own raising of the
  # mmap threshold: every step buffer would be a fresh mmap.
  fresh.accept = False
  assert heap.keep_freed_buffers(ON) == "refused"
  assert fresh.calls == [(-3, 32 * MiB)]


def test_not_glibc(clean, monkeypatch):  # pylint: disable=redefined-outer-name,unused-argument
  monkeypatch.setattr(sys, "platform", "darwin")
  assert heap.keep_freed_buffers(ON) == "not glibc"


# Eight 512 KiB buffers allocated, written and freed, as a step's: with
# glibc's defaults, the first round raises the thresholds only to 512 KiB
# and 1 MiB, so every later round gets its 4 MiB back from the kernel and
# takes a page fault on each of its 1024 pages.
PATTERN = textwrap.dedent("""
    import ctypes, importlib.util, resource, sys, types
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[2] == "tuned":
      spec = importlib.util.spec_from_file_location("heap", sys.argv[1])
      heap = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(heap)
      on = types.SimpleNamespace(malloc_tuning=True)
      assert heap.keep_freed_buffers(on) == "set"
    def step():
      buffers = [libc.malloc(512 << 10) for _ in range(8)]
      for b in buffers:
        ctypes.memset(b, 1, 512 << 10)
      for b in reversed(buffers):
        libc.free(b)
    for _ in range(3):
      step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
      step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
""")


def _faults_per_step(mode):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "TFEMB_MALLOC"))}
  done = subprocess.run([sys.executable, "-c", PATTERN, HEAP_PY, mode],
                        capture_output=True, text=True, env=env, timeout=60,
                        check=True)
  return float(done.stdout.split()[-1])


def test_freed_buffers_are_reused_without_page_faults():
  pages = 8 * (512 << 10) // 4096
  assert _faults_per_step("default") > pages / 2
  assert _faults_per_step("tuned") < pages / 20


@pytest.mark.parametrize("tuning", [True, False])
def test_the_engine_keeps_freed_buffers_when_it_builds(fresh, tuning):
  import tfemb  # pylint: disable=g-import-not-at-top
  table = tfemb.TableConfig(10, 4, name="t")
  with options.use(malloc_tuning=tuning):  # the engine's own options
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   tfemb.SGD(0.1))
  assert not fresh.calls
  embedding.build(2)
  assert len(fresh.calls) == (2 if tuning else 0)
