"""Text utilities shared by the manager and the engine: tokenizer and chat template (no torch)."""

from parrot.text.cut import cut_to_text
from parrot.text.tokenizer import ChatTemplateError, IncrementalDecoder, Tokenizer

__all__ = ["ChatTemplateError", "IncrementalDecoder", "Tokenizer", "cut_to_text"]
