"""Exceptions shared by the build, the dataset reader and (later) the filesystem."""
import errno


class PcrfsError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""


class DatasetError(PcrfsError):
    """The dataset directory is incomplete or inconsistent and must not be opened."""


class CorruptDataError(OSError):
    """Stored bytes fail their checksum or are missing: the one file reads as EIO."""

    def __init__(self, detail: str):
        super().__init__(errno.EIO, f"corrupt data: {detail}")
        self.detail = detail
