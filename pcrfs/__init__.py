"""pcrfs: Progressive Compressed Records served as ordinary JPEG files."""
from __future__ import annotations

__all__ = ["Dataset", "open_dataset"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # `import pcrfs.<module>` (the CLI's argument parsing, the kernel shim, a tool) must
    # not pay for lmdb, numpy, Pillow and the C extension: the dataset API loads on use
    if name in __all__:
        from pcrfs import dataset
        return getattr(dataset, name)
    raise AttributeError(f"module 'pcrfs' has no attribute {name!r}")
