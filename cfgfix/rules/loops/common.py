"""What CFX304 and CFX305 share: the allocator variables as trigger bytes."""

from __future__ import annotations

VARIABLE_TRIGGERS = (b"PYTORCH_CUDA_ALLOC_CONF", b"PYTORCH_ALLOC_CONF")
