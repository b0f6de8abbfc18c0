"""CFX1xx: model loading and placement (Python)."""
