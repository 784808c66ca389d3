"""`python -m conformance --tensorflow DIR --keras-rs DIR`: other projects'
TPU tests, unmodified, on tfemb's host TPU (conformance/README.md).

Each suite (`conformance.suites.SUITES`) whose tree is given runs in its
own process, `python -m tfemb.run --tpu TYPE -m pytest FILES`, as on that
Cloud TPU type. Prints each suite's pass, fail and skip counts and the
tests that did not pass; writes `results.json` and each suite's log and
JUnit XML to `--out`. Exit status 1 if a suite did not finish (a crash, or
longer than `--timeout`), else 0.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional, Tuple

from conformance import pytest_plugin
from conformance import suites

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m conformance", description=__doc__.split("\n\n")[0])
  parser.add_argument("--tensorflow", metavar="DIR",
                      help="a TensorFlow source tree (its tensorflow/python/"
                      "tpu test files at their repository paths)")
  parser.add_argument("--keras-rs", metavar="DIR",
                      help="a keras-rs checkout at the installed release")
  parser.add_argument("--suite", action="append", choices=sorted(
      suites.SUITES), help="run only these suites (repeatable)")
  parser.add_argument("-k", metavar="EXPRESSION",
                      help="pytest's -k, within each suite")
  parser.add_argument("--out", default="/tmp/tfemb_conformance",
                      help="where logs, JUnit XML and results.json go")
  parser.add_argument("--timeout", type=float, default=3600,
                      help="seconds a suite may take (default 3600)")
  return parser


def _command(suite: suites.Suite, tree: str, files: List[str], xml: str,
             ini: str, selection: Optional[str]) -> List[str]:
  return [sys.executable, "-m", "tfemb.run", "--tpu", suite.tpu, "-m",
          "pytest", "-p", "conformance.pytest_plugin", "-p",
          "no:cacheprovider", "-c", ini, "--rootdir", tree,
          "-v", f"--junitxml={xml}"] + (
              ["-k", selection] if selection else []) + files


def _environment(suite: suites.Suite, tree: str) -> Dict[str, str]:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TFEMB_TPU", None)  # the suite's type, from --tpu
  env["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
  if suite.project == "tensorflow":
    env[pytest_plugin.TENSORFLOW_TREE] = tree
  env.update(dict(suite.environment))
  return env


def outcomes(xml: str) -> Dict[str, Tuple[str, str]]:
  """{test id: (passed | failed | skipped, message)} of a JUnit XML."""
  found = {}
  for case in ElementTree.parse(xml).iter("testcase"):
    name = f"{case.get('classname')}::{case.get('name')}"
    if case.get("name") == "test_session":
      continue  # TensorFlow's TestCase's, "Not a test."
    problem = case.find("failure")
    if problem is None:
      problem = case.find("error")
    if problem is not None:
      found[name] = ("failed", (problem.get("message") or "").strip())
    elif case.find("skipped") is not None:
      found[name] = ("skipped", case.find("skipped").get("message", ""))
    else:
      found[name] = ("passed", "")
  return found


def run_suite(suite: suites.Suite, tree: str, out: str, timeout: float,
              selection: Optional[str] = None) -> dict:
  """Runs one suite; its counts, the tests that did not pass, its time."""
  files = suite.files(tree)
  if not files:
    return {"suite": suite.name, "tpu": suite.tpu, "finished": False,
            "problem": f"no test files of {suite.patterns} under {tree}"}
  xml = os.path.join(out, f"{suite.name}.xml")
  log = os.path.join(out, f"{suite.name}.log")
  ini = os.path.join(out, "pytest.ini")
  with open(ini, "w", encoding="utf-8") as f:
    f.write("[pytest]\n")  # the tree's own pytest settings stay out
  if os.path.exists(xml):
    os.remove(xml)
  start = time.monotonic()
  with open(log, "w", encoding="utf-8") as output:
    child = subprocess.Popen(  # pylint: disable=consider-using-with
        _command(suite, tree, files, xml, ini, selection), cwd=tree,
        env=_environment(suite, tree), stdout=output,
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
      child.wait(timeout=timeout)
      problem = None
    except subprocess.TimeoutExpired:
      os.killpg(child.pid, signal.SIGKILL)
      child.wait()
      problem = f"timed out after {timeout:.0f} s (log: {log})"
  seconds = time.monotonic() - start
  if problem is None and not os.path.exists(xml):
    problem = f"pytest exited {child.returncode} without results (log: {log})"
  found = outcomes(xml) if problem is None else {}
  counts = {k: sum(1 for o, _ in found.values() if o == k)
            for k in ("passed", "failed", "skipped")}
  return {"suite": suite.name, "tpu": suite.tpu, "finished": problem is None,
          "problem": problem, "seconds": round(seconds, 1), **counts,
          "not_passed": {n: list(o) for n, o in sorted(found.items())
                         if o[0] != "passed"}}


def _print(result: dict) -> None:
  head = f"{result['suite']} ({result['tpu']})"
  if not result["finished"]:
    print(f"{head}: did not finish: {result['problem']}")
    return
  total = result["passed"] + result["failed"] + result["skipped"]
  print(f"{head}: {result['passed']} passed, {result['failed']} failed, "
        f"{result['skipped']} skipped of {total} ({result['seconds']} s)")
  for name, (outcome, message) in result["not_passed"].items():
    first = message.splitlines()[0][:160] if message else ""
    print(f"  {outcome}: {name}: {first}")


def main(argv: Optional[List[str]] = None) -> int:
  args = _parser().parse_args(argv)
  trees = {"tensorflow": args.tensorflow, "keras-rs": args.keras_rs}
  if not any(trees.values()):
    _parser().error("give --tensorflow DIR, --keras-rs DIR or both")
  os.makedirs(args.out, exist_ok=True)
  results = []
  for name in args.suite or list(suites.SUITES):
    suite = suites.SUITES[name]
    tree = trees[suite.project]
    if not tree:
      continue
    result = run_suite(suite, os.path.abspath(tree), args.out, args.timeout,
                       args.k)
    _print(result)
    results.append(result)
  with open(os.path.join(args.out, "results.json"), "w",
            encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return 0 if all(r["finished"] for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
