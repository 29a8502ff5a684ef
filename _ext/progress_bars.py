"""Sphinx extension: show each tqdm progress bar in the book as a terminal shows it at the end, one line.

In a notebook, tqdm redraws its bar by writing `\\r` and the new state, a few times a second. The notebook
stores every redraw as its own stream output, and myst-nb's `nb_merge_streams` joins them with a newline
after each, so the HTML showed every redraw on a line of its own (sixty lines under a two-minute training
cell). After myst-nb has read a notebook (`doctree-read`), this keeps, of every run of consecutive lines of one
bar, only the last: the final count, time and rate. Other lines of the output are kept as they are. A new bar
starts after a full one, or where the count falls back or the total changes, so a cell that trains three
models keeps three lines.
Loaded from _config.yml (`sphinx: local_extensions`); tests/test_book_structure.py tests `collapse_progress`.
"""

import re

from docutils import nodes

__all__ = ["BAR", "collapse_progress", "setup"]

# tqdm's default format: "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]"
BAR = re.compile(r"^(?P<desc>.*?)\s*\d{1,3}%\|[^|\n]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[")


def collapse_progress(text: str) -> str:
    """`text` with every run of consecutive redraws of one tqdm bar reduced to its last line.
    Text without a bar is returned unchanged."""
    lines = text.split("\n")
    bars = [BAR.match(line) for line in lines]
    if not any(bars):
        return text
    kept = []
    for i, (line, bar) in enumerate(zip(lines, bars, strict=True)):
        nxt = bars[i + 1] if i + 1 < len(lines) else None
        same_bar_continues = (bar is not None and nxt is not None and nxt["desc"] == bar["desc"]
                              and nxt["total"] == bar["total"] and int(bar["n"]) < int(bar["total"])
                              and int(nxt["n"]) >= int(bar["n"]))     # a full bar is finished: what follows is new
        if not same_bar_continues:
            kept.append(line)
    return "\n".join(kept)


def _is_stream_output(node) -> bool:
    return isinstance(node, nodes.literal_block) and {"stream", "stderr"} & set(node.get("classes", []))


def collapse_doctree(app, doctree) -> None:
    for block in list(doctree.findall(_is_stream_output)):
        text = block.astext()
        new = collapse_progress(text)
        if new != text:
            block[:] = [nodes.Text(new)]
            block.rawsource = new          # as in strip_markers: keeps Sphinx's highlighting path


def setup(app):
    app.connect("doctree-read", collapse_doctree)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
