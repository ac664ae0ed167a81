"""Adapters for frameworks that refuse backend names they do not know: one module a framework,
each imported only when used (``import torch_backend_registry`` imports none of them)."""
