"""An OpenAI-compatible HTTP server over a specstruct engine (`specstruct serve`; needs `pip install
"specstruct[server]"`)."""

from specstruct.serving.openai.app import create_app
from specstruct.serving.openai.http import uvicorn_options
from specstruct.serving.openai.limits import ServerLimits

__all__ = ["create_app", "ServerLimits", "uvicorn_options"]
