"""Framework models as data: each framework's defaults per release, read from its released code."""
