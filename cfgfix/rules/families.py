"""Importing this module registers every rule family."""

from cfgfix.rules import loading, tool  # noqa: F401
