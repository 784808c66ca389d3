"""One-off experiments beside the benchmark suite (benchmarks/): not run by CI.

Each runs as `python -m experiments.<name> --help` from the repository
root, importing the suite's workload, stacks and runner. See README.md.
"""
