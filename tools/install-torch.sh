#!/bin/sh
# torch and torchvision for this machine, before `make setup` installs the torch extra.
#   PCRFS_TORCH_BUILD=auto (default): the CPU build where no NVIDIA driver is present,
#     else the registry's default build (CUDA);
#   PCRFS_TORCH_BUILD=cpu or cuda: that build, whatever the machine has.
# The CPU build comes from PCRFS_TORCH_CPU_INDEX (PyTorch's CPU wheel index by default),
# about a tenth of the CUDA build's 3 GB; the registry's torchvision is built against CUDA
# torch and does not import with a CPU torch ("operator torchvision::nms does not exist"),
# so both come from that index.  Where it cannot be reached, the registry's build is
# installed (it runs on the CPU) and this says how to get the other.
set -u
PY=${1:?usage: install-torch.sh PYTHON}
BUILD=${PCRFS_TORCH_BUILD:-auto}
INDEX=${PCRFS_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

case $BUILD in
auto)
    if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; then
        BUILD=cuda
    else
        BUILD=cpu
    fi ;;
cpu|cuda) ;;
*) echo "PCRFS_TORCH_BUILD=$BUILD: auto, cpu or cuda" >&2; exit 2 ;;
esac

if [ "$BUILD" = cuda ]; then
    exit 0      # the torch extra installs the registry's build
fi
if "$PY" -c 'import torch, torchvision' >/dev/null 2>&1; then
    exit 0      # a torch is there already: kept (remove .venv to choose again)
fi
# only that index: the configured registries and wheel folders hold the CUDA build under
# the same names (no pip configuration, no PIP_* locations)
if env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null \
        "$PY" -m pip install -q --no-cache-dir --timeout 15 --retries 1 \
        --index-url "$INDEX" torch torchvision >/dev/null 2>&1 &&
        "$PY" -c 'import torchvision.ops' >/dev/null 2>&1; then
    echo "no NVIDIA driver: torch's CPU build installed from $INDEX" \
         "(PCRFS_TORCH_BUILD=cuda make setup, in a fresh .venv, for the CUDA one)"
else
    # nothing half-installed stays behind for the torch extra to take as satisfied
    "$PY" -m pip uninstall -q -y torch torchvision >/dev/null 2>&1
    echo "no NVIDIA driver, but torch's CPU build could not be installed from $INDEX:" \
         "installing the registry's build (CUDA, about 3 GB; it runs on the CPU)." \
         "PCRFS_TORCH_CPU_INDEX=URL names another index of CPU wheels." >&2
fi
exit 0
