"""Sphinx extension: keep the toolchain's marker lines in the notebooks, out of the rendered book.

The chapters carry whole-line markers for their tools: nbdev's directives (`#| export`, `#| export utils`,
`#| default_exp attention`) and nbval's (`# NBVAL_IGNORE_OUTPUT`, `# NBVAL_CHECK_OUTPUT`, `# NBVAL_SKIP`).
A reader of the HTML needs none of them. After myst-nb has read a notebook (`doctree-read`), this removes
those lines from the source of every code cell (the literal block inside myst-nb's `cell_code_source`
container, class `cell_input`), with the blank lines they leave at the start or end of the cell. Outputs,
prose and Markdown code blocks are not touched; a cell whose source is only markers loses its input (and
the cell disappears when it has no output either). The notebooks, Colab and the download button keep the
markers. Loaded from _config.yml (`sphinx: local_extensions`); tests/test_book_structure.py tests
`strip_markers` and tests/test_browser.py checks the built pages.
"""

import re

from docutils import nodes

__all__ = ["MARKER", "strip_markers", "setup"]

# A marker is a whole line starting at column 0: an nbdev/Quarto directive `#|...`, or an nbval marker.
MARKER = re.compile(r"^(#\||# NBVAL_[A-Z_]+\b)")


def strip_markers(source: str) -> str:
    """`source` without its marker lines and the blank lines they leave at its start and end.
    A source without markers is returned unchanged."""
    lines = source.splitlines()
    kept = [line for line in lines if not MARKER.match(line)]
    if len(kept) == len(lines):
        return source
    while kept and not kept[0].strip():
        kept.pop(0)
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept)


def _is_cell_input(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code_source"


def strip_doctree(app, doctree) -> None:
    for cell_input in list(doctree.findall(_is_cell_input)):
        for block in list(cell_input.findall(nodes.literal_block)):
            text = block.astext()
            new = strip_markers(text)
            if new == text:
                continue
            if new.strip():
                # rawsource must equal the text, or Sphinx's HTML writer treats the block as a parsed
                # literal and skips syntax highlighting
                block[:] = [nodes.Text(new)]
                block.rawsource = new
            else:
                block.parent.remove(block)
        if not cell_input.children:
            cell = cell_input.parent
            cell.remove(cell_input)
            if not cell.children and cell.parent is not None:
                cell.parent.remove(cell)


def setup(app):
    app.connect("doctree-read", strip_doctree)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
