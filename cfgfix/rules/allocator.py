"""CFX304, CFX305: PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF (Python, shell, Dockerfile, .env)."""
