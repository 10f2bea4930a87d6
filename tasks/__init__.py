"""Training tasks: the embedded default (a char transformer on pydoc topics) and the interface."""

from skyfed.tasks.base import Task
from skyfed.tasks.registry import load_task

__all__ = ["Task", "load_task"]
