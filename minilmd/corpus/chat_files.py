"""The files beside a tokenizer that a chat corpus is rendered with: its tokenizer_config.json and
chat_template.jinja, read when they are the user's or the tokenizer owner's, and resolved to one template string
(`chat_config`: what a chat corpus, a checkpoint and an export carry). The rendering rule is chat.py's."""
from __future__ import annotations

import os
from pathlib import Path

from minilmd.corpus.chat import ChatError, ChatTemplate
from minilmd.corpus.sources.jsonl import loads_bounded
from minilmd.names import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES, TOKENIZER_FILE
from minilmd.perms import own_uid, owner_in, user_words
from minilmd.untrusted import Unreadable


def tokenizer_dir(tokenizer: str | Path) -> Path:
    """The directory of a tokenizer given as its tokenizer.json or as the directory holding it."""
    path = Path(tokenizer)
    return path if path.is_dir() else path.parent


def _read_text(path: Path, owners: tuple[int, ...], tokenizer: Path) -> str:
    """A small text file beside a tokenizer, its links followed by the one link rule (sources/local.py read_source:
    a Hugging Face cache is links into its blobs) and the file read as untrusted (regular, bounded, never a blocking
    open), when it and any link to it belong to one of `owners` (_owners_beside); else a ChatError naming its owner
    (or the link refused), before a byte of it is parsed. Raises Unreadable."""
    from minilmd.corpus.sources.local import LinkRefused, read_source

    for st in (os.lstat(path), os.stat(path)):  # the link (when it is one), then what it names
        if not owner_in(st, owners):
            raise ChatError(
                f"{path} belongs to {user_words(st.st_uid)}, neither you nor the owner of {tokenizer}: minilmd "
                "renders no chat template another user put beside a tokenizer (a team or sticky directory). Ask that "
                "user to remove it, or copy the tokenizer into a directory of yours and give it a template there "
                "(`minilmd tokenizer template COPY --chat-template minimind`, or copy that file too once you have "
                "read it: the copy is yours)")
    try:  # the owner checked again on the file opened (it may have been swapped since)
        return read_source(path, max_bytes=TOKENIZER_CONFIG_MAX_BYTES, owner=owners)[0].decode("utf-8")
    except LinkRefused as e:
        raise ChatError(str(e)) from None
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8", path, kind="not_utf8") from None


def _owners_beside(tokenizer_file: Path) -> tuple[int, ...]:
    """Whose files beside a tokenizer are read: the user's, root's and the tokenizer's owner's (a tokenizer taken
    from another user comes with that user's template). A file another user put beside the user's own tokenizer,
    in a team or sticky directory, is not: it would render every reply of the user's corpus."""
    try:
        theirs: tuple[int, ...] = (os.stat(tokenizer_file).st_uid,)
    except OSError:
        theirs = ()  # the tokenizer's own reader says what is wrong with it
    return (own_uid(), 0, *theirs)


def read_tokenizer_config(tokenizer: str | Path, data_format: str = "chat") -> dict:
    """The tokenizer_config.json beside a tokenizer the user named (an option, a config's path), its `chat_template`
    resolved to one string (module docstring): what a chat corpus, a checkpoint and an export carry. Its links are
    followed, the user's own choice, but it and chat_template.jinja are read only when they are the user's or the
    tokenizer owner's (_read_text); a checkpoint's or a corpus's files, which may be another user's,
    are read without following one and given to `chat_config` (trainer/model/export.py). ChatError when
    there is no template."""
    from minilmd.corpus.tokenizer import beside_not_tokenizer
    from minilmd.corpus.tokenizer_beside import without_record

    if why := beside_not_tokenizer(tokenizer):  # its own directory's config would be read as "beside" it
        raise ChatError(why)
    folder = tokenizer_dir(tokenizer)
    path = folder / TOKENIZER_CONFIG
    file = Path(tokenizer) if Path(tokenizer) != folder else folder / TOKENIZER_FILE
    owners = _owners_beside(file)
    try:  # whatever is there is read (a FIFO, a directory: unreadable, said), not taken for "no template"
        config_text = _read_text(path, owners, file) if path.exists() else None
    except ChatError:
        raise
    except Unreadable as e:
        raise ChatError(f"{path}: unreadable ({e.why})") from None
    except (OSError, ValueError) as e:
        raise ChatError(f"{path}: not readable JSON ({e})") from None
    not_its = _not_its(config_text, folder, Path(tokenizer))
    template = None
    if (folder / CHAT_TEMPLATE_FILE).exists() and not not_its:
        try:
            template = _read_text(folder / CHAT_TEMPLATE_FILE, owners, file)
        except Unreadable as e:
            raise ChatError(f"{folder / CHAT_TEMPLATE_FILE}: unreadable ({e.why})") from None
        except OSError as e:
            raise ChatError(f"{folder / CHAT_TEMPLATE_FILE}: unreadable ({e.strerror})") from None
    try:
        return without_record(chat_config(None if not_its else config_text, template, folder,
                                          tokenizer_name=str(tokenizer), data_format=data_format))
    except ChatError as e:
        raise ChatError(f"{e}; {not_its}" if not_its else str(e)) from None


def _not_its(config_text: str | None, folder: Path, tokenizer: Path) -> str:
    """Why the files beside `tokenizer` (its directory's tokenizer_config.json, chat_template.jinja) are another
    tokenizer's (minilmd/corpus/tokenizer_beside.py); "" when they are its own, or there is no config."""
    from minilmd.corpus.tokenizer import TokenizerError, read_tokenizer_text
    from minilmd.corpus.tokenizer_beside import belongs

    if config_text is None:
        return ""
    try:
        config = loads_bounded(config_text)
    except ValueError:
        return ""  # chat_config says what is wrong with it
    if not isinstance(config, dict):
        return ""
    file = tokenizer if tokenizer != folder else folder / TOKENIZER_FILE
    try:
        data = read_tokenizer_text(file).encode("utf-8")
    except TokenizerError:
        data = None  # the tokenizer's own reader says what is wrong with it
    return belongs(config, file, data)


def chat_config(config_text: str | None, template: str | None, folder: Path,
                tokenizer_name: str | None = None, data_format: str = "chat") -> dict:
    """The text of a tokenizer_config.json (None: there is none) and of a chat_template.jinja beside it (None: none,
    else preferred) -> the config with its `chat_template` resolved to one string; `folder` names them in a
    ChatError, raised when there is no template, and `tokenizer_name` (the tokenizer as the user gave it) names the
    tokenizer without one (`folder` otherwise: `.` for a tokenizer.json of the working directory said nothing)."""
    path = folder / TOKENIZER_CONFIG
    try:
        config = loads_bounded(config_text) if config_text is not None else {}
    except ValueError as e:
        raise ChatError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise ChatError(f"{path}: not a JSON object")
    source = config.get("chat_template")
    if template is not None:
        source = template
    elif isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        who = tokenizer_name or folder
        raise ChatError(f"{who}: no chat template (neither {CHAT_TEMPLATE_FILE} nor a \"chat_template\" in "
                        f"{TOKENIZER_CONFIG} beside {TOKENIZER_FILE}); --format {data_format} renders conversations "
                        f"with the tokenizer's own template. `minilmd tokenizer template {who} --chat-template "
                        f"minimind` gives it one (add `--out DIR`, a directory of its own, where another tokenizer's "
                        f"{TOKENIZER_CONFIG} is beside it), its vocabulary unchanged (a model trained with it can be "
                        "fine-tuned); `tokenizer train --chat-template` would train another vocabulary")
    return {**config, "chat_template": source}


def load_template(tokenizer: str | Path) -> ChatTemplate:
    """The chat template of a tokenizer the user named (a tokenizer.json, or its directory)."""
    return ChatTemplate.from_config(read_tokenizer_config(tokenizer))
