"""CFX5xx: DeepSpeed configs (JSON, or YAML), on their own and against the launches and
scripts that use them [C12]."""
