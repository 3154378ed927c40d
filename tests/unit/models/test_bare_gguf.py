"""A bare GGUF file is enough (models/bare_gguf.py): config, tokenizer and chat template come from the file's own
metadata, converted by transformers once per file and read from the cache after; the model loaded from the bare
file computes what transformers' float model of the same weights does; the draft is chosen or refused by
vocabulary. The files are written with gguf's GGUFWriter (specstruct.testing_gguf): a tiny qwen2 / llama model over
a small real BPE tokenizer, with the metadata llama.cpp's converter writes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specstruct import settings
from specstruct.errors import IncompatibleDraftError
from specstruct.models import bare_gguf
from specstruct.models.gguf_header import identity, read_header
from specstruct.testing import tiny_llama, tiny_model, tiny_tokenizer
from specstruct.testing_gguf import write_bare_gguf

pytest.importorskip("gguf")
pytest.importorskip("accelerate")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECSTRUCT_CACHE", str(root))
    monkeypatch.setenv("SPECSTRUCT_HOME", str(tmp_path / "home"))  # no pulled registry model in sight
    settings.cache_clear()
    return root


@pytest.fixture(scope="module", params=[("qwen2", "Q8_0"), ("llama", "F16")])
def bare_file(request, tmp_path_factory, tok):
    """(a bare GGUF file in a folder of its own, the float model its weights stand for)."""
    arch, kind = request.param
    model = tiny_llama(tok) if arch == "llama" else tiny_model(tok)
    path = tmp_path_factory.mktemp("bare") / f"Tiny-{arch}-{kind}.gguf"
    return path, write_bare_gguf(model, tok, path, kind)


def test_a_bare_file_loads_with_its_own_config_tokenizer_and_template(bare_file, cache, tok):
    from specstruct.runtime.gguf_model import load_model, load_quantized

    path, stands_for = bare_file
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # nothing beside it
    model, tokenizer = load_model(str(path))
    assert model.config.model_type == stands_for.config.model_type
    assert model.config.vocab_size == stands_for.config.vocab_size
    text = 'Extract: {"name": "Ada", "city": "London"} <|im_end|>'
    pads = {f"[PAD{i}]": i for i in range(len(tok), stands_for.config.vocab_size)}  # the converter's, to the rows
    assert tokenizer.get_vocab() == {**tok.get_vocab(), **pads}
    assert tokenizer.encode(text) == tok.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.eos_token == tok.eos_token
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, stands_for(input_ids=ids).logits
        # the file's config is the model's own: the same bits as the file loaded with the original config
        assert torch.equal(got, load_quantized(path, stands_for.config)(input_ids=ids).logits)
    if "F16" in path.name:  # 16-bit weights, float32 activations: float rounding only
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:  # int8 activations per group
        assert ((got - want).norm() / want.norm()).item() < 0.03
        assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


def test_the_metadata_is_converted_once_per_file_and_shared_by_its_copies(bare_file, cache, tmp_path, monkeypatch):
    from specstruct.models import provisioning

    path, _ = bare_file
    folder = bare_gguf.metadata_folder(path)
    assert folder.parent == cache / "gguf-metadata" and folder.name == identity(path)
    assert {"config.json", "tokenizer.json", "chat_template.jinja"} <= {p.name for p in folder.iterdir()}
    assert json.loads((folder / bare_gguf.MARKER).read_text())["architecture"] == read_header(
        path, ("general.architecture",)).values["general.architecture"]

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(provisioning, "convert_gguf", no_conversion)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    assert bare_gguf.metadata_folder(path) == folder == bare_gguf.metadata_folder(copy)


def test_a_folder_an_older_conversion_wrote_is_converted_again(bare_file, cache):
    """A cached config from before the conversion read what transformers leaves out (gguf_hparams) is redone."""
    path, _ = bare_file
    folder = bare_gguf.metadata_folder(path)
    marker = folder / bare_gguf.MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "version": bare_gguf.VERSION - 1}))
    (folder / "config.json").write_text("{}")
    assert bare_gguf.metadata_folder(path) == folder
    assert json.loads((folder / "config.json").read_text())["model_type"] in ("qwen2", "llama")


def test_another_file_is_another_identity(tmp_path, tok):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_bare_gguf(tiny_model(tok, seed=1), tok, a, name="one")
    write_bare_gguf(tiny_model(tok, seed=1), tok, b, name="two")  # the same tensors, other metadata
    assert identity(a) != identity(b)


def test_a_file_that_is_not_gguf_or_is_cut_short_is_refused_by_name(tmp_path, tok):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just bytes")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        identity(junk)
    whole = tmp_path / "whole.gguf"
    write_bare_gguf(tiny_model(tok), tok, whole)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:5000])
    with pytest.raises(ValueError, match="cut short"):
        read_header(cut)


def _engine_draft(path, draft, monkeypatch, cache):
    import specstruct as ss

    return ss.SpecStruct.from_pretrained(str(path), draft=draft, config=ss.SpecConfig(max_new_tokens=8))


def test_a_draft_is_another_bare_file_with_the_same_vocabulary_or_is_refused(bare_file, cache, tmp_path, tok,
                                                                             monkeypatch):
    path, _ = bare_file
    draft = tmp_path / "draft.gguf"
    # the same tokenizer; for the llama target padded to other rows (416 and 408, as Qwen2.5-7B's 152,064 and 0.5B's
    # 151,936): the files' token lists differ in their [PAD<id>] tokens alone
    write_bare_gguf(tiny_model(tok, seed=5, hidden=32, layers=1), tok, draft)
    engine = _engine_draft(path, str(draft), monkeypatch, cache)
    assert engine.draft_model is not None
    alone = _engine_draft(path, None, monkeypatch, cache)
    prompt = [{"role": "user", "content": "Extract: Ada, 36"}]
    assert engine.run(prompt).token_ids == alone.run(prompt).token_ids  # the target's own greedy tokens
    other = tiny_tokenizer(vocab_size=380)
    stranger = tmp_path / "stranger.gguf"
    write_bare_gguf(tiny_model(other, seed=5, hidden=32, layers=1), other, stranger)
    with pytest.raises(IncompatibleDraftError, match="draft"):
        _engine_draft(path, str(stranger), monkeypatch, cache)


def test_auto_picks_a_pulled_registry_draft_by_vocabulary_or_none(bare_file, cache, tmp_path, tok, monkeypatch):
    from specstruct.models import loading, registry
    from specstruct.runtime.gguf_model import load_model

    path, _ = bare_file
    target, target_tok = load_model(str(path))
    assert loading.matching_draft(target_tok, target) is None  # nothing pulled
    folder = registry.model_dir("qwen2.5-coder-0.5b")  # pulled: a folder with its config, tokenizer and marker
    folder.mkdir(parents=True)
    (folder / registry.MARKER).write_text("{}")
    target.config.to_json_file(folder / "config.json")
    target_tok.save_pretrained(folder)  # as pulled: converted from its own file, [PAD] tokens and all
    small = registry.REGISTRY["qwen2.5-coder-0.5b"]
    weights = sum(t.numel() * t.element_size() for t in (*target.parameters(), *target.buffers()))
    monkeypatch.setitem(registry.REGISTRY, small.name, registry.ModelSpec(**{**small.__dict__,
                                                                             "size": int(weights * 0.4)}))
    assert loading.matching_draft(target_tok, target) == "qwen2.5-coder-0.5b"
    monkeypatch.setitem(registry.REGISTRY, small.name, registry.ModelSpec(**{**small.__dict__,
                                                                             "size": int(weights * 0.9)}))
    assert loading.matching_draft(target_tok, target) is None  # not cheaper than the target
    monkeypatch.setitem(registry.REGISTRY, small.name, registry.ModelSpec(**{**small.__dict__,
                                                                             "size": int(weights * 0.4)}))
    tiny_tokenizer(vocab_size=380).save_pretrained(folder)
    assert loading.matching_draft(target_tok, target) is None  # another vocabulary
