"""The native benchmarks (benchmarks/native/*.cc) build without warnings and
run: the README's numbers come from them, so they must keep compiling.

dedup.cc also checks that its two hash-table layouts give the same distinct
ids and positions (it exits 1 otherwise).
"""

import os
import re
import shutil
import subprocess

import pytest

NATIVE = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                      "benchmarks", "native")

RUNS = {
    "dedup": (["10000"], r"positions \+ distinct rows\s+\d+\.\d+"),
    "row_update": (["10000", "zipf", "lookup"],
                   r"interleaved \d+\.\d+ ms \(\d+ ns per row\)"),
    "step_order": (["10000", "lookups-first", "2", "adam"],
                   r"adam, 10000 rows x 8 tables, lookups-first, 2 threads: "
                   r"\d+\.\d+ ms per step"),
    "step_algorithm": (["1000,3000", "adam"],
                       r"adam, 1000 rows x 8 tables, tfemb's algorithm: "
                       r"\d+\.\d+ ms per step\n"
                       r"adam, 3000 rows x 8 tables, tfemb's algorithm: "
                       r"\d+\.\d+ ms per step"),
    # Two sizes side by side in one process, one line each.
    "step_order:sizes": (["1000,3000", "per-table", "1", "adagrad"],
                         r"adagrad, 1000 rows x 8 tables, per-table, 1 thread: "
                         r"\d+\.\d+ ms per step.*\n"
                         r"adagrad, 3000 rows x 8 tables, per-table, 1 thread: "
                         r"\d+\.\d+ ms per step"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_builds_without_warnings_and_runs(name, tmp_path):
  compiler = os.environ.get("CXX", "c++")
  assert shutil.which(compiler), "the fused kernels need a C++ compiler too"
  source = name.split(":")[0]
  binary = str(tmp_path / source)
  subprocess.run([compiler, "-O2", "-fno-math-errno", "-Wall", "-Werror",
                  "-I", NATIVE, "-pthread",
                  os.path.join(NATIVE, source + ".cc"), "-o", binary],
                 check=True, timeout=300)
  args, pattern = RUNS[name]
  done = subprocess.run([binary] + args, capture_output=True, text=True,
                        timeout=300, check=True)
  assert re.search(pattern, done.stdout), done.stdout
