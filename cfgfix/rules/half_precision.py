"""CFX203, CFX205, CFX206: half-precision weights and their optimizers (Python)."""
