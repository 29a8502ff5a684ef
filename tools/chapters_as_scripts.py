"""Each chapter as a plain Python script, for a machine without Jupyter (a GPU machine with no network, say).

    python tools/chapters_as_scripts.py OUTDIR [chapters/11_decoder_only.ipynb ...]

Writes OUTDIR/<chapter>.py: the chapter's code cells in order, each preceded by `print("@@CELL", i)` (i counts
code cells from 0) so that a failure can be traced to its cell, and `print("@@DONE")` at the end. The Colab setup
cell (it would pip-install the library) is left out. Run a script from chapters/, as the notebooks run:

    cd chapters && MPLBACKEND=Agg HF_HUB_OFFLINE=1 python ../OUTDIR/03_positional_encoding.py

A script stops at the first failing cell; its traceback names the line. The stored outputs are not compared
(nbval does that): this checks that every cell runs and every assert holds, e.g. on CUDA (CONTRIBUTING.md)."""

import sys
from pathlib import Path

import nbformat
from setup_cell import find_setup_cells  # tools/setup_cell.py, beside this script

ROOT = Path(__file__).resolve().parent.parent


def chapter_script(path) -> str:
    """The script of one chapter notebook."""
    lines = [f"# generated from chapters/{Path(path).name} by tools/chapters_as_scripts.py"]
    nb = nbformat.read(path, as_version=4)
    setup = {id(nb.cells[i]) for i in find_setup_cells(nb)}
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        lines.append(f'print("@@CELL", {i}, flush=True)')
        if cell.source.startswith("#| default_exp") or id(cell) in setup:
            continue                                             # nbdev's marker; the Colab install
        magic = [line for line in cell.source.splitlines() if line.lstrip().startswith(("%", "!"))]
        if magic:
            raise ValueError(f"{path}: code cell {i} uses IPython syntax, which a script cannot run: {magic[0]!r}")
        lines.append(cell.source)
    lines.append('print("@@DONE", flush=True)')
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    out, paths = Path(argv[0]), [Path(p) for p in argv[1:]] or sorted((ROOT / "chapters").glob("*.ipynb"))
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        (out / f"{path.stem}.py").write_text(chapter_script(path))
        print(out / f"{path.stem}.py")


if __name__ == "__main__":
    main()
