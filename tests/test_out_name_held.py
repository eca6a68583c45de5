"""Messages of an output written onto a name another user holds, and of a tokenizer file that is not a regular one
(hostile audit 5). `tokenizer train --force` (and `export --out`) onto a name someone else made first in a sticky
directory (/tmp, a 1777 share: only its owner may replace it) said "Operation not permitted
(.tok.json.b10beb5a.tmp) ... Fix it (free space, the share)"; now the one rename of the output rule (dirfd.Dir)
says whose the name is and what to do. A FIFO as tokenizer_config.json made `prepare --format chat` say "no chat
template", as if nothing were there."""
from __future__ import annotations

import os
import subprocess

import pytest

from minilmd.corpus.chat import ChatError
from minilmd.corpus.chat_files import read_tokenizer_config
from second_user import second_user, shared, user_python  # noqa: F401 - shared: a fixture

WRITE = ("import sys\nfrom minilmd.cli.tokenizer import _write_tokenizer\n"
         "from minilmd.corpus.exits import out_dir_of, out_error_exit\n"
         "try:\n    _write_tokenizer(sys.argv[1], '{}', False)\n"
         "except OSError as e:\n"
         "    raise SystemExit(out_error_exit(e, 'tokenizer train', out_dir_of(sys.argv[1]), 'kept').exit_code)\n")
"""What `tokenizer train` does once its child trained the tokenizer (a child nobody's interpreter could not spawn
with this checkout importable): the write under the output rule, and its failure said as every output's is."""


@pytest.mark.root
def test_tokenizer_train_onto_a_name_another_user_holds_says_whose_it_is(shared, tokenizer):
    second_user()
    held = shared / "tok.json"
    held.symlink_to(tokenizer)  # root's name, made first: nobody may not replace it in the sticky directory
    done = subprocess.run(user_python(WRITE, str(held)), capture_output=True, text=True, cwd="/", timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode == 74, said
    assert "tok.json there belongs to user root (uid 0)" in said and "only its owner may replace it" in said, said
    assert "have user root (uid 0) remove it" in said and ".tmp" not in said, said
    assert held.is_symlink() and os.readlink(held) == str(tokenizer)  # left as it was


def test_an_export_onto_a_held_name_says_whose_it_is(tmp_path):
    from minilmd.dirfd import NameHeld
    from minilmd.trainer.model.export_paths import not_written

    out = tmp_path / "f.pth"
    said = str(not_written(out, NameHeld(out, 0)))
    assert said.startswith(f"{out}: the export could not be written: f.pth there belongs to user root (uid 0)"), said
    assert said.endswith("choose another name, or have user root (uid 0) remove it"), said


def test_a_fifo_as_tokenizer_config_is_unreadable_not_no_template(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    os.mkfifo(tmp_path / "tokenizer_config.json")
    with pytest.raises(ChatError, match=r"tokenizer_config.json: unreadable \(a FIFO\)"):
        read_tokenizer_config(tmp_path / "tokenizer.json")


