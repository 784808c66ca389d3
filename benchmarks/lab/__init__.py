"""One-off lab tools beside the suite: each answers one question about the step.

The suite (`benchmarks.compare` and what it runs) never imports them; they
import the suite's workload, stacks and runner, and run as
`python -m benchmarks.lab.<tool> --help` from the repository root. See
../README.md, "Lab tools".
"""
