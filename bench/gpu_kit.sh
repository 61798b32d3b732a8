#!/bin/bash
# Prepares, here, everything bench/devkit_run.sh needs on a borrowed GPU host, and prints
# the device call to make: its carry list stays within the 64 MiB a call may take (with
# the tree itself).  Usage, from the repository root:  bench/gpu_kit.sh [KIT_SOURCE]
#   .cache/devkit     KIT_SOURCE's kit (default ../shared/tools/devkit: the workplace's,
#                     not the product's): cp312 wheels, libfuse3 and libjpeg .debs,
#                     pyfuse3's source; plus libxxhash-dev and setup.sh beside it
#   .cache/devcorpus  the smallest colour corpus JPEGs of 1.5 MP or more (24): gpu_decode's
#                     large set, and the photos the ImageNet-like crops are cut from there
set -euo pipefail
SRC=${1:-../shared/tools/devkit}
[ -x "$SRC/prepare.sh" ] || { echo "gpu_kit: no $SRC/prepare.sh (the devkit)" >&2; exit 2; }
[ -d .cache/corpus ] || { echo "gpu_kit: no .cache/corpus: run make corpus first" >&2; exit 2; }
"$SRC/prepare.sh" .cache/devkit >/dev/null
(cd .cache/devkit/debs && apt-get download -qq libxxhash-dev libxxhash0)
cp "$SRC/setup.sh" .cache/devkit/
rm -rf .cache/devcorpus && mkdir -p .cache/devcorpus
.venv/bin/python -P - <<'PY'
import shutil
from pathlib import Path

from PIL import Image
big = []
for f in sorted(Path(".cache/corpus").glob("*.jpg")):
    with Image.open(f) as im:
        if im.mode == "RGB" and im.width * im.height >= 1.5e6:
            big.append((f.stat().st_size, f))
for _, f in sorted(big)[:24]:
    shutil.copy(f, ".cache/devcorpus/")
PY
total=$(( $(du -sb .cache/devkit .cache/devcorpus | awk '{s+=$1} END {print s}') \
          + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
echo "carry .cache/devkit .cache/devcorpus: $((total / 1048576)) MiB with the tree (limit 64)"
echo 'run: bench/devkit_run.sh $OUT gpu_decode peers_gpu   (carry [".cache/devkit", ".cache/devcorpus"])'
[ "$total" -lt $((64 * 1048576)) ]
