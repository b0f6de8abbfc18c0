"""Rules, one module per rule in its family's folder (`loading/cfx103_move_dispatched_model.py`);
`base` holds the rule classes and the registry, `manifest` what a run needs to know about
every rule without importing it."""
