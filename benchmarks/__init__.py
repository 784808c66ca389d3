"""tfemb's benchmark suite: the same workload on tfemb and on its peers.

`python -m benchmarks.compare --help` (from the repository root) runs it;
the one-off lab tools beside it are in `benchmarks.lab` (e.g.
`python -m benchmarks.lab.soak --help`, the long-run check). See README.md.
"""
