"""LangChain's standard integration tests (langchain-tests) against the real Qwen2.5-Coder pair: 1.5B target,
0.5B draft. Slow on CPU (minutes); skipped when the models are not pulled (`specstruct pull`)."""

from __future__ import annotations

from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_specstruct import ChatSpecStruct


class TestChatSpecStructReal(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatSpecStruct]:
        return ChatSpecStruct

    @property
    def chat_model_params(self) -> dict:
        # Short replies keep the suite within minutes on a CPU; structured replies here fit in 96 tokens.
        return {"model": "qwen2.5-coder-1.5b", "draft_model": "qwen2.5-coder-0.5b", "max_tokens": 96}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True
