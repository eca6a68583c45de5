"""The MiniMind-compatible model, generation from it, and export to Hugging Face and MiniMind formats."""
