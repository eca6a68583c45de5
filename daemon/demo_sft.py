"""`make demo-sft`: the MiniMind pipeline's two stages under the supervisor, on CPU, then a chat with the result.

1. the pretraining demo (daemon/demo.py): real text, a tokenizer, `minilmd run` with a real SIGBUS injected, the
   checkpoints synced to <root>/nfs;
2. a small real chat corpus, the chatterbot-corpus package's Chinese and English dialogs as MiniMind SFT JSONL,
   prepared with `--format chat` under the demo tokenizer and a ChatML template (loss on the replies only);
3. `minilmd run` of an SFT config: `[init] from` the pretraining run's 'NFS' share (the checkpoint its LATEST
   names), the SFT defaults for the mode (length bucketing) and the schedule's floor, the budget in epochs, and
   a SIGKILL injected into the trainer halfway: the supervisor restarts it, it resumes from its own checkpoint;
4. `minilmd chat` answers a question from the fine-tuned model on the SFT run's 'NFS' share.

Its sections are numbered on from the demo's (7-9). In its own directory, demo-sft-run/ by default: make demo's
demo-run/ stays. Every step is a real `minilmd` command, printed before it runs. Torch-free, like the demo it extends.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from minilmd import pychild
from minilmd.daemon import demo
from minilmd.daemon.demo import minilmd, say
from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_FILE

CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
"""ChatML, as MiniMind's template writes turns (without its default system message and think block): the demo
tokenizer is trained on the spot and has no template of its own."""

SFT_CONFIG = """\
# The demo's fine-tuning run: the pretrained demo model, on chat data, under the same supervisor.
[run]
name = "demo-sft"
dir = "{root}/sft-run"
scratch = "{scratch}"
remote = "{root}/nfs-sft"

[data]
prepared = "{root}/sft-prepared"
# data.mode is left out: on a chat corpus it defaults to "bucketed" (length bucketing, the SFT seed's method)
val_windows = 16

[init]
from = "{root}/nfs"                # the pretraining run's remote: the checkpoint its LATEST names

[model]                            # must be the pretrained model's (run --check names any difference)
""" + demo.MODEL_LINES + """
[train]
seq_len = 128
micro_batch_size = 16
grad_accum = 1
lr = 5e-4                          # a real SFT leaves lr to its default, 1e-5 (the seed's); a 2M-parameter demo
                                   # model needs larger steps to learn the turn format in a few hundred steps
max_epochs = {epochs}              # the SFT budget unit; min_lr_ratio is left to the SFT default (0.1)
device = "cpu"
log_every = 20
eval_every = 100
checkpoint_every = 30

""" + demo.SYNC_AND_RESTART


def main(root: str = "demo-sft-run", pretrain_steps: int = 240, epochs: int = 3) -> None:
    started = time.monotonic()
    demo.main(root, pretrain_steps)
    root_path = Path(root).resolve()
    scratch = demo.stage_scratch(root_path, "demo-sft", "sft-")

    say("7. A small real chat corpus: chatterbot-corpus's dialogs as SFT JSONL, prepared with --format chat")
    made = pychild.run(pychild.module_argv("minilmd.cli", "demo-corpus", str(root_path / "chat"), "--chat"),
                       stdout=subprocess.PIPE, text=True)
    if made.returncode != 0:
        sys.exit(f"demo: `minilmd demo-corpus --chat` failed with exit status {made.returncode}")
    chats = made.stdout.splitlines()
    for path in chats:
        print(f"  {path}: {sum(1 for _ in open(path, encoding='utf-8')):,} conversations")
    tokenizer_dir = root_path / "sft-tokenizer"
    tokenizer_dir.mkdir()
    (tokenizer_dir / TOKENIZER_FILE).write_bytes((root_path / TOKENIZER_FILE).read_bytes())
    (tokenizer_dir / TOKENIZER_CONFIG).write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>"}, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(f"  the demo tokenizer with a ChatML template: {tokenizer_dir}")
    minilmd("prepare", *chats, "--tokenizer", str(tokenizer_dir), "--format", "chat", "--out",
            str(root_path / "sft-prepared"), "--seq-len", "128", "--batch-size", "16", "--val-fraction", "0.02")

    say("8. Fine-tuning under the supervisor from the pretrained model; a SIGKILL hits the trainer at step 60")
    config = root_path / "demo-sft.toml"
    config.write_text(SFT_CONFIG.format(root=root_path, scratch=scratch, epochs=epochs), encoding="utf-8")
    demo.run_stage(config, "sigkill@60", root_path / "sft-run", root_path / "nfs-sft", "the SFT run")

    say("9. Talking to the fine-tuned model (each line on stdin is a user message)")
    demo.chat(root_path / "nfs-sft")
    print(f"\ndemo-sft finished in {time.monotonic() - started:.0f} s; everything is under {root_path}/ "
          f"(the SFT config: {config})")


if __name__ == "__main__":
    main(demo.directory_argument(sys.argv[1:], "demo-sft-run", __doc__))
