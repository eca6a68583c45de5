"""Whose a tokenizer_config.json is (minilmd/corpus/tokenizer_beside.py): a directory holding two tokenizers gave
the second one the first one's chat template (`prepare --format chat --tokenizer tokB.json` rendered with tok.json's
and wrote it into the corpus), and `tokenizer template tokT.json` was refused only because tok.json's config was
there. Now a config minilmd writes records its tokenizer (name and sha256) and applies to it alone; one without a
record applies to the directory's tokenizer.json, or to its only tokenizer."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.corpus.chat import ChatError
from minilmd.corpus.chat_files import read_tokenizer_config
from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE, tokenizer_config
from minilmd.corpus.tokenizer_beside import RECORD


def template(tokenizer: Path, *extra: str):
    return CliRunner().invoke(app, ["tokenizer", "template", str(tokenizer), "--chat-template", "minimind", *extra])


def test_a_config_minilmd_wrote_is_its_tokenizers_alone(tmp_path, tokenizer):
    tk = tmp_path / "tk"
    tk.mkdir()
    shutil.copyfile(tokenizer, tk / "tok.json")
    done = template(tk / "tok.json")
    assert done.exit_code == 0, done.output
    assert json.loads((tk / "tokenizer_config.json").read_text())[RECORD]["file"] == "tok.json"
    own = read_tokenizer_config(tk / "tok.json")
    assert own["chat_template"] == MINIMIND_TEMPLATE and RECORD not in own  # a corpus carries it without the record

    shutil.copyfile(tokenizer, tk / "tokB.json")  # another tokenizer (the same bytes, even), no template of its own
    with pytest.raises(ChatError, match=r"tokB.json: no chat template .*tokenizer_config.json is tok.json's \(it "
                                        r"records it\), not tokB.json's"):
        read_tokenizer_config(tk / "tokB.json")
    with pytest.raises(ChatError) as said:  # walk 4 #2: the way it names is refused there without --out
        read_tokenizer_config(tk / "tokB.json")
    assert (f"`minilmd tokenizer template {tk / 'tokB.json'} --chat-template minimind` gives it one (add `--out DIR`, "
            "a directory of its own, where another tokenizer's tokenizer_config.json is beside it)") in str(said.value)

    shutil.copyfile(tokenizer, tk / "tokT.json")
    refused = template(tk / "tokT.json")
    assert refused.exit_code == 2 and "tokenizer_config.json is tok.json's chat template" in refused.output, \
        refused.output
    assert "give tokT.json a directory of its own (--out DIR), or pass --force" in refused.output, refused.output
    moved = template(tk / "tokT.json", "--out", str(tmp_path / "tkT"))
    assert moved.exit_code == 0, moved.output
    assert read_tokenizer_config(tmp_path / "tkT")["chat_template"] == MINIMIND_TEMPLATE  # its tokenizer.json


def test_a_config_retrained_over_is_no_longer_its_tokenizers(tmp_path, tokenizer):
    shutil.copyfile(tokenizer, tmp_path / "tok.json")
    assert template(tmp_path / "tok.json").exit_code == 0
    (tmp_path / "tok.json").write_text(json.dumps(json.loads(tokenizer.read_text())) + "\n")  # other bytes
    with pytest.raises(ChatError, match="was written for another tok.json"):
        read_tokenizer_config(tmp_path / "tok.json")


def test_a_config_without_a_record_is_the_directorys_tokenizer_json_or_its_only_tokenizer(tmp_path, tokenizer):
    config = json.dumps(tokenizer_config(MINIMIND_TEMPLATE))  # transformers' layout, or an older minilmd's
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copyfile(tokenizer, hf / "tokenizer.json")
    shutil.copyfile(tokenizer, hf / "tokB.json")
    (hf / "tokenizer_config.json").write_text(config)
    assert read_tokenizer_config(hf)["chat_template"] == MINIMIND_TEMPLATE
    assert read_tokenizer_config(hf / "tokenizer.json")["chat_template"] == MINIMIND_TEMPLATE
    with pytest.raises(ChatError, match="is tokenizer.json's"):
        read_tokenizer_config(hf / "tokB.json")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(tokenizer, alone / "tok.json")
    (alone / "tokenizer_config.json").write_text(config)
    assert read_tokenizer_config(alone / "tok.json")["chat_template"] == MINIMIND_TEMPLATE
    shutil.copyfile(tokenizer, alone / "tokB.json")
    with pytest.raises(ChatError, match="records no tokenizer"):
        read_tokenizer_config(alone / "tok.json")


def test_template_says_why_it_cannot_look_at_the_tokenizer(tmp_path):
    unlookable = tmp_path / ("x" * 300) / "tok.json"  # a name too long: os.stat raises, as EACCES does
    refused = template(unlookable)
    assert refused.exit_code == 2 and "cannot be looked at (File name too long)" in refused.output, refused.output
    assert refused.exception is None or isinstance(refused.exception, SystemExit), refused.exception


def test_a_directory_too_full_to_list_gives_an_unrecorded_config_to_no_tokenizer(tmp_path, tokenizer):
    """owner_of listed the tokenizer's directory whole (os.listdir): one another user filled with millions of
    entries held the command for minutes and its names in memory. Now at most untrusted.MAX_DIR_ENTRIES are read,
    and past them the config is no tokenizer's, said with the way on."""
    from minilmd.untrusted import MAX_DIR_ENTRIES

    full = tmp_path / "full"
    full.mkdir()
    shutil.copyfile(tokenizer, full / "tok.json")  # its only .json: the config would be its own, were it all read
    (full / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(MINIMIND_TEMPLATE)))
    (full / "filler").touch()
    for i in range(MAX_DIR_ENTRIES - 1):  # links of one file: the quickest names to make
        os.link(full / "filler", full / f"filler{i}")
    with pytest.raises(ChatError, match=rf"full cannot be listed \(holds over {MAX_DIR_ENTRIES:,} entries\).*"
                                        r"--force` records its own"):
        read_tokenizer_config(full / "tok.json")
    (full / "tokenizer.json").symlink_to("tok.json")  # a directory's tokenizer.json is told without a listing
    assert read_tokenizer_config(full / "tokenizer.json")["chat_template"] == MINIMIND_TEMPLATE


@pytest.mark.parametrize("planted", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_template_another_user_put_beside_the_tokenizer_is_not_rendered(tmp_path, tokenizer, planted):
    """Hostile audit 4 F2: in a team or sticky directory another user wrote the tokenizer_config.json (or the
    chat_template.jinja) beside the user's own tokenizer; prepare rendered the user's corpus with it (his words
    appended to every reply, trained on, carried into checkpoints and exports). It is refused, naming its owner."""
    from second_user import second_user

    uid, gid = second_user()
    shutil.copyfile(tokenizer, tmp_path / "tok.json")
    beside = tmp_path / planted
    evil = MINIMIND_TEMPLATE.replace("{{- content.lstrip('\\n') }}", "{{- content.lstrip('\\n') + ' EVIL' }}")
    assert evil != MINIMIND_TEMPLATE
    beside.write_text(json.dumps(tokenizer_config(evil)) if planted == "tokenizer_config.json" else evil)
    assert read_tokenizer_config(tmp_path / "tok.json")["chat_template"] == evil  # the user's own: read
    os.chown(beside, uid, gid)
    with pytest.raises(ChatError, match=rf"{planted} belongs to user nobody \(uid {uid}\), neither you nor the "
                                        r"owner of .*tok.json.*copy the tokenizer into a directory of yours"):
        read_tokenizer_config(tmp_path / "tok.json")
    link = tmp_path / "tk" / planted  # a link of the other user's to the user's own file: the link is his word
    link.parent.mkdir()
    shutil.copyfile(tokenizer, link.parent / "tok.json")
    os.chown(beside, 0, 0)
    link.symlink_to(beside)
    os.lchown(link, uid, gid)
    with pytest.raises(ChatError, match=rf"{planted} belongs to user nobody"):
        read_tokenizer_config(link.parent / "tok.json")

    os.chown(tmp_path / "tok.json", uid, gid)  # a tokenizer taken from that user comes with that user's template
    os.chown(beside, uid, gid)
    assert read_tokenizer_config(tmp_path / "tok.json")["chat_template"] == evil
