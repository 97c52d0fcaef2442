"""Hugging Face datasets and Parquet (pyarrow) are optional (requirements-hf.txt): README
command 1 installs without them, and a source that needs them says so in one line."""
import sys

import pytest

from cgpt.data import sources
from cgpt.data.prepare import Corpus
from cgpt.data.sources import DataError


def test_requirements_txt_leaves_out_datasets():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pins = [ln.split("==")[0] for ln in (root / "requirements.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert "datasets" not in pins and "pyarrow" not in pins
    assert "datasets==" in (root / "requirements-hf.txt").read_text()
    assert "-r requirements-hf.txt" in (root / "requirements-test.txt").read_text()


def test_parquet_without_pyarrow_is_one_clear_error(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": ["a document", "another"]}), path)
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    with pytest.raises(DataError, match=r"docs\.parquet \(Parquet\) needs the optional package "
                                        r"'pyarrow'.*requirements-hf\.txt.*cgpt\[hf\]"):
        Corpus(str(path)).units(1 << 20)


def test_hf_source_without_datasets_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"'hf:wikitext' .* needs the optional package 'datasets'"):
        Corpus("hf:wikitext:wikitext-2-raw-v1")


def test_optional_returns_the_module():
    assert sources.optional("json", "anything").dumps([1]) == "[1]"
