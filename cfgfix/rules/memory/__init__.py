"""CFX7xx: the memory budget of each launch against its target GPU [C14, C15]."""
