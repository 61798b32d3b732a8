"""What the offline tools share: the task runner (engine.py: local threads or Dask) and
the stores tasks read and write (stores.py: a directory or an object-store prefix).
`pcrfs build`, `push` and `materialize` all run on them."""
