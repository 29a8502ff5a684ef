"""Count each chapter's exercises and the graders they name (issue 21: every exercise is graded).

An exercise is a numbered bold item (`1. **Title.** ...`) in the markdown after a chapter's `## Exercises`
heading. It is graded when its text names a grader (`check_xxx(...)`) that exists in `transformer_lib.exercises`
and that a code cell of the exercise section calls (the hidden worked solution runs it).

Usage: python tools/exercise_count.py    # one line per chapter, then the total missing; exit 1 if any
"""

import importlib
import pkgutil
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
ITEM = re.compile(r"^\s*(\d+)\.\s+\*\*(.*?)(?=^\s*\d+\.\s+\*\*|\Z)", re.M | re.S)
CALL = re.compile(r"\b(check_\w+)\s*\(")


def graders() -> set[str]:
    """Every check_* function of transformer_lib.exercises."""
    import transformer_lib.exercises as pkg
    names = set()
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        names |= {n for n in vars(module) if n.startswith("check_") and callable(getattr(module, n))}
    return names


def exercises(path: Path) -> list[tuple[str, list[str], bool]]:
    """(exercise number and title, graders its text names, whether a code cell of the section calls one); none for
    a notebook without an Exercises section (the appendix of the book's tools)."""
    cells = nbformat.read(path, as_version=4).cells
    start = next((i for i, c in enumerate(cells)
                  if c.cell_type == "markdown" and re.search(r"^## Exercises", c.source, re.M)), None)
    if start is None:
        return []
    section = cells[start:]
    md = "\n".join(c.source for c in section if c.cell_type == "markdown")
    md = md[md.index("## Exercises"):]
    called = {name for c in section if c.cell_type == "code" for name in CALL.findall(c.source)}
    out = []
    for m in ITEM.finditer(md):
        named = sorted(set(CALL.findall(m.group(2))))
        title = f"{m.group(1)}. {m.group(2).split('**')[0].strip()}"
        out.append((title, named, any(n in called for n in named)))
    return out


def _problem(named, known, called) -> str:
    if not named:
        return "no grader named"
    if set(named) - known:
        return "unknown " + ", ".join(sorted(set(named) - known))
    return "grader never called"


def report(paths) -> int:
    known = graders()
    missing = 0
    for path in paths:
        items = exercises(path)
        bad = [f"{t} ({_problem(n, known, called)})" for t, n, called in items if not n or set(n) - known or not called]
        missing += len(bad)
        print(f"{path.stem}: {len(items)} exercises, {len(items) - len(bad)} graded"
              + (f"; missing: {bad}" if bad else ""))
    print(f"{missing} exercises without a grader")
    return missing


if __name__ == "__main__":
    sys.exit(1 if report(sorted((ROOT / "chapters").glob("*.ipynb"))) else 0)
