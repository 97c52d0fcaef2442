"""cgpt: Cerebras-GPT scaling-law studies in JAX."""
from cgpt.config.model import ModelConfig, get_config, list_configs
from cgpt.errors import LoadError

__all__ = ["ModelConfig", "get_config", "list_configs", "LoadError", "LM", "load", "save_hf"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`cgpt.LM`, `cgpt.load`, `cgpt.save_hf` import jax on first use only, so that the data
    tools (`cgpt.data.batches`, and `cgpt data prepare`'s worker processes) start fast and small."""
    if name in ("LM", "load", "save_hf"):
        from cgpt.eval import lm

        return getattr(lm, name)
    raise AttributeError(f"module 'cgpt' has no attribute {name!r}")
