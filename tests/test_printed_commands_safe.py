"""The MiniMind commands minilmd prints for the user to paste (hostile audit 8 F1): the LoRA merge (init.from or
`sample --lora` given a MiniMind adapter) and the safetensors conversion (init.from given a MiniMind transformers
save). Before, both named their output beside the given file and the merge its base beside it too, in what is often
a team directory: a teammate's base was loaded, and `torch.save` followed his link at the output name and replaced
the victim's 0600 notes with a zip. Now each command loads only files looked at when it was printed (the base only
when it is the user's own regular file, in a directory no one else can rearrange), with weights_only, and writes
into a directory of the user's own through an exclusive create that refuses a file or a link there. The printed
command is run here, a real subprocess, in the audit's set-up; the teammate is a real second uid (`nobody`,
tests/second_user.py), the test root."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from second_user import second_user, sh_as_user, shared, team  # noqa: F401 - shared, team: fixtures

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # the printed commands run as pasted: a Python process importing torch, each
NOTES = b"her own notes, 0600\n"
HIDDEN, RANK = 64, 16


def _place(tmp_path: Path) -> tuple[Path, Path, Path, int]:
    """(a team directory, root's 2775; her own directory, the current one; her notes; his uid)."""
    uid, _ = second_user()
    team, mine = tmp_path / "team", tmp_path / "mine"
    team.mkdir()
    team.chmod(0o2775)
    mine.mkdir(mode=0o700)
    notes = tmp_path / "notes.txt"
    notes.write_bytes(NOTES)
    notes.chmod(0o600)
    return team, mine, notes, uid


def _his(path: Path, uid: int) -> None:
    os.chown(path, uid, uid, follow_symlinks=False)


def _command(said: str) -> list[str]:
    line = next(line.strip() for line in said.splitlines() if line.strip().startswith("python -c "))
    return [sys.executable, *shlex.split(line)[1:]]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_merge_command_loads_no_teammates_base_and_writes_only_her_own_place(tmp_path, monkeypatch):
    from minilmd.init_pth import minimind_lora_file

    team, mine, notes, uid = _place(tmp_path)
    torch.manual_seed(0)
    names = [f"model.layers.0.self_attn.{proj}" for proj in ("q_proj", "o_proj")]
    adapter = {f"{n}.lora.{part}.weight": torch.randn((RANK, HIDDEN) if part == "A" else (HIDDEN, RANK)).half()
               for n in names for part in ("A", "B")}
    base = {f"{n}.weight": torch.randn(HIDDEN, HIDDEN).half() for n in names}
    base["model.norm.weight"] = torch.ones(HIDDEN)
    torch.save(adapter, team / "lora_vic_64.pth")  # hers
    torch.save(base, team / "full_sft_64.pth")
    _his(team / "full_sft_64.pth", uid)  # his base beside her adapter
    os.symlink(notes, team / "lora_vic_merged_64.pth")
    _his(team / "lora_vic_merged_64.pth", uid)  # his link at the name the merge once wrote
    monkeypatch.chdir(mine)

    said = minimind_lora_file(team / "lora_vic_64.pth")  # `sample --lora`'s words; init.from's are the same
    assert f"{team}/full_sft_64.pth belongs to user nobody (uid {uid}), not to you, so it is not named: put your " \
           f"base's path for BASE.pth" in said, said
    assert "runs it as it is" not in said, said  # eval_llm.py would load his base beside it (hostile audit 9 F4)
    assert "would run it with the base beside it, full_sft_64.pth" in said and "run the merged file" in said, said
    argv = _command(said)
    assert argv[-3:] == ["BASE.pth", str(team / "lora_vic_64.pth"), str(mine / "lora_vic_merged_64.pth")], argv
    assert "weights_only=True" in argv[2] and "torch.load(sys.argv[1]" in argv[2] and '"xb"' in argv[2]
    refused = _run(argv, mine)  # as printed: there is no BASE.pth, so nothing is loaded nor written
    assert refused.returncode != 0 and "BASE.pth" in refused.stderr, refused.stderr
    assert notes.read_bytes() == NOTES and os.listdir(mine) == []

    hers = tmp_path / "hers"  # her own base beside her adapter in a directory of hers: named, merged into her place
    hers.mkdir(mode=0o755)
    os.rename(team / "lora_vic_64.pth", hers / "lora_vic_64.pth")
    torch.save(base, hers / "full_sft_64.pth")
    argv = _command(minimind_lora_file(hers / "lora_vic_64.pth"))
    assert argv[-3] == str(hers / "full_sft_64.pth")
    done = _run(argv, mine)
    assert done.returncode == 0, done.stderr
    assert notes.read_bytes() == NOTES and (team / "lora_vic_merged_64.pth").is_symlink()
    merged = torch.load(mine / "lora_vic_merged_64.pth", weights_only=True)
    for n in names:  # MiniMind's merge_lora: each weight plus B A, fp16
        want = base[f"{n}.weight"] + (adapter[f"{n}.lora.B.weight"].float() @ adapter[f"{n}.lora.A.weight"].float()
                                      ).half()
        assert torch.equal(merged[f"{n}.weight"], want)
    assert merged.keys() == base.keys() and merged["model.norm.weight"].dtype == torch.float16

    again = _run(argv, mine)  # a file there already is never replaced
    assert again.returncode != 0 and "FileExistsError" in again.stderr
    (mine / "lora_vic_merged_64.pth").unlink()
    os.symlink(notes, mine / "lora_vic_merged_64.pth")  # nor a link there followed
    linked = _run(argv, mine)
    assert linked.returncode != 0 and "FileExistsError" in linked.stderr and notes.read_bytes() == NOTES


def test_her_own_base_in_a_team_directory_is_not_named_since_he_can_rename_his_over_it(team, tmp_path, monkeypatch):
    """Her own base beside her adapter, in a team directory his group may write (review10b F3): a name looked at when
    the command is printed proves nothing by the time she pastes it, since he can rename his file over hers (done
    here, as him). Before, the command named her base there and so loaded his weights; now BASE.pth, and why."""
    from minilmd.init_pth import minimind_lora_file

    torch.manual_seed(0)
    name = "model.layers.0.self_attn.q_proj"
    torch.save({f"{name}.lora.A.weight": torch.randn(RANK, HIDDEN).half(),
                f"{name}.lora.B.weight": torch.randn(HIDDEN, RANK).half()}, team / "lora_vic_64.pth")
    torch.save({f"{name}.weight": torch.randn(HIDDEN, HIDDEN).half()}, team / "full_sft_64.pth")  # hers
    (mine := tmp_path / "mine").mkdir(mode=0o700)
    monkeypatch.chdir(mine)

    said = minimind_lora_file(team / "lora_vic_64.pth")
    argv = _command(said)
    assert argv[-3] == "BASE.pth", argv
    assert f"the base {team}/full_sft_64.pth: the directory {team} above it can be written by other users" in said, said
    assert "put your base's path for BASE.pth" in said, said
    assert "runs it as it is" not in said and "run the merged file (made from your own base) instead" in said, said
    sh_as_user("echo his weights > his.pth && mv his.pth full_sft_64.pth", team)  # what he can do before she pastes
    assert os.stat(team / "full_sft_64.pth").st_uid == second_user()[0]


def test_the_conversion_command_writes_only_her_own_place_never_through_his_link(tmp_path, monkeypatch):
    safetensors = pytest.importorskip("safetensors.torch")
    from minilmd.init_source import InitSourceError, resolve

    team, mine, notes, uid = _place(tmp_path)
    save = team / "mmhf"
    save.mkdir()
    (save / "config.json").write_text('{"model_type": "minimind", "hidden_size": 64}')
    safetensors.save_file({"model.norm.weight": torch.ones(HIDDEN)}, str(save / "model.safetensors"))
    os.symlink(notes, team / "mmhf.pth")
    _his(team / "mmhf.pth", uid)  # his link beside her directory, at the name the conversion once wrote
    monkeypatch.chdir(mine)

    with pytest.raises(InitSourceError) as e:
        resolve(str(save))
    argv = _command(str(e.value))
    done = _run(argv, mine)  # as printed (before: through his link, her notes became a zip)
    assert done.returncode == 0, done.stderr
    assert notes.read_bytes() == NOTES and (team / "mmhf.pth").is_symlink()
    assert argv[-2:] == [str(save / "model.safetensors"), str(mine / "mmhf.pth")], argv
    assert torch.load(mine / "mmhf.pth", weights_only=True).keys() == {"model.norm.weight"}
    again = _run(argv, mine)
    assert again.returncode != 0 and "FileExistsError" in again.stderr


FAKE_EVAL_LLM = 'print("eval_llm ran on", open("out/pretrain_64.pth").read())'
"""Stands in for MiniMind's eval_llm.py: says which weights it would evaluate (./out/pretrain_64.pth)."""


def _paste(said: str, checkout: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The printed lines pasted into an interactive shell in `checkout` (no `set -e`: a failed line does not stop the
    next one unless the lines themselves say so), with a fake eval_llm.py there and `python` on PATH."""
    lines = [line.strip() for line in said.splitlines() if line.startswith("  ")]
    (checkout / "eval_llm.py").write_text(FAKE_EVAL_LLM)
    (bin_dir := tmp_path / "bin").mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        os.symlink(sys.executable, bin_dir / "python")
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    return subprocess.run(["bash", "-c", "\n".join(lines)], cwd=checkout, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=env, timeout=300)


def test_the_eval_llm_copy_writes_no_link_of_his_in_a_shared_checkout(tmp_path):
    """`export --format minimind`'s eval_llm advice (hostile audit 9 F4): `mkdir -p out && cp X out/pretrain_64.pth`,
    pasted in a team's MiniMind checkout where he had planted out/pretrain_64.pth as a link to her notes, replaced
    her 0600 notes with the export. Then (review11b F1) the exclusive create refused a second export's copy, and the
    next pasted line evaluated the old weights; her own link at out/ was refused. Now the copy goes to a fresh name
    and is renamed into place (his link replaced, never written through), out/ is followed when it is her link,
    refused when it is his, and eval_llm.py runs only after a copy that succeeded."""
    from minilmd.config import ModelSection
    from minilmd.trainer.model.export import minimind_eval_command

    team, mine, notes, uid = _place(tmp_path)
    export = mine / "mm.pth"
    export.write_bytes(b"weights v1")
    said = minimind_eval_command(export, vars(ModelSection(hidden_size=HIDDEN, num_hidden_layers=2)))
    assert "of your own" in said and "cp " not in said, said
    argv = _command(said)
    assert argv[-3:] == [str(export), "pretrain_64.pth", "&&"], argv

    (team / "out").mkdir(mode=0o755)  # root's, as hers are, writable by her alone
    os.symlink(notes, team / "out" / "pretrain_64.pth")
    _his(team / "out" / "pretrain_64.pth", uid)
    replaced = _paste(said, team, tmp_path)  # his link at the name: replaced as an entry, not written through
    assert replaced.returncode == 0, replaced.stderr
    assert notes.read_bytes() == NOTES and not (team / "out" / "pretrain_64.pth").is_symlink()
    assert "eval_llm ran on weights v1" in replaced.stdout, replaced.stdout

    (private := tmp_path / "private").mkdir(mode=0o700)
    (other := tmp_path / "other").mkdir()
    os.symlink(private, other / "out")  # his link at out/ itself, to a directory of hers
    _his(other / "out", uid)
    refused = _paste(said, other, tmp_path)
    assert refused.returncode != 0 and os.listdir(private) == [], refused.stderr
    assert f"out is a link owned by uid {uid}" in refused.stderr and "eval_llm ran" not in refused.stdout

    (own := tmp_path / "own").mkdir(mode=0o700)  # her own checkout: out/ made, the export copied, then evaluated
    first = _paste(said, own, tmp_path)
    assert first.returncode == 0 and "eval_llm ran on weights v1" in first.stdout, first.stderr
    export.write_bytes(b"weights v2")  # trained on, exported again, pasted again: the new weights land
    again = _paste(said, own, tmp_path)
    assert again.returncode == 0 and "eval_llm ran on weights v2" in again.stdout, (again.stdout, again.stderr)
    assert sorted(os.listdir(own / "out")) == ["pretrain_64.pth"]
    export.unlink()  # a copy that fails: eval_llm.py does not run on what out/ holds
    failed = _paste(said, own, tmp_path)
    assert failed.returncode != 0 and "eval_llm ran" not in failed.stdout, failed.stdout
    assert sorted(os.listdir(own / "out")) == ["pretrain_64.pth"]

    (linked := tmp_path / "linked").mkdir(mode=0o700)  # her own link at out/ (out -> /data/big/out): followed
    (big := tmp_path / "big").mkdir(mode=0o700)
    os.symlink(big, linked / "out")
    export.write_bytes(b"weights v3")
    followed = _paste(said, linked, tmp_path)
    assert followed.returncode == 0 and "eval_llm ran on weights v3" in followed.stdout, followed.stderr
    assert (big / "pretrain_64.pth").read_bytes() == b"weights v3" and (linked / "out").is_symlink()


def test_the_eval_llm_copy_lands_in_no_out_directory_another_user_owns_or_can_write(tmp_path):
    """Hostile audit 10 F3: a plain out/ directory of his (mode 777, in a team checkout) took her copy, replacing his
    file there, and he could swap it before eval_llm.py's torch.load ran his pickle as her; so could anyone in the
    group of a group-writable out/, and her own link at out/ could lead to his directory. Now the directory reached
    must be hers or root's and writable by no one else: each is refused, nothing copied, eval_llm.py not run."""
    from minilmd.config import ModelSection
    from minilmd.trainer.model.export import minimind_eval_command

    _, _, _, uid = _place(tmp_path)
    export = tmp_path / "mm.pth"
    export.write_bytes(b"her weights")
    said = minimind_eval_command(export, vars(ModelSection(hidden_size=HIDDEN, num_hidden_layers=2)))
    assert "that no one else can write" in said, said

    (his_checkout := tmp_path / "his_checkout").mkdir(mode=0o755)
    (out := his_checkout / "out").mkdir()
    (out / "pretrain_64.pth").write_bytes(b"his weights")
    _his(out / "pretrain_64.pth", uid)
    _his(out, uid)
    out.chmod(0o777)
    his = _paste(said, his_checkout, tmp_path)
    assert his.returncode != 0 and f"out is a directory owned by uid {uid}, not by you nor root" in his.stderr, his
    assert "eval_llm ran" not in his.stdout and os.listdir(out) == ["pretrain_64.pth"]
    assert (out / "pretrain_64.pth").read_bytes() == b"his weights"

    (linked := tmp_path / "linked").mkdir()
    os.symlink(out, linked / "out")  # her own link, to his directory
    through = _paste(said, linked, tmp_path)
    assert through.returncode != 0 and f"out is a directory owned by uid {uid}" in through.stderr, through.stderr
    assert os.listdir(out) == ["pretrain_64.pth"]

    (team := tmp_path / "team_checkout").mkdir()
    (team / "out").mkdir()
    (team / "out").chmod(0o2775)  # root's, as hers are, but the group writes it
    grouped = _paste(said, team, tmp_path)
    assert grouped.returncode != 0 and "out is a directory other users can write (mode 2775)" in grouped.stderr
    assert "eval_llm ran" not in grouped.stdout and os.listdir(team / "out") == []


def test_the_merge_and_conversion_write_into_no_directory_another_user_owns_or_can_write(tmp_path, monkeypatch):
    """The same rule for the LoRA merge's and the conversion's output directory (hostile audit 10 F3): a directory
    she puts for DIR, or one changed before she pastes, that is his or group-writable is refused before anything
    is loaded, and the directory own_place prints is never one that rule refuses (a 0775 current directory: home)."""
    from minilmd.init_foreign import CONVERT_CODE
    from minilmd.init_model import MERGE_CODE, own_place

    _, _, _, uid = _place(tmp_path)
    (his := tmp_path / "his").mkdir()
    _his(his, uid)
    (grouped := tmp_path / "grouped").mkdir()
    grouped.chmod(0o775)
    for code, inputs in ((MERGE_CODE, ["base.pth", "lora.pth"]), (CONVERT_CODE, ["model.safetensors"])):
        refused = _run([sys.executable, "-c", code, *inputs, str(his / "out.pth")], tmp_path)
        assert refused.returncode != 0 and f"{his} is owned by uid {uid}, not by you nor root" in refused.stderr
        refused = _run([sys.executable, "-c", code, *inputs, str(grouped / "out.pth")], tmp_path)
        assert refused.returncode != 0 and f"{grouped} can be written by other users (mode 775)" in refused.stderr
        assert os.listdir(his) == [] and os.listdir(grouped) == []

    (home := tmp_path / "home").mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(grouped)
    assert own_place() == str(home)
