"""pcrfs: Progressive Compressed Records served as ordinary JPEG files."""
from pcrfs.dataset import Dataset, open_dataset

__all__ = ["Dataset", "open_dataset"]
__version__ = "0.1.0"
