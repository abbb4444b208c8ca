"""``python -m python_algos``: print the algorithm table (declared costs) in markdown."""

from .registry import markdown_table

print(markdown_table())
