"""Seeded synthetic post-RoPE Q/K/V with the stripe structures of the paper's Section 2.1.

Real long-context attention maps are a diffuse background crossed by three kinds of fine-grained
lines (paper Section 2.1, Fig. 2a). The generator plants each of them, with its own strength knob,
so the operator study can run anywhere without a model. All strengths are in *logit units*: the
extra ``q . k / sqrt(D)`` a structure adds where it applies.

* **Diffuse background** (``background``): i.i.d. Gaussian q and k whose logits have standard
  deviation ``background``; keys also share a mean direction ``mu`` (``key_mean``), as keys of real
  models do. Alone this gives a flat, dense-looking map.
* **Vertical stripes** (``sink``, ``heavy``, ``n_heavy``): every query carries a direction ``g``;
  key 0 (the attention sink) and ``n_heavy`` random heavy-hitter keys carry ``g`` too, so their
  column gets ``+sink`` (key 0) or ``+heavy * u`` (``u ~ U[0.5, 1]``) in every row. The sink key has
  no content part at all, so its logit is exactly ``sink`` (times the query scale below) in every
  row, as the sink of a trained model dominates every row.
* **Slash stripes** (``slash``, ``n_slash``): (1) locality through RoPE: q and k share a content
  vector ``c`` before the rotation, so ``q_i . k_j`` contains
  ``sum_p |c_p|^2 cos((i - j) theta_p)``, a function of the relative position that peaks at
  ``i = j`` and decays; ``c`` uses only the RoPE pairs whose period is below ``LOCALITY_PERIOD``
  tokens, so the band is narrow and adds no long-range bias;
  (2) ``n_slash`` fixed offsets ``delta`` per head (drawn in ``[1, L/2]``): every token ``t`` has a
  random unit content ``e_t`` added to its key, and query ``i`` carries ``e_{i - delta}``, so the
  diagonal ``j = i - delta`` lights up (a "look back delta tokens" head). ``slash`` is the logit
  added on every one of these diagonals.
* **Horizontal stripes** (``horizontal``, ``frac_horizontal``): a random ``frac_horizontal`` of the
  queries are scaled by ``1 + horizontal`` (their softmax is sharper: they attend sharply to the
  stripes above) and moved ``horizontal`` logit units along ``mu`` (their whole row of scores is
  high; S2O's ``Q_perm`` ranks exactly these queries first).

Two structures measured on real captures (``eval/calibrate.py``) and off by default (strength 0):

* **Topics** (``topics``, ``n_topics``, ``topic_span``, ``topic_frac``): the text is a sequence of
  regions of ``topic_span`` tokens, each about one of ``n_topics`` topics (drawn per region, shared
  by all heads of a batch element). A random ``topic_frac`` of the keys of each region carry the
  region's topic direction ``u_z`` (one unit content per topic and KV head); every query carries
  the topic of its own region. So the rows of a tile share their important far keys, and those keys
  are single tokens scattered over the earlier regions of the same topic (clustered by region, not
  contiguous): on SmolLM2's captures the rows of a 128-row tile share their top far keys
  (``tile_share``) and those keys fall in fewer key blocks than random tokens would
  (``block_scatter``) without forming runs. ``topics`` is the logit a topic key adds to a query of
  its topic. With ``topic_balance`` the regions' topics are dealt so that every topic has the same
  number of regions (give or take one), in a random order, instead of drawn independently: at
  L=4096 and spans of ~200 tokens there are only ~20 regions for 8 topics, all heads share them,
  so with independent draws how many earlier regions share a query's topic moves every head's
  statistics at once from one draw to the next (on the pooled fit's knobs the sink mass of one
  draw's median head spans 0.09-0.28 over seeds 0-7, 0.13-0.21 balanced).
* **Drift** (``drift``, ``drift_len``): a slowly varying content ``r_t`` (an AR(1) sequence over
  positions with correlation ``exp(-|i - j| / drift_len)``, spread over all content dims, no RoPE)
  is added to both q and k, so ``q_i . k_j`` gains ``drift * exp(-|i - j| / drift_len)`` on
  average: a broad locality band like the one measured on real captures (the logit excess decays
  over hundreds of tokens), whose far-key spread is only about ``drift / sqrt(D)``, not the fast
  RoPE pairs' oscillation of ``slash``.

A third, ``head_temp``, makes the heads unequally sharp, as a real layer's heads are (on SmolLM2 the
share of keys holding 90% of a row's mass spans 0.3% to 14% within one layer): query head ``h``'s
whole query (every structure's logit) is scaled by ``exp(head_temp * z_h)``, ``z`` deterministic
normal quantiles of unit spread dealt to the heads at random.

All three draw from their own generator (seeded from ``seed``), so turning them on leaves every
other structure's tensors unchanged (``head_temp`` then scales the whole query), and with all
three off the tensors are bit for bit those of the generator before they were added
(``tests/test_synthetic_pin.py``).

The sink/heavy direction ``g`` and the key-mean direction ``mu`` live in two reserved RoPE pairs
(the two lowest frequencies, no rotation applied to them) that the random contents avoid, so a
strength is the logit it adds and not a random multiple of it (a strong key in a random direction
would add cross-talk noise of the order of its own strength to every row).

Per head, the heavy-hitter keys, horizontal queries and directions are drawn independently; query
heads of one GQA group share the keys and values. V is standard Gaussian. Everything is drawn on the
CPU from one ``torch.Generator`` seeded with ``seed``, so a spec gives the same tensors on every
machine; the result is then cast and moved.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

LOCALITY_PERIOD = 64  # RoPE pairs with a shorter period carry the locality content (band width)


@dataclass(frozen=True)
class SyntheticSpec:
    """Shapes, seed and structure strengths (logit units) of a synthetic Q/K/V set."""

    L: int = 4096
    batch: int = 1
    heads_q: int = 8
    heads_kv: int = 2
    head_dim: int = 128
    seed: int = 0
    background: float = 0.5
    key_mean: float = 0.5
    sink: float = 12.0
    heavy: float = 5.0
    n_heavy: int = 16
    slash: float = 4.0
    n_slash: int = 1
    horizontal: float = 1.0
    frac_horizontal: float = 0.02
    rope_base: float = 10000.0
    topics: float = 0.0  # 0: no topic structure
    n_topics: int = 8
    topic_span: int = 256
    topic_frac: float = 0.1
    topic_balance: bool = False  # True: every topic gets the same number of regions (+-1)
    drift: float = 0.0  # 0: no drift band
    drift_len: float = 128.0
    head_temp: float = 0.0  # 0: every head equally sharp

    def __post_init__(self):
        if self.heads_kv <= 0 or self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q={self.heads_q} must be a multiple of heads_kv={self.heads_kv}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.L <= 0 or self.batch <= 0:
            raise ValueError(f"L={self.L} and batch={self.batch} must be positive")
        if not 0.0 <= self.frac_horizontal <= 1.0:
            raise ValueError(f"frac_horizontal={self.frac_horizontal} must be in [0, 1]")
        if not 0.0 <= self.topic_frac <= 1.0:
            raise ValueError(f"topic_frac={self.topic_frac} must be in [0, 1]")
        if self.n_topics <= 0 or self.topic_span <= 0:
            raise ValueError(
                f"n_topics={self.n_topics} and topic_span={self.topic_span} must be positive"
            )
        if self.drift_len <= 0:
            raise ValueError(f"drift_len={self.drift_len} must be positive")
        if self.topics < 0 or self.drift < 0 or self.head_temp < 0:
            raise ValueError(
                f"topics={self.topics}, drift={self.drift} and head_temp={self.head_temp} must "
                "be >= 0 (0: off)"
            )


def rope_angles(L: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``theta [D/2]`` and ``angle [L, D/2] = position * theta`` (Llama-style half-split RoPE)."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return theta, torch.arange(L, dtype=torch.float64)[:, None] * theta[None, :]


def apply_rope(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., L, D]`` by ``angle [L, D/2]`` (pairs ``(d, d + D/2)``)."""
    half = x.shape[-1] // 2
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _reserved(D: int) -> tuple[int, int, int, int]:
    """Dims of the two lowest-frequency RoPE pairs: ``g`` uses the first pair, ``mu`` the second."""
    return D // 2 - 1, D - 1, D // 2 - 2, D - 2


def _content(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Gaussian entries, zero in the reserved dims (a RoPE rotation keeps them zero)."""
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    x[..., list(_reserved(shape[-1]))] = 0.0
    return x


def _unit(g: torch.Generator, *shape: int) -> torch.Tensor:
    x = _content(g, *shape)
    return x / x.norm(dim=-1, keepdim=True)


def _axis(D: int, dim: int) -> torch.Tensor:
    x = torch.zeros(D, dtype=torch.float64)
    x[dim] = 1.0
    return x


def _slashes(spec: SyntheticSpec, g: torch.Generator):
    """RoPE content ``c [D]`` (``|c|^2 = slash sqrt(D)``), token contents ``e [L, D]``, offsets."""
    D, L = spec.head_dim, spec.L
    theta = rope_angles(1, D, spec.rope_base)[0].repeat(2)
    c = _content(g, D) * (2 * math.pi / theta < LOCALITY_PERIOD)  # fast pairs only: a narrow band
    c = c / c.norm() * math.sqrt(spec.slash * math.sqrt(D))
    e = _unit(g, L, D) * math.sqrt(spec.slash * math.sqrt(D))
    offsets = torch.randint(1, max(2, L // 2), (spec.n_slash,), generator=g)
    return c, e, offsets


def _kv_head(spec: SyntheticSpec, g: torch.Generator, angle):
    """Pre-RoPE keys, post-RoPE additions and per-head structure for one KV head."""
    L, D = spec.L, spec.head_dim
    root = D**0.25
    c, e, offsets = _slashes(spec, g)
    vert, mu = _axis(D, _reserved(D)[0]), _axis(D, _reserved(D)[2])
    k = _content(g, L, D) * math.sqrt(spec.background)
    k = apply_rope(k + c, angle) + spec.key_mean * root * mu + e
    heavy_pos = torch.randperm(L, generator=g)[: spec.n_heavy]
    u = 0.5 + 0.5 * torch.rand(spec.n_heavy, generator=g, dtype=torch.float64)
    k[heavy_pos] += (spec.heavy * u * root)[:, None] * vert
    k[0] = spec.key_mean * root * mu + spec.sink * root * vert  # a pure sink: no content
    return k, (c, e, offsets, mu, vert)


def _q_head(spec: SyntheticSpec, g: torch.Generator, angle, shared) -> torch.Tensor:
    L, D = spec.L, spec.head_dim
    root = D**0.25
    c, e, offsets, mu, vert = shared
    q = _content(g, L, D) * math.sqrt(spec.background)
    q = apply_rope(q + c, angle) + root * vert
    for delta in offsets.tolist():
        q[delta:] += e[: L - delta]
    n_h = round(spec.frac_horizontal * L)
    rows = torch.randperm(L, generator=g)[:n_h]
    q[rows] = q[rows] * (1.0 + spec.horizontal) + spec.horizontal * root * mu
    return q


def _ar1(g: torch.Generator, L: int, D: int, length: float) -> torch.Tensor:
    """``r [L, D]``, zero in the reserved dims, ``E[r_i . r_j] = exp(-|i - j| / length)``.

    ``r_t = rho r_{t-1} + sqrt(1 - rho^2) xi_t`` with ``rho = exp(-1 / length)`` and ``xi_t`` of
    unit expected norm, computed chunk by chunk: inside a chunk ``r_t`` is ``rho^(t-s+1) r_{s-1}``
    plus a discounted cumulative sum (chunks of at most ``16 length`` keep the discounts within
    ``e^16`` of each other, far from float64's limits)."""
    xi = _content(g, L, D)
    xi = xi / math.sqrt(D - 4)  # E|xi_t|^2 = 1 over the D - 4 content dims
    rho = math.exp(-1.0 / length)
    r = torch.empty_like(xi)
    prev = xi[0]
    r[0] = prev
    chunk = max(1, min(1024, int(16 * length)))
    c = math.sqrt(1.0 - rho * rho)
    for s in range(1, L, chunk):
        e = min(L, s + chunk)
        n = torch.arange(e - s, dtype=torch.float64)
        up = rho ** (-n)  # rho^-(u - s)
        acc = torch.cumsum(xi[s:e] * up[:, None], dim=0) * (rho**n)[:, None]
        r[s:e] = rho ** (n + 1)[:, None] * prev + c * acc
        prev = r[e - 1]
    return r


def _topics_and_drift(spec: SyntheticSpec, g: torch.Generator, regions: torch.Tensor):
    """Post-RoPE additions ``(dk [L, D], dq [L, D])`` of one KV head: topics and drift."""
    L, D = spec.L, spec.head_dim
    dk = torch.zeros(L, D, dtype=torch.float64)
    dq = torch.zeros(L, D, dtype=torch.float64)
    if spec.topics > 0:
        scale = math.sqrt(spec.topics * math.sqrt(D))
        u = _unit(g, spec.n_topics, D) * scale
        z = regions[torch.arange(L) // spec.topic_span]
        carries = torch.rand(L, generator=g, dtype=torch.float64) < spec.topic_frac
        carries[0] = False  # the sink stays pure
        dk[carries] += u[z[carries]]
        dq += u[z]
    if spec.drift > 0:
        r = _ar1(g, L, D, spec.drift_len) * math.sqrt(spec.drift * math.sqrt(D))
        r[0] = 0.0  # the sink stays pure
        dk += r
        dq += r
    return dk, dq


def _head_factors(heads: int, spread: float, g: torch.Generator) -> torch.Tensor:
    """``exp(spread * z_h)`` per query head: ``z`` are the normal quantiles at ``(i + 0.5) / heads``
    scaled to unit standard deviation (so the heads' log-sharpness has standard deviation
    ``spread`` at any head count), dealt to the heads in a random order; one head: 1."""
    if heads == 1:
        return torch.ones(1, dtype=torch.float64)
    normal = torch.distributions.Normal(0.0, 1.0)
    z = normal.icdf((torch.arange(heads, dtype=torch.float64) + 0.5) / heads)
    z = z / z.std(unbiased=False)
    return (spread * z[torch.randperm(heads, generator=g)]).exp()


def _regions(spec: SyntheticSpec, g: torch.Generator) -> torch.Tensor:
    """The topic of each region of ``topic_span`` tokens: drawn independently, or with
    ``topic_balance`` dealt so that every topic has the same number of regions (+-1)."""
    n_regions = -(-spec.L // spec.topic_span)
    if not spec.topic_balance:
        return torch.randint(spec.n_topics, (n_regions,), generator=g)
    dealt = torch.arange(n_regions) % spec.n_topics
    return dealt[torch.randperm(n_regions, generator=g)]


def synthetic_qkv(
    spec: SyntheticSpec, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-RoPE Q ``[batch, heads_q, L, head_dim]``, K and V ``[batch, heads_kv, L, head_dim]``."""
    g = torch.Generator().manual_seed(spec.seed)
    _, angle = rope_angles(spec.L, spec.head_dim, spec.rope_base)
    group = spec.heads_q // spec.heads_kv
    shape_kv = (spec.batch, spec.heads_kv, spec.L, spec.head_dim)
    q = torch.empty(spec.batch, spec.heads_q, spec.L, spec.head_dim, dtype=torch.float64)
    k, v = torch.empty(shape_kv, dtype=torch.float64), torch.empty(shape_kv, dtype=torch.float64)
    g_new = torch.Generator().manual_seed(2**32 + spec.seed)  # topics and drift only
    for b in range(spec.batch):
        regions = _regions(spec, g_new)
        for h in range(spec.heads_kv):
            k[b, h], shared = _kv_head(spec, g, angle)
            v[b, h] = torch.randn(spec.L, spec.head_dim, generator=g, dtype=torch.float64)
            for j in range(group):
                q[b, h * group + j] = _q_head(spec, g, angle, shared)
            if spec.topics > 0 or spec.drift > 0:
                dk, dq = _topics_and_drift(spec, g_new, regions)
                k[b, h] += dk
                q[b, h * group : (h + 1) * group] += dq
    if spec.head_temp > 0:
        q *= _head_factors(spec.heads_q, spec.head_temp, g_new)[None, :, None, None]
    return tuple(t.to(dtype=dtype, device=device) for t in (q, k, v))


def spec_from_cfg(cfg: dict) -> SyntheticSpec:
    """A :class:`SyntheticSpec` from the ``data`` config (other keys are ignored)."""
    names = set(asdict(SyntheticSpec()))
    return SyntheticSpec(**{k: v for k, v in cfg.items() if k in names})
