"""Coordinator replicas: one leader elected through etcd, standbys that point agents at it."""
