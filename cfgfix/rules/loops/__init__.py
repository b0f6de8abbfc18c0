"""CFX3xx: memory hygiene: training and evaluation loops, the CUDA allocator settings, gradient
checkpointing (Python), destructive commands in launch scripts (shell, Dockerfile, .env)."""
