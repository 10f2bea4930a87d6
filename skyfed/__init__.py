"""skyfed: train one PyTorch model across several clouds over mutually authenticated gRPC."""

__version__ = "0.1.0"
