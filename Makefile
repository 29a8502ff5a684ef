# The two commands a reader needs: `make book` and `make test` (see README.md).
# Each creates .venv on first use and installs what it needs, torch first.

PYTHON     ?= $(shell command -v python3.11 || command -v python3)
VENV       := .venv
BIN        := $(VENV)/bin
# torch is installed on its own, first: a bare `torch` requirement would pull a multi-GB CUDA build.
# On a machine with a GPU, e.g.: make test TORCH_SPEC="torch" (or any wheel/index you prefer).
TORCH_SPEC ?= torch==2.13.0
NBVAL      := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg
JOBS       ?= 2
TIMED      := tools/timed
# Part III builds Hugging Face models from configs only: any attempt to reach the Hub fails instead of downloading.
export HF_HUB_OFFLINE := 1

.PHONY: help venv export sync-check lint test-lib test-notebooks test-notebooks-other-cpu book book-stored test-browser test test-gpu bench clean

help:
	@echo "make book   execute every chapter and build the HTML book into _build/html/ (open _build/html/index.html)"
	@echo "make test   sync check, lint, library tests, nbval on every chapter, strict book build, browser check"
	@echo "make export re-export transformer_lib/ from the chapters' #| export cells"
	@echo "make bench  the book's performance as ratios measured in one run (prints a table, writes _build/bench.json)"

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

export: venv
	$(BIN)/python tools/export.py

# Library == what the chapters export (also fails on a new module git does not track);
# every chapter's setup cell == the one generated from _config.yml.
sync-check: venv
	$(BIN)/python tools/export.py --check
	$(BIN)/python tools/setup_cell.py

lint: venv
	$(BIN)/ruff check transformer_lib tests tools benchmarks _ext

test-lib: venv
	$(BIN)/pytest tests -n $(JOBS) --ignore=tests/test_browser.py

# Strict nbval: every stored output must equal what the current code prints (volatile text sanitized).
# The chapters that train for minutes with both CPU threads (8, 11, 12, 13) run one after the other, after the rest:
# two of them side by side on two cores oversubscribe the threads and each runs many times slower.
TRAINING_NBS   := chapters/08_training.ipynb chapters/11_decoder_only.ipynb chapters/12_t5_and_vit.ipynb \
                  chapters/13_scaling.ipynb
test-notebooks: venv
	$(BIN)/pytest $(NBVAL) $(filter-out $(TRAINING_NBS),$(wildcard chapters/*.ipynb)) -n $(JOBS) --dist loadfile
	$(BIN)/pytest $(NBVAL) $(TRAINING_NBS) -p no:xdist

# Stored outputs are made on one CPU and compared on another. Re-run nbval with PyTorch's portable (non-vector)
# kernels and MKL limited to SSE4.2: a printed float that depends on the CPU's vector units fails here, on the
# machine that stored it, instead of in CI on another. Chapters 8, 11, 12 and 13 are left out: their
# training runs (one to three minutes each) would double the stage, and the outputs they compare after training
# are fixed text (their claims are asserts).
OTHER_CPU      := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41
OTHER_CPU_NBS  := $(filter-out $(TRAINING_NBS),$(wildcard chapters/*.ipynb))
test-notebooks-other-cpu: venv
	$(OTHER_CPU) $(BIN)/pytest $(NBVAL) $(OTHER_CPU_NBS) -n $(JOBS) --dist loadfile -q

# The book, executing every chapter (`execute_notebooks: force`); a cell error or a Sphinx warning fails it.
book: venv
	$(BIN)/jupyter-book build --all -W -n --keep-going .
	@echo "Open _build/html/index.html in a browser (it works offline)."

# The same strict build from the stored outputs, which `make test-notebooks` has just proven current:
# it saves executing every chapter a second time.
book-stored: venv
	mkdir -p _build
	sed -e 's/^  execute_notebooks: force.*/  execute_notebooks: "off"/' \
	    -e 's|^\(    [a-z_]*: \)_ext$$|\1../_ext|' _config.yml > _build/_config.stored.yml
	$(BIN)/jupyter-book build --all -W -n --keep-going --config _build/_config.stored.yml .

test-browser: venv
	$(BIN)/pytest tests/test_browser.py -rs

test: venv
	@mkdir -p _build && : > _build/stage-times.txt
	$(TIMED) "sync check" $(MAKE) --no-print-directory sync-check
	$(TIMED) "lint" $(MAKE) --no-print-directory lint
	$(TIMED) "library tests" $(MAKE) --no-print-directory test-lib
	$(TIMED) "nbval (all chapters)" $(MAKE) --no-print-directory test-notebooks
	$(TIMED) "nbval, other CPU kernels" $(MAKE) --no-print-directory test-notebooks-other-cpu
	$(TIMED) "book build (-W)" $(MAKE) --no-print-directory book-stored
	$(TIMED) "browser check" $(MAKE) --no-print-directory test-browser
	@cat _build/stage-times.txt

# On a CUDA machine the chapters run on the GPU, where floating-point results differ in the last digits:
# execute every cell (all asserts still hold) but compare only outputs marked `# NBVAL_CHECK_OUTPUT`.
test-gpu: venv
	$(BIN)/pytest --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg chapters
	$(BIN)/pytest tests --ignore=tests/test_browser.py

# Not part of `make test`: ratios measured in one run (ours vs nn.Transformer, KV cache, explicit vs fused
# attention; tokens/s and MFU on a GPU). Timings depend on the machine and its load; the ratios are the result.
bench: venv
	$(BIN)/python benchmarks/bench.py --json _build/bench.json

clean:
	rm -rf _build
