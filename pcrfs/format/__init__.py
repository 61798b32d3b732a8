"""On-disk formats: record files, the LMDB index and the manifest (docs/FORMAT.md).

The one table of a dataset's object names (paths under DST, keys under a prefix), which
build, push, finalize, verify, the remote loader and the views all use:

  manifest.json         MANIFEST        the dataset's identity; written last by a build
  index.lmdb/data.mdb   INDEX_DIR       the LMDB index
  index.segtab          SEGTAB          the fast lane's segment table (derived, optional)
  records/rNNNNNN.pcr   record_key()    the records
  records/rNNNNNN.l3m   l3m_key()       their L3 sidecars
  build-report.json     BUILD_REPORT    what the build skipped and converted
  quality.json          QUALITY         `info --quality`        } AFTER_BUILD_META:
  raw.json              RAW_SUMMARY     `materialize`           } tied to the dataset's
  raw/rNNNNNN.ppk       RAW_DIR         `materialize`'s packs   } UUID, removed by
  liquid.json           TUNED           `tune`                  } --overwrite"""
FORMAT_VERSION = 1
RECORDS_DIR = "records"
INDEX_DIR = "index.lmdb"
INDEX_FILE = f"{INDEX_DIR}/data.mdb"
SEGTAB = "index.segtab"
MANIFEST = "manifest.json"
BUILD_REPORT = "build-report.json"
QUALITY = "quality.json"
RAW_DIR = "raw"
RAW_SUMMARY = "raw.json"
TUNED = "liquid.json"
# what a dataset gains after its build (`info --quality`, `materialize`, `tune`): each
# belongs to the dataset's UUID, so replacing the dataset (--overwrite) removes them
AFTER_BUILD_META = (QUALITY, RAW_SUMMARY, TUNED)
# metadata a remote mount fetches if present; the mutable ones again at every mount
OPTIONAL_META = (QUALITY, BUILD_REPORT, RAW_SUMMARY, TUNED)
MUTABLE_META = (RAW_SUMMARY, TUNED)
EOI = b"\xff\xd9"          # JPEG end of image: closes every assembled qk file


def dataset_object(key: str) -> bool:
    """Whether a path or key under a dataset's root is one of the table's objects (what
    replacing the dataset must remove unless the new one writes it again)."""
    return key.startswith((f"{RECORDS_DIR}/", f"{INDEX_DIR}/", f"{RAW_DIR}/")) or key in (
        MANIFEST, SEGTAB, BUILD_REPORT, *AFTER_BUILD_META)


def record_name(number: int) -> str:
    return f"r{number:06d}.pcr"


def record_key(number: int) -> str:
    return f"{RECORDS_DIR}/{record_name(number)}"


def sidecar_path(record_path: str) -> str:
    """A record's L3 sidecar (format/l3meta.py), beside it: rNNNNNN.pcr -> rNNNNNN.l3m."""
    return record_path[: -len(".pcr")] + ".l3m"


def l3m_key(number: int) -> str:
    return sidecar_path(record_key(number))
