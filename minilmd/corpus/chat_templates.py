"""The chat template `minilmd tokenizer train --chat-template` puts beside a new tokenizer, so that `prepare --format
chat`, `sample --chat`, `chat` and the HF export find one (minilmd/corpus/chat.py reads it from there).

`minimind` is ChatML as MiniMind renders a conversation: `<|im_start|>ROLE\\n` ... `<|im_end|>\\n` per message, and
every reply opened by the think block, empty unless the reply brings its own (`<think>...</think>` at its start, or
`reasoning_content`), the generation prompt ending with the empty block; with MiniMind's tool calls
(chat_tools.py): the specs written into the system turn, each reply's `<tool_call>` blocks after its text, tool
results as one user turn of `<tool_response>` blocks. Written here, in our own words: it renders the text MiniMind's
own tokenizer_config.json template renders (tests/test_tokenizer.py compares the two where MiniMind's is at hand,
tool calls included). Any other template is brought as a file: `--chat-template FILE` (a
Jinja template, or a tokenizer_config.json whose chat_template is taken), or written later as
`chat_template.jinja` beside tokenizer.json.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.corpus.sources.jsonl import loads_bounded
from minilmd.names import TOKENIZER_CONFIG_MAX_BYTES

MINIMIND_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with '
        'function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
        '\\n</tool_call><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' and tools %}
        {#- its text went into the tools' system turn above #}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
        {{- content.lstrip('\\n') }}
        {%- for call in message.tool_calls or [] %}
            {%- if content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {%- set call = call.function if call.function else call %}
            {#- the name written, not joined with +: a call without one renders an empty name, as MiniMind's #}
            {{- '<tool_call>\\n{"name": "' }}{{- call.name }}{{- '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {#- a tool's result is the user's turn; consecutive results share one #}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}
{%- endif %}"""

BUILT_IN = {"minimind": MINIMIND_TEMPLATE}

class ChatTemplateError(ValueError):
    """--chat-template names no built-in template and no readable template file."""


def template_text(spec: str) -> str:
    """The template `--chat-template SPEC` names: a built-in one by name, or a file's (a tokenizer_config.json:
    its "chat_template")."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    from minilmd.corpus.sources.local import LinkRefused, read_source
    from minilmd.untrusted import Unreadable

    path = Path(spec)
    try:  # a regular file, bounded, never a blocking open (a FIFO), a link followed by the one link rule only
        text = read_source(path, max_bytes=TOKENIZER_CONFIG_MAX_BYTES)[0].decode("utf-8")
    except LinkRefused as e:
        raise ChatTemplateError(f"--chat-template {spec}: {e}") from None
    except (Unreadable, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"--chat-template {spec}: not {' or '.join(BUILT_IN)}, and not a readable template "
                                f"file ({e})") from None
    if path.suffix == ".json":
        try:
            config = loads_bounded(text)
        except ValueError as e:
            raise ChatTemplateError(f"--chat-template {spec}: not readable JSON ({e})") from None
        found = config.get("chat_template") if isinstance(config, dict) else None
        if not isinstance(found, str):
            raise ChatTemplateError(f"--chat-template {spec}: no \"chat_template\" string in it")
        text = found
    if not text.strip():
        raise ChatTemplateError(f"--chat-template {spec}: empty")
    return text


def tokenizer_config(template: str) -> dict:
    """A tokenizer_config.json that transformers loads beside a tokenizer.json of MiniMind's special ids, holding
    `template`."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
            "add_eos_token": False, "clean_up_tokenization_spaces": False, "chat_template": template}


def checked_config(spec: str) -> dict:
    """The tokenizer_config.json for `spec`'s template, once the template has compiled and rendered a conversation
    whose reply it shows (chat.py's check); ChatTemplateError otherwise."""
    import jinja2

    from minilmd.corpus.chat import ChatError, ChatTemplate

    config = tokenizer_config(template_text(spec))
    try:
        ChatTemplate.from_config(config).targets([{"role": "user", "content": "你好"},
                                                  {"role": "assistant", "content": "你好！"}])
    except (ChatError, jinja2.TemplateError) as e:
        raise ChatTemplateError(f"--chat-template {spec}: {e}") from None
    return config


def write_beside(tokenizer_json: str | Path, config: dict, tokenizer_text: str, *,
                 group_share: bool = False) -> Path:
    """Write `config` as the tokenizer_config.json beside `tokenizer_json` (whose text is `tokenizer_text`), where
    chat.py looks for the template, recording that tokenizer (tokenizer_beside.RECORD: the config is its alone): as
    tokenizer train writes the tokenizer.json (fsio.write_out_text: at the directory's descriptor, under the place
    rule; PlaceRefused there; perms.published_file_mode: only its owner writes it, whatever the umask)."""
    import json

    from minilmd.corpus.tokenizer_beside import RECORD, record_for
    from minilmd.fsio import write_out_text
    from minilmd.names import TOKENIZER_CONFIG
    from minilmd.perms import published_file_mode

    path = Path(tokenizer_json).with_name(TOKENIZER_CONFIG)
    config = {**config, RECORD: record_for(Path(tokenizer_json), tokenizer_text)}
    write_out_text(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n", "--out", "the tokenizer",
                   OUT_ADVICE, group_share=group_share, mode=published_file_mode())
    return path


OUT_ADVICE = ("choose an --out in a directory only you (and root) can change, or pass --group-share to write the "
              "tokenizer into a team directory anyway")
