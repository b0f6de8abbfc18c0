"""CFX6xx: training configs, on each launch's resolved training setup [B10]."""
