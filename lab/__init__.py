"""The network lab: namespaces, shaped links, link self-checks."""
