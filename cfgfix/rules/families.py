"""Importing this module registers every rule family."""

from cfgfix.rules import (  # noqa: F401  (imported for registration)
    allocator,
    amp,
    checkpointing,
    half_precision,
    launch_scripts,
    loading,
    loops,
    tool,
)
