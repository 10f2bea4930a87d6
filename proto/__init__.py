"""Wire format: the .proto source, the code grpcio-tools generates from it, the conversions
to and from the plain dataclasses, and the loss probe's UDP packet."""
