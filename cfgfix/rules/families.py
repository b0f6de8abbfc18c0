"""Importing this module registers every rule family."""

from cfgfix.rules import (  # noqa: F401  (imported for registration)
    accelerate_config,
    allocator,
    amp,
    checkpointing,
    deepspeed,
    half_precision,
    launch_scripts,
    loading,
    loops,
    memory_budget,
    tool,
    training_setup,
)
