"""Training tasks: the embedded default (a char transformer on pydoc topics) and the task interface."""
