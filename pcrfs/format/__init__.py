"""On-disk formats: record files, the LMDB index and the manifest (docs/FORMAT.md)."""
FORMAT_VERSION = 1
RECORDS_DIR = "records"
INDEX_DIR = "index.lmdb"
MANIFEST = "manifest.json"
BUILD_REPORT = "build-report.json"
# what a dataset gains after its build (`info --quality`, `materialize`, `tune`): each
# belongs to the dataset's UUID, so replacing the dataset (--overwrite) removes them
AFTER_BUILD_META = ("quality.json", "raw.json", "liquid.json")
EOI = b"\xff\xd9"          # JPEG end of image: closes every assembled qk file


def record_name(number: int) -> str:
    return f"r{number:06d}.pcr"
