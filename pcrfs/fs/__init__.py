"""The FUSE filesystem: a thin pyfuse3 layer over pcrfs.dataset (docs/SEMANTICS.md)."""
