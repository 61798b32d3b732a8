# Sourced on a GPU machine that has Python, torch and a C compiler but neither network nor
# pcrfs's own dependencies (how bench/results/gpu.json was measured).  CARRY holds what
# was brought along:
#   whl/   cp312 wheels of cffi, pycparser and lmdb  (pip download --only-binary=:all:
#          --python-version 3.12 --platform manylinux2014_x86_64 ...)
#   jpeg/  libjpeg62-turbo and -dev unpacked  (apt-get download ...; dpkg -x DEB jpeg)
# It builds pcrfs._native in place against that libjpeg and leaves PYTHONPATH and
# LD_LIBRARY_PATH set, so `python3 bench/gpu.py measure DIR` runs from the repository root.
CARRY=${CARRY:-.gpu}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$CARRY"/whl/*.whl || return 1
J=$PWD/$CARRY/jpeg/usr
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$J/lib/x86_64-linux-gnu
if ! ls pcrfs/_native*.so >/dev/null 2>&1; then
    CFLAGS="-I$J/include -I$J/include/x86_64-linux-gnu" LDFLAGS="-L$J/lib/x86_64-linux-gnu" \
        python3 -c "import sys; sys.path.insert(0, 'csrc'); from build_native import ffibuilder; ffibuilder.compile(tmpdir='.')" \
        >/tmp/gpu_setup.log 2>&1 || { tail -30 /tmp/gpu_setup.log; return 1; }
fi
python3 -c "import pcrfs.l3, pcrfs.torch.l3, torch; print(torch.__version__, torch.cuda.get_device_name(0))"
