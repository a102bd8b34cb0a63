"""Transports and tool implementations. Adapters run tools; they never decide."""
