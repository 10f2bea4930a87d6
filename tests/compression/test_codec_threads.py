"""The codecs' worker threads: work run beside this thread is finished before the caller
goes on, whichever side fails."""

from __future__ import annotations

import threading
import time

import pytest

from skyfed.compression.base import beside


def test_work_beside_is_done_before_the_result_is_returned() -> None:
    done = threading.Event()

    def background() -> None:
        time.sleep(0.05)
        done.set()

    assert beside(background, lambda: 7) == 7
    assert done.is_set()


def test_a_failure_here_waits_for_the_background_before_it_is_raised() -> None:
    done = threading.Event()

    def background() -> None:
        time.sleep(0.05)
        done.set()

    def here() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        beside(background, here)
    assert done.is_set()  # never left writing the caller's memory


def test_a_failure_in_the_background_is_raised_to_the_caller() -> None:
    def background() -> None:
        raise PermissionError("background")

    with pytest.raises(PermissionError, match="background"):
        beside(background, lambda: None)
