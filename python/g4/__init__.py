"""g4: Gemma 4 QAT checkpoints with static int8 activations, from Python.

    import g4
    model = g4.Model("models/gemma4-tiny-math", threads=2)
    print(model.generate("What is 149 * 2 + 592?", temperature=0))
    for delta in model.generate("What is 7 * 8?", temperature=0, stream=True):
        print(delta, end="", flush=True)
    reply = model.chat([{"role": "user", "content": "What is 2 + 3?"}])
    print(reply.content, reply.reasoning, reply.tool_calls)

Every call goes to libg4's public C API (g4.h) through ctypes; the GIL is released while the
engine computes. Errors are g4.Error subclasses whose message is g4's one-line error.
"""

from ._capi import library_path, version
from ._version import __version__
from ._core import (
    ChatDelta,
    ChatReply,
    Completion,
    ContextError,
    Conversation,
    Error,
    G4Warning,
    GenerationError,
    InputError,
    LoadError,
    Model,
    OptionError,
    OptionInfo,
    ParsedReply,
    Stream,
    ToolCall,
    options,
    parse_reply,
    set_threads,
    threads,
)


__all__ = [
    "ChatDelta",
    "ChatReply",
    "Completion",
    "ContextError",
    "Conversation",
    "Error",
    "G4Warning",
    "GenerationError",
    "InputError",
    "LoadError",
    "Model",
    "OptionError",
    "OptionInfo",
    "ParsedReply",
    "Stream",
    "ToolCall",
    "library_path",
    "options",
    "parse_reply",
    "set_threads",
    "threads",
    "version",
]
