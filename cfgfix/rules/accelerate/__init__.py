"""CFX4xx: accelerate config YAML, on its own and against the DeepSpeed file it names [B10]."""
