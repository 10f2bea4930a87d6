"""Prometheus metrics and health endpoints of the coordinator and the agents (docs/operations.md)."""
