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

**Several prompts at once** (:func:`greedy_decode_batch`): each prompt is prefilled alone
(:func:`prefill`: batch 1, unpadded, as the sparse methods need), then the caches are merged into
one left-padded batch and decoded together, one forward per step for every row still decoding,
each row with its own positions, padding mask and stops. A small model's decode step is bound by
the host (the forward's Python, not the GPU), so B rows cost about one row's step: the accuracy
job's ``decode_batch``. Each row's tokens equal :func:`greedy_decode`'s up to the padded batch's
numerics (equal in fp32 on the CPU; on a GPU a batched matmul may round differently).

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
        decode_ms: the decode loop after it (its forwards, argmaxes and stop checks); in a
            batch (:func:`greedy_decode_batch`) the row's share of the batch's decode time.
        decode_steps: decode forwards (one token each): ``len(tokens) - 1``.
        stopped: ``"eos"``, ``"stop_string"`` or ``"max_new_tokens"``.
        batch: the rows decoded together (:func:`greedy_decode_batch`); 1 alone.
    """

    tokens: torch.Tensor
    prefill_ms: float
    decode_ms: float
    decode_steps: int
    stopped: str
    batch: int = 1

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


def _check_ids(input_ids: torch.Tensor) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [1, L] with L >= 1, got {tuple(input_ids.shape)}")


def _rules(model, tokenizer, stop: Iterable[str]):
    """What ends decoding: the stop-string check (or None), the EOS ids, and the forward's cache
    keyword; the generation config checked (:func:`check_generation_config`)."""
    check_generation_config(model)
    stop = list(stop)
    return (
        _StopStrings(tokenizer, stop) if stop else None,
        eos_ids(model, tokenizer),
        _cache_kw(model),
    )


def _check_max_new(max_new_tokens) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


@dataclass
class Prefilled:
    """One prompt after its prefill forward (:func:`prefill`), ready to decode alone or with
    others (:func:`greedy_decode_batch`, which takes its cache: ``cache`` is None after it).

    Attributes:
        cache: the ``DynamicCache`` the prefill filled (batch 1).
        next_ids: ``[1]`` the first new token (the prefill's argmax), on the model's device.
        length: prompt tokens.
        max_new_tokens: at most this many new tokens, the first included.
        prefill_ms: the prefill forward and its argmax, between two ``sync()`` calls.
    """

    cache: object
    next_ids: torch.Tensor
    length: int
    max_new_tokens: int
    prefill_ms: float

    @property
    def first(self) -> int:
        return int(self.next_ids[0])


def prefill(
    model, input_ids: torch.Tensor, max_new_tokens: int, *, sync: Callable[[], None] | None = None
) -> Prefilled:
    """The prefill forward of one prompt (see the module): ``[1, L]`` ids from an empty
    ``DynamicCache``, all-ones attention mask, ``logits_to_keep=1``; its argmax is the first new
    token."""
    _check_ids(input_ids)
    _check_max_new(max_new_tokens)
    check_generation_config(model)
    from transformers import DynamicCache

    sync = sync or _no_sync
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=True,
            logits_to_keep=1, **{_cache_kw(model): cache},
        )  # fmt: skip
        nxt = out.logits[:, -1].float().argmax(dim=-1)
        del out
    sync()
    ms = (time.perf_counter() - t0) * 1e3
    return Prefilled(cache, nxt, int(input_ids.shape[1]), max_new_tokens, ms)


def _stop_reason(tokens: list[int], eos: frozenset[int], stops, max_new_tokens: int) -> str | None:
    """Why decoding ends after ``tokens`` (EOS, a stop string, the budget), or None."""
    if tokens[-1] in eos:
        return "eos"
    if stops is not None and stops.hit(tokens):
        return "stop_string"
    if len(tokens) >= max_new_tokens:
        return "max_new_tokens"
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
    _check_ids(input_ids)
    _check_max_new(max_new_tokens)
    sync = sync or _no_sync
    stops, eos, kw = _rules(model, tokenizer, stop)
    length = input_ids.shape[1]

    with torch.inference_mode():
        p = prefill(model, input_ids, max_new_tokens, sync=sync)
        cache, nxt = p.cache, p.next_ids
        positions = torch.arange(length, length + max_new_tokens, device=input_ids.device)[None]
        tokens = [int(nxt)]
        t1 = time.perf_counter()
        steps = 0
        while (stopped := _stop_reason(tokens, eos, stops, max_new_tokens)) is None:
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
        tokens=torch.tensor(tokens, dtype=torch.long), prefill_ms=p.prefill_ms,
        decode_ms=(t2 - t1) * 1e3, decode_steps=steps, stopped=stopped,
    )  # fmt: skip


def _merge(items: Sequence[Prefilled], model):
    """One ``DynamicCache`` for the batch of ``items``' caches, left-padded to the longest prompt
    (the cache a batched prefill of the left-padded prompts would hold, pads as zero keys and
    values), with the ``[B, longest + budget]`` padding mask (1 = a real token) and each row's
    prompt length. The items' own caches are consumed: each layer's tensors are dropped once
    copied (the memory peak is the batch's cache plus one layer), then ``cache = None``."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    lmax = max(p.length for p in items)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    sources = [p.cache.layers for p in items]
    if any(len(s) != len(sources[0]) for s in sources) or len(cache.layers) != len(sources[0]):
        raise ValueError("greedy_decode_batch: the prompts' caches have different layer counts")
    for li in range(len(sources[0])):  # every layer checked before any is consumed
        layers = [s[li] for s in sources]
        kind = type(layers[0])
        if kind not in (DynamicLayer, DynamicSlidingWindowLayer) or any(
            type(layer) is not kind for layer in layers
        ) or type(cache.layers[li]) is not kind:  # fmt: skip
            raise NotImplementedError(
                f"greedy_decode_batch: layer {li} caches with {kind.__name__}; only DynamicLayer "
                "and DynamicSlidingWindowLayer caches are merged into a batch"
            )
        for p, layer in zip(items, layers):
            n = 0 if layer.keys is None else layer.keys.shape[-2]
            full = kind is DynamicLayer
            if layer.keys is None or layer.keys.shape[0] != 1 or n > p.length or (
                full and n != p.length
            ):  # fmt: skip
                raise ValueError(
                    f"greedy_decode_batch: layer {li} holds {n} positions of a {p.length}-token "
                    "prompt: not a fresh prefill's cache"
                )
    for li in range(len(sources[0])):
        layers = [s[li] for s in sources]
        keys = [layer.keys for layer in layers]
        vals = [layer.values for layer in layers]
        m = max(k.shape[-2] for k in keys)  # full layers: lmax; sliding: at most the window
        shape = (len(items), keys[0].shape[1], m, keys[0].shape[-1])
        k_all, v_all = keys[0].new_zeros(shape), vals[0].new_zeros(shape)
        for r, (k, v) in enumerate(zip(keys, vals)):  # each row's positions end at lmax
            n = k.shape[-2]
            k_all[r, :, m - n :] = k[0]
            v_all[r, :, m - n :] = v[0]
        del keys, vals
        for layer in layers:  # consumed: freed layer by layer, so the peak is one layer's copy
            layer.keys = layer.values = None
        if lmax > m:  # a sliding layer: the positions before its window count, as zeros
            z = k_all.new_zeros((*shape[:2], lmax - m, shape[-1]))
            cache.update(z, z, li)
            del z
        cache.update(k_all, v_all, li)
    for p in items:
        p.cache = None
    budget = max(p.max_new_tokens for p in items)
    mask = torch.zeros(len(items), lmax + budget, dtype=torch.long, device=items[0].next_ids.device)
    for r, p in enumerate(items):
        mask[r, lmax - p.length :] = 1
    lengths = torch.tensor([p.length for p in items], device=mask.device)
    return cache, mask, lmax, lengths


def greedy_decode_batch(
    model, items: Sequence[Prefilled], *, tokenizer=None, stop: Iterable[str] = (),
    sync: Callable[[], None] | None = None,
) -> list[Greedy]:  # fmt: skip
    """Greedy decoding of several prefilled prompts (:func:`prefill`, one at a time, so that each
    prefill stays unpadded batch 1, as the sparse methods need) in one batch of decode forwards:
    the caches merged left-padded (:func:`_merge`), one forward per step for the rows still
    decoding, each row with its own positions and padding mask, its own EOS / stop-string /
    ``max_new_tokens`` stop (the rules of :func:`greedy_decode`); a row that stops leaves the batch.
    The host's work per step (the forward's Python, the argmax's copy, the stop checks) is paid
    once per step for all rows: what a small model's decode is bound by.

    Each row's tokens are those :func:`greedy_decode` gives on the same prompt up to the
    numerics of a padded batch (pad keys masked; a batched matmul may round differently on a
    GPU): ``tests/test_decode.py`` checks equality on the CPU in fp32.

    Returns one :class:`Greedy` per item, in order: ``prefill_ms`` the item's own; ``decode_ms``
    its share of the batch's decode wall time (each step's time split evenly over the rows in
    it, the merge counted in the first step), so the shares sum to the batch's time; ``batch``
    the rows that entered the batched decode (items that stop at their first token never do).
    """
    items = list(items)
    if not items:
        raise ValueError("greedy_decode_batch: no prompts")
    if any(not isinstance(p, Prefilled) or p.cache is None for p in items):
        raise ValueError("greedy_decode_batch takes fresh prefill() results (each used once)")
    sync = sync or _no_sync
    stops, eos, kw = _rules(model, tokenizer, stop)
    tokens = [[p.first] for p in items]
    why = [_stop_reason(t, eos, stops, p.max_new_tokens) for t, p in zip(tokens, items)]
    share, steps = [0.0] * len(items), [0] * len(items)
    active = [i for i, w in enumerate(why) if w is None]
    for i, w in enumerate(why):
        if w is not None:
            items[i].cache = None
    batch = len(active)
    with torch.inference_mode():
        if active:
            sync()
            t = time.perf_counter()
            cache, mask, lmax, lengths = _merge([items[i] for i in active], model)
            nxt = torch.cat([items[i].next_ids for i in active])
            step = 0
            while active:
                out = model(
                    input_ids=nxt[:, None], attention_mask=mask[:, : lmax + step + 1],
                    position_ids=(lengths + step)[:, None], use_cache=True, logits_to_keep=1,
                    **{kw: cache},
                )  # fmt: skip
                nxt = out.logits[:, -1].float().argmax(dim=-1)
                del out
                new = nxt.tolist()
                sync()
                now = time.perf_counter()
                for r, i in enumerate(active):
                    share[i] += (now - t) * 1e3 / len(active)
                    tokens[i].append(new[r])
                    steps[i] += 1
                    why[i] = _stop_reason(tokens[i], eos, stops, items[i].max_new_tokens)
                t, step = now, step + 1
                keep = [r for r, i in enumerate(active) if why[i] is None]
                if len(keep) < len(active):
                    active = [active[r] for r in keep]
                    if not active:
                        break
                    idx = torch.tensor(keep, device=nxt.device)
                    cache.batch_select_indices(idx)
                    mask, lengths, nxt = mask[idx], lengths[idx], nxt[idx]
            del cache
    return [
        Greedy(
            tokens=torch.tensor(tok, dtype=torch.long),
            prefill_ms=p.prefill_ms,
            decode_ms=share[i],
            decode_steps=steps[i],
            stopped=why[i],
            batch=batch if steps[i] else 1,
        )  # fmt: skip
        for i, (tok, p) in enumerate(zip(tokens, items))
    ]
