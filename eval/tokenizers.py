"""Verified tokenizers for the GGUF models: what transformers builds from a GGUF file is checked
against an independent implementation of the file's own algorithm before any prompt reaches a
model, and cached, verified, keyed by the file's sha256.

Why: transformers builds the tokenizer of a GGUF file from its ``tokenizer.ggml.*`` fields, and
some releases build it wrong. transformers 5.17 builds Gemma 3's (``tokenizer.ggml.model =
llama``: SentencePiece BPE with scores, no merges in the file) without SentencePiece's merges
(" The" -> ``▁T`` + ``he``) and without the BOS the file asks for; 5.24 builds it right. A wrong
tokenizer changes every prompt silently, so :func:`load_verified` refuses it with an error that
names the transformers version.

The independent implementations (``reference_encoder``), one per ``tokenizer.ggml.model``:

- ``llama`` (SentencePiece): the ``sentencepiece`` package (Google's C++ implementation) over a
  ``ModelProto`` made from the file's pieces, scores and types (BPE, identity normalizer, no
  extra-whitespace removal, the file's ``add_space_prefix``, byte fallback when the file has byte
  pieces).
- ``gpt2`` (byte-level BPE with merges): ``tiktoken`` (OpenAI's Rust implementation) over ranks
  made from the file's merges, after the pre-tokenizer split that the file's
  ``tokenizer.ggml.pre`` names (:data:`PRE_SPLITS`, written from the published pre-tokenizer
  definitions).

Both parse the file's control and user-defined tokens written in the text as those tokens (what
transformers and llama.cpp do, and what chat templates rely on), and put BOS first where the file
says ``add_bos_token``.

Expected ids for a fixed table of strings (:data:`PROBES`: prose, digits, code, whitespace runs,
non-Latin text, emoji, chat special tokens) are committed per model under
``tests/data/tokenizer_ids/`` (``python -m eval.tokenizers write <gguf> <name>`` makes them) and
checked by the tests against the tokenizer transformers builds, on every transformers version the
project accepts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import files

# Bump when how a tokenizer is built or verified changes: cached tokenizers are rebuilt, and a
# run's identity (experiments.records.model_fingerprint) changes with it.
VERIFY_VERSION = 1

PROBES: tuple[str, ...] = (
    "The passkey is 71432.",
    " The quick brown fox jumps over the lazy dog. the end",
    "A special magic number is hidden within the following text. Make sure to memorize it.",
    "What is the special magic uuid for 4a5b6c7d-8e9f-0a1b-2c3d-4e5f6a7b8c9d in the text?",
    "1234567890 3.14159 -42 1,000,000 2026-11-25 0x1F",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "  leading spaces, trailing spaces   ",
    "tabs\t\tand\n\nnewlines\r\n and  double  spaces",
    "Ünïcödé façade naïve café — “quotes” ‘single’ … ½ ©",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם.",
    "emoji 🙂🚀 👩‍💻 🇫🇷 and symbols ∑∫√∞ ≠ ≤",
    "don't won't it's we're they've I'm you'll he'd",
    "",
    " ",
    "\n",
    "a",
    "       ",
)

# The chat special tokens a probe string uses, per GGUF model family (only those in the file's
# vocabulary are probed).
CHAT_PROBES: tuple[str, ...] = (
    "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|>assistant\n<|endoftext|>",
)

# tokenizer.ggml.pre -> the regular expressions of the byte-level pre-tokenizer, applied in
# order (each splits the pieces the previous one made), as the model's published tokenizer
# defines it. A pre-tokenizer not named here is refused: verifying against a guess would prove
# nothing.
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_QWEN2 = (
    r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"""
    r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "gpt-2": (_GPT2,),
    # SmolLM2's tokenizer.json: Digits(individual_digits) (ASCII digits only: tokenizers'
    # is_ascii_digit, so '½' stays with its space), then GPT-2's byte-level split
    "smollm": (r"[0-9]", _GPT2),
    "qwen2": (_QWEN2,),  # Qwen2 / Qwen2.5 (NFC-normalized first)
}
_NFC = {"qwen2"}


# Measured (tests/test_tokenizers.py's table, 2026-11-25): the GGUF files whose tokenizer some
# transformers releases build wrong, the first release that builds it right, and what was wrong.
# Records made before verification existed (no ``tokenizer.verified`` block) with an older
# release carry the note where they are shown (analysis).
FAULTY_BUILDS: dict[str, tuple[str, str]] = {
    "gemma-3-270m-q4_k_m.gguf": (
        "5.23",
        "no SentencePiece merges (' The' -> '▁T' + 'he') and no BOS; checked wrong on 5.17, 5.18, "
        "5.19, 5.20.2, 5.21.1 and 5.22.2",
    ),
}


def faulty_tokenizer(gguf_file: str | None, transformers_version: str | None) -> str | None:
    """Why a record's prompts were mis-tokenized, or ``None``: for a record made without
    verification, whether its transformers release builds its GGUF's tokenizer wrong."""
    from packaging.version import Version

    known = FAULTY_BUILDS.get(gguf_file or "")
    if known is None or not transformers_version:
        return None
    fixed, what = known
    if Version(transformers_version) >= Version(fixed):
        return None
    return (
        f"transformers {transformers_version} built the tokenizer of {gguf_file} wrong ({what}): "
        f"these prompts were mis-tokenized; re-run with transformers >= {fixed}"
    )


class TokenizerError(RuntimeError):
    """The tokenizer transformers built does not tokenize as the file's algorithm does."""


@dataclass
class GGUFVocab:
    """The ``tokenizer.ggml.*`` fields of a GGUF file."""

    model: str
    pre: str | None
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos_id: int | None
    add_bos: bool
    add_space_prefix: bool
    chat_template: str | None = None
    specials: dict[str, int] = field(default_factory=dict)
    unk_id: int | None = None


def read_vocab(path: str | Path) -> GGUFVocab:
    """The tokenizer fields of the GGUF file at ``path`` (needs the ``gguf`` package); read once
    per process while the file's size and modification time stay the same (opening a GGUF parses
    all its tensors: seconds)."""
    st = Path(path).stat()
    return _read_vocab(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_vocab(path: str, size: int, mtime_ns: int) -> GGUFVocab:
    import numpy as np
    from gguf import GGUFReader

    class Reader(GGUFReader):
        """Reads its fields through a plain ndarray view of the file's memory map: the same
        bytes, without np.memmap's bookkeeping on each of the millions of small slices a
        262k-token vocabulary takes (two thirds of Gemma's parse: 28 s -> 9 s of CPU)."""

        def _get(self, *args, **kwargs):
            if isinstance(self.data, np.memmap):
                self.data = self.data.view(np.ndarray)
            return super()._get(*args, **kwargs)

    fields = Reader(str(path)).fields

    def get(key, default=None):
        return fields[key].contents() if key in fields else default

    tokens, types = get("tokenizer.ggml.tokens"), get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        raise TokenizerError(f"{path}: no tokenizer.ggml.tokens / token_type fields")
    specials = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4) and t}
    return GGUFVocab(
        model=get("tokenizer.ggml.model"),
        pre=get("tokenizer.ggml.pre"),
        tokens=tokens,
        types=types,
        scores=get("tokenizer.ggml.scores"),
        merges=get("tokenizer.ggml.merges"),
        bos_id=get("tokenizer.ggml.bos_token_id"),
        add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", False)),
        chat_template=get("tokenizer.chat_template"),
        specials=specials,
        unk_id=get("tokenizer.ggml.unknown_token_id"),
    )


def probes_for(vocab: GGUFVocab) -> list[str]:
    """:data:`PROBES` plus the chat probes whose special tokens are all in the vocabulary."""
    import regex

    out = list(PROBES)
    for text in CHAT_PROBES:
        names = regex.findall(r"<[^<>\s]+>", text)
        if all(n in vocab.specials for n in names):
            out.append(text)
    return out


def reference_encoder(vocab: GGUFVocab) -> Callable[[str], list[int]]:
    """``encode(text) -> ids`` by an implementation independent of transformers (module doc)."""
    if vocab.model == "llama":
        body = _sentencepiece_encoder(vocab)
    elif vocab.model == "gpt2":
        body = _tiktoken_encoder(vocab)
    else:
        raise TokenizerError(
            f"tokenizer.ggml.model={vocab.model!r}: no independent implementation here "
            "(llama = SentencePiece, gpt2 = byte-level BPE)"
        )
    split = _special_splitter(vocab)
    bos = [vocab.bos_id] if vocab.add_bos and vocab.bos_id is not None else []

    def encode(text: str) -> list[int]:
        ids = list(bos)
        for piece, special in split(text):
            ids.extend([vocab.specials[piece]] if special else body(piece))
        return ids

    return encode


def _special_splitter(vocab: GGUFVocab) -> Callable[[str], list[tuple[str, bool]]]:
    """Split text at the control / user-defined tokens written in it (longest match first)."""
    import regex

    names = sorted(vocab.specials, key=len, reverse=True)
    pattern = regex.compile("|".join(regex.escape(n) for n in names)) if names else None

    def split(text: str) -> list[tuple[str, bool]]:
        if pattern is None:
            return [(text, False)] if text else []
        out, pos = [], 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                out.append((text[pos : m.start()], False))
            out.append((m.group(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], False))
        return out

    return split


def _sentencepiece_encoder(vocab: GGUFVocab) -> Callable[[str], list[int]]:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(vocab.tokens)
    proto.trainer_spec.byte_fallback = 6 in vocab.types
    # One UNKNOWN piece, as SentencePiece requires (before 0.2.3 it refuses a model without):
    # the file's unknown_token_id (Gemma 3's GGUF types its <unk> as control). BOS/EOS/PAD are
    # not SentencePiece's to add here: encode() adds BOS as the file says.
    unk = vocab.unk_id if vocab.unk_id is not None else (vocab.types + [2]).index(2)
    proto.trainer_spec.unk_id = unk
    proto.trainer_spec.bos_id = proto.trainer_spec.eos_id = proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = vocab.add_space_prefix
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    scores = vocab.scores or [0.0] * len(vocab.tokens)
    for i, (tok, ty, sc) in enumerate(zip(vocab.tokens, vocab.types, scores)):
        p = proto.pieces.add()
        p.piece, p.score = tok or f"<empty_{i}>", float(sc)
        p.type = 2 if i == unk else (ty if ty in (1, 3, 4, 5, 6) else 1)
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    return lambda text: list(sp.encode(text)) if text else []


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the published table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _tiktoken_encoder(vocab: GGUFVocab) -> Callable[[str], list[int]]:
    import unicodedata

    import regex
    import tiktoken

    if vocab.pre not in PRE_SPLITS:
        raise TokenizerError(
            f"tokenizer.ggml.pre={vocab.pre!r}: its pre-tokenizer is not written here (known: "
            f"{sorted(PRE_SPLITS)})"
        )
    if not vocab.merges:
        raise TokenizerError("a gpt2 tokenizer without tokenizer.ggml.merges")
    back = {c: b for b, c in _bytes_to_unicode().items()}

    def raw(tok: str) -> bytes:
        return bytes(back[c] for c in tok)

    ranks = {bytes([b]): b for b in range(256)}
    for merge in vocab.merges:
        a, b = merge.split(" ")
        ranks.setdefault(raw(a) + raw(b), len(ranks))
    ids = {raw(t): i for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.types)) if ty in (1, 6)}
    enc = tiktoken.Encoding(
        name=f"gguf-{vocab.pre}", pat_str=r"[\s\S]+", mergeable_ranks=ranks, special_tokens={}
    )
    splits = [regex.compile(p) for p in PRE_SPLITS[vocab.pre]]
    nfc = vocab.pre in _NFC

    def encode(text: str) -> list[int]:
        if nfc:
            text = unicodedata.normalize("NFC", text)
        pieces = [text]
        for pat in splits:
            pieces = [m for p in pieces for m in _split_keep(pat, p)]
        out = []
        for p in pieces:
            for rank in enc.encode_ordinary(p):
                out.append(ids[enc.decode_single_token_bytes(rank)])
        return out

    return encode


def _split_keep(pattern, text: str) -> list[str]:
    """``text`` cut at the pattern's matches, keeping the unmatched stretches as pieces too."""
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


# -- building, verifying and caching -----------------------------------------------------------


def reference_ids(vocab: GGUFVocab) -> dict[str, list[int]]:
    """``{probe: ids}`` by the independent implementation, for :func:`probes_for`."""
    encode = reference_encoder(vocab)
    return {text: encode(text) for text in probes_for(vocab)}


def mismatches(tokenizer, expected: dict[str, list[int]]) -> list[str]:
    """What ``tokenizer`` does differently from ``expected`` (ids with its default special
    tokens, and exact round trips of the text); empty when it agrees."""
    added = list(tokenizer.encode(""))  # what the tokenizer puts before any text (BOS or none)
    out = []
    for text, ids in expected.items():
        got = list(tokenizer.encode(text))
        if got != ids:
            out.append(f"{text!r} -> {got[:24]} where the file's algorithm gives {ids[:24]}")
            continue
        body = got[len(added) :] if got[: len(added)] == added else got
        back = tokenizer.decode(body, skip_special_tokens=False)
        if back != text:
            out.append(f"{text!r} decodes back as {back!r}")
    return out


def fingerprint(tokenizer) -> str:
    """A behavioural fingerprint: the ids of every probe (chat probes included), the size of the
    vocabulary, BOS/EOS and the chat template. Two tokenizers with one fingerprint tokenize the
    probes alike; a run's identity includes it."""
    ids = [list(tokenizer.encode(t)) for t in (*PROBES, *CHAT_PROBES)]
    parts = [ids, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
             getattr(tokenizer, "chat_template", None)]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


@dataclass
class Verified:
    """How a tokenizer was checked (a record's ``tokenizer`` block)."""

    gguf_sha256: str
    fingerprint: str
    reference: str
    probes: int
    transformers: str
    cached: bool
    load_s: float

    def summary(self) -> dict:
        return dict(self.__dict__)


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("transformers", "tokenizers", "sentencepiece", "tiktoken"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def load_verified(gguf_path: str | Path, cache_dir: str | Path, sha256: str | None = None):
    """``(tokenizer, Verified)``: the tokenizer transformers builds from the GGUF file, checked
    against the file's own algorithm (:func:`reference_ids`) and cached under
    ``cache_dir/<sha256[:16]>-v<VERIFY_VERSION>/`` (saved by transformers, reloaded and checked
    again before it is kept). A later load reads the cache and checks the committed probes'
    ids again (seconds). Raises :class:`TokenizerError` naming the transformers version when the
    tokenizer differs from the file's algorithm."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    gguf_path = Path(gguf_path)
    sha = sha256 or files.sha256(gguf_path)
    folder = Path(cache_dir) / f"{sha[:16]}-v{VERIFY_VERSION}"
    meta_file = folder / "verified.json"
    versions = _versions()
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if meta.get("versions", {}).get("transformers") == versions.get("transformers"):
            tok = AutoTokenizer.from_pretrained(folder)
            if not mismatches(tok, meta["expected"]):
                return tok, _verified(tok, sha, meta, True, t0)
            print(f"tokenizer cache {folder} no longer verifies: rebuilding", file=sys.stderr)
    print(f"building and verifying the tokenizer of {gguf_path.name} ...", file=sys.stderr)
    reference, expected = expected_ids(gguf_path)
    tok = build_tokenizer(gguf_path)
    bad = mismatches(tok, expected)
    if bad:
        raise TokenizerError(
            f"transformers {versions.get('transformers')} builds the tokenizer of {gguf_path.name} "
            f"wrong: {len(bad)} of {len(expected)} probe strings differ from {reference}, e.g. "
            f"{bad[0]}. Install a transformers release that builds it right (pip install -U "
            "transformers; pyproject.toml names the tested range)"
        )
    meta = {"gguf": gguf_path.name, "gguf_sha256": sha, "reference": reference,
            "versions": versions, "expected": expected}  # fmt: skip
    _save(tok, folder, meta)
    return tok, _verified(tok, sha, meta, False, t0)


def expected_ids(gguf_path: Path) -> tuple[str, dict[str, list[int]]]:
    """``(name of the independent implementation, {probe: ids})`` for a GGUF file."""
    vocab = read_vocab(gguf_path)
    return _reference_name(vocab), reference_ids(vocab)


def build_tokenizer(gguf_path: Path):
    """The tokenizer transformers builds from the GGUF file (the thing under verification)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def _reference_name(vocab: GGUFVocab) -> str:
    v = _versions()
    if vocab.model == "llama":
        return f"sentencepiece {v.get('sentencepiece')}"
    return f"tiktoken {v.get('tiktoken')} (pre-tokenizer {vocab.pre})"


def _verified(tok, sha: str, meta: dict, cached: bool, t0: float) -> Verified:
    return Verified(
        gguf_sha256=sha, fingerprint=fingerprint(tok), reference=meta["reference"],
        probes=len(meta["expected"]), transformers=meta["versions"].get("transformers"),
        cached=cached, load_s=round(time.perf_counter() - t0, 2),
    )  # fmt: skip


def _save(tok, folder: Path, meta: dict) -> None:
    """Save, reload and check again; keep the folder only if the reloaded tokenizer verifies
    (transformers 5.17's saved Gemma tokenizer reloads character-level)."""
    from transformers import AutoTokenizer

    tmp = files.staging_dir(folder)
    tok.save_pretrained(tmp)
    bad = mismatches(AutoTokenizer.from_pretrained(tmp), meta["expected"])
    if bad:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"not caching the tokenizer: saved and reloaded it differs ({bad[0]})",
              file=sys.stderr)  # fmt: skip
        return
    (tmp / "verified.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
    files.publish_dir(tmp, folder, replace=True)  # a cache that no longer verifies is replaced


# -- the committed tables ----------------------------------------------------------------------

TABLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer_ids"


def write_table(gguf_path: str | Path, name: str, out_dir: Path = TABLES) -> Path:
    """``out_dir/<name>.json``: the file's sha256 and the independent implementation's ids of
    every probe (what the tests hold transformers' tokenizer to)."""
    vocab = read_vocab(gguf_path)
    table = {
        "gguf": Path(gguf_path).name, "gguf_sha256": files.sha256(gguf_path),
        "tokenizer_model": vocab.model, "pre": vocab.pre, "add_bos": vocab.add_bos,
        "bos_id": vocab.bos_id, "reference": _reference_name(vocab),
        "expected": reference_ids(vocab),
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    head = {k: v for k, v in table.items() if k != "expected"}
    lines = [f"  {json.dumps(k, ensure_ascii=False)}: {json.dumps(v)}"
             for k, v in table["expected"].items()]  # fmt: skip
    body = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    path.write_text(body + ',\n "expected": {\n' + ",\n".join(lines) + "\n }\n}\n")
    assert json.loads(path.read_text()) == table
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m eval.tokenizers", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the committed table of expected ids for a GGUF")
    w.add_argument("gguf")
    w.add_argument("name", help="the table's name (the model config's name)")
    c = sub.add_parser("check", help="build, verify and cache the tokenizer of a GGUF")
    c.add_argument("gguf")
    c.add_argument("--cache-dir", default="cache/models/tokenizers")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        print(write_table(args.gguf, args.name))
        return 0
    _, info = load_verified(args.gguf, args.cache_dir)
    print(json.dumps(info.summary(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
