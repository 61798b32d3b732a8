#!/bin/bash
# The measurements that need a many-core GPU host, on a borrowed one with no network.
# Carried beside the tree:
#   .cache/devkit     shared/tools/devkit's kit (prepare.sh) with libxxhash-dev's .deb added
#                     to debs/ and setup.sh copied beside it
#   .cache/devcorpus  a few corpus photos, cropped there into the ImageNet-like source
#   .cache/gpucarry   `bench/gpu.py prepare .cache/gpucarry --max-images 40`, made here
#   .cache/bench/imagenet-like-400   the peers' source (bench/peers.py), for peers_gpu; where
#                     it is not carried, peers_gpu cuts 400 crops from .cache/devcorpus there
# bench/gpu_kit.sh prepares .cache/devkit and .cache/devcorpus here and prints the call.
# Usage, from the repository root:  bench/devkit_run.sh OUT [STEP...]
#   dataplane     bench/dataplane.py, 8,000 images, q10/raw/mix, C and Python, 1-16 readers
#   lane_threads  cold q10 files/s by 1-16 readers with the default lane threads (and a
#                 32-reader stress check), then 2, 4 and 16 (LANE_THREADS picks)
#   gpu_check     bench/gpu.py measure on the carried l3 files (decode_batch against C)
#   peers_gpu     bench/peers_gpu.py: the peers' gpu regime (GPUImageFolder arms included)
#   gpu_decode    bench/gpu_decode.py: decode_jpeg on the GPU against nvJPEG, decode only
# Each step has its own time limit and writes as it goes, so a cut lease keeps what it got;
# its whole log is $OUT/STEP.log.  A lease is 15 minutes with the machine's start, so the
# default is the two GPU steps (6 + 4 minutes at most, each one call of under 8); the
# many-core data-plane steps run when named.
set -uo pipefail
OUT=${1:?usage: bench/devkit_run.sh OUT [STEP...]}
shift
STEPS=${*:-gpu_decode peers_gpu}
IMAGES=${IMAGES:-8000}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source .cache/devkit/setup.sh .cache/devkit || exit 1
[ -e .cache/corpus ] || ln -s "$PWD/.cache/devcorpus" .cache/corpus
echo "cores $(nproc); realtime: rt_runtime_us $(cat /proc/sys/kernel/sched_rt_runtime_us)," \
     "RLIMIT_RTPRIO $(ulimit -r), chrt -f 1: $(chrt -f 1 true 2>&1 && echo ok)"
for step in $STEPS; do
  case $step in
    dataplane)
      timeout "${DATAPLANE_S:-420}" python3 -m bench.dataplane --images "$IMAGES" --work /tmp/w \
          --out "$OUT" --views q10 raw mix --arms c python --extras stress priority \
          --stress-seconds 30 2>&1 | tee "$OUT/dataplane.log" | grep -v "^{'view'" ;;
    lane_threads)
      # "default" mounts without the option and adds the 32-reader stress check
      runs=()
      for n in ${LANE_THREADS:-default 2 4 16}; do
        mkdir -p "$OUT/lt$n"; runs+=("$OUT/lt$n")
        if [ "$n" = default ]; then set -- --extras stress --stress-seconds 20
        else set -- --extras --mount-options "lane_threads=$n"; fi
        timeout "${SWEEP_S:-90}" python3 -m bench.dataplane --images "$IMAGES" --work /tmp/w \
            --out "$OUT/lt$n" --views q10 --arms c --readers 1 4 8 16 "$@" 2>&1 \
            | grep "q10 \+c x\|stress:"
        rm -f "$OUT/lt$n"/dataplane.partial.json "$OUT/lt$n"/dataplane.png
      done
      python3 -m bench.dataplane --out "$OUT" --merge-sweep "${runs[@]}" ;;
    gpu_check)
      timeout "${GPU_S:-100}" python3 -m bench.gpu measure .cache/gpucarry --device cuda \
          --repeat 3 --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log" | tail -3 ;;
    peers_gpu)
      src=.cache/bench/imagenet-like-400
      if [ ! -d $src ]; then
        src=/tmp/w/imagenet-like-400
        [ -d $src ] || python3 tools/make_imagefolder.py .cache/corpus $src --mode crops --count 400 \
            --classes 20 --workers "$(nproc)" || exit 1
      fi
      timeout "${PEERS_GPU_S:-240}" python3 -m bench.peers_gpu $src \
          --work /tmp/w --out "$OUT" --device cuda --rounds 3 --epochs 3 2>&1 \
          | tee "$OUT/peers_gpu.log" | tail -12 ;;
    gpu_decode)
      timeout "${GPU_DECODE_S:-360}" python3 -c "from bench import gpu_decode; \
from pathlib import Path; \
print(gpu_decode.summary(gpu_decode.run_all(Path('/tmp/w'), Path('$OUT'), 512, rounds=3)))" \
          2>&1 | tee "$OUT/gpu_decode.log" | tail -12 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
