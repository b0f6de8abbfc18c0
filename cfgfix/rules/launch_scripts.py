"""CFX308: destructive commands in training launch scripts (shell)."""
