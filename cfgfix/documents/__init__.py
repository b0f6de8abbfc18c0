"""Documents: one parsed view per file kind (Python, shell, YAML/JSON)."""
