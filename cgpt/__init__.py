"""cgpt: Cerebras-GPT scaling-law studies in JAX."""
from cgpt.config import ModelConfig, get_config, list_configs
from cgpt.hf import LoadError
from cgpt.lm import LM, load, save_hf

__all__ = ["ModelConfig", "get_config", "list_configs", "LoadError", "LM", "load", "save_hf"]
__version__ = "0.1.0"
