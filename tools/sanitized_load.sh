#!/usr/bin/env bash
# The reliability load test (32 readers, lane on) against an AddressSanitizer build of the
# fast-lane shim: the shim is rebuilt with ASan into the venv, the daemon runs with libasan
# preloaded and logs any report under .cache/asan/, then the normal shim is put back.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SITE=$(cd / && "$OLDPWD/$PY" -c 'import pcrfs, os; print(os.path.dirname(pcrfs.__file__))')
SO=$(ls "$SITE"/_fuseshim*.so)
OUT=.cache/asan
rm -rf "$OUT" build/asan && mkdir -p "$OUT" build/asan
cp "$SO" build/asan/normal.so
trap 'cp build/asan/normal.so "$SO"' EXIT
ln -s ../../csrc build/asan/csrc
rm -f csrc/*.o       # objects land beside the sources (through the link): never reuse them
(cd build/asan && PCRFS_SHIM_SANITIZE=address ../../$PY ../../csrc/build_fuseshim.py >build.log 2>&1)
cp build/asan/pcrfs/_fuseshim*.so "$SO"
# (grep without -q: under pipefail, -q's early exit would fail nm with SIGPIPE)
nm -D "$SO" | grep __asan_init >/dev/null || { echo "the shim is not ASan-instrumented" >&2; exit 1; }
export LD_PRELOAD=$(gcc -print-file-name=libasan.so)
# quarantine: ASan keeps freed blocks (256 MB by default) to catch use-after-free; the
# lane frees an image per cold read, and the load test bounds RSS growth at 10%
export ASAN_OPTIONS="detect_leaks=0:log_path=$PWD/$OUT/asan:handle_segv=1:quarantine_size_mb=16"
PCRFS_SOAK_SECONDS=${SECONDS_OF_LOAD:-120} PCRFS_RELIABILITY_RESULTS=$PWD/$OUT/results.jsonl \
  .venv/bin/pytest -p no:cacheprovider -q tests/reliability/test_load.py "$@"
unset LD_PRELOAD
if ls "$OUT"/asan.* >/dev/null 2>&1 && grep -l "ERROR: AddressSanitizer" "$OUT"/asan.*; then
  echo "AddressSanitizer reported errors (see $OUT)" >&2; exit 1
fi
echo "ASan shim under load: no report ($(wc -l < "$OUT/results.jsonl") result row)"
