"""`minilmd prepare` and `prepare --append`: the pipeline and its steps."""
