"""Taking turns over one model: a user's training loop and its site's federation thread.

The script's thread runs its optimizer steps; the federation's thread contributes
``start - now``, applies the federation's update and resyncs. They never touch the model
at once: at each phase boundary the script hands the model over and waits until the
federation hands it back (or ends), and the federation waits while the script trains.
"""

from __future__ import annotations

import threading


class Stopped(Exception):
    """The script closed its site: the federation thread ends, with no failure to report
    unless ``reason`` says why the script failed."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or "the script closed its site")
        self.reason = reason


class Handoff:
    """Whose turn it is with the model: the script's or the federation's (at first)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._script = False
        self._closed = False
        self._why: str | None = None
        self._ended = False
        self._error: BaseException | None = None

    # ---- the federation's side -----------------------------------------------------------

    def to_script(self) -> None:
        """Give the script its turn and wait until it gives it back (a phase boundary);
        ``Stopped`` once the script has closed the site."""
        with self._cond:
            if not self._closed:
                self._script = True
                self._cond.notify_all()
                self._cond.wait_for(lambda: not self._script or self._closed)
            if self._closed:
                raise Stopped(self._why)

    def end(self, error: BaseException | None) -> None:
        """The federation is over for this site: finished (``error`` None) or failed. The
        script's turn comes back for good."""
        with self._cond:
            self._ended, self._error = True, error
            self._cond.notify_all()

    # ---- the script's side ---------------------------------------------------------------

    def wait_turn(self) -> bool:
        """Wait for the script's turn: True; False once the federation has finished; the
        federation's error, raised, once it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._script or self._ended)
            return self._outcome()

    def to_federation(self) -> bool:
        """Give the federation its turn (a phase boundary) and wait for the next one, as
        :meth:`wait_turn`."""
        with self._cond:
            if not self._ended:
                self._script = False
                self._cond.notify_all()
        return self.wait_turn()

    def close(self, why: str | None = None) -> None:
        """The script is done with the site (``why``: it failed, in one line): a
        federation waiting for its turn stops."""
        with self._cond:
            self._closed, self._why = True, why
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ended(self) -> bool:
        return self._ended

    def _outcome(self) -> bool:
        if not self._ended:
            return True
        if self._error is not None:
            raise self._error
        return False
