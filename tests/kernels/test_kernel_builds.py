"""Where the fused kernels come from: builds for every CPU target (with a
safer target when one does not compile), for ARM, built into the package
at install, and one clear warning when none can be had
(tfemb/kernels/build.py, install.py, packaged.py).

The builds compile into the machine's kernel cache (each target once per
machine and TensorFlow). They use no Keras, so each runs in one pass only
(`runs_under`): the aarch64 build in the tf_keras pass, the others in
Keras 3's, so that the two passes take about as long.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import helpers
from tfemb import options
from tfemb.kernels import build
from tfemb.kernels import compiler
from tfemb.kernels import install
from tfemb.kernels import packaged

ROOT = str(helpers.ROOT)

# Every x86-64 target TensorFlow's wheels may meet, newest names included
# where the compiler knows them; each compiles and computes the same floats.
X86_TARGETS = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4",
               "skylake-avx512", "icelake-server", "sapphirerapids",
               "emeraldrapids", "graniterapids", "graniterapids-d",
               "diamondrapids", "znver4", "znver5"]


def _env(**changes):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0",
             **changes)
  return env


# Three steps of every rule the kernels implement, with clipping and weight
# decay, rows of 37 floats (not a multiple of any vector width), with the
# kernels compiled for -march=argv[2] (in the machine's kernel cache);
# saves the tables to argv[1] and prints the library it loaded.
_EVERY_RULE = """
import sys
import numpy as np
import tensorflow as tf
import tfemb
from tfemb.kernels import build

tfemb.options.set(kernel_march=sys.argv[2])
assert build.load() is not None
print(build.loaded().path)
optimizers = {
    "sgd": tfemb.SGD(0.3, clipvalue=(-0.4, 0.5), weight_decay_factor=0.01,
                     clip_weight_min=-2.0, clip_weight_max=2.5),
    "adagrad": tfemb.Adagrad(
        0.2, weight_decay_factor=0.02,
        multiply_weight_decay_factor_by_learning_rate=True),
    "momentum": tfemb.AdagradMomentum(0.1, momentum=0.9, use_nesterov=True,
                                      exponent=3.0, beta2=0.99, epsilon=1e-4),
    "adam": tfemb.Adam(0.05, epsilon=1e-3),
    "adam_inside": tfemb.Adam(0.05, sum_inside_sqrt=False),
    "ftrl": tfemb.FTRL(0.2, l1_regularization_strength=0.01,
                       l2_regularization_strength=0.1, beta=0.2),
    "ftrl_power": tfemb.FTRL(0.2, learning_rate_power=-0.6,
                             multiply_linear_by_learning_rate=True),
}
tables = {n: tfemb.TableConfig(50, 37, name=n, optimizer=o,
                               initializer=tf.random_normal_initializer(seed=1))
          for n, o in optimizers.items()}
embedding = tfemb.TPUEmbedding(
    {n: tfemb.FeatureConfig(t, name=n) for n, t in tables.items()}, None)
rng = np.random.default_rng(0)

@tf.function
def step(ids, grads):
  embedding.enqueue(ids, training=True)
  embedding.dequeue()
  embedding.apply_gradients(grads)

for _ in range(3):
  ids = {n: tf.constant(rng.integers(0, 50, 64)) for n in tables}
  step(ids, {n: tf.constant(rng.normal(size=(64, 37)), tf.float32)
             for n in tables})
types = [op.type for op in step.get_concrete_function(ids, {
    n: tf.zeros([64, 37]) for n in tables}).graph.get_operations()]
assert types.count("TfembApplyRows") == len(tables), types
np.savez(sys.argv[1], **{n: embedding.embedding_tables[t].numpy()
                         for n, t in tables.items()})
"""


def _targets():
  if install.is_x86():
    known = [m for m in X86_TARGETS if compiler.target(m)[0]]
  else:
    known = [m for m in ("armv8-a", "armv8.2-a") if compiler.target(m)[0]]
  return known + ["native", ""]


def _every_rule(march, out):
  done = subprocess.run(
      [sys.executable, "-c", _EVERY_RULE, str(out), march], cwd=ROOT,
      capture_output=True, text=True, env=_env(), timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout.strip().splitlines()[-1]


@pytest.mark.long  # a build per CPU level; CI keeps the native, aarch64 and wheel builds
@pytest.mark.runs_under("keras3")
def test_every_cpu_target_compiles_and_computes_the_same_floats(tmp_path):
  # Every target compiles, through safer flags where its own do not (GCC
  # 12 and the AVX512-FP16 code of TensorFlow's Eigen: sapphirerapids and
  # newer), and every one this CPU runs gives the same bits as the
  # compiler's default target: no fused multiply-adds, correctly rounded
  # sqrt and division, pow from libm.
  cpu = packaged.cpu_flags()
  results, libraries = {}, set()
  for march in _targets():
    path = build.build(options.Options(kernel_march=march))
    record = build.built_with(path)
    flags = record["flags"]
    for attempt in record["attempts"]:  # a fallback says why
      assert attempt["error"] and attempt["flags"] != flags
    if march and march != "native":
      assert flags[0] == f"-march={march}" or record["attempts"], record
    runs_here = march == "native" or (
        cpu is not None and set(install.requirements(flags)) <= cpu)
    if runs_here:
      out = tmp_path / f"{march or 'default'}.npz"
      assert _every_rule(march, out) == path
      results[march] = dict(np.load(out))
      libraries.add(path)
  assert {"native", ""} <= set(results)
  assert len(libraries) == len(results)  # one build per target
  for march, tables in results.items():
    for name, table in tables.items():
      np.testing.assert_array_equal(table, results[""][name],
                                    err_msg=f"{march}: {name}")


def test_the_cache_keeps_a_build_per_cpu_target(monkeypatch):
  # A cache directory shared by machines with different CPUs (a network
  # home) holds one build for each: `native` is expanded by the compiler.
  here = build.library_path()
  monkeypatch.setattr(compiler, "target", lambda march=None: (
      ["-march=native"], "-march=znver9 -mavx1024"))
  assert build.library_path() != here
  monkeypatch.setattr(compiler, "target", lambda march=None: ([], ""))
  assert build.library_path() != here


def test_a_march_the_compiler_refuses_compiles_for_its_default():
  assert compiler.target("no-such-cpu") == ([], "")
  assert compiler.target("") == ([], "")
  flags, expansion = compiler.target("native")
  assert flags == ["-march=native"] and expansion


def test_a_failed_compile_tries_the_target_without_the_extension_then_the_default(
    monkeypatch, tmp_path):
  tried = []

  def compile_(cxx, flags, sources, include_dirs, out):
    tried.append(list(flags))
    if flags == ["-march=native"]:
      return False, ("In file included from x.h:1:\n/i/Eigen/src/Core/arch/"
                     "AVX512/PacketMathFP16.h:740:49: error: expected "
                     "initializer\n"), "c++ ..."
    if flags == ["-march=native", "-mno-avx512fp16"]:
      return False, "y.cc:3:1: error: something else\n", "c++ ..."
    with open(out, "w") as f:
      f.write("library")
    return True, "", "c++ ..."

  monkeypatch.setattr(compiler, "run", compile_)
  path = build.build(options.Options(kernel_march="native",
                                     kernel_cache=str(tmp_path)))
  assert tried == [["-march=native"], ["-march=native", "-mno-avx512fp16"],
                   []]
  record = build.built_with(path)
  assert record["flags"] == []
  assert [a["error"] for a in record["attempts"]] == [
      "PacketMathFP16.h:740:49: error: expected initializer",
      "y.cc:3:1: error: something else"]


_FAILING_CXX = """#!/bin/sh
echo "In file included from /usr/include/a.h:3," >&2
echo "/usr/include/b.h:12:5: error: this compiler is broken" >&2
echo "   12 | int x = ;" >&2
echo "compilation terminated." >&2
exit 1
"""

# One SGD step of a 4-row table: whether the kernels loaded, the table.
_STEP = """
import json
import tensorflow as tf
import tfemb
from tfemb.kernels import build

embedding = tfemb.TPUEmbedding(
    {"f": tfemb.FeatureConfig(tfemb.TableConfig(
        4, 2, name="t", initializer=tf.ones_initializer()))}, tfemb.SGD(0.5))
embedding.build(2)
embedding.enqueue({"f": tf.constant([1, 3])}, training=True)
embedding.apply_gradients({"f": tf.ones_like(embedding.dequeue()["f"])})
print(json.dumps({"loaded": build.loaded().origin,
                  "file": tfemb.__file__,
                  "table": embedding.embedding_tables["t"].numpy().tolist()}))
"""
_STEPPED = [[1.0, 1.0], [0.5, 0.5], [1.0, 1.0], [0.5, 0.5]]


def _step(env, cwd=ROOT):
  done = subprocess.run([sys.executable, "-c", _STEP], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["table"] == _STEPPED
  return out, done.stderr


@pytest.mark.runs_under("keras3")
def test_a_broken_compiler_gives_one_warning_line_and_a_log(tmp_path):
  cxx = tmp_path / "c++"
  cxx.write_text(_FAILING_CXX)
  cxx.chmod(0o755)
  out, stderr = _step(_env(CXX=str(cxx),
                           TFEMB_KERNEL_CACHE=str(tmp_path / "cache")))
  assert out["loaded"] is None
  lines = [l for l in stderr.splitlines() if "tfemb" in l]
  assert len(lines) == 1, stderr
  assert ("fused CPU kernels unavailable: compiling them with "
          f"{cxx} failed: b.h:12:5: error: this compiler is broken") in lines[0]
  assert "TensorFlow's ops" in lines[0] and "wheel" in lines[0]
  assert "int x = ;" not in stderr and "compilation terminated" not in stderr
  log = lines[0].split("Compiler output: ")[1].strip()
  with open(log) as f:
    text = f.read()
  # -march=native is refused by this compiler too: the default target only
  assert text.count("int x = ;") == 1
  assert "compilation terminated" in text


# An unknown -march in the long suite (the suite's time): CI keeps the
# unwritable cache, and the compiler's refusal of a target is checked above.
@pytest.mark.parametrize("env", [
    pytest.param({"TFEMB_KERNEL_MARCH": "no-such-cpu"},  # for the default
                 marks=pytest.mark.long, id="unknown_march"),
    pytest.param({"TFEMB_KERNEL_CACHE": "/proc/no/such/cache"},  # temporary
                 id="unwritable_cache"),
])
@pytest.mark.runs_under("keras3")
def test_bad_build_options_still_give_the_fused_path(env):
  out, stderr = _step(_env(**env))
  assert out["loaded"] == "cache"
  assert "unavailable" not in stderr


@pytest.mark.runs_under("tf_keras")  # see the module docstring
def test_the_kernels_compile_for_aarch64(tmp_path):
  # No x86-only code: the sources compile to an AArch64 object, as one
  # translation unit as a build compiles them (there is no ARM TensorFlow
  # here to link against). CI installs the cross compiler
  # (ci/install_cross_compiler.sh).
  cxx = shutil.which("aarch64-linux-gnu-g++")
  if cxx is None:
    assert os.environ.get("CI") != "true", "CI installs the cross compiler"
    pytest.skip("this machine has no aarch64 cross compiler "
                "(aarch64-linux-gnu-g++, Debian's g++-aarch64-linux-gnu, "
                "which ci/install_cross_compiler.sh installs as root)")
  include = build.generated_include_dir()
  out = tmp_path / "kernels.o"
  done = subprocess.run(
      compiler.compile_command(cxx, ["-march=armv8-a"], compiler.SOURCES,
                               [include], str(out), link=False),
      capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  header = out.read_bytes()[:20]
  assert header[:4] == b"\x7fELF"
  assert struct.unpack("<H", header[18:20])[0] == 183  # EM_AARCH64


@pytest.mark.runs_under("keras3")
def test_a_wheel_built_once_trains_on_the_fused_path_without_a_compiler(
    tmp_path):
  # pip wheel --no-build-isolation compiles the kernels into the package
  # (two targets here, through the machine's kernel cache); installed into
  # a fresh directory, with no compiler and an empty kernel cache, tfemb
  # trains on the packaged build the CPU runs.
  source = tmp_path / "source"
  source.mkdir()
  for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md",
               "LICENSE"):
    shutil.copy(os.path.join(ROOT, name), source)
  shutil.copytree(os.path.join(ROOT, "tfemb"), source / "tfemb",
                  ignore=shutil.ignore_patterns("__pycache__", "lib"))
  marches = "x86-64-v3,x86-64" if install.is_x86() else ""
  subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
       "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source)],
      env=_env(TFEMB_BUILD_TARGETS=marches), check=True,
      capture_output=True, timeout=1200)
  [wheel] = os.listdir(tmp_path / "dist")
  assert not wheel.endswith("-none-any.whl"), wheel  # tagged for the platform
  subprocess.run(
      [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
       str(tmp_path / "site"), str(tmp_path / "dist" / wheel)],
      check=True, capture_output=True, timeout=600)
  env = _env(PYTHONPATH=str(tmp_path / "site"), CXX="/nonexistent/c++",
             TFEMB_KERNEL_CACHE=str(tmp_path / "empty_cache"))
  out, stderr = _step(env, cwd=str(tmp_path))
  assert out["file"].startswith(str(tmp_path / "site"))
  assert out["loaded"] == "package", stderr
  assert not os.path.exists(tmp_path / "empty_cache")
  report = subprocess.run([sys.executable, "-m", "tfemb.kernels"],
                          cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  assert report.returncode == 0, report.stderr[-3000:]
  assert "the package's build, for -march=" in report.stdout


def test_the_loader_picks_the_best_packaged_build_the_cpu_runs(
    monkeypatch, tmp_path):
  levels = {"x86-64-v4": ["avx2", "avx512f"], "x86-64-v3": ["avx2"],
            "x86-64": []}
  for name in levels:
    (tmp_path / f"{name}.so").write_text("")
  record = {"tensorflow": packaged.tf.__version__,
            "sources": build.source_digest(),
            "builds": [{"file": f"{name}.so", "march": name,
                        "flags": [f"-march={name}"], "requires": needs}
                       for name, needs in levels.items()]}
  (tmp_path / packaged.MANIFEST).write_text(json.dumps(record))

  def picked(flags):
    monkeypatch.setattr(packaged, "cpu_flags", lambda: flags)
    found = packaged.find(build.source_digest(), str(tmp_path))
    return found and found["march"]

  assert picked({"avx2", "avx512f", "fma"}) == "x86-64-v4"
  assert picked({"avx2", "fma"}) == "x86-64-v3"  # no AVX-512
  assert picked({"sse4_2"}) == "x86-64"
  assert picked(None) == "x86-64"  # flags unknown: the baseline only
  # Built for another TensorFlow or other sources: compiled here instead.
  for key, value in (("tensorflow", "0.0.0"), ("sources", "other")):
    (tmp_path / packaged.MANIFEST).write_text(
        json.dumps(dict(record, **{key: value})))
    assert picked({"avx2", "avx512f"}) is None


def test_python_m_tfemb_kernels_says_which_build_is_used(capsys):
  from tfemb.kernels import __main__ as report  # pylint: disable=g-import-not-at-top
  assert report.main([]) == 0
  assert report.main(["--verbose"]) == 0
  lines = capsys.readouterr().out.splitlines()
  result = build.loaded()
  target = " ".join(result.flags) or "the compiler's default target"
  said = [l for l in lines if l.startswith("tfemb fused kernels:")]
  assert len(said) == 2
  for line in said:
    assert f", for {target}: {result.path}" in line
  failed = [l for l in lines if l.startswith("  ")]  # --verbose only
  assert len(failed) == len(result.attempts)
  for line, attempt in zip(failed, result.attempts):
    assert line.endswith(f"did not compile: {attempt['error']}")
