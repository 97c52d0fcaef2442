"""The demo sweep's model sizes (tiny-9k ... tiny-76k, sweeps/demo.yaml) are presets: `cgpt
train --model tiny-9k` trains the model the demo names, with the demo's vocabulary."""
from pathlib import Path

import yaml

from cgpt.config.model import get_config, list_configs
from cgpt.config.run import from_dict

DEMO = Path(__file__).resolve().parents[2] / "sweeps" / "demo.yaml"


def test_every_demo_model_is_the_preset_of_its_name():
    spec = yaml.safe_load(DEMO.read_text())
    vocab = spec["base"]["model"]["vocab_size"]
    for name, keys in spec["models"].items():
        keys = dict(keys)
        base = keys.pop("preset")
        assert name in list_configs()
        assert get_config(name) == get_config(base, vocab_size=vocab, **keys).replace(name=name)


def test_a_demo_preset_brings_its_data_shape():
    run = from_dict({"preset": "tiny-9k"})
    assert run.model.num_params() == 8_928 and run.model.name == "tiny-9k"
    assert (run.data.vocab_size, run.data.seq_len) == (300, 128)  # the tokenizer fits the model
