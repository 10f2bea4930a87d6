"""``skyfed report RUN_DIR``: a run's history as ``report.html`` with PNG plots."""

from skyfed.report.page import make_report

__all__ = ["make_report"]
