"""CFX306, CFX307: gradient checkpointing (Python)."""
