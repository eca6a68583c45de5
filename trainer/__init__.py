"""The training side of minilmd: tokenizer, prepare, token stream, model, training loop, checkpoints."""
