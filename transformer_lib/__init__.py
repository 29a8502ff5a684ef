"""transformer_lib: the code of the executable Transformer textbook.

Every module except this file is generated from a chapter notebook in ``chapters/`` by nbdev's exporter;
edit the notebook, then run ``make export``.
"""

__version__ = "0.1.0"
