"""Sphinx configuration of the documentation site: the pages under docs/ (Markdown, read by
myst-parser) and an API reference generated from the docstrings of the public API.

Build it with ``sphinx-build -W -b html docs docs/_build/html`` after
``pip install -r docs/requirements.txt``; ``-W`` turns every warning into an error, as CI runs it.
The package must be importable (installed), since the reference imports it to read its docstrings.
"""

project = "fedkernels"
author = "the fedkernels developers"
copyright = "2026, the fedkernels developers"

extensions = [
    "myst_parser",  # the pages are Markdown, shared with GitHub's rendering of docs/
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google/NumPy-style "Args:" sections in docstrings
    "sphinx.ext.mathjax",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "requirements.txt"]

# Anchors like [text](page.md#a-heading) resolve to the heading's generated id.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]
# A page may link to a file outside docs/ (an example's source, bench/README.md): Sphinx has no page
# for it and would warn. Those links are checked to lead to an existing file by
# tests/test_docs_pages.py::test_links_resolve, so this one warning is silenced.
suppress_warnings = ["myst.xref_missing"]

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
# "Attributes:" sections as fields of their class, not as entries that collide with the properties
napoleon_use_ivar = True
autodoc_typehints = "description"
autodoc_mock_imports = ["flwr"]  # optional extra: the reference reads docstrings, it runs nothing

html_theme = "furo"
html_title = "fedkernels"
