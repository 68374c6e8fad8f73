"""RULER's QA tasks: a SQuAD v2 (``qa_1``) or HotpotQA (``qa_2``) question over its gold
paragraph(s) hidden among distractor documents (NVIDIA/RULER ``scripts/data/synthetic/qa.py``).

Data: the official dev files (SQuAD v2 ``dev-v2.0.json``, HotpotQA
``hotpot_dev_distractor_v1.json``) from ``benchmark.data.squad`` / ``benchmark.data.hotpotqa``, or
the same sets from the hub through ``datasets`` when those paths are not given.

Randomness, as RULER: sample ``i`` asks question ``i``; its distractor documents are drawn from the
sample's stream (RULER's module-level ``random``), and the chosen documents (gold first) are
shuffled with a fresh ``random.Random(seed)`` (:func:`~.common.fixed_shuffle`), the same
permutation for every sample: at one number of documents, the gold document of a SQuAD question
lands at the same position in every sample.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .common import PromptFormat, fit_sample, fit_size, fixed_shuffle
from .templates import DOCUMENT, FAMILIES

HUB_IDS = {"squad": "rajpurkar/squad_v2", "hotpotqa": "hotpotqa/hotpot_qa"}
HOW_TO_GET = {
    "squad": "SQuAD v2 dev: dev-v2.0.json from the SQuAD site "
    "(rajpurkar.github.io/SQuAD-explorer), "
    "then benchmark.data.squad=PATH (conf/local/), or `pip install datasets` with hub access "
    "(rajpurkar/squad_v2, validation)",
    "hotpotqa": "HotpotQA dev (distractor): hotpot_dev_distractor_v1.json from the HotpotQA site "
    "(hotpotqa.github.io), then benchmark.data.hotpotqa=PATH (conf/local/), or `pip install "
    "datasets` with hub access (hotpotqa/hotpot_qa, distractor, validation)",
}


def _squad_from_articles(articles: list[dict]) -> tuple[list[dict], list[str]]:
    docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
    doc_id = {d: i for i, d in enumerate(docs)}
    qas = []
    for a in articles:
        same_article = [doc_id[p["context"]] for p in a["paragraphs"]]
        for p in a["paragraphs"]:
            me = doc_id[p["context"]]
            for q in p["qas"]:
                if not q.get("is_impossible", not q["answers"]):
                    qas.append(
                        dict(
                            query=q["question"],
                            outputs=[x["text"] for x in q["answers"]],
                            context=[me],
                            more_context=[i for i in same_article if i != me],
                        )
                    )
    return qas, docs


def _hotpot_from_items(items: list[dict]) -> tuple[list[dict], list[str]]:
    def doc(title, sents):
        return f"{title}\n{''.join(sents)}"

    docs = sorted({doc(t, s) for d in items for t, s in d["context"]})
    doc_id = {d: i for i, d in enumerate(docs)}
    qas = [
        dict(
            query=d["question"],
            outputs=[d["answer"]],
            context=[doc_id[doc(t, s)] for t, s in d["context"]],
            more_context=[],
        )
        for d in items
    ]
    return qas, docs


def _read_json(path: Path, dataset: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: line {e.lineno}: not valid JSON ({e.msg}); expected the "
            f"official {dataset} dev file"
        ) from e


def load_qa(dataset: str, path: str | None = None) -> tuple[list[dict], list[str]]:
    """(questions, documents) of SQuAD v2 dev or HotpotQA dev in RULER's form."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist. {HOW_TO_GET[dataset]}")
        raw = _read_json(p, dataset)
        try:
            return (
                _squad_from_articles(raw["data"]) if dataset == "squad" else _hotpot_from_items(raw)
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{p}: not in the official {dataset} format ({e!r})") from e
    return _from_hub(dataset)


def _from_hub(dataset: str):
    try:
        import datasets
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            f"no local file and no `datasets` package. {HOW_TO_GET[dataset]}"
        ) from e
    try:
        if dataset == "squad":
            rows = datasets.load_dataset(HUB_IDS["squad"], split="validation")
            by_title: dict[str, dict] = {}
            for r in rows:
                art = by_title.setdefault(r["title"], {"paragraphs": {}})
                par = art["paragraphs"].setdefault(
                    r["context"], {"context": r["context"], "qas": []}
                )
                par["qas"].append(
                    {
                        "question": r["question"],
                        "is_impossible": not r["answers"]["text"],
                        "answers": [{"text": t} for t in r["answers"]["text"]],
                    }
                )
            return _squad_from_articles(
                [{"paragraphs": list(a["paragraphs"].values())} for a in by_title.values()]
            )
        rows = datasets.load_dataset(HUB_IDS["hotpotqa"], "distractor", split="validation")
        items = [
            {
                "question": r["question"],
                "answer": r["answer"],
                "context": list(zip(r["context"]["title"], r["context"]["sentences"])),
            }
            for r in rows
        ]
        return _hotpot_from_items(items)
    except Exception as e:  # no hub access: say what to download
        raise FileNotFoundError(
            f"could not load {dataset} from the hub ({e}). {HOW_TO_GET[dataset]}"
        ) from e


def make_task_text(qa: dict, docs: list[str], num_docs: int, rng: random.Random, seed: int) -> str:
    gold, more = qa["context"], qa["more_context"]
    if num_docs < len(docs):
        if num_docs - len(gold) > len(more):
            taken = set(gold + more)
            others = [i for i in range(len(docs)) if i not in taken]
            chosen = gold + more + rng.sample(others, max(0, num_docs - len(gold) - len(more)))
        else:
            chosen = gold + rng.sample(more, max(0, num_docs - len(gold)))
        picked = [docs[i] for i in chosen]
    else:
        picked = (docs * (num_docs // len(docs) + 1))[:num_docs]
    fixed_shuffle(picked, seed)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(picked))
    return FAMILIES["qa"].template.format(context=context, query=qa["query"])


def generate(
    args: dict, length: int, fmt: PromptFormat, n: int, seed: int, path: str | None = None
) -> list[dict]:
    fam = FAMILIES["qa"]
    qas, docs = load_qa(args["dataset"], path)
    if n > len(qas):
        raise ValueError(f"{args['dataset']}: n={n} > {len(qas)} answerable questions")
    budget = length - fam.tokens_to_generate

    def full(i: int, size: int, rng: random.Random) -> str:
        return fmt.render(make_task_text(qas[i], docs, size, rng, seed)) + fam.answer_prefix

    probe = fmt.n_tokens(full(0, 10, random.Random(f"{seed}-fit")))
    size = fit_size(
        lambda s: fmt.n_tokens(full(0, s, random.Random(f"{seed}-fit"))),
        budget,
        10,
        int(budget * 10 / max(probe, 1)),
    )
    rng = random.Random(seed)
    samples = []
    for index in range(n):  # sample i asks question i, as RULER does
        state = rng.getstate()

        def make(s: int, state=state, index=index):
            rng.setstate(state)
            text = full(index, s, rng)
            return text, text

        text, _, tok, used = fit_sample(make, fmt.n_tokens, size, budget, 10, args["dataset"])
        samples.append(
            dict(
                index=index,
                input=text[: len(text) - len(fam.answer_prefix)],
                answer_prefix=fam.answer_prefix,
                outputs=qas[index]["outputs"],
                prompt_tokens=tok,
                haystack_size=used,
            )
        )
    return samples
