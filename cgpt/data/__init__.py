"""Text to token batches: sources, tokenizers, token stores, preparation, the pure batch
function."""
