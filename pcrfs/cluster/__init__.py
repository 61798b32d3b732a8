"""Many nodes, one bucket: who owns which records (shard), a node's part (node), and the
IBM paper's capacity model (model)."""
