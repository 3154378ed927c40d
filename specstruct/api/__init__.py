"""The Python API: `SpecStruct` and what it does around a request.

    specstruct     SpecStruct: load, compile the output type, submit to the engine, validate, retry;
                   run / stream / arun / astream take one set of keywords (a Call)
    many           generate_many: many prompts at once, in order, with a progress bar
    inputs         what a prompt may be (checked before tokenizing); RawPrompt
    prompt_ids     chat messages -> prompt ids in which only the template's markers are control tokens
    output         a finished row -> final text; streamed ids -> chunks
    streaming      committed ids -> text deltas and partial objects
    tool_replies   tools= on the Python API: the tool grammar and ToolReply
"""
