"""Fused CPU kernels for the host engine: one op per table for the lookup,
the row-gradient sum and the optimizer update (`embedding_kernels.cc`), and
the split of an interleaved table for a checkpoint save (`column_split.cc`),
compiled on first use (`build`, with the table of rules `rule_table`
generates from the optimizers' declarations), with TensorFlow ops as the
fallback."""
