"""CFX9xx: findings about cfgfix's own input (emitted by the engine)."""
