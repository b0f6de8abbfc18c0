"""cfgfix: a linter, autofixer and config transformer for ML training repositories."""

__version__ = "0.1.0"
