"""Named tasks, and ``module:factory`` references to a user's own."""

from __future__ import annotations

import importlib

from skyfed.tasks.base import Task


class TaskLoadError(ValueError):
    """A task spec that names nothing loadable; the message says what and how to fix it."""


def load_task(spec: str, **options: object) -> Task:
    """``"chargpt"`` (the embedded default) or ``"package.module:factory"``.

    The factory is called with ``options`` and must return an object with the
    :class:`~skyfed.tasks.base.Task` methods.
    """
    if spec == "chargpt":
        from skyfed.tasks.chargpt import CharTask, CharTaskConfig

        return CharTask(CharTaskConfig(**options))  # type: ignore[arg-type]
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise TaskLoadError(f"task {spec!r} is neither 'chargpt' nor 'module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise TaskLoadError(f"task {spec!r}: cannot import {module_name!r} ({exc})") from exc
    except AttributeError as exc:
        raise TaskLoadError(f"task {spec!r}: {module_name!r} has no {attr!r}") from exc
    task = factory(**options)
    if not isinstance(task, Task):
        raise TaskLoadError(f"task factory {spec!r} returned {type(task).__name__}, not a Task")
    return task
