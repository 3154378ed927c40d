"""LangChain partner package for specstruct: local chat/completion models whose structured output and tool
calls are enforced while decoding, sped up by grammar-aware speculative decoding.

    from langchain_specstruct import ChatSpecStruct, SpecStructLLM
"""

from langchain_specstruct._engines import clear_engines
from langchain_specstruct.chat_models import ChatSpecStruct
from langchain_specstruct.llms import SpecStructLLM

__version__ = "0.1.0"
__all__ = ["ChatSpecStruct", "SpecStructLLM", "clear_engines", "__version__"]
