"""skyfed: train one PyTorch model across several clouds over mutually authenticated gRPC.

``skyfed.Site`` joins a federation from a script's own training loop (docs/own-loop.md);
``skyfed.hf.SkyfedCallback`` does it for a Hugging Face ``Trainer``. Both load torch on
first use, so the command-line tools that import this package stay quick to start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Site", "SiteError", "__version__"]

if TYPE_CHECKING:
    from skyfed.agent.script import ScriptSite as Site
    from skyfed.agent.script import SiteError


def __getattr__(name: str) -> Any:
    if name in ("Site", "SiteError"):
        from skyfed.agent import script

        return script.ScriptSite if name == "Site" else script.SiteError
    raise AttributeError(f"module 'skyfed' has no attribute {name!r}")
