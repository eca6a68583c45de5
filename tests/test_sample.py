"""Generation: the KV cache gives the same logits and the same greedy text as recomputing everything; top-k and
top-p keep what they promise; `minilmd sample` runs on a real checkpoint."""
from __future__ import annotations

import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.trainer.model.generate import filter_logits, generate
from minilmd.trainer.model.minimind import KVCache
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)


def test_cached_logits_equal_the_full_forward_for_prefill_chunks_and_single_tokens():
    model = tiny_model(seed=3).eval()
    ids = torch.randint(0, 320, (2, 20))
    with torch.no_grad():
        full = model(ids).logits
        cache = KVCache(model, batch=2, max_len=20)
        pieces = [model(ids[:, :7], cache=cache).logits,  # prefill
                  model(ids[:, 7:12], cache=cache).logits]  # a chunk after a prefix (explicit mask)
        pieces += [model(ids[:, t:t + 1], cache=cache).logits for t in range(12, 20)]  # one token at a time
    assert cache.pos == 20
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_greedy_generation_with_cache_equals_generation_without():
    model = tiny_model(seed=4).eval()
    prompt = torch.randint(3, 320, (2, 5))
    with_cache = generate(model, prompt, 30, temperature=0, eos_id=None)
    without = generate(model, prompt, 30, temperature=0, eos_id=None, use_cache=False)
    assert with_cache.shape == (2, 35)
    assert torch.equal(with_cache[:, :5], prompt)
    assert torch.equal(with_cache, without)


def test_sampling_with_cache_equals_sampling_without_given_the_same_generator():
    model = tiny_model(seed=5).eval()
    prompt = [1, 10, 11, 12]
    a = generate(model, prompt, 20, temperature=1.0, top_p=0.9, top_k=40,
                 generator=torch.Generator().manual_seed(3))
    b = generate(model, prompt, 20, temperature=1.0, top_p=0.9, top_k=40, use_cache=False,
                 generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_generation_stops_at_eos_and_pads_finished_rows_with_eos():
    model = tiny_model(seed=6).eval()
    prompt = torch.tensor([[1, 5, 6], [1, 7, 8]])
    run = lambda eos: generate(model, prompt, 40, temperature=1.0, top_k=0, top_p=1.0, eos_id=eos,
                               generator=torch.Generator().manual_seed(0))[:, 3:]
    reference = run(None)
    # Declare "end of text" a token both rows produce, at different steps.
    common = [t for t in reference[0, 1:].tolist() if t in reference[1].tolist() and t != reference[1, 0]]
    eos = common[0]
    ends = [int((row == eos).nonzero()[0]) for row in reference]
    assert ends[0] != ends[1]
    out = run(eos)
    assert out.shape[1] == max(ends) + 1  # stopped once every row had ended
    for r, end in enumerate(ends):
        assert torch.equal(out[r, :end + 1], reference[r, :end + 1])
        assert (out[r, end + 1:] == eos).all()


def test_top_k_and_top_p_keep_exactly_what_they_promise():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda x: torch.isfinite(x)[0].tolist()
    assert kept(filter_logits(logits, top_k=2)) == [True, True, False, False, False]
    assert kept(filter_logits(logits, top_p=0.6)) == [True, True, False, False, False]  # 0.5 < 0.6 needs a 2nd
    assert kept(filter_logits(logits, top_p=0.5)) == [True, False, False, False, False]
    assert kept(filter_logits(logits, top_p=0.01)) == [True, False, False, False, False]  # never empty
    assert kept(filter_logits(logits[:, [4, 3, 2, 1, 0]], top_p=0.8)) == [False, False, True, True, True]


def test_prompt_longer_than_the_model_is_refused():
    model = tiny_model().eval()
    try:
        generate(model, list(range(100)), 50)
    except ValueError as e:
        assert "max_position_embeddings (128)" in str(e)
    else:
        raise AssertionError("no error")


def test_minilmd_sample_on_a_real_checkpoint(tmp_path):
    tok = train_tokenizer(tmp_path / "tokenizer.json")
    save_checkpoint(tmp_path / "ckpt", tiny_model(seed=9), step=2, tokenizer=tok)
    runner = CliRunner()
    args = ["sample", str(tmp_path / "ckpt"), "--prompt", "hello", "--max-new-tokens", "12", "--temperature", "0"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("hello")
    assert runner.invoke(app, args).output == first.output  # greedy is deterministic
    seeded = args[:-2] + ["--seed", "5"]
    assert runner.invoke(app, seeded).output == runner.invoke(app, seeded).output
    missing = runner.invoke(app, ["sample", str(tmp_path / "nothing"), "--prompt", "x"])
    assert missing.exit_code == 1 and "no such checkpoint" in missing.output


def test_sample_refuses_a_tokenizer_of_another_vocabulary_naming_both_sizes(tmp_path):
    """`--tokenizer` of another vocabulary than the model's: its ids name other text, so the sample would be
    mojibake printed with exit 0 (before); it is refused as a usage error, both sizes named."""
    tok = train_tokenizer(tmp_path / "tokenizer.json")
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(seed=9), step=1, tokenizer=tok)
    (tmp_path / "other").mkdir()
    other = train_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=300)
    model_vocab = tiny_model().config.vocab_size
    from tokenizers import Tokenizer

    other_vocab = Tokenizer.from_file(str(other)).get_vocab_size(with_added_tokens=True)
    assert other_vocab != model_vocab
    runner = CliRunner()
    refused = runner.invoke(app, ["sample", str(ckpt), "--prompt", "hello", "--tokenizer", str(other)])
    assert refused.exit_code == 2, refused.output
    assert f"a vocabulary of {other_vocab:,} entries, but the model's is {model_vocab:,}" in refused.output
    same = runner.invoke(app, ["sample", str(ckpt), "--prompt", "hello", "--tokenizer", str(tok),
                               "--max-new-tokens", "4"])
    assert same.exit_code == 0, same.output
