"""The book's own invariants: every chapter is in the TOC, has the generated setup cell, is stored executed."""

import ast
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
# The numbered chapters (NN_name.ipynb) teach and set exercises; an appendix (appendix_tools.ipynb: the book's tools,
# exported to transformer_lib.utils and .validation) has the same layout but no Summary or Exercises.
NUMBERED = [p for p in CHAPTERS if p.stem[:2].isdigit()]
sys.path.insert(0, str(ROOT / "tools"))
import exercise_count  # noqa: E402
import setup_cell  # noqa: E402


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] for c in part["chapters"]]


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    listed = toc_files()
    assert sorted(f"chapters/{p.stem}" for p in CHAPTERS) == sorted(f for f in listed if f.startswith("chapters/"))
    for f in listed:
        assert (ROOT / f"{f}.ipynb").exists() or (ROOT / f"{f}.md").exists(), f


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_layout(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "starts with a title"
    assert re.fullmatch(r"#\| default_exp \w+", code[0].source), "first code cell: #| default_exp"
    assert "remove-cell" in code[0].metadata.get("tags", []), "the default_exp cell is hidden in the book"
    assert code[1].source == setup_cell.setup_cell_source(), "second code cell: the generated setup cell"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    if path in NUMBERED:
        assert "## Summary" in text and "## Exercises" in text
    assert "{cite}`" in text, "cites its sources"
    assert any(c.source.startswith("#| export") for c in code)


def graders() -> dict[str, str]:
    """Every grader of the book, check_* of a module of transformer_lib.exercises -> that module's name."""
    import transformer_lib.exercises as pkg
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        found |= {n: module.__name__ for n in vars(module) if n.startswith("check_") and callable(getattr(module, n))}
    return found


def code_tree(cell) -> ast.Module:
    """A code cell's syntax tree, without its IPython magics and shell lines."""
    return ast.parse("\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_cell_defines_a_grader(path):
    """Colab shows every cell, hidden or not, and a grader's reference and named slips give its exercise's answer
    away: the graders and the check command are hand-written modules that the chapters only import."""
    known = graders()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        assert not re.search(r"^#\|\s*export\w*\s+(exercises\b|check\s*$)", cell.source, re.M), \
            f"cell {cell.id} exports a grader: graders are hand-written in transformer_lib/exercises/"
        assert "transformer_lib.exercises.grading" not in cell.source, \
            f"cell {cell.id} uses the graders' toolkit: write the grader in transformer_lib/exercises/"
        defined = {n.name for n in ast.walk(code_tree(cell)) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert not defined & known.keys(), f"cell {cell.id} defines the grader(s) {sorted(defined & known.keys())}"


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_every_grader_a_chapter_calls_is_imported_from_the_library(path):
    """Each grader a chapter calls is imported from transformer_lib.exercises (the chapter's own check_* functions
    are input checks of its model code), and the graders its exercises name are imported by a cell the reader sees."""
    cells = nbformat.read(path, as_version=4).cells
    known = graders()
    own, imported, seen = set(), set(), set()
    for cell in (c for c in cells if c.cell_type == "code"):
        tree = code_tree(cell)
        own |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lib.exercises."):
                for alias in node.names:
                    assert known.get(alias.name) == node.module, f"{alias.name} is not a grader of {node.module}"
                imported |= {alias.name for alias in node.names}
                if not {"hide-input", "remove-cell"} & set(cell.metadata.get("tags", [])):
                    seen |= {alias.name for alias in node.names}
    called = {name for c in cells if c.cell_type == "code" for name in re.findall(r"\b(check_\w+)\s*\(", c.source)}
    missing = (called & known.keys()) - own - imported
    assert not missing, f"graders called but not imported from transformer_lib.exercises: {sorted(missing)}"
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and re.search(r"^## Exercises", c.source, re.M))
    named = {n for c in cells[start:] if c.cell_type == "markdown" for n in re.findall(r"\bcheck_\w+", c.source)}
    assert named <= seen, f"graders the exercises name without a visible import: {sorted(named - seen)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_stored_executed_in_order_without_errors(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in code]
    assert None not in counts, "every code cell executed (nbval skips cells without an execution count)"
    assert counts == sorted(counts), "executed top to bottom"
    for c in code:
        for out in c.outputs:
            if out.output_type == "error":
                assert "raises-exception" in c.metadata.get("tags", []), f"unexpected error: {out.ename}"
            text = out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
            assert "<matplotlib." not in text, "end plotting cells with plt.show()"
            assert "Warning" not in text or "NBVAL_IGNORE_OUTPUT" in c.source, f"a warning leaked into the book: {text[:200]}"


def test_setup_cells_agree_with_config():
    assert subprocess.run([sys.executable, str(ROOT / "tools" / "setup_cell.py")], cwd=ROOT).returncode == 0


def test_repository_url_is_kept_in_one_place():
    url = setup_cell.repository_url()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url)
    hits = []
    for folder, subfolders, files in os.walk(ROOT):      # not into builds, git's store or virtualenvs (.venv-floor)
        subfolders[:] = [d for d in subfolders if d not in {"_build", ".git"} and not d.startswith(".venv")]
        hits += [Path(folder, f) for f in files if Path(f).suffix in {".py", ".yml", ".toml", ".md", ".cfg"}
                 and url in Path(folder, f).read_text(errors="ignore")]
    assert [p.relative_to(ROOT).as_posix() for p in hits] == ["_config.yml"]


def test_bibliography_has_the_paper():
    bib = (ROOT / "references.bib").read_text()
    assert "@inproceedings{vaswani2017attention," in bib
    cited = set()
    for p in CHAPTERS + [ROOT / "intro.md"]:
        cited |= set(re.findall(r"\{cite\}`([^`]+)`", p.read_text()))
    keys = {k.strip() for c in cited for k in c.split(",")}
    missing = {k for k in keys if f"{{{k}," not in bib}
    assert not missing, f"cited but not in references.bib: {missing}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_nbval_markers_are_spelled_so_nbval_sees_them(path):
    # nbval honours a marker only when the whole comment is the marker: `# NBVAL_IGNORE_OUTPUT  (why)` is
    # silently ignored, and the cell is then compared after all.
    from nbval.plugin import comment_markers

    for c in nbformat.read(path, as_version=4).cells:
        for line in c.source.splitlines():
            if line.lstrip().startswith("#") and "NBVAL" in line:
                assert line.strip().lstrip("#").strip() in comment_markers, f"not an nbval marker: {line!r}"


def test_strip_markers_removes_only_whole_line_markers():
    """_ext/strip_markers.py (loaded by _config.yml) takes the nbdev/nbval lines out of the rendered code."""
    local = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["local_extensions"]
    assert (ROOT / local["strip_markers"] / "strip_markers.py").is_file(), local
    sys.path.insert(0, str(ROOT / local["strip_markers"]))
    from strip_markers import strip_markers

    source = ("#| export utils\n# NBVAL_IGNORE_OUTPUT\n\ndef f(x):\n    # NBVAL_ stays when indented\n"
              "    return x  # NBVAL_SKIP in a trailing comment stays too\n\n# NBVAL_CHECK_OUTPUT\n")
    assert strip_markers(source) == ("def f(x):\n    # NBVAL_ stays when indented\n"
                                     "    return x  # NBVAL_SKIP in a trailing comment stays too")
    assert strip_markers("#| default_exp attention") == ""                  # the cell then renders as nothing
    assert strip_markers("#| export\n\nx = 1\n# NBVAL_SKIP\nprint(x)") == "x = 1\nprint(x)"
    unmarked = "\nx = '#| not a marker'\n\n"
    assert strip_markers(unmarked) == unmarked                              # no marker: returned unchanged


def test_progress_bars_keep_only_their_last_redraw():
    """_ext/progress_bars.py (loaded by _config.yml) shows each tqdm bar as a terminal does at its end."""
    local = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["local_extensions"]
    assert (ROOT / local["progress_bars"] / "progress_bars.py").is_file(), local
    sys.path.insert(0, str(ROOT / local["progress_bars"]))
    from progress_bars import collapse_progress

    def bar(n, total, desc=""):
        pct = 100 * n // total
        return f"{desc}{pct:3d}%|{'█' * (pct // 10):10}| {n}/{total} [00:0{n % 10}<00:01, 70.1it/s]"
    first = [bar(0, 600), bar(137, 600), bar(600, 600)]
    second = [bar(0, 600), bar(300, 600), bar(600, 600)]            # a new bar: its count falls back to 0
    third = [bar(0, 50, "eval: "), bar(50, 50, "eval: ")]            # another description
    text = "\n".join(["before", *first, *second, *third, "accuracy 99.7 %", ""])
    assert collapse_progress(text) == "\n".join(["before", first[-1], second[-1], third[-1], "accuracy 99.7 %", ""])
    assert collapse_progress("\n".join([bar(3, 9), bar(9, 9), bar(2, 5)])) == "\n".join([bar(9, 9), bar(2, 5)])
    three_runs = "\n".join([bar(0, 600), bar(600, 600), bar(600, 600), bar(0, 600), bar(600, 600)])
    assert collapse_progress(three_runs) == "\n".join([bar(600, 600)] * 3)   # a full bar is finished
    plain = "step 100 | loss 2.1 | 12/40 [batches]\n50% done\n"
    assert collapse_progress(plain) == plain                          # no bar: returned unchanged


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_marker_lines_start_at_column_0_so_the_book_strips_them(path):
    # The book hides `#| ...` and `# NBVAL_...` lines only when they start a line (no indent).
    for c in nbformat.read(path, as_version=4).cells:
        if c.cell_type == "code":
            for line in c.source.splitlines():
                if line.lstrip().startswith(("#|", "# NBVAL_")):
                    assert line.startswith(("#|", "# NBVAL_")), f"indented marker, shown in the book: {line!r}"


def test_only_the_tools_appendix_is_unnumbered():
    """No chapter escapes the Summary and Exercises checks above by a name without a number."""
    assert [p.stem for p in CHAPTERS if p not in NUMBERED] == ["appendix_tools"]


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_every_exercise_names_a_grader_that_its_solution_calls(path):
    """Issue 21: each numbered exercise names a check_* grader of transformer_lib.exercises (the reader calls it
    on their own answer), and a code cell of the exercise section calls it (the hidden worked solution)."""
    known = exercise_count.graders()
    items = exercise_count.exercises(path)
    assert items, "the chapter has numbered exercises"
    for title, named, called in items:
        assert named, f"exercise {title!r} names no grader (check_xxx(...))"
        assert set(named) <= known, f"exercise {title!r} names {set(named) - known}, not in transformer_lib.exercises"
        assert called, f"exercise {title!r}: no code cell of the section calls {named}"


def test_chapters_as_scripts_keep_every_code_cell_and_compile(tmp_path):
    import chapters_as_scripts

    for path in CHAPTERS:
        script = chapters_as_scripts.chapter_script(path)
        compile(script, str(path), "exec")                          # a SyntaxError names the chapter
        code_cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert script.count('print("@@CELL"') == len(code_cells) and script.endswith('print("@@DONE", flush=True)\n')
        assert "# Setup: on Colab" not in script                  # the cell that would pip-install the library
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2"), nbformat.v4.new_code_cell("print(x * 21)")])
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    chapters_as_scripts.main([str(tmp_path / "out"), str(tmp_path / "tiny.ipynb")])
    run = subprocess.run([sys.executable, str(tmp_path / "out" / "tiny.py")], capture_output=True, text=True)
    assert run.stdout.split() == ["@@CELL", "0", "@@CELL", "1", "42", "@@DONE"]
    nb.cells.append(nbformat.v4.new_code_cell("!pip install something"))
    nbformat.write(nb, tmp_path / "magic.ipynb")
    with pytest.raises(ValueError, match="code cell 2 uses IPython syntax"):
        chapters_as_scripts.chapter_script(tmp_path / "magic.ipynb")


def test_nbval_reports_each_chapters_span_per_worker(tmp_path):
    """chapters/conftest.py with NBVAL_TIMES set: every worker records when each notebook started and ended, and the
    run ends with the table (make test's nbval stage prints it: its critical path)."""
    (tmp_path / "conftest.py").write_text((ROOT / "chapters" / "conftest.py").read_text())
    for name, seconds in (("quick", 0), ("slow", 1.5)):
        cells = [nbformat.v4.new_code_cell(f"import time; time.sleep({seconds})"), nbformat.v4.new_code_cell("1 + 1")]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / f"{name}.ipynb")
    times = tmp_path / "times.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NBVAL_"))}   # not this run's xdist
    env["NBVAL_TIMES"] = str(times)
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-n", "2", "-q",
                          "quick.ipynb", "slow.ipynb"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:]
    rows = [line.split() for line in times.read_text().splitlines()]
    assert sorted(r[1] for r in rows) == ["quick.ipynb", "slow.ipynb"] and {r[0] for r in rows} <= {"gw0", "gw1"}
    span = {r[1]: float(r[3]) - float(r[2]) for r in rows}
    assert span["slow.ipynb"] >= 1.5 and span["quick.ipynb"] >= 0     # each span holds its cells (and kernel start)
    assert "seconds per chapter, by worker" in run.stdout
    assert re.search(r"slow\.ipynb\s+\d+ -\s*\d+\s+\d+ s", run.stdout), run.stdout[-2000:]


def _solution_cells(nb):
    """(cell, kind) for the cells of the exercise solutions: the markdown that says 'Solution to exercise N' and the
    code cells that follow it up to the next heading or exercise text, and any code cell whose first line (after
    nbval markers) is a '# Solution' comment."""
    out, inside = [], False
    for cell in nb.cells:
        text = cell.source
        if cell.cell_type == "markdown":
            if "Solution to exercise" in text:
                out.append((cell, "prose"))
                inside = True
            elif text.lstrip().startswith("#"):
                inside = False
            continue
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith("# NBVAL")]
        if inside or (lines and re.match(r"#\s*(A )?[Ss]olution", lines[0])):
            out.append((cell, "code"))
    return out


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_solutions_are_folded_in_the_book_and_in_colab(path):
    """Issue 51: no answer on the page. A solution's prose is a <details> block (folded in the HTML, in Jupyter and
    in Colab); a solution's code cell is hide-cell, which folds its output too (hide-input left the output, which
    states some answers, on the page), and a Colab form, which folds its code in Colab."""
    for cell, kind in _solution_cells(nbformat.read(path, as_version=4)):
        if kind == "prose":
            assert cell.source.lstrip().startswith("<details>") and cell.source.rstrip().endswith("</details>"), \
                f"{cell.get('id')}: a solution's prose goes in a <details> block: {cell.source[:80]!r}"
        else:
            tags = cell.metadata.get("tags", [])
            assert "hide-cell" in tags or "remove-cell" in tags, \
                f"{cell.get('id')}: a solution's code cell is tagged hide-cell (it has {tags}): {cell.source[:80]!r}"
            # Colab ignores the book's tags; it folds a code cell shown as a form with a title (its code hidden)
            assert cell.metadata.get("cellView") == "form" and cell.source.startswith("#@title Solution"), \
                f"{cell.get('id')}: a solution's code cell is a Colab form too (metadata cellView 'form', first line " \
                f"'#@title Solution to exercise N ...'): {cell.source[:80]!r}"
