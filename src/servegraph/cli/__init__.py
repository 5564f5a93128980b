"""The `servegraph` command line: one module per group of commands, `main.py` parses and dispatches."""
