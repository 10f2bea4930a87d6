"""The certificate tool: CA, issue, revoke, inspect; SPIFFE identity rules."""
