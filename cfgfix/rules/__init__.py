"""Rules, one module per family; `base` holds the rule class and the registry."""
