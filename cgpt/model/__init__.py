"""The GPT-3-style decoder: its forward pass, KV-cache decoding and the Hugging Face mapping."""
