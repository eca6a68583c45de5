"""Another user's link among a command's sources (hostile audit 6 F1): a teammate's `b.jsonl` in a team corpus
directory, linked to the victim's private file (0600, in a 0700 directory), was read with her rights by `prepare`
(and `--append`, `tokenizer train`, `corpus report`, `corpus count`) and published in a corpus he reads. The one link
rule (place_rule.link_followed, as the views' run argument): a link is followed only when it is the caller's, root's
or the owner's of what it leads to; another's is refused, exit 2, naming it, its owner and its target, nothing
written, nothing of the file said. The victim is root (this process); the attacker a real uid (64123, no passwd entry
needed) that makes his link himself, through setpriv, in a sticky shared directory both may write.

A tokenizer (or a chat template) the victim names keeps the same rule (sources/local.py read_source): a teammate's
`tok.json`, linked to her private tokenizer.json, was read with her rights by `prepare --tokenizer` (and `corpus report
--tokenizer`, `tokenizer template`, `tokenizer check`, `export --tokenizer`, and `tokenizer train --chat-template`
through a directory link on the way), and by prepare copied into a corpus he reads."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.corpus.chat_templates import ChatTemplateError, template_text
from minilmd.corpus.prepare.options import PrepareTokenizer
from minilmd.corpus.sources import local
from minilmd.corpus.sources.local import LinkRefused, open_source
from minilmd.corpus.tokenizer import TokenizerError, read_tokenizer_text

OTHER = 64123
SECRET = "my bank PIN is 4321 and password hunter2"

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv: another uid makes the link")


def as_other(*argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups", "--", *argv], check=True,
                   timeout=60, cwd="/")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True, timeout=300)


def jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


@pytest.fixture
def team(tmp_path):
    """(a team corpus directory both may write: sticky 1777 under /tmp, holding the victim's a.jsonl; her private
    0600 file in her 0700 directory)."""
    shared = Path(subprocess.run(["mktemp", "-d", "/tmp/minilmd-links-XXXXXX"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    shared.chmod(0o1777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = jsonl(private / "notes.jsonl", [SECRET] * 3)
    secret.chmod(0o600)
    jsonl(shared / "a.jsonl", [f"document number {i} of the team corpus, plain text." for i in range(200)])
    try:
        yield shared, secret
    finally:
        shutil.rmtree(shared)


def nothing_secret_in(*roots: Path) -> bool:
    for root in roots:
        for here, _, files in os.walk(root):
            for name in files:
                path = Path(here, name)
                if not path.is_symlink() and b"hunter2" in path.read_bytes():
                    return False
    return True


def refused(done: subprocess.CompletedProcess, link: Path, target: Path) -> None:
    assert done.returncode == 2, done
    assert f"{link} is a symbolic link of uid {OTHER} to {target}, a file of user root (uid 0)" in done.stderr, done
    assert "hunter2" not in done.stdout + done.stderr, done


@pytest.mark.slow  # eight commands, each a process of its own
@needs_root
def test_another_users_link_to_her_private_file_is_refused_by_every_command_reading_sources(team, tmp_path,
                                                                                            tokenizer):
    shared, secret = team
    link = shared / "b.jsonl"
    as_other("ln", "-s", str(secret), str(link))
    sources = [str(shared / "a.jsonl"), str(link)]
    out = shared / "prep"

    for bad in ("error", "skip"):  # a refused link is no bad line: --on-bad-line skip refuses it too
        done = cli("prepare", *sources, "--tokenizer", str(tokenizer), "--out", str(out), "--seq-len", "64",
                   "--on-bad-line", bad, "--workers", "0")
        refused(done, link, secret)
        assert not out.exists() and not [p for p in shared.iterdir() if p.name.startswith(".prep")]

    done = cli("prepare", sources[0], "--tokenizer", str(tokenizer), "--out", str(out), "--seq-len", "64",
               "--workers", "0")
    assert done.returncode == 0, done
    meta = (out / "meta.json").read_bytes()
    done = cli("prepare", "--append", str(link), "--out", str(out), "--workers", "0")
    refused(done, link, secret)
    assert (out / "meta.json").read_bytes() == meta

    tok_out = tmp_path / "tok.json"
    done = cli("tokenizer", "train", *sources, "--vocab-size", "300", "--out", str(tok_out))
    refused(done, link, secret)
    assert not tok_out.exists()

    for command in (["corpus", "report", str(link)], ["corpus", "count", "hunter2", "PIN", str(link)]):
        refused(cli(*command), link, secret)
    assert nothing_secret_in(shared)


@needs_root
def test_a_directory_link_of_another_users_on_the_way_is_refused_and_his_link_to_his_own_file_followed(team):
    shared, secret = team
    through = shared / "mine"
    as_other("ln", "-s", str(secret.parent), str(through))  # a link on the way, not the last component
    with pytest.raises(LinkRefused, match=f"{through} is a symbolic link of uid {OTHER} to {secret.parent}"):
        open_source(through / secret.name)

    escaped = shared / "b\x1b]0;OWNED\x07.jsonl"  # a name he chose, with a terminal escape: said escaped
    as_other("ln", "-s", f"{secret}\x1b[2J", str(escaped))
    with pytest.raises(LinkRefused) as refused:
        open_source(escaped)
    assert "\x1b" not in str(refused.value) and "\\x1b]0;OWNED" in str(refused.value), refused.value

    his = shared / "his.jsonl"
    as_other("sh", "-c", f"printf '{{\"text\": \"his own\"}}\\n' > {his} && ln -s {his} {shared / 'his-link'}")
    fd, real = open_source(shared / "his-link")  # his link to his own file: he chooses nothing of hers
    os.close(fd)
    assert real == his
    mine = shared / "mine-link"
    mine.symlink_to(shared / "a.jsonl")  # the caller's own link: followed
    fd, real = open_source(mine)
    os.close(fd)
    assert real == shared / "a.jsonl"


@needs_root
def test_a_followed_link_is_named_in_meta_json_by_the_file_it_led_to(team, tokenizer):
    shared, _ = team
    his = shared / "his.jsonl"
    as_other("sh", "-c", f"printf '{{\"text\": \"his own text, shared with the team\"}}\\n' > {his} && "
             f"ln -s {his} {shared / 'b.jsonl'}")
    out = shared / "prep"
    done = cli("prepare", str(shared / "a.jsonl"), str(shared / "b.jsonl"), "--tokenizer", str(tokenizer), "--out",
               str(out), "--seq-len", "64", "--workers", "0")
    assert done.returncode == 0, done
    sources = json.loads((out / "meta.json").read_text())["sources"]
    assert [s["path"] for s in sources] == [str(shared / "a.jsonl"), str(shared / "b.jsonl")]
    assert "real_path" not in sources[0] and sources[1]["real_path"] == str(his)


def test_a_directory_swapped_for_a_link_after_the_look_is_refused_never_followed(tmp_path, monkeypatch):
    """The path is resolved first, then opened from "/" by descriptor: a directory that became a link since (a
    teammate's rename in a team directory) is refused, whoever's link it is."""
    (tmp_path / "real").mkdir()
    jsonl(tmp_path / "real" / "a.jsonl", ["text"])
    (tmp_path / "elsewhere").mkdir()
    jsonl(tmp_path / "elsewhere" / "a.jsonl", ["not this one"])
    looked = local.real_source

    def swapped_after_the_look(path):
        found = looked(path)
        (tmp_path / "real").rename(tmp_path / "real.away")
        (tmp_path / "real").symlink_to(tmp_path / "elsewhere")
        return found

    monkeypatch.setattr(local, "real_source", swapped_after_the_look)
    with pytest.raises(LinkRefused, match=f"{tmp_path / 'real'} is a symbolic link now"):
        open_source(tmp_path / "real" / "a.jsonl")


@pytest.fixture
def private_tokenizer(team, tokenizer) -> tuple[Path, Path]:
    """(the team directory, the victim's private tokenizer.json: 0600 in her 0700 directory, a template beside it)."""
    shared, secret = team
    mine = secret.parent / "tok"
    mine.mkdir(mode=0o700)
    copy = mine / "tokenizer.json"
    shutil.copyfile(tokenizer, copy)
    copy.chmod(0o600)
    (mine / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    return shared, copy


@needs_root
def test_another_users_link_to_her_private_tokenizer_is_refused_by_every_reader(private_tokenizer):
    shared, secret = private_tokenizer
    link, through = shared / "tok.json", shared / "tokdir"
    as_other("ln", "-s", str(secret), str(link))
    as_other("ln", "-s", str(secret.parent), str(through))  # a link on the way, not the last component
    with pytest.raises(TokenizerError, match=f"{link} is a symbolic link of uid {OTHER} to {secret}, a file of"):
        read_tokenizer_text(link)
    for named in (through, through / "tokenizer.json"):  # the directory, or the file in it
        with pytest.raises(TokenizerError, match=f"{through} is a symbolic link of uid {OTHER} to {secret.parent}"):
            PrepareTokenizer.load(named, chat=True)
    with pytest.raises(ChatTemplateError, match=f"{through} is a symbolic link of uid {OTHER}"):
        template_text(str(through / "chat_template.jinja"))

    from minilmd.trainer.model.export_paths import ExportError, read_explicit  # export --tokenizer's reader

    with pytest.raises(ExportError, match=f"{link} is a symbolic link of uid {OTHER}"):
        read_explicit(link, 1 << 24)


@pytest.mark.slow  # four commands, each a process of its own
@needs_root
def test_the_tokenizer_commands_refuse_it_with_exit_2_and_write_nothing(private_tokenizer, tmp_path):
    shared, secret = private_tokenizer
    link = shared / "tok.json"
    as_other("ln", "-s", str(secret), str(link))
    out = shared / "prep"
    refused(cli("prepare", str(shared / "a.jsonl"), "--tokenizer", str(link), "--out", str(out), "--seq-len", "64",
                "--workers", "0"), link, secret)
    assert not out.exists() and not [p for p in shared.iterdir() if p.name.startswith(".prep")]
    refused(cli("corpus", "report", str(shared / "a.jsonl"), "--tokenizer", str(link)), link, secret)
    refused(cli("tokenizer", "check", str(link)), link, secret)
    copy = tmp_path / "copy"
    refused(cli("tokenizer", "template", str(link), "--chat-template", "minimind", "--out", str(copy)), link, secret)
    assert not copy.exists()


@needs_root
def test_his_link_to_his_own_tokenizer_and_her_own_link_are_followed(private_tokenizer, tokenizer):
    shared, secret = private_tokenizer
    his = shared / "his.json"
    shutil.copyfile(tokenizer, his)
    os.chown(his, OTHER, OTHER)  # his file: his link to it chooses nothing of hers
    as_other("ln", "-s", str(his), str(shared / "his-link.json"))
    assert read_tokenizer_text(shared / "his-link.json") == tokenizer.read_text(encoding="utf-8")
    mine = shared / "my-link.json"
    mine.symlink_to(secret)  # her own link to her own file: followed
    assert PrepareTokenizer.load(mine).json == tokenizer.read_text(encoding="utf-8")


def test_a_link_loop_named_as_a_tokenizer_is_said_not_a_traceback(tmp_path):
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json .more than 40 symbolic links on the way"):
        read_tokenizer_text(tmp_path / "a.json")
