"""skyfed: train one PyTorch model across several clouds over mutually authenticated gRPC.

``skyfed.Site`` joins a federation from a script's own training loop (docs/own-loop.md);
``skyfed.hf.SkyfedCallback`` does it for a Hugging Face ``Trainer``. Both load torch on
first use, so the command-line tools that import this package stay quick to start.
``skyfed.exit_rank`` ends a finished rank process without interpreter teardown, which
torch 2.13 sometimes aborts after a multi-process run (docs/own-loop.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Site", "SiteError", "__version__", "exit_rank"]

if TYPE_CHECKING:
    from skyfed.agent.script import ScriptSite as Site
    from skyfed.agent.script import SiteError
    from skyfed.procs import exit_rank


def __getattr__(name: str) -> Any:
    if name in ("Site", "SiteError"):
        from skyfed.agent import script

        return script.ScriptSite if name == "Site" else script.SiteError
    if name == "exit_rank":
        from skyfed.procs import exit_rank

        return exit_rank
    raise AttributeError(f"module 'skyfed' has no attribute {name!r}")
