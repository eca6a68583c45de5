"""The commands that run the trainer's code: `train`, `verify`, `sample`, `chat`, `export`.

Each imports its implementation (`minilmd.trainer`, hence torch) inside its body, so that loading the command line
costs none of it.
"""
from __future__ import annotations

import typer

from minilmd.corpus.cli_options import force_option, group_share_option
from minilmd.corpus.exits import COMMAND_FAILED, EXIT_CONFIG, interruptible

commands = typer.Typer()
"""The top-level commands of this group; minilmd/cli/__init__.py registers them on the `minilmd` app."""


@commands.command("train")
def train_command(
    config: str = typer.Argument(..., help="The run config (TOML)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Train (or resume) one run in the foreground; under torchrun, one rank per device.

    Exit status: 0 budget reached, 75 stopped by SIGTERM after saving, 73 run.dir full while training (saved to
    scratch first), 76 CUDA out of memory, 74 scratch full (a checkpoint did not fit; or run.dir's file system, when
    making run.dir), 69 this run's supervised trainer holds its scratch (trainer.lock: nothing read or written;
    2 when a `minilmd train` by hand holds it), 2 bad config (or MINILMD_RUN_DIR without MINILMD_SUPERVISOR_PROCESS,
    or the reverse: only `minilmd run` sets them), 65 bad data, 1 crash."""
    from minilmd.config import ConfigError
    from minilmd.plan.budget import epoch_without_budget
    from minilmd.probes import load_checked
    from minilmd.protocol import EXIT_CONFIG
    from minilmd.supervision import SupervisionRefused, supervision

    try:  # judged before torch is imported (seconds of CPU): a mistyped config is said at once
        supervision()  # a run directory without its supervisor's identity (or the reverse): refused at once
        cfg = load_checked(config, set_, more_checks=epoch_without_budget, count_replies=False)  # counted exactly
    except (ConfigError, SupervisionRefused) as e:
        typer.echo(f"minilmd train: {e}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    from minilmd.trainer.loop.entry import main as train_main

    raise typer.Exit(train_main(config, set_, checked=cfg))  # its probes (the corpus, init.from) not run twice


@commands.command("verify")
def verify_command(
    path: str = typer.Argument(..., help="A step-XXXXXXXX checkpoint directory, a root holding several, or a run "
                                "directory (every checkpoint of its scratch and its run.remote, each with its root, "
                                "and the one a resume of the run would take)."),
    json_: bool = typer.Option(False, "--json", help="Print a JSON report (for scripts)."),
    config: str = typer.Option("", "--config", help="A run config: also check its model config and corpus "
                                                    "fingerprints."),
) -> None:
    """Validate checkpoints strictly (manifest, sizes, sha256, shapes, finiteness, steps); nothing is moved.

    Exit status: 0 every checkpoint is valid, 1 otherwise (the reasons are printed; a run directory whose
    run.toml cannot be read, or no checkpoint at all, is one), 2 a bad --config."""
    import json

    from minilmd.checkpoint_verify import expectation_from_config, report_lines, verify_report
    from minilmd.config import ConfigError

    try:
        expected = expectation_from_config(config, log=lambda s: typer.echo(s, err=True)) if config else None
    except ConfigError as e:
        typer.echo(f"minilmd verify: {e}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    report = verify_report(path, expected)
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        for line in report_lines(report):
            typer.echo(line)
    raise typer.Exit(0 if report["ok"] else COMMAND_FAILED)


CHECKPOINT_HELP = ("A step-XXXXXXXX checkpoint directory, a directory with LATEST, or a run directory (the "
                   "checkpoint a resume of the run would take: the newest valid one of its scratch and run.remote).")
LORA_HELP = ("A LoRA run's checkpoint (or its root) to put on CHECKPOINT, which must be the base it was trained on. "
             "A LoRA checkpoint given as CHECKPOINT brings its own recorded base.")
NO_LORA_HELP = "With a LoRA checkpoint: the base alone, its adapters switched off."


@commands.command()
def sample(
    checkpoint: str = typer.Argument(..., help=CHECKPOINT_HELP),
    prompt: str = typer.Option(..., "--prompt", help="Text to continue; the model sees BOS + text (with --chat: "
                               "the user's message)."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1),
    temperature: float = typer.Option(0.85, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(0.85, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 = no top-k filter."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json (default: the checkpoint's, or the "
                                                          "prepared corpus's)."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (default: random)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    chat: bool = typer.Option(False, "--chat", help="Render --prompt as a user message with the model's chat "
                              "template and print only the reply (it stops at <|im_end|>; one that ends at once "
                              "prints (empty reply))."),
    system: str = typer.Option("", "--system", help="With --chat: a system message before the prompt."),
    lora: str = typer.Option("", "--lora", help=LORA_HELP),
    no_lora: bool = typer.Option(False, "--no-lora", help=NO_LORA_HELP),
) -> None:
    """Generate text from a checkpoint with a KV cache.

    Exit status: 0, 1 a checkpoint or tokenizer that cannot be used, 2 a --tokenizer whose vocabulary is not the
    model's."""
    from minilmd.trainer.model.export import ExportError
    from minilmd.trainer.model.generate import sample_text

    try:
        checkpoint = _say_whose(checkpoint, "sample")  # another user's: said; his copy claiming your run: refused
        if chat:
            from minilmd.trainer.model.chat import ChatSession, shown

            session = ChatSession(checkpoint, tokenizer or None, device, max_new_tokens, temperature, top_p, top_k,
                                  seed, lora or None, no_lora)
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": prompt}]
            typer.echo(shown(session.reply(messages)))  # "(empty reply)" rather than nothing
            return
        text, chat_model = sample_text(checkpoint, prompt, tokenizer or None, max_new_tokens, temperature, top_p,
                                       top_k, seed, device, lora or None, no_lora)
    except (ExportError, ValueError) as e:
        typer.echo(f"minilmd sample: {e}", err=True)
        # ExportError's own: 2 for another vocabulary
        raise typer.Exit(e.exit_status if isinstance(e, ExportError) else COMMAND_FAILED) from None
    from minilmd.untrusted import printable

    typer.echo(printable(prompt + text, lines=True))  # a tokenizer from elsewhere may decode to terminal escapes
    if chat_model:  # a raw continuation of a chat model's prompt reads as noise: say how it is asked
        typer.echo("minilmd sample: note: this model was trained on conversations (SFT or DPO): pass --chat to give "
                   "--prompt as a user message in its chat template and print its reply alone", err=True)


@commands.command("chat")
def chat_command(
    checkpoint: str = typer.Argument(..., help=CHECKPOINT_HELP),
    system: str = typer.Option("", "--system", help="A system message opening the conversation."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="The longest reply, in tokens."),
    temperature: float = typer.Option(0.85, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(0.85, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 = no top-k filter."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json with a tokenizer_config.json holding the "
                                  "chat template beside it (default: the checkpoint's, or the corpus's)."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (default: random)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    lora: str = typer.Option("", "--lora", help=LORA_HELP),
    no_lora: bool = typer.Option(False, "--no-lora", help=NO_LORA_HELP),
) -> None:
    """Talk to a fine-tuned checkpoint: each line on stdin is a user message, each reply is printed on stdout
    (`/reset` starts over, `/exit` or end of input ends). The conversation is rendered by the model's own chat
    template; the oldest exchanges are dropped when it outgrows the model.

    With stdin piped (`minilmd chat CKPT < questions.txt`) stdout is a transcript: each message as `> MESSAGE`,
    then its reply, then an empty line."""
    import sys

    from minilmd.trainer.model.chat import ChatSession, converse, interactive_prompt
    from minilmd.trainer.model.export import ExportError

    try:
        checkpoint = _say_whose(checkpoint, "chat")
        session = ChatSession(checkpoint, tokenizer or None, device, max_new_tokens, temperature, top_p, top_k,
                              seed, lora or None, no_lora)
        converse(session, sys.stdin, sys.stdout, system or None, interactive_prompt(), echo=not sys.stdin.isatty())
    except (ExportError, ValueError) as e:
        typer.echo(f"minilmd chat: {e}", err=True)
        # ExportError's own: 2 for another vocabulary
        raise typer.Exit(e.exit_status if isinstance(e, ExportError) else COMMAND_FAILED) from None


@commands.command()
def export(
    checkpoint: str = typer.Argument(..., help=CHECKPOINT_HELP),
    format: str = typer.Option(..., "--format", help="minimind (a .pth for MiniMind's eval_llm.py), hf "
                                                     "(a Qwen3ForCausalLM directory) or peft (a LoRA run's "
                                                     "adapters as a PEFT adapter directory)."),
    out: str = typer.Option(..., "--out", help="FILE.pth for minimind (the file itself: a directory is "
                                               "refused), a new directory for hf and peft (the export itself)."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json for hf (default: the checkpoint's, or "
                                                          "the prepared corpus's)."),
    dtype: str = typer.Option("float32", "--dtype", help="hf only: float32, bfloat16 or float16."),
    merge: bool = typer.Option(False, "--merge", help="A LoRA checkpoint with --format hf or minimind: the full "
                               "weights, its adapters merged into its base."),
    base_name: str = typer.Option("", "--base-name", help="peft only: the adapter_config.json's "
                                  "base_model_name_or_path, what AutoPeftModelForCausalLM loads the base from: the "
                                  "base's --format hf export (its path) or a hub id (default: the minilmd "
                                  "checkpoint of the base, which transformers cannot load)."),
    share: str = typer.Option("private", "--share", help="Who may read the export: private (0700/0600), "
                                                         "group (0750/0640) or all (0755/0644); your umask only "
                                                         "tightens it."),
    group_share: bool = group_share_option(more="The export's copy is still written 0700, and a killed export's "
                                                "copy there is left for you to remove."),
    force: bool = force_option("an existing --out FILE.pth (--format minimind; an hf or peft --out must be new or "
                               "an empty directory)"),
) -> None:
    """Export a checkpoint's weights for MiniMind or HF transformers.

    Written as .OUT.tmp-HOST-PID-TICKS-bootTAG.RANDOM (this host, pid, start time and boot, 8 random hex digits) beside
    --out and renamed onto it when complete; that temporary copy is removed on every other way out (an error, Ctrl-C,
    SIGTERM), and an --out there before is left as it was. One a killed export left (SIGKILL, OOM) is removed by the
    next export to that --out, and said, when its process is gone and it is your own file or directory; another user's,
    a link, another host's or an older .OUT.tmp is left and said. Exit status: 0 written, 1 a checkpoint or argument
    that cannot be exported, 2 an --out it must not write (a symbolic link; another export to it still running; a
    directory others can rearrange, without --group-share; a .pth already there without --force; a directory for
    minimind's .pth, with --force or without; a directory not empty, or another user's), 74 the export could not be
    written (the message says why: a full disk or quota with the room left, permission denied, a read-only or failing
    file system) or the checkpoint could not be read (whose place it is when the permission is missing), 130 interrupted
    (Ctrl-C, SIGTERM, SIGHUP)."""
    from minilmd import perms

    if share_problem := perms.problem(share, "--share"):
        typer.echo(f"minilmd export: {share_problem}", err=True)
        raise typer.Exit(EXIT_CONFIG)
    perms.apply(share)  # before anything is created
    from minilmd.trainer.model.export_paths import ExportError

    # Ctrl-C, SIGTERM, SIGHUP unwind through the export's cleanup: its temporary copy removed
    with interruptible(f"minilmd export: interrupted; nothing half-written is left beside {out}"):
        try:
            from minilmd.trainer.model.export import (  # torch: seconds, which a Ctrl-C may interrupt
                export_hf,
                minimind_eval_command,
                minimind_weight,
                write_minimind,
            )
            from minilmd.trainer.model.tokenizer_files import find_chat_config

            if format not in ("minimind", "hf", "peft"):  # said before the checkpoint is looked for
                raise ExportError(f"--format {format!r}: use minimind, hf or peft")
            checkpoint = _say_whose(checkpoint, "export")  # another user's: said; his copy claiming your run: refused
            if format == "minimind":
                path, checked = write_minimind(checkpoint, out, merge, group_share, force)
                try:  # only for the eval command's advice: the .pth is written and published, whatever this finds
                    chat = find_chat_config(checkpoint, tokenizer or None, checked=checked) is not None
                except ExportError as e:
                    typer.echo(f"minilmd export: the chat template not looked up ({e}); the command below is a text "
                               f"model's", err=True)
                    chat = False
                weight = minimind_weight(checked.listed, chat)  # "dpo" for a DPO run's: MiniMind's dpo_<hidden>.pth
                typer.echo(f"wrote {path} (fp16). "
                           f"{minimind_eval_command(path, checked.state['config']['model'], chat, weight)}")
            elif format == "hf":
                path = export_hf(checkpoint, out, tokenizer or None, dtype, merge, group_share)
                typer.echo(f"wrote {path}: Qwen3ForCausalLM.from_pretrained({str(path)!r})")
            else:  # peft
                from minilmd.trainer.model.adapter import export_peft

                path = export_peft(checkpoint, out, base_name, group_share)
                if base_name:
                    typer.echo(f"wrote {path}: AutoPeftModelForCausalLM.from_pretrained({str(path)!r}) (its base: "
                               f"{base_name})")
                else:
                    typer.echo(f"wrote {path}: PeftModel.from_pretrained(<the base exported with --format hf>, "
                               f"{str(path)!r}); --base-name names that base for AutoPeftModelForCausalLM")
        except ExportError as e:
            typer.echo(f"minilmd export: {e}", err=True)
            raise typer.Exit(e.exit_status) from None  # 2: an --out it must not write (a link, a live export's)
        except OSError as e:  # what the writing side did not turn into ExportNotWritten: a read of the checkpoint
            from minilmd.trainer.model.export_paths import not_read

            failed = not_read(checkpoint, e)  # its run.remote chmod 700 by the directory's owner: EACCES
            typer.echo(f"minilmd export: {failed}", err=True)
            raise typer.Exit(failed.exit_status) from None


def _say_whose(checkpoint: str, command: str) -> str:
    """The checkpoint directory `export`, `sample` or `chat` (`command`) takes, judged by minilmd/source_owner.py:
    another user's, or below a directory another user owns or can rearrange, said on stderr; another user's copy
    naming one of your run directories refused (ExportError). The same rule init.from's checkpoint is said and
    refused by. Resolved once, here (a run directory's or a run config's: find_latest, which hashes every file):
    the command loads the directory judged, validated once more where it is read, not a resolution made again
    (LATEST may have moved on between; before, a run directory's checkpoint was hashed three times)."""
    from minilmd.source_owner import named_checkpoint_words
    from minilmd.trainer.model.export_paths import ExportError
    from minilmd.trainer.model.export_source import resolve_checkpoint

    resolved = resolve_checkpoint(checkpoint)
    note, refused = named_checkpoint_words(resolved, "")
    if refused:
        raise ExportError(refused)
    if note:
        typer.echo(f"minilmd {command}: note: {note}", err=True)
    return str(resolved)
