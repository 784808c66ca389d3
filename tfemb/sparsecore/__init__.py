"""The SparseCore generation (`TPUEmbeddingV2`) on the host: how TensorFlow
stacks tables and lays their rows out (`tfemb.sparsecore.table_stacking`)."""
