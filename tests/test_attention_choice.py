"""model.attention and train.deterministic without a GPU: the backend chosen by a fake timer (the fastest of those
offered, the deterministic ones only when the run is), kept from a checkpoint's record, forced, refused; the real
timer on the CPU; the values checked; the cuBLAS workspace set before CUDA starts (trainer/model/attention_choice.py,
trainer/loop/determinism.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from minilmd import checkpoint as ck
from minilmd.checkpoint import CheckpointMismatch, Expectation
from minilmd.config import ConfigError, ModelSection, RunConfig
from minilmd.config_values import attention_problems
from minilmd.names import CUBLAS_WORKSPACE_ENV, determinism_env
from minilmd.trainer.loop import determinism
from minilmd.trainer.model import attention_choice as ac


class FakeTimer:
    """Seconds per backend from a table; a backend missing from it is not offered (the real timer's None)."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.asked = seconds, []

    def __call__(self, name: str) -> float | None:
        self.asked.append(name)
        return self.seconds.get(name)


def config(attention: str = "auto", deterministic: bool = True) -> RunConfig:
    cfg = RunConfig()
    cfg.model.attention, cfg.train.deterministic = attention, deterministic
    return cfg


def test_auto_on_cuda_keeps_the_fastest_deterministic_backend():
    timer = FakeTimer({"flash": 3.87e-3, "efficient": 4.5e-3, "cudnn": 2.0e-3, "math": 6.5e-3})
    choice = ac.decide(config(), "cuda", "NVIDIA H200", None, timer)
    assert (choice.attention, choice.how) == ("flash", "measured")  # cuDNN is faster but not deterministic
    assert "cudnn" not in timer.asked
    assert choice.timings_ms == {"flash": 3.87, "efficient": 4.5, "math": 6.5}


def test_auto_without_determinism_may_take_cudnn_and_skips_what_is_not_offered():
    timer = FakeTimer({"cudnn": 2.0e-3, "math": 6.5e-3})  # flash and efficient raise for this shape
    choice = ac.decide(config(deterministic=False), "cuda", "NVIDIA H200", None, timer)
    assert choice.attention == "cudnn"
    assert choice.timings_ms == {"flash": None, "efficient": None, "cudnn": 2.0, "math": 6.5}


def test_a_tie_keeps_the_earlier_backend_and_none_offered_is_an_error():
    assert ac.fastest(FakeTimer({"math": 1.0, "efficient": 1.0}), ["flash", "efficient", "math"])[0] == "efficient"
    with pytest.raises(RuntimeError, match="no SDPA backend"):
        ac.fastest(FakeTimer({}), ["flash", "math"])


def test_a_recorded_choice_is_kept_on_the_same_kind_of_device_without_timing_again():
    recorded = ac.Choice("efficient", "measured", "cuda", "NVIDIA H200", {"efficient": 4.5}).record(True)
    timer = FakeTimer({"flash": 1e-3, "efficient": 9e-3, "math": 9e-3})  # flash would win a new measurement
    choice = ac.decide(config(), "cuda", "NVIDIA H100", recorded, timer)
    assert (choice.attention, choice.how, choice.device_name) == ("efficient", "measured", "NVIDIA H200")
    assert timer.asked == ["efficient"]  # only: is it still offered here


def test_a_cpu_record_is_measured_again_on_cuda_and_cpu_auto_is_torchs_own_choice():
    cpu = ac.decide(config(), "cpu", "", None, FakeTimer({"math": 1e-3}))
    assert (cpu.attention, cpu.how) == (ac.DEFAULT, "default")
    on_gpu = ac.decide(config(), "cuda", "NVIDIA H200", cpu.record(True), FakeTimer({"math": 2e-3, "flash": 1e-3}))
    assert (on_gpu.attention, on_gpu.how) == ("flash", "measured")


def test_a_forced_backend_is_checked_not_timed_against_the_others():
    timer = FakeTimer({"math": 5e-3, "flash": 1e-3})
    choice = ac.decide(config("math"), "cpu", "", None, timer)
    assert (choice.attention, choice.how, timer.asked) == ("math", "forced", ["math"])
    with pytest.raises(ConfigError, match="does not run it"):
        ac.decide(config("efficient"), "cpu", "", None, timer)


def test_config_values_of_model_attention():
    assert attention_problems("auto", True) == [] and attention_problems("flash", True) == []
    assert "must be \"auto\" or one of" in attention_problems("fast", False)[0]
    assert "non-deterministic backward" in attention_problems("cudnn", True)[0]
    assert attention_problems("cudnn", False) == []


def test_the_kernel_is_not_part_of_the_weights_config():
    cfg = config("flash")
    assert "attention" not in cfg.model_dict()
    assert cfg.to_dict()["model"]["attention"] == "flash"  # but recorded with the config


def test_the_real_timer_runs_the_models_attention_on_the_cpu_and_leaves_the_rng_alone():
    cfg = config()
    cfg.model = ModelSection(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=64, max_position_embeddings=64)
    cfg.train.micro_batch_size, cfg.train.seq_len = 2, 16
    timer = ac.attention_timer(cfg, torch.device("cpu"), bf16=False, repeats=1)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    math_s, efficient_s = timer("math"), timer("efficient")
    assert math_s is not None and math_s > 0
    assert efficient_s is None  # the CPU has no memory-efficient kernel: not offered
    assert torch.equal(torch.get_rng_state(), before)


def test_apply_restricts_sdpa_to_the_choice_and_math():
    names = ("flash", "efficient", "cudnn", "math")
    flags = {n: getattr(torch.backends.cuda, f"{'mem_efficient' if n == 'efficient' else n}_sdp_enabled")
             for n in names}
    saved = {n: f() for n, f in flags.items()}
    try:
        ac.apply(ac.Choice("flash", "forced", "cuda"), deterministic=True)
        assert {n: f() for n, f in flags.items()} == {"flash": True, "efficient": False, "cudnn": False, "math": True}
        for n in names:
            getattr(torch.backends.cuda, ac._FLAGS[n])(True)
        ac.apply(ac.Choice(ac.DEFAULT, "default", "cuda"), deterministic=True)
        assert not flags["cudnn"]() and flags["flash"]()
    finally:
        for n, on in saved.items():
            getattr(torch.backends.cuda, ac._FLAGS[n])(on)


def test_prepare_environment_sets_the_cublas_workspace_only_for_a_deterministic_run():
    env: dict[str, str] = {}
    assert "set before CUDA started" in determinism.prepare_environment(config(), env)
    assert env == {CUBLAS_WORKSPACE_ENV: ":4096:8"} == determinism_env(True)
    env = {CUBLAS_WORKSPACE_ENV: ":16:8"}
    assert "from the environment" in determinism.prepare_environment(config(), env)
    assert env[CUBLAS_WORKSPACE_ENV] == ":16:8"
    env = {}
    assert "false" in determinism.prepare_environment(config(deterministic=False), env) and env == {}
    assert determinism_env(False) == {}


def test_deterministic_algorithms_only_on_cuda():
    assert determinism.apply(config(), "cpu") is False
    assert not torch.are_deterministic_algorithms_enabled()


def state_with(deterministic: bool | None, attention: str | None) -> dict:
    state: dict = {"config": {"model": {"hidden_size": 64, "attention": "auto"}, "train": {}}}
    if deterministic is not None:
        state["config"]["train"]["deterministic"] = deterministic
    if attention is not None:
        state["kernels"] = ac.Choice(attention, "measured", "cuda", "NVIDIA H200").record(bool(deterministic))
    return state


def expect(attention: str | None = None, deterministic: bool = True) -> Expectation:
    return Expectation(model={"hidden_size": 64}, deterministic=deterministic, attention=attention)


def test_a_resume_keeps_the_kernels_or_is_refused_with_the_reason(tmp_path):
    check = ck.check_expectation
    check(tmp_path, state_with(True, "flash"), expect())  # auto keeps what was recorded
    check(tmp_path, state_with(True, "flash"), expect("flash"))
    check(tmp_path, state_with(None, None), expect("math"))  # saved before either existed: the run's settings
    with pytest.raises(CheckpointMismatch, match="saved with train.deterministic = true, the run has false") as e:
        check(tmp_path, state_with(True, "flash"), expect(deterministic=False))
    assert e.value.exit_status == 2
    with pytest.raises(CheckpointMismatch, match="trained with attention kernel 'flash' .measured., the run forces "
                                                 "model.attention = 'math': a resume must not change kernels"):
        check(tmp_path, state_with(True, "flash"), expect("math"))


@pytest.mark.parametrize(("kernel", "how", "setting"), [("default", "default", "auto"), ("flash", "measured", "auto"),
                                                        ("efficient", "forced", "efficient")])
def test_the_refusal_of_another_kernel_names_the_setting_to_put_back(tmp_path, kernel, how, setting):
    """Found by a new user: a CPU run's resume with model.attention = "math" was refused with `were trained with
    model.attention "default" ... Put the old value back`, and "default" is no value model.attention takes. What the
    run's config said is named: "auto" for a kernel auto chose, the kernel itself where it was forced."""
    from minilmd.daemon.jobs.resumefrom import refusal

    state = state_with(True, None)
    state["kernels"] = ac.Choice(kernel, how, "cpu").record(True)
    with pytest.raises(CheckpointMismatch) as e:
        ck.check_expectation(tmp_path / "step-00000030", state, expect("math"))
    words = refusal(e.value, "in scratch /s")
    assert f'were trained with model.attention "{setting}"; the config says "math"' in words, words
    assert attention_problems(setting, True) == []  # what it says to put back is a value the config takes


def test_the_run_config_gives_the_kernel_expectation():
    e = Expectation.for_corpus(config("math", deterministic=False))
    assert (e.attention, e.deterministic) == ("math", False)
    assert Expectation.for_corpus(config()).attention is None


def test_torchs_refusal_of_a_nondeterministic_op_is_a_config_error():
    torch_says = RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                              "'torch.use_deterministic_algorithms(True)'. You can turn off ...")
    refused = determinism.refusal(torch_says, config())
    assert refused is not None and "train.deterministic = false" in str(refused)
    assert determinism.refusal(RuntimeError("CUDA error: an illegal memory access"), config()) is None


@pytest.mark.slow
def test_the_trainer_entry_sets_the_workspace_before_cuda_starts(tmp_path):
    """In a fresh process, as `minilmd train` calls it: torch imported (train.py imports it first), CUDA not yet."""
    code = ("import torch\nfrom minilmd.config import RunConfig\nfrom minilmd.trainer.loop import determinism\n"
            "print(determinism.prepare_environment(RunConfig()))\nimport os\n"
            "print(os.environ['CUBLAS_WORKSPACE_CONFIG'])")
    env = {k: v for k, v in os.environ.items() if k != CUBLAS_WORKSPACE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.splitlines() == ["CUBLAS_WORKSPACE_CONFIG=:4096:8 set before CUDA started", ":4096:8"]
