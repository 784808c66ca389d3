"""Fused CPU kernels for the host engine: one op per table for each part of
a training step, instead of 17-26 small TensorFlow ops: the lookup, the
row-gradient sum and the optimizer update, and the split of an interleaved
table for a checkpoint save. Their C++ is in `src/`, a file per kernel (or
pair of kernels) with its op's registration (`compiler.SOURCES`), and the
headers they share (`compiler.HEADERS`: the optimizers' row rules in
`update_rules.h`). Compiled on first use (`build`, with the table of rules
`rule_table` generates from the optimizers' declarations), with TensorFlow
ops as the fallback."""
