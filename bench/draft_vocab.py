"""Writes a draft model's draft_vocab.json: the tokens it may propose (FR-Spec, Zhao et al. 2025).

A small draft's lm_head is most of what each drafting forward reads (the reference draft: 4096 x 128
of its 0.9M weights). Proposals are almost always frequent tokens, so the draft only scores the N
tokens seen most often in the training split of the reference corpus (bench/stdlib_corpus.py: the
same split train_reference.py trains on; the held-out files are not counted). The engine reads the
file beside the draft's checkpoint (worker/engine/speculation/draft.py); the target's outputs do not
change, only which tokens the draft can propose. The file records the share of training tokens
the list covers.

    .venv/bin/python bench/draft_vocab.py examples/models/pycoder-tiny-draft [--tokens 1024]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import train_files  # noqa: E402

from worker.engine.speculation.draft import DRAFT_VOCAB  # noqa: E402
from worker.engine.tokenizer import Tokenizer  # noqa: E402


def frequent(folder: Path, tokens: int) -> dict:
    """The `tokens` most frequent token ids over the training split (ties: the lower id), sorted, with
    the share of the split's tokens they cover."""
    tok = Tokenizer(folder)
    counts: collections.Counter[int] = collections.Counter()
    for ids in tok.encode_batch(train_files()):
        counts.update(ids)
        counts[min(tok.eos_token_ids)] += 1  # the training streams end every file with EOS
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:tokens]
    total = sum(counts.values())
    return {
        "token_ids": sorted(ranked),
        "coverage": round(sum(counts[t] for t in ranked) / total, 4),
        "source": "bench/draft_vocab.py: most frequent tokens of the stdlib corpus's training split",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="the draft model's checkpoint folder (its tokenizer.json is used)")
    ap.add_argument("--tokens", type=int, default=1024, help="how many tokens the draft may propose")
    args = ap.parse_args()
    if args.tokens < 1:
        raise SystemExit("--tokens must be >= 1")
    out = frequent(args.folder, args.tokens)
    path = args.folder / DRAFT_VOCAB
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out) + "\n")
    tmp.replace(path)
    print(f"wrote {path}: {len(out['token_ids'])} tokens covering {out['coverage']:.1%} of the training split")


if __name__ == "__main__":
    main()
