"""Wire format: the .proto source and the code grpcio-tools generates from it."""
