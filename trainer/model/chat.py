"""Talking to a fine-tuned model: `minilmd sample --chat` (one reply) and `minilmd chat` (a conversation on stdin).

The prompt is the conversation rendered by the model's own chat template with `add_generation_prompt=True`
(minilmd/corpus/chat.py, the text transformers' apply_chat_template gives), encoded without added special tokens;
generation (generate.py, KV cache) stops at `<|im_end|>` and only the reply is printed. The template is found as
tokenizer_files.find_chat_config finds it: beside --tokenizer, in the checkpoint, or in the prepared corpus it was
trained on. A conversation that outgrows the model's max_position_embeddings loses its oldest exchanges first (a system
message stays); when even the last user message does not fit with room for a reply, it is refused.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import torch

from minilmd.corpus.chat import ChatTemplate
from minilmd.protocol import EOS_ID
from minilmd.trainer.model.generate import generate
from minilmd.untrusted import printable

MIN_REPLY_TOKENS = 16
"""A conversation is shortened (or refused) rather than leave less room than this for the reply."""


def reply_ids(new: list[int]) -> list[int]:
    """The generated ids of a reply: up to, not including, the first `<|im_end|>`."""
    return new[:new.index(EOS_ID)] if EOS_ID in new else new


class ChatSession:
    """A checkpoint's model, tokenizer and chat template, loaded once; `reply(messages)` answers the last turn."""

    def __init__(self, checkpoint: str | Path, tokenizer: str | Path | None = None, device: str = "auto",
                 max_new_tokens: int = 256, temperature: float = 0.85, top_p: float = 0.85, top_k: int = 50,
                 seed: int | None = None, lora: str | None = None, no_lora: bool = False):
        from tokenizers import Tokenizer

        from minilmd.trainer.model.export import ExportError, load_model
        from minilmd.trainer.model.tokenizer_files import find_chat_config, find_tokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, loaded = load_model(checkpoint, device, lora, no_lora)
        checked = None if lora else loaded  # with --lora, the adapter's, not CHECKPOINT's (tokenizer_files._state)
        config = find_chat_config(checkpoint, tokenizer, checked=checked)
        if config is None:
            raise ExportError(f"{checkpoint}: no chat template found (a model trained on a chat corpus carries its "
                              "tokenizer_config.json); pass --tokenizer DIR/tokenizer.json of a tokenizer with one")
        self.template = ChatTemplate.from_config(config)
        self.tok = Tokenizer.from_buffer(find_tokenizer(checkpoint, tokenizer, checked=checked).data)
        self.limit = self.model.config.max_position_embeddings
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The rendered prompt's ids, the oldest exchanges dropped until a reply of MIN_REPLY_TOKENS fits."""
        messages = list(messages)
        while True:
            text = self.template.render(messages, add_generation_prompt=True)
            ids = self.tok.encode(text, add_special_tokens=False).ids
            if len(ids) + MIN_REPLY_TOKENS <= self.limit:
                return ids
            first = 1 if messages and messages[0]["role"] == "system" else 0
            if len(messages) - first <= 1:
                raise ValueError(f"the prompt is {len(ids)} tokens; with room for a reply it exceeds the model's "
                                 f"max_position_embeddings ({self.limit})")
            del messages[first:first + 2]  # the oldest user message and its reply

    def reply(self, messages: list[dict]) -> str:
        """The model's reply to a conversation that ends with a user message."""
        ids = self.prompt_ids(messages)
        budget = min(self.max_new_tokens, self.limit - len(ids))
        out = generate(self.model, ids, budget, self.temperature, self.top_p, self.top_k, eos_id=EOS_ID,
                       generator=self.generator)
        return self.tok.decode(reply_ids(out[0, len(ids):].tolist()), skip_special_tokens=True)


def converse(session: ChatSession, lines: Iterable[str], out: TextIO, system: str | None = None,
             prompt: TextIO | None = None, echo: bool = False) -> int:
    """`minilmd chat`: each line read is a user message, each reply printed on its own line(s); `/reset` forgets
    the conversation, `/exit` (or the end of input) ends it. Returns the number of replies.

    `echo` (stdin is not a terminal: a file of questions piped in) makes stdout a transcript that says where each
    turn starts and ends, a reply holding line breaks or nothing: each message as `> MESSAGE` (a `/reset` too),
    then its reply, then an empty line."""
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    start = list(messages)
    replies = 0
    if prompt:
        prompt.write("> ")
        prompt.flush()
    for line in lines:
        text = line.rstrip("\n")
        if text.strip() == "/exit":
            break
        if echo and text.strip():
            out.write(f"> {text}\n")
        if text.strip() == "/reset":
            messages = list(start)
            if echo:
                out.write("\n")
        elif text.strip():
            messages.append({"role": "user", "content": text})
            answer = session.reply(messages)
            messages.append({"role": "assistant", "content": answer})
            out.write(shown(answer) + "\n" + ("\n" if echo else ""))
            out.flush()
            replies += 1
        if prompt:
            prompt.write("> ")
            prompt.flush()
    return replies


EMPTY_REPLY = "(empty reply)"
"""What is printed for an empty reply (the model ended it at once): printing nothing looked like a
hang or a crash."""


def shown(answer: str) -> str:
    """A reply as printed: itself (white space too: the model's own) with its control characters escaped
    (untrusted.printable: a tokenizer's decoder from elsewhere, or the model's bytes, may hold ESC sequences that
    retitle the terminal or write its clipboard), or EMPTY_REPLY when it is empty."""
    return printable(answer, lines=True) if answer else EMPTY_REPLY


def interactive_prompt() -> TextIO | None:
    """stderr for the `> ` prompt when a person types (stdin is a terminal); None for a pipe."""
    return sys.stderr if sys.stdin.isatty() else None
