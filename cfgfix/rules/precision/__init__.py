"""CFX2xx: mixed precision, gradient scaling, half-precision weights and their optimizers (Python)."""
