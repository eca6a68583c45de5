"""Exports: an HF Qwen3 directory that transformers loads without missing/unexpected keys and whose logits equal
ours; MiniMind's fp16 .pth with the tied head under both names; damaged checkpoints refused."""
from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.model_shapes import expected_state_shapes
from minilmd.procs import process_start_ticks
from minilmd.tmpnames import export_tmp_name
from minilmd.trainer.model.export import ExportError, export_hf, export_minimind, read_checkpoint
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from second_user import shared, user_python  # noqa: F401 - shared: a fixture
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real checkpoint root (with LATEST) holding a tiny model and its tokenizer, and the model itself."""
    root = tmp_path_factory.mktemp("export")
    tok = train_tokenizer(root / "tokenizer.json")
    model = tiny_model(seed=11)
    save_checkpoint(root / "ckpt", model, step=3, tokenizer=tok)
    return root, model.eval()


@pytest.mark.slow
def test_hf_export_loads_in_qwen3_without_key_warnings_and_gives_our_logits(trained, tmp_path, capfd):
    transformers = pytest.importorskip("transformers")
    root, model = trained
    out = export_hf(root / "ckpt", tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in out.iterdir()}
    capfd.readouterr()
    hf, info = transformers.Qwen3ForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    report = capfd.readouterr()
    for word in ("MISSING", "UNEXPECTED", "MISMATCH", "newly initialized", "not used"):
        assert word not in report.out + report.err
    assert hf.config.tie_word_embeddings and hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.decode(tok("hello world").input_ids) == "hello world"


def test_hf_export_in_bf16_and_refusing_a_used_directory(trained, tmp_path):
    from safetensors import safe_open

    root, _ = trained
    out = export_hf(root / "ckpt", tmp_path / "hf16", dtype="bfloat16")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert "lm_head.weight" in set(f.keys())
    with pytest.raises(ExportError, match="not an empty directory"):
        export_hf(root / "ckpt", out)


def test_minimind_export_is_fp16_with_the_tied_head_under_both_names(trained, tmp_path):
    root, model = trained
    path = export_minimind(root / "ckpt", tmp_path / "pretrain_64.pth")
    state = torch.load(path, weights_only=True)
    assert set(state) == set(expected_state_shapes(model.config)) | {"lm_head.weight"}
    assert {v.dtype for v in state.values()} == {torch.float16}
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    # The same names as MiniMind's model_minimind.py: a model of ours loads it strictly, as eval_llm.py does.
    reloaded = MiniMindForCausalLM(model.config)
    reloaded.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, atol=2e-3, rtol=2e-3)


def test_a_damaged_checkpoint_is_refused_with_the_reason(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(seed=12), step=1)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="invalid.*model.safetensors"):
        read_checkpoint(ckpt)
    with pytest.raises(ExportError, match="invalid"):
        export_minimind(ckpt, tmp_path / "x.pth")
    assert not (tmp_path / "x.pth").exists()


def test_export_cli_both_formats_and_bad_input(trained, tmp_path):
    root, _ = trained
    runner = CliRunner()
    ok = runner.invoke(app, ["export", str(root / "ckpt"), "--format", "minimind", "--out", str(tmp_path / "m.pth")])
    assert ok.exit_code == 0, ok.output
    assert "eval_llm.py cannot load it" in ok.output and (tmp_path / "m.pth").is_file()  # a tiny vocabulary
    ok = runner.invoke(app, ["export", str(root / "ckpt" / "step-00000003"), "--format", "hf",
                             "--out", str(tmp_path / "hf")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "hf" / "config.json").is_file()
    bad = runner.invoke(app, ["export", str(root / "ckpt"), "--format", "gguf", "--out", str(tmp_path / "g")])
    assert bad.exit_code == 1 and "use minimind, hf or peft" in bad.output
    empty = tmp_path / "empty"
    empty.mkdir()
    none = runner.invoke(app, ["export", str(empty), "--format", "hf", "--out", str(tmp_path / "h2")])
    assert none.exit_code == 1 and "not a checkpoint" in none.output


@pytest.mark.parametrize("fmt, name", [("minimind", "m.pth"), ("hf", "hf")])
@pytest.mark.parametrize("linked", ["out", "tmp"])
def test_export_to_a_symbolic_link_is_refused_naming_it_and_leaves_nothing_behind(trained, tmp_path, fmt, name,
                                                                                  linked):
    """--out a dangling symbolic link was a traceback (hf: the rename onto the link) that left `.NAME.tmp` beside
    it. An export never writes through a link nor renames onto one: --out a link is exit 2, the path named, nothing
    written. A link by this process's temporary name is passed by: the copy is a directory with a random suffix
    (Dir.make_temp), written through its descriptor; the link is left, said, and nothing is written where it
    leads."""
    root, _ = trained
    out, target = tmp_path / "out" / name, tmp_path / "elsewhere" / name
    out.parent.mkdir()
    ours = export_tmp_name(name, socket.gethostname(), os.getpid(), process_start_ticks(os.getpid()) or 0)
    link = out if linked == "out" else out.with_name(ours)
    link.symlink_to(target)  # dangling: nothing there yet
    result = CliRunner().invoke(app, ["export", str(root / "ckpt"), "--format", fmt, "--out", str(out)])
    assert not target.parent.exists()
    if linked == "tmp":
        assert result.exit_code == 0, (result.output, result.exception)
        assert f"minilmd export: {link}: a symbolic link by an export's temporary name; left as it is" \
            in result.output, result.output
        assert sorted(p.name for p in out.parent.iterdir()) == sorted([link.name, out.name]) and link.is_symlink()
        return
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: {link}: is a symbolic link" in result.output, result.output
    assert [p.name for p in out.parent.iterdir()] == [link.name] and link.is_symlink()  # nothing else left


@pytest.mark.parametrize("fmt, name", [("minimind", "m.pth"), ("hf", "hf")])
def test_an_export_onto_a_full_disk_says_so_and_leaves_nothing_behind(trained, small_tmpfs, fmt, name):
    """--out on a disk that fills up while the export writes (a real 16 KiB tmpfs): on main a traceback (torch's
    "unexpected pos", safetensors' SafetensorError) with the half-written `.NAME.tmp` left beside --out. Now exit
    74, the path, the reason and the room left; nothing written there."""
    root, _ = trained
    disk = small_tmpfs("16k")
    result = CliRunner().invoke(app, ["export", str(root / "ckpt"), "--format", fmt, "--out", str(disk / name)])
    assert result.exit_code == 74 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: {disk / name}: the export could not be written" in result.output, result.output
    assert "MB free there" in result.output and "nothing was left behind" in result.output, result.output
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("fmt, name", [("minimind", "m.pth"), ("hf", "hf")])
def test_an_export_onto_a_read_only_disk_says_so_not_to_free_space(trained, small_tmpfs, fmt, name):
    """--out on a read-only file system (a real tmpfs remounted ro): before, the full-disk message (`N MB free
    there ... free some space`) for a disk with room. Now exit 74 still, saying what it is and what to do."""
    root, _ = trained
    disk = small_tmpfs("1m")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    result = CliRunner().invoke(app, ["export", str(root / "ckpt"), "--format", fmt, "--out", str(disk / name)])
    assert result.exit_code == 74 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: {disk / name}: the export could not be written: Read-only file system" in result.output
    assert "choose an --out on a writable file system" in result.output, result.output
    assert "free some space" not in result.output and "MB free" not in result.output, result.output
    assert list(disk.iterdir()) == []


@pytest.mark.slow  # a `minilmd export` child as the second user
@pytest.mark.parametrize("fmt, name", [("minimind", "m.pth"), ("hf", "hf")])
def test_an_export_where_it_may_not_write_says_permission_denied_not_to_free_space(trained, shared, fmt, name):
    """A real second user exporting into root's directory (EACCES): before, "N MB free there ... free some
    space" for a disk with room. Now exit 74 still, saying permission denied and what to do."""
    root, _ = trained
    ckpt = shutil.copytree(root / "ckpt", shared / "ckpt")
    subprocess.run(["chmod", "-R", "a+rX", str(ckpt)], check=True)
    roots = shared / "roots"
    roots.mkdir(mode=0o755)  # root's: the second user may read it, not create in it
    code = "import sys\nfrom minilmd.cli import main\nsys.argv = ['minilmd', *sys.argv[1:]]\nmain()\n"
    done = subprocess.run(user_python(code, "export", str(ckpt), "--format", fmt, "--out", str(roots / name)),
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 74, done.stdout + done.stderr
    assert f"minilmd export: {roots / name}: the export could not be written: Permission denied" in done.stderr
    assert "choose an --out you may write" in done.stderr, done.stderr
    assert "free some space" not in done.stderr and "MB free" not in done.stderr, done.stderr
    assert list(roots.iterdir()) == []


@pytest.mark.parametrize("code, said", [(errno.EACCES, "Permission denied;"), (errno.EIO, "Input/output error;"),
                                        (errno.ENOSPC, "MB free there"), (errno.EDQUOT, "MB free there")])
def test_only_a_full_disk_or_a_quota_is_told_to_free_space(tmp_path, code, said):
    """The message of each write error, from the OSError the write raised: EACCES was "free some space" too."""
    from minilmd.trainer.model.export_paths import not_written

    message = str(not_written(tmp_path / "out", OSError(code, os.strerror(code))))
    assert said in message
    assert ("free some space" in message) == (code in (errno.ENOSPC, errno.EDQUOT)), message
