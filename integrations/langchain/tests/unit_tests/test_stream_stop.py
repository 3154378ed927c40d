"""Streaming with stop strings: the streamed text never holds a stop string and equals what
`invoke` returns. A scripted target writes a known text through the real specstruct loop."""

from __future__ import annotations

import pytest

from langchain_specstruct import ChatSpecStruct
from specstruct.testing import scripted_engine


@pytest.mark.parametrize("stop", [["Good"], ["d."], ["bye", "o w"]])
def test_chat_stream_with_stop_equals_invoke(stop):
    chat = ChatSpecStruct(engine=scripted_engine("Hello world. Goodbye."), max_tokens=24)
    streamed = "".join(str(c.content) for c in chat.stream("hi", stop=stop))
    invoked = chat.invoke("hi", stop=stop).content
    assert streamed == invoked
    assert not any(s in streamed for s in stop)
