"""The tokenizer files an export copies, and `minilmd sample` / `minilmd chat` load, come from a checkpoint or a
prepared corpus that may be another user's (trainer/model/tokenizer_files.py find_tokenizer): a symbolic link there is
never followed (nothing of the file it names reaches the export), a FIFO never opened, an oversize file never read, a
tokenizer other than the one the run recorded refused; an explicit --tokenizer (the user's own) is followed."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from minilmd import checkpoint as ck
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.model.export import ExportError, export_hf
from waiting import without_blocking
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)

SECRET = "PRIVATE-NOT-FOR-EXPORT-7f3a"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture
def private(tmp_path) -> Path:
    """A file of the user's own that no export may carry: what a planted link would point at."""
    path = tmp_path / "home" / "notes.json"
    path.parent.mkdir()
    path.write_text('{"chat_template": "' + SECRET + '", "secret": "' + SECRET + '"}\n')
    path.chmod(0o600)
    return path


def _bare(tmp_path: Path) -> Path:
    """A valid checkpoint saved without a tokenizer (a pretraining checkpoint saved before one was given)."""
    return save_checkpoint(tmp_path / "ckpts", tiny_model(seed=3), step=1)


def _with_corpus(tmp_path: Path, corpus: Path, fingerprint: str | None) -> Path:
    """A valid checkpoint without a tokenizer whose run trained on the prepared corpus `corpus` (its trainer_state
    config.data.prepared), recording the tokenizer's sha256 `fingerprint` as the trainer does."""
    model = tiny_model(seed=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    state = {"step": 1, "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": str(corpus)}}}
    if fingerprint is not None:
        state["fingerprints"] = {"data": "d" * 64, "tokenizer": fingerprint}
    return ckpt_io.save(tmp_path / "ckpts", 1, model.state_dict(), optimizer.state_dict(), state)


def _nothing_of_the_secret_under(root: Path) -> None:
    for where, _dirs, files in os.walk(root):
        for name in files:
            path = Path(where, name)
            if path.is_file() and not path.is_symlink() and "home" not in path.parts:
                assert SECRET.encode() not in path.read_bytes(), path


def test_a_checkpoint_tokenizer_linked_to_a_private_file_is_refused_and_nothing_of_it_exported(tmp_path, private):
    ckpt = _bare(tmp_path)
    (ckpt / "tokenizer.json").symlink_to(private)
    with pytest.raises(ExportError, match=r"tokenizer\.json: a symbolic link"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    _nothing_of_the_secret_under(tmp_path)


def test_a_checkpoint_chat_config_linked_to_a_private_file_is_not_exported(tmp_path, tok, private):
    """The checkpoint's own tokenizer is fine; a tokenizer_config.json planted beside it as a link would have put
    the private file's "chat_template" into the export's tokenizer_config.json."""
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=5), step=1, tokenizer=tok)
    (ckpt / "tokenizer_config.json").symlink_to(private)
    with pytest.raises(ExportError, match=r"tokenizer_config\.json: a symbolic link"):
        export_hf(ckpt, tmp_path / "hf")
    _nothing_of_the_secret_under(tmp_path)


def test_a_fifo_as_the_checkpoint_tokenizer_is_refused_without_blocking(tmp_path):
    ckpt = _bare(tmp_path)
    fifo = ckpt / "tokenizer.json"
    os.mkfifo(fifo)
    with pytest.raises(ExportError, match=r"tokenizer\.json: a FIFO"):
        without_blocking(lambda: export_hf(ckpt, tmp_path / "hf"), fifo=fifo)
    assert not (tmp_path / "hf").exists()


def test_an_oversize_tokenizer_is_never_kept_nor_exported(tmp_path, tok, monkeypatch):
    """Listed in the manifest with its size (as consistent as a writer of the checkpoint can make it): over its
    bound (made small here, so that no test reads 256 MiB), validation hashes it without keeping it, and the export
    refuses it (before: the old copy read and copied it whole)."""
    monkeypatch.setitem(ck.TOKENIZER_FILES, "tokenizer.json", 64)
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=5), step=1, tokenizer=tok)
    with pytest.raises(ExportError, match=r"tokenizer\.json: listed over 64 bytes"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_corpus_tokenizer_linked_to_a_private_file_is_refused(tmp_path, private):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "tokenizer.json").symlink_to(private)
    ckpt = _with_corpus(tmp_path, corpus, fingerprint=None)
    with pytest.raises(ExportError, match=r"corpus/tokenizer\.json: a symbolic link"):
        export_hf(ckpt, tmp_path / "hf")
    _nothing_of_the_secret_under(tmp_path)


def test_a_corpus_tokenizer_other_than_the_one_the_run_recorded_is_refused(tmp_path, tok):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "tokenizer.json").write_bytes(tok.read_bytes())
    ckpt = _with_corpus(tmp_path, corpus, fingerprint="0" * 64)
    with pytest.raises(ExportError, match="not the tokenizer the checkpoint's run trained with"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_the_corpus_tokenizer_the_run_recorded_is_exported_as_it_is(tmp_path, tok):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "tokenizer.json").write_bytes(tok.read_bytes())
    ckpt = _with_corpus(tmp_path, corpus, fingerprint=hashlib.sha256(tok.read_bytes()).hexdigest())
    out = export_hf(ckpt, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    assert not (out / "tokenizer.json").is_symlink()


def test_an_explicit_tokenizer_of_the_users_own_is_followed_through_its_link(tmp_path, tok):
    """--tokenizer names the user's own file: a link (a Hugging Face cache is links into its blobs) is followed;
    the export holds the bytes, not a link."""
    link = tmp_path / "cache" / "tokenizer.json"
    link.parent.mkdir()
    link.symlink_to(tok)
    out = export_hf(_bare(tmp_path), tmp_path / "hf", tokenizer=link)
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    assert not (out / "tokenizer.json").is_symlink()


def test_an_explicit_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    with pytest.raises(ExportError, match=r"--tokenizer .*: a FIFO"):
        without_blocking(lambda: export_hf(_bare(tmp_path), tmp_path / "hf", tokenizer=fifo), fifo=fifo)


def test_sample_reads_the_trainer_state_once_its_validation_read(tmp_path, tok, monkeypatch):
    """`minilmd sample` looks for the tokenizer with the trainer_state its load validated, not a second read, and
    takes the checkpoint's tokenizer.json as that validation hashed it (before: opened again)."""
    from minilmd.trainer.model.generate import sample_text

    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=6), step=1, tokenizer=tok)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(os.path.abspath(os.fsdecode(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    sample_text(ckpt, "hello", max_new_tokens=2, seed=0, device="cpu")
    assert opened.count(str((ckpt / "trainer_state.json").absolute())) == 1
    assert opened.count(str((ckpt / "tokenizer.json").absolute())) == 1


@pytest.mark.slow
def test_a_normal_export_still_loads_with_transformers(tmp_path, tok):
    transformers = pytest.importorskip("transformers")
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=7), step=1, tokenizer=tok)
    out = export_hf(ckpt, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert loaded.decode(loaded("hello world").input_ids) == "hello world"


# --- a checkpoint's own tokenizer files are those its manifest lists ----------------------------------------------
# Before: export read whatever tokenizer.json or tokenizer_config.json lay in the checkpoint directory, listed in
# its manifest or not; without a tokenizer fingerprint in the trainer_state (a LoRA or an init.from checkpoint, a
# test's), a file planted beside a checkpoint was exported as the run's tokenizer or chat template.

def test_a_tokenizer_planted_beside_a_checkpoint_and_not_in_its_manifest_is_refused_unread(tmp_path, tok):
    ckpt = _bare(tmp_path)
    (ckpt / "tokenizer.json").write_bytes(tok.read_bytes())
    with pytest.raises(ExportError, match=r"tokenizer\.json: a regular file that the checkpoint's manifest\.json "
                                          r"does not list: not read"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_chat_config_planted_beside_a_checkpoint_and_not_in_its_manifest_is_refused_unread(tmp_path, tok):
    """The checkpoint lists its tokenizer and no template (a text model's); a tokenizer_config.json put beside it
    would have made the export a chat model's, with the planted template."""
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=8), step=1, tokenizer=tok)
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "PLANTED {{ messages }}"}')
    with pytest.raises(ExportError, match=r"tokenizer_config\.json: a regular file that the checkpoint's "
                                          r"manifest\.json does not list: not read"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_sample_refuses_a_chat_config_planted_beside_a_checkpoint_as_export_does(tmp_path, tok):
    """`minilmd sample` and `minilmd chat` keep the validation their load made (export.load_model) and so refuse
    an unlisted tokenizer file as export does (before: they read it as the checkpoint's)."""
    from minilmd.trainer.model.export import load_model
    from minilmd.trainer.model.tokenizer_files import find_chat_config

    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=9), step=1, tokenizer=tok)
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "PLANTED {{ messages }}"}')
    _, checked = load_model(ckpt)
    assert checked.weights == b"" and checked.tokenizer == tok.read_bytes()  # kept: all but the weights' bytes
    with pytest.raises(ExportError, match=r"tokenizer_config\.json: a regular file that the checkpoint's "
                                          r"manifest\.json does not list: not read"):
        find_chat_config(ckpt, checked=checked)


def test_a_corpus_that_cannot_be_read_is_passed_by_as_the_hint_it_is(tmp_path, tok):
    """The prepared corpus is only named by the trainer_state: another user's private directory, or a path that no
    longer leads anywhere (here: through a regular file, ENOTDIR; as root, a mode-0700 directory of another user's
    would still be read) is passed by, and a text model exports with the tokenizer given (before: `permission
    denied`/`not a directory` ended the export even with --tokenizer)."""
    (tmp_path / "a-file").write_text("")
    ckpt = _with_corpus(tmp_path, tmp_path / "a-file" / "corpus", fingerprint=None)
    out = export_hf(ckpt, tmp_path / "hf", tokenizer=tok)
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    assert "chat_template" not in json.loads((out / "tokenizer_config.json").read_text())
    with pytest.raises(ExportError, match=r"no tokenizer found .*a-file/corpus/tokenizer\.json: "):
        export_hf(ckpt, tmp_path / "hf2")  # nowhere else to look: the error says what each place was
