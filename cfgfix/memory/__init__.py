"""The memory model: model shapes and GPU catalogs, the analytic estimator, and the
FakeTensor simulator. Nothing here imports torch at module import time."""
