"""The training side of minilmd: everything that needs torch, and the corpus preparation that feeds it.

Subpackages by concern: `data` (tokenizer, prepare, samplers), `model` (model, generation, export),
`checkpoint` (save, load, the asynchronous writer), `loop` (the Trainer), `bench`.
"""
