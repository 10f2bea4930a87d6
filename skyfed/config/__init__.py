"""Configuration: loading a component's dataclass from TOML, environment and flags, the
checks every field goes through, the flags generated from the fields, and the references
generated from them."""
