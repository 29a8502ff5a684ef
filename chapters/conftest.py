"""Each chapter's kernel environment in `make test`'s single nbval stage (see the Makefile, `test-notebooks-ci`).

nbval starts one Jupyter kernel per notebook, and the kernel inherits the pytest worker's environment at that
moment. `make test` runs every chapter in one pytest-xdist run (two workers, the longest chapters first), so that
neither worker waits for the other between two stages. When NBVAL_TRAINING is set (the Makefile sets it to
TRAINING_NBS), this hook sets, before a chapter's kernel starts:

- for a chapter in NBVAL_TRAINING (it trains for minutes): one CPU thread, PyTorch's default kernels;
- for every other chapter: one CPU thread and the portable kernels of NBVAL_PORTABLE ("NAME=value ...", the
  Makefile's OTHER_CPU: PyTorch's non-vector kernels, MKL limited to SSE4.2), so that an output which only this
  CPU's vector units reproduce fails here rather than in CI on another CPU.

Without NBVAL_TRAINING (a plain `pytest --nbval chapters/...`) it changes nothing.

When NBVAL_TIMES names a file (the Makefile's `test-notebooks-ci` sets it), each worker appends when each chapter
started and ended there, and the run ends with a table of the chapters per worker: which worker's chapters made
the stage as long as it was (the critical path), the first thing to read before making CI faster."""

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spans = {}                                                   # chapter -> [start, end] in this process


def _portable() -> dict:
    pairs = [p.split("=", 1) for p in os.environ.get("NBVAL_PORTABLE", "").split()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"NBVAL_PORTABLE must be 'NAME=value ...', got {os.environ['NBVAL_PORTABLE']!r}")
    return dict(pairs)


def pytest_runtest_setup(item):
    if item.path.suffix == ".ipynb":                          # a chapter's time starts with its kernel's start
        _spans.setdefault(item.path.name, [time.time(), None])
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


def pytest_runtest_teardown(item):
    if item.path.suffix == ".ipynb" and item.path.name in _spans:
        _spans[item.path.name][1] = time.time()


def pytest_sessionfinish(session):
    path = os.environ.get("NBVAL_TIMES")
    if path and _spans:
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")      # gw0, gw1, ... under xdist
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(f"{worker} {name} {start:.1f} {end:.1f}\n" for name, (start, end) in _spans.items() if end)


def pytest_terminal_summary(terminalreporter):
    path = os.environ.get("NBVAL_TIMES")
    if not path or hasattr(terminalreporter.config, "workerinput") or not Path(path).exists():
        return                                                # an xdist worker: the controller prints the table
    rows = [line.split() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return
    t0 = min(float(r[2]) for r in rows)
    terminalreporter.section("seconds per chapter, by worker (start-end from the stage's start)")
    for worker in sorted({r[0] for r in rows}):
        mine = sorted((r for r in rows if r[0] == worker), key=lambda r: float(r[2]))
        busy = sum(float(r[3]) - float(r[2]) for r in mine)
        terminalreporter.write_line(f"{worker}: {busy:.0f} s in {len(mine)} chapters, done at "
                                    f"{max(float(r[3]) for r in mine) - t0:.0f} s")
        for _, name, start, end in mine:
            terminalreporter.write_line(f"    {name:<36} {float(start) - t0:6.0f} -{float(end) - t0:6.0f}"
                                        f"  {float(end) - float(start):5.0f} s")
