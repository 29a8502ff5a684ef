"""Draw the book's static figures into figures/ (the front page is Markdown, so it cannot draw them itself).

Usage: python tools/make_figures.py     # writes figures/architecture.png

The figures come from the library's own plotting functions, so the front page shows the same drawing as the
chapters (Chapter 7 draws the full map, every chapter a small "you are here" copy). Re-run after changing
`transformer_lib.utils.plot_architecture` (Chapter 1) and commit the PNG.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from transformer_lib.utils import plot_architecture  # noqa: E402

FIGURES = Path(__file__).resolve().parent.parent / "figures"


def main() -> None:
    FIGURES.mkdir(exist_ok=True)
    ax = plot_architecture()
    path = FIGURES / "architecture.png"
    ax.figure.savefig(path, dpi=110, metadata={"Software": None})  # no version string: same bytes each run
    plt.close(ax.figure)
    print("wrote", path.relative_to(FIGURES.parent))


if __name__ == "__main__":
    main()
