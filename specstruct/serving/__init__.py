"""Serving many requests: the OpenAI-compatible server and scale-out live here (see the open issues)."""
