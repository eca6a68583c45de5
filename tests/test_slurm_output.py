"""The job scripts' check of their own output file (deploy/slurm/*.sbatch; hostile6, "Not reproduced (Slurm)").

`#SBATCH --output=minilmd-%x-%j.out` is opened by Slurm, as the user, in the directory the job starts in, following
a link there, before the script runs: a teammate's link at the next job's name in a team directory made the job
append its output to any file of the user's. #SBATCH can name no path under $HOME, so the script looks at what
Slurm opened and, where that is unsafe, goes on in ~/minilmd-slurm/ instead. Run here for real with bash, the
block cut from each script and its stdout opened the way slurmstepd opens it (O_APPEND, following a link).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "deploy" / "slurm"
BEGIN, END = "# --- the job's output file", "# --- end of the job's output file check ---"
NAME = "minilmd-minilmd-43.out"
"""The default output's name for job 43 (%x: the job name `minilmd`)."""


def output_check(script: str) -> str:
    text = (SCRIPTS / script).read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


@pytest.fixture(params=["minilmd.sbatch", "minilmd-multinode.sbatch"])
def job(request, tmp_path):
    block = output_check(request.param)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)

    def start(workdir: Path, output: Path) -> None:
        """The job's start: its output opened as Slurm opens it, then the check and one line of the job's."""
        fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            subprocess.run(["bash", "-c", "set -euo pipefail\n" + block + "\necho the job says hello\n"],
                           stdout=fd, stderr=fd, cwd=workdir, check=True, timeout=60,
                           env={"PATH": os.environ["PATH"], "HOME": str(home), "SLURM_JOB_NAME": "minilmd",
                                "SLURM_JOB_ID": "43"})
        finally:
            os.close(fd)

    return start, home


def test_both_scripts_hold_the_same_check():
    assert output_check("minilmd.sbatch") == output_check("minilmd-multinode.sbatch")


def test_a_link_planted_at_the_next_jobs_name_gets_nothing_the_job_goes_on_in_home(job, tmp_path):
    start, home = job
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2777)
    private = home / "notes"
    private.write_text("hers\n")
    (team / NAME).symlink_to(private)  # the teammate's link
    start(team, team / NAME)
    assert private.read_text() == "hers\n"
    moved = home / "minilmd-slurm" / NAME
    said = moved.read_text()
    assert f"not writing {team / NAME} (it is a symbolic link)" in said and "the job says hello" in said, said
    assert moved.stat().st_mode & 0o777 == 0o600 and moved.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o2775, 0o1777])
def test_an_own_output_in_a_directory_others_write_says_where_the_job_goes_on(job, tmp_path, mode):
    start, home = job
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(mode)
    start(team, team / NAME)
    here = (team / NAME).read_text()
    assert f"others can write its directory {team}" in here and str(home / "minilmd-slurm" / NAME) in here, here
    assert "the job says hello" not in here
    assert "the job says hello" in (home / "minilmd-slurm" / NAME).read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user's: made by root")
def test_an_output_name_that_is_another_users_file_gets_nothing(job, tmp_path):
    start, home = job
    team = tmp_path / "team"
    team.mkdir(mode=0o755)
    theirs = team / NAME
    theirs.write_text("")
    theirs.chmod(0o666)
    os.chown(theirs, 65534, 65534)
    start(team, theirs)
    assert theirs.read_text() == ""
    assert "(it is not your file)" in (home / "minilmd-slurm" / NAME).read_text()


def test_an_output_in_a_directory_of_yours_or_one_you_chose_stays_where_it_is(job, tmp_path):
    start, home = job
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)
    start(mine, mine / NAME)
    assert (mine / NAME).read_text() == "the job says hello\n"
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o1777)
    start(team, mine / "chosen.out")  # sbatch --output=... of the user's: not the default name, left alone
    assert (mine / "chosen.out").read_text() == "the job says hello\n"
    assert not (home / "minilmd-slurm").exists()
