"""A launch's resolved training setup: the values of every file that configures it, each
with its origin (`resolve.py`), read by `cfgfix explain`, CFX511, CFX6xx and the memory model."""
