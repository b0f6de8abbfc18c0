"""Shared analyses that rules read: names, model bindings, versions."""
