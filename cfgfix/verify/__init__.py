"""`cfgfix verify`: run a training launch twice for N optimizer steps, as it is and with
cfgfix's fixes applied (or at two git revisions), and judge the fix by what the runs
measure. Nothing here imports torch: the measuring happens inside the launched processes,
through `harness/sitecustomize.py`."""
