"""μP coordinate check: μP is flat in width, SP and a broken μP blow up."""
import dataclasses

import numpy as np
import pytest

from cgpt.eval.coordcheck import CoordCheck, coord_check, family
from cgpt.config.model import ModelConfig
from cgpt.cli import main

WIDTHS = [16, 32, 64, 128]
FAST = dict(lr=1e-2, steps=3, batch=4, seq_len=16)


def test_slope_is_the_growth_exponent():
    w = np.array([16, 32, 64, 128])
    stats = {"flat": np.ones((3, 4)), "grows": np.stack([np.ones(4), w ** 0.5, 3 * w ** 1.0])}
    c = CoordCheck("x", tuple(w), 2, stats, max_slope=0.25)
    np.testing.assert_allclose(c.slopes()["grows"], [0, 0.5, 1.0], atol=1e-12)
    assert c.worst()[:2] == ("grows", 2) and not c.passed
    assert CoordCheck("y", tuple(w), 2, {"flat": stats["flat"]}).passed


@pytest.mark.slow  # ~45 s: the CLI over both parametrizations; test_broken_mup_fails keeps the check
def test_cli_mup_passes_sp_fails(tmp_path, capsys):
    out = tmp_path / "cc.png"
    rc = main(["coord-check", "--widths", ",".join(map(str, WIDTHS)), "--steps", "3",
               "--batch", "4", "--seq-len", "16", "--seeds", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "μP: PASS" in text and "SP: FAIL" in text
    assert out.stat().st_size > 10_000


@dataclasses.dataclass(frozen=True)
class NoLogitScale(ModelConfig):
    """μP with the 1/m_w output multiplier deliberately left out."""

    @property
    def logits_mult(self) -> float:
        return 1.0


@pytest.mark.slow  # ~35 s of widths trained; the verdict's arithmetic is tested above
def test_broken_mup_fails():
    good = family("tiny-45k", WIDTHS, mup=True)
    broken = {w: NoLogitScale(**c.to_dict()) for w, c in good.items()}
    assert broken[128].logits_mult == 1.0 and good[128].logits_mult == 4.0 ** -1 * 1.0
    check = coord_check(broken, "μP without 1/m_w on the logits", **FAST)
    act, _, slope = check.worst()
    assert not check.passed and act == "output_logits" and slope > 0.4, check.verdict()


def test_bad_widths_are_errors():
    with pytest.raises(ValueError, match="at least 3 widths"):
        coord_check(family("tiny-45k", [16, 32], mup=True), "x", **FAST)
    with pytest.raises(ValueError, match="multiple of the 2 heads"):
        family("tiny-45k", [15, 32, 64], mup=True)
    assert main(["coord-check", "--widths", "a,b"]) == 2
