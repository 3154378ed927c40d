"""Tool calls as a constraint: free text or calls that name a bound tool with arguments matching its schema.

    grammar   the Lark grammar for Qwen-style (Hermes) <tool_call> replies
    schema    the JSON schema of one call, as the grammar embeds it
"""
