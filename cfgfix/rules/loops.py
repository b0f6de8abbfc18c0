"""CFX301, CFX302, CFX303: memory hygiene in training and evaluation loops (Python)."""
