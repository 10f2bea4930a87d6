"""Named tasks, and ``module:factory`` references to a user's own."""

from __future__ import annotations

import importlib

from skyfed.tasks.base import Task


class TaskLoadError(ValueError):
    """A task spec that names nothing loadable; the message says what and how to fix it."""


def load_task(spec: str, **options: object) -> Task:
    """``"chargpt"`` (the embedded default) or ``"package.module:factory"``, either with
    optional ``?key=value&key=value`` options (``"skyfed.tasks.examples:wide?params=100M"``).

    The factory is called with the spec's options (integers and floats parsed, the rest
    strings) updated by ``options``, and must return an object with the
    :class:`~skyfed.tasks.base.Task` methods. Options in the spec travel with the one
    ``--task`` string every site and the coordinator are given.
    """
    spec, options = _split_options(spec, options)
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


def _split_options(spec: str, options: dict[str, object]) -> tuple[str, dict[str, object]]:
    base, sep, query = spec.partition("?")
    if not sep:
        return spec, options
    parsed: dict[str, object] = {}
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"task option {item!r} in {spec!r} is not key=value")
        parsed[key] = _scalar(value)
    return base, {**parsed, **options}


def _scalar(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
