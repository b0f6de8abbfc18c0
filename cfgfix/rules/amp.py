"""CFX201, CFX202, CFX204, CFX207: mixed precision and gradient scaling (Python)."""
