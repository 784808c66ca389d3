"""tfemb's benchmark suite: the same workload on tfemb and on its peers.

`python -m benchmarks.compare --help` (from the repository root) runs it.
See README.md; the one-off experiments are outside it, in experiments/.
"""
