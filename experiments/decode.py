"""Greedy decoding of one prompt for the accuracy job: one prefill forward, then one token per
forward from a ``DynamicCache``, without ``model.generate``.

Why not ``model.generate``: with ``stop_strings`` it builds a ``StopStringCriteria`` on every call,
which preprocesses the whole vocabulary (1.6 s per sample with Gemma 3's 262K tokens), and each
call also copies and validates the generation config, builds its logits processors and stopping
criteria, and prepares the cache and the inputs. Here the loop is a few lines around the model's
forward.

What it does (:func:`greedy_decode`), the same as ``generate(do_sample=False, num_beams=1,
max_new_tokens=N)`` with a dense cache:

- **prefill**: ONE forward over the whole prompt from an empty ``DynamicCache`` (built from the
  model's text config, as ``generate`` builds it), with an all-ones attention mask and
  ``logits_to_keep=1``, so only the last position's logits exist (a 32K x 152K logits tensor is
  never built). It must be one forward: :func:`s2o.hf.sparse_prefill` detects the prefill as query
  length = key length and refuses a chunked one;
- **decode**: one token per forward with the cache, greedy argmax over the fp32 logits (ties go to
  the lowest id, as ``torch.argmax`` and ``generate``), at most ``max_new_tokens`` tokens in all
  (so at most ``max_new_tokens - 1`` decode forwards: no forward runs after the last token);
- **stops** after a token that is an EOS id of ``model.generation_config.eos_token_id`` (an int or
  a list; the tokenizer's ``eos_token_id`` when the generation config has none). The EOS token is
  returned with the new tokens, as ``generate`` returns it (``skip_special_tokens=True`` drops it
  from the text);
- **stop strings**: after each new token, stops once a stop string occurs in the text of the new
  tokens (``tokenizer.decode(new, skip_special_tokens=True)``); the caller cuts the answer at the
  first occurrence. While the new tokens are few the whole text is decoded; after that only a tail
  window of them (``TAIL`` tokens plus 4 per character of the longest stop string, so a stop
  string spanning several tokens is still caught), and a hit there is confirmed on the whole text.
  Only a stop string spread over more than the window (tokens that decode to nothing) could be
  missed there, which would end decoding later, not change the cut answer.

These are the budgets of RULER, InfiniteBench and LongBench v2 (the task's ``max_new_tokens``, EOS,
the job's ``benchmark.stop``): stop strings only end decoding early, they never change the scored
answer, which is the text before the first stop string either way. ``generate``'s
``StopStringCriteria`` stops once a stop string ends inside the last token (also strictly inside
one token), which is where this loop stops too. Where the two can differ (none arises with the
job's models and its single-character stops):

- ``StopStringCriteria`` matches on the whole sequence, the prompt included: a multi-character
  stop string that the prompt starts and the first new token completes (``\n\n`` after a prompt
  ending in ``\n``) stops ``generate`` after one token, with an answer that holds no stop string.
  This loop looks at the new tokens only and decodes on;
- ``StopStringCriteria`` matches each token's own string (special tokens by their text), this loop
  the decoded text with special tokens skipped (what the caller cuts);
- with no EOS in the model's generation config, ``generate`` has none; this loop takes the
  tokenizer's;
- ``generate`` applies the logits processors its generation config asks for even when greedy
  (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``bad_words_ids``,
  forced BOS/EOS, ...): this loop refuses such a config (``ValueError`` naming the setting) instead
  of decoding differently.

``tests/test_decode.py`` checks the token ids against ``model.generate`` (tiny random Llama, Qwen2
and Gemma 3 text models, prompts that end on EOS and prompts that run to ``max_new_tokens``; with
stop strings on a small offline tokenizer, the ids and the cut text), one prefill forward inside
``sparse_prefill`` and ``logits_to_keep``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

# A stop string is looked for in the decoded text of the last TAIL + 4 * (longest stop string)
# new tokens once there are more; fewer are decoded whole.
TAIL = 64

# Generation-config settings with which ``generate`` would change the greedy argmax (logits
# processors it applies without sampling) or stop differently, and the values that do nothing.
_NEUTRAL = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "exponential_decay_length_penalty": (None,), "guidance_scale": (None, 1.0),
    "watermarking_config": (None,), "remove_invalid_values": (None, False),
    "stop_strings": (None,), "max_time": (None,),
}  # fmt: skip


@dataclass(frozen=True)
class Greedy:
    """One prompt's greedy decode.

    Attributes:
        tokens: the new token ids, 1-D int64 on the CPU (the EOS that ended decoding included).
        prefill_ms: the prefill forward and its argmax, between two ``sync()`` calls.
        decode_ms: the decode loop after it (its forwards, argmaxes and stop checks).
        decode_steps: decode forwards (one token each): ``len(tokens) - 1``.
        stopped: ``"eos"``, ``"stop_string"`` or ``"max_new_tokens"``.
    """

    tokens: torch.Tensor
    prefill_ms: float
    decode_ms: float
    decode_steps: int
    stopped: str

    @property
    def total_ms(self) -> float:
        """The whole loop: prefill and decode."""
        return self.prefill_ms + self.decode_ms


def eos_ids(model, tokenizer=None) -> frozenset[int]:
    """The EOS ids that end decoding: ``model.generation_config.eos_token_id`` (int or list),
    else the tokenizer's ``eos_token_id``; empty when neither has one."""
    gc = getattr(model, "generation_config", None)
    eos = None if gc is None else gc.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return frozenset(int(e) for e in ([eos] if isinstance(eos, int) else eos))


def check_generation_config(model) -> None:
    """Refuse a generation config with which ``generate``'s greedy output would differ from a
    plain argmax (a logits processor, a stop rule of its own): ``ValueError`` naming it."""
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return
    bad = {}
    for key, neutral in _NEUTRAL.items():
        value = getattr(gc, key, None)
        if not any(value is n or (n is not None and value == n) for n in neutral):
            if not (isinstance(value, (list, tuple, dict)) and not value):  # empty: nothing
                bad[key] = value
    if bad:
        raise ValueError(
            f"the model's generation_config sets {bad}: model.generate would apply it even when "
            "greedy, experiments.decode's plain argmax would not; unset it (e.g. "
            "model.generation_config.repetition_penalty = None) to decode greedily"
        )


class _StopStrings:
    """Whether a stop string occurs in the decoded text of the new tokens (see the module)."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        if tokenizer is None:
            raise ValueError("stop strings need the tokenizer (to decode the new tokens)")
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.window = TAIL + 4 * max(len(s) for s in self.stop)

    def _in(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(s in text for s in self.stop)

    def hit(self, tokens: list[int]) -> bool:
        if len(tokens) <= self.window:
            return self._in(tokens)
        return self._in(tokens[-self.window :]) and self._in(tokens)


_CACHE_KW: dict[type, str] = {}


def _cache_kw(model) -> str:
    """The forward's cache keyword: ``cache`` from transformers 5.24, ``past_key_values`` before
    (5.24 still takes ``past_key_values``, with a deprecation warning on every call)."""
    cls = type(model)
    if cls not in _CACHE_KW:
        params = inspect.signature(model.forward).parameters
        _CACHE_KW[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[cls]


def _no_sync() -> None:
    return None


def greedy_decode(
    model, input_ids: torch.Tensor, max_new_tokens: int, *, tokenizer=None,
    stop: Iterable[str] = (), sync: Callable[[], None] | None = None,
) -> Greedy:  # fmt: skip
    """Greedy decoding of one prompt (see the module): a prefill forward, then one forward per
    token, until EOS, a stop string or ``max_new_tokens``.

    Args:
        model: a transformers causal LM in eval mode.
        input_ids: ``[1, L]`` prompt ids on the model's device.
        max_new_tokens: at most this many new tokens (>= 1).
        tokenizer: decodes the new tokens for ``stop``; its ``eos_token_id`` is the EOS when the
            model's generation config has none.
        stop: stop strings (the caller cuts the answer at the first one).
        sync: called before each clock reading (``torch.cuda.synchronize`` on a GPU); no-op if None.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [1, L] with L >= 1, got {tuple(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_generation_config(model)
    from transformers import DynamicCache

    sync = sync or _no_sync
    stop = list(stop)
    stops = _StopStrings(tokenizer, stop) if stop else None
    eos = eos_ids(model, tokenizer)
    kw = _cache_kw(model)
    length = input_ids.shape[1]

    with torch.inference_mode():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        positions = torch.arange(length, length + max_new_tokens, device=input_ids.device)[None]
        sync()
        t0 = time.perf_counter()
        out = model(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=True,
            logits_to_keep=1, **{kw: cache},
        )  # fmt: skip
        nxt = out.logits[:, -1].float().argmax(dim=-1)
        del out
        tokens = [int(nxt)]
        sync()
        t1 = time.perf_counter()
        steps = 0
        while True:
            if tokens[-1] in eos:
                stopped = "eos"
                break
            if stops is not None and stops.hit(tokens):
                stopped = "stop_string"
                break
            if len(tokens) >= max_new_tokens:
                stopped = "max_new_tokens"
                break
            out = model(
                input_ids=nxt[:, None], position_ids=positions[:, steps : steps + 1],
                use_cache=True, logits_to_keep=1, **{kw: cache},
            )  # fmt: skip
            steps += 1
            nxt = out.logits[:, -1].float().argmax(dim=-1)
            del out
            tokens.append(int(nxt))
        sync()
        t2 = time.perf_counter()
    return Greedy(
        tokens=torch.tensor(tokens, dtype=torch.long), prefill_ms=(t1 - t0) * 1e3,
        decode_ms=(t2 - t1) * 1e3, decode_steps=steps, stopped=stopped,
    )  # fmt: skip
