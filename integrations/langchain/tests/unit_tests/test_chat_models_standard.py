"""LangChain's standard unit tests for chat models (langchain-tests), on the tiny engine: offline, no weights."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_specstruct import ChatSpecStruct

from lc_tiny_engine import tiny_engine


class TestChatSpecStructUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatSpecStruct]:
        return ChatSpecStruct

    @property
    def chat_model_params(self) -> dict:
        return {"engine": tiny_engine()}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True
