"""The files `cfgfix verify` puts first on a run's PYTHONPATH. `sitecustomize.py` is copied
into a temporary folder at run time (never imported from here)."""
