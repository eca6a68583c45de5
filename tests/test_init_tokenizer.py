"""init.from's checkpoint and a corpus prepared with another tokenizer (minilmd/init_tokenizer.py): where the two
tokenizer.json files provably differ (ids that stand for other text, another vocabulary size) `run --check`, the
launch (before staging) and `minilmd train` on its own refuse, exit 2, naming both; where it cannot be proven (the
same tokenizer saved again: other bytes, the same ids) a note stays. Before, each said only a note and the SFT run
trained its model on ids that meant other text. The checkpoint is a fake (its manifest.json, trainer_state.json with
the run's model, the tokenizer files): all that these checks read of it."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.names import CORPUS_META, TOKENIZER_FILE
from minilmd.protocol import EXIT_CONFIG, SUPERVISOR_CONFIG
from supervisor_helpers import cli
from trainer_corpus import train, write_config


def _with_tokenizer(corpus: Path, dest: Path, change) -> Path:
    """A copy of `corpus` whose tokenizer.json is change(its parsed JSON) written out, meta.json following it."""
    root = Path(shutil.copytree(corpus, dest))
    raw = json.dumps(change(json.loads((root / TOKENIZER_FILE).read_bytes())), indent=1, ensure_ascii=False).encode()
    (root / TOKENIZER_FILE).write_bytes(raw)
    meta = json.loads((root / CORPUS_META).read_text(encoding="utf-8"))
    meta["tokenizer_sha256"] = hashlib.sha256(raw).hexdigest()
    meta["files"][TOKENIZER_FILE] = {"size": len(raw), "sha256": meta["tokenizer_sha256"]}
    (root / CORPUS_META).write_text(json.dumps(meta), encoding="utf-8")
    return root


def _swap_two_ids(tokenizer: dict) -> dict:
    """Another tokenizer of the same size: two ordinary tokens trade their ids (the same ids, other text)."""
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return tokenizer


def _checkpoint_of(tmp_path: Path, config: Path, corpus: Path) -> Path:
    """A checkpoint root whose LATEST step, of a finished run of `config`'s model, was trained on `corpus`."""
    meta = json.loads((corpus / CORPUS_META).read_text(encoding="utf-8"))
    ckpt = tmp_path / "pretrained" / "step-00000008"
    ckpt.mkdir(parents=True)
    state = {"step": 8, "total_steps": 8, "config": load_config(config).to_dict(),
             "fingerprints": {"data": "d" * 64, "tokenizer": meta["tokenizer_sha256"]}}
    (ckpt / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    (ckpt / "manifest.json").write_text(json.dumps({"step": 8, "files": {}}), encoding="utf-8")
    shutil.copy(corpus / TOKENIZER_FILE, ckpt / TOKENIZER_FILE)
    (ckpt.parent / "LATEST").write_text(ckpt.name, encoding="utf-8")
    return ckpt.parent


def test_the_ids_that_differ_are_shown_as_their_tokenizers_decode_them(tmp_path, chat_corpus):
    """Walk 4 #6: a byte-level BPE spells text in its byte alphabet ("id 278 is 'ä¸į' in the checkpoint's"): the
    message shows each side's decode of the id, escaped, with the raw token beside."""
    from tokenizers import Tokenizer

    from minilmd.init_kinds import InitSource
    from minilmd.init_tokenizer import mismatch

    tok = Tokenizer.from_file(str(chat_corpus[0] / TOKENIZER_FILE))
    vocab = tok.get_vocab(with_added_tokens=False)
    whole = sorted(i for t, i in vocab.items() if not t.isascii() and (text := tok.decode([i])) != t
                   and "\ufffd" not in text and not text.isascii())[:2]  # each a whole character, spelt otherwise
    assert len(whole) == 2

    def swap(tokenizer: dict) -> dict:
        v = tokenizer["model"]["vocab"]
        a, b = (next(t for t, i in v.items() if i == n) for n in whole)
        v[a], v[b] = v[b], v[a]
        return tokenizer

    other = _with_tokenizer(chat_corpus[0], tmp_path / "other", swap)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(chat_corpus[0] / TOKENIZER_FILE, ckpt / TOKENIZER_FILE)
    state = {"config": {"model": {"vocab_size": chat_corpus[1]}}, "fingerprints": {"tokenizer": "a" * 64}}
    meta = json.loads((other / CORPUS_META).read_text(encoding="utf-8"))
    refused = mismatch("x", str(other), InitSource("checkpoint", ckpt), state, meta)
    first, second = whole
    text_of = {i: tok.decode([i]) for i in whole}
    token_of = {i: tok.id_to_token(i) for i in whole}
    assert refused is not None and (
        f"2 of {chat_corpus[1]} ids stand for other text: id {first} is {text_of[first]!r} (token "
        f"{token_of[first]!r}) in the checkpoint's, {text_of[second]!r} (token {token_of[second]!r}) in the "
        f"corpus's") in refused, refused


@pytest.mark.slow  # three processes: run --check, run, train
def test_a_corpus_whose_tokenizer_gives_ids_other_text_is_refused_by_check_launch_and_train(tmp_path, chat_corpus):
    other = _with_tokenizer(chat_corpus[0], tmp_path / "share" / "sft-other", _swap_two_ids)
    config = write_config(tmp_path, (other, chat_corpus[1]), name="sft", init={"from": str(tmp_path / "pretrained")})
    root = _checkpoint_of(tmp_path, config, chat_corpus[0])
    said = (f"init.from = {str(root)!r}: {root / 'step-00000008'} was trained with another tokenizer than the corpus "
            f"{other} was prepared with (2 of {chat_corpus[1]} ids stand for other text: id 300 is ")

    check = cli("run", "--check", str(config))
    assert check.returncode == SUPERVISOR_CONFIG, check.stdout + check.stderr
    out = " ".join((check.stdout + check.stderr).split())
    assert said in out and f"Prepare the corpus with the checkpoint's tokenizer ({root / 'step-00000008'}" in out, out
    assert f"({other / TOKENIZER_FILE})" in out, out

    launch = cli("run", str(config))
    assert launch.returncode == SUPERVISOR_CONFIG and said in " ".join((launch.stdout + launch.stderr).split())
    assert not (load_config(config).scratch_dir / "corpus").exists()  # refused before staging

    alone = train(config)
    assert alone.returncode == EXIT_CONFIG and said in " ".join(alone.stderr.split()), alone.stderr[-2000:]

    # the same tokenizer saved again (other bytes, every id the same text): not proven another, a note as before
    resaved = _with_tokenizer(chat_corpus[0], tmp_path / "share" / "sft-resaved", lambda tokenizer: tokenizer)
    config = write_config(tmp_path, (resaved, chat_corpus[1]), name="sft", init={"from": str(root)})
    check = cli("run", "--check", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "note: init.from" in check.stdout and "was trained with another tokenizer" in check.stdout, check.stdout


def test_another_vocabulary_size_is_proof_without_reading_either_tokenizer():
    from minilmd.init_kinds import InitSource
    from minilmd.init_tokenizer import mismatch

    source = InitSource("checkpoint", Path("/nowhere/step-00000008"))
    state = {"config": {"model": {"vocab_size": 6400}}, "fingerprints": {"tokenizer": "a" * 64}}
    refused = mismatch("/nowhere", "/corpus", source, state, {"vocab_size": 512, "tokenizer_sha256": "b" * 64})
    assert refused is not None and "(a vocabulary of 6400 against 512; the checkpoint's tokenizer.json sha256 " \
        "aaaaaaaaaaaa, the corpus's bbbbbbbbbbbb)" in refused, refused
    state["fingerprints"]["tokenizer"] = "b" * 64  # one tokenizer by its fingerprint: nothing to refuse
    assert mismatch("/nowhere", "/corpus", source, state, {"vocab_size": 512, "tokenizer_sha256": "b" * 64}) is None
