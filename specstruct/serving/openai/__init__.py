"""An OpenAI-compatible HTTP server over a specstruct engine (`specstruct serve`; needs `pip install
"specstruct[server]"`)."""

from .app import create_app
from .limits import ServerLimits

__all__ = ["create_app", "ServerLimits"]
