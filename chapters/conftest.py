"""Each chapter's kernel environment in `make test`'s single nbval stage (see the Makefile, `test-notebooks-ci`).

nbval starts one Jupyter kernel per notebook, and the kernel inherits the pytest worker's environment at that
moment. `make test` runs every chapter in one pytest-xdist run (two workers, the longest chapters first), so that
neither worker waits for the other between two stages. When NBVAL_TRAINING is set (the Makefile sets it to
TRAINING_NBS), this hook sets, before a chapter's kernel starts:

- for a chapter in NBVAL_TRAINING (it trains for minutes): one CPU thread, PyTorch's default kernels;
- for every other chapter: one CPU thread and the portable kernels of NBVAL_PORTABLE ("NAME=value ...", the
  Makefile's OTHER_CPU: PyTorch's non-vector kernels, MKL limited to SSE4.2), so that an output which only this
  CPU's vector units reproduce fails here rather than in CI on another CPU.

Without NBVAL_TRAINING (a plain `pytest --nbval chapters/...`) it changes nothing."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _portable() -> dict:
    pairs = [p.split("=", 1) for p in os.environ.get("NBVAL_PORTABLE", "").split()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"NBVAL_PORTABLE must be 'NAME=value ...', got {os.environ['NBVAL_PORTABLE']!r}")
    return dict(pairs)


def pytest_runtest_setup(item):
    training = os.environ.get("NBVAL_TRAINING")
    if training is None or item.path.suffix != ".ipynb":
        return
    chapter = item.path.resolve().relative_to(ROOT).as_posix()
    os.environ["OMP_NUM_THREADS"] = "1"
    portable = _portable()
    if chapter in training.split():
        for name in portable:
            os.environ.pop(name, None)
    else:
        os.environ.update(portable)
