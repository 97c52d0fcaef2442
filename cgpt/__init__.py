"""cgpt: Cerebras-GPT scaling-law studies in JAX. Importing it installs nothing (no signal
handler: the process entry, `cgpt.cli.entry`, does) and loads little."""
from cgpt.errors import CgptError, LoadError, TrainError

__all__ = ["ModelConfig", "get_config", "list_configs", "CgptError", "LoadError", "TrainError",
           "LM", "load", "save_hf"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`cgpt.LM`, `cgpt.load`, `cgpt.save_hf` import jax on first use only, so that the data
    tools (`cgpt.data.batches`, and `cgpt data prepare`'s worker processes) start fast and small;
    the presets load on first use too, so that `analysis`, which reads run directories through
    `cgpt.rundir`, loads no more of cgpt than that contract."""
    if name in ("LM", "load", "save_hf"):
        from cgpt.eval import lm  # JAX: `import cgpt` stays light for the data tools

        return getattr(lm, name)
    if name in ("ModelConfig", "get_config", "list_configs"):
        from cgpt.config import model  # `analysis` reads only the run-directory contract

        return getattr(model, name)
    raise AttributeError(f"module 'cgpt' has no attribute {name!r}")
