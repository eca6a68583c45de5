"""`minilmd bench prepare` and `bench append`: what preparing and appending a corpus cost (torch-free)."""
