import pytest

import cgpt
from cgpt.config import flops
from cgpt.config.model import ModelConfig

# Published shapes and the counts they imply (Cerebras-GPT paper App. E formula; HF cards).
PUBLISHED = {
    "111M": (10, 768, 12, 64, 111_050_496, 70_880_256),
    "256M": (14, 1088, 17, 64, 255_977_024, 199_069_184),
    "590M": (18, 1536, 12, 128, 590_310_912, 509_970_432),
    "1.3B": (24, 2048, 16, 128, 1_315_723_264, 1_208_602_624),
    "2.7B": (32, 2560, 32, 80, 2_651_553_280, 2_517_652_480),
    "6.7B": (32, 4096, 32, 128, 6_658_404_352, 6_444_163_072),
    "13B": (40, 5120, 40, 128, 12_853_386_240, 12_585_584_640),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_shapes_and_counts(name):
    L, d, H, dh, total, nonemb = PUBLISHED[name]
    cfg = cgpt.get_config(name)
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_ffn) == (L, d, H, dh, 4 * d)
    assert (cfg.vocab_size, cfg.n_ctx, cfg.ln_eps) == (50257, 2048, 1e-5)
    assert cfg.num_params() == total
    assert cfg.num_params(embedding=False) == nonemb
    assert cfg.chinchilla_tokens() == 20 * total


def test_names_are_case_insensitive_and_prefixed():
    a = cgpt.get_config("111M")
    assert cgpt.get_config("111m") == a
    assert cgpt.get_config("cerebras-gpt-111m") == a
    assert cgpt.get_config("Cerebras-GPT-111M") == a
    assert cgpt.get_config("cerebras/Cerebras-GPT-1.3B").d_model == 2048


def test_published_residual_init_scales():
    # yaml values: 1.3B and 13B use 0.0025, not 0.02/sqrt(2L).
    assert cgpt.get_config("1.3B").resid_out_std == 0.0025
    assert cgpt.get_config("13B").resid_out_std == 0.0025
    assert cgpt.get_config("111M").resid_out_std == pytest.approx(0.004472)


def test_mup_rules_match_published_values():
    # (m_w, hidden σ, output σ, logits multiplier) from the μP yamls.
    want = {"111M": (3, 0.046188, 0.010328), "256M": (4.25, 0.038806, 0.0073336),
            "590M": (6, 0.032660, 0.0054433), "1.3B": (8, 0.028284, 0.0040825),
            "2.7B": (10, 0.025298, 0.0031623)}
    for name, (mw, hid, out) in want.items():
        c = cgpt.get_config(name + "-mup")
        assert c.mup and c.width_mult == mw
        assert c.hidden_std == pytest.approx(hid, rel=1e-4)
        assert c.resid_out_std == pytest.approx(out, rel=1e-4)
        assert c.embed_std == 0.08 and c.embed_mult == 10.0
        assert c.logits_mult == pytest.approx(1 / mw)
        assert c.attn_scale == pytest.approx(1 / c.d_head)
    with pytest.raises(ValueError, match="unknown model preset"):
        cgpt.get_config("13B-mup")  # no μP twin was published


def test_list_configs_and_unknown_name():
    names = cgpt.list_configs()
    for n in PUBLISHED:
        assert n in names
    cpu = [n for n in names if n.startswith("cpu-") and not n.endswith("-mup")]
    assert len(cpu) >= 6
    counts = sorted(cgpt.get_config(n).num_params() for n in cpu)
    assert counts[0] < 200_000 and 15_000_000 < counts[-1] < 25_000_000
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt-5'.*111M.*13B"):
        cgpt.get_config("gpt-5")


def test_cpu_family_follows_shape_rules():
    for n in cgpt.list_configs():
        c = cgpt.get_config(n)
        assert c.d_ffn == 4 * c.d_model and c.n_head * c.d_head == c.d_model


def test_inconsistent_shapes_name_the_field():
    with pytest.raises(ValueError, match="n_head"):
        ModelConfig(d_model=100, n_head=3)
    with pytest.raises(ValueError, match="d_head"):
        ModelConfig(d_model=64, n_head=2, d_head=16)
    with pytest.raises(ValueError, match="n_layer"):
        ModelConfig(n_layer=0)
    with pytest.raises(ValueError, match="compute_dtype"):
        ModelConfig(compute_dtype="float16")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        cgpt.get_config("111M", n_layers=3)


def test_flops_conventions():
    cfg = cgpt.get_config("111M")
    T = 2048
    full = flops.train_flops_per_token(cfg, T)
    causal = flops.train_flops_per_token(cfg, T, attention="causal")
    attn_full = 12 * cfg.n_layer * T * cfg.d_model
    assert full - causal == pytest.approx(attn_full / 2)
    # Matmul weights: non-embedding kernels (no biases/LN) plus the tied LM head.
    kernels = cfg.n_layer * 12 * cfg.d_model ** 2
    assert full == pytest.approx(6 * (kernels + cfg.vocab_size * cfg.d_model) + attn_full)
    D = cfg.chinchilla_tokens()
    assert flops.flops_6nd(cfg, D) == pytest.approx(6 * 111_050_496 * D)
    with pytest.raises(ValueError, match="attention"):
        flops.train_flops_per_token(cfg, T, attention="sparse")


def test_param_tree_is_the_model_and_the_counts():
    cfg = cgpt.get_config("2.7B")  # 32 heads of 80: d_head is not d_model / 16
    tree = cfg.param_tree()
    assert list(tree)[:2] == [("wte",), ("wpe",)] and list(tree)[-1] == ("ln_f", "bias")
    assert tree[("h", "attn", "c_attn", "kernel")].shape == (32, 2560, 3 * 2560)
    assert tree[("h", "mlp", "c_fc", "kernel")].axes == ("layers", "embed", "mlp")
    assert tree[("h", "ln_1", "scale")].std is None and tree[("h", "ln_1", "scale")].fill == 1.0
    assert tree[("h", "mlp", "c_proj", "kernel")].std == cfg.resid_out_std == 0.0025
    assert sum(s.std is not None for s in tree.values()) == 6  # wte, wpe and four kernels
    assert flops.matmul_params(cfg) == 32 * 12 * 2560 ** 2 + 50257 * 2560


def test_units_read_and_write_bytes():
    from cgpt.config.units import fmt_bytes, parse_bytes

    assert [fmt_bytes(x) for x in (72e9, 19_123_456_789, 870_000, 512, 999_700_000, 2.5e15)] == \
        ["72 GB", "19.1 GB", "870 kB", "512 B", "1 GB", "2.5 PB"]
    assert parse_bytes(fmt_bytes(80e9).replace(" ", "")) == 80 * 10**9
    assert parse_bytes("16GiB") == 16 * 2**30
    with pytest.raises(ValueError, match="train.device_memory 'lots'"):
        parse_bytes("lots", "train.device_memory")
