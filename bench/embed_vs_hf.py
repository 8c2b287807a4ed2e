"""Engine.embed vs transformers (and sentence-transformers) on one random ~30M-parameter Qwen3 embedding
checkpoint (last-token pooling + Normalize, an EOS appended per text, as Qwen3-Embedding), same run.

    .venv/bin/python bench/embed_vs_hf.py                 # 512 texts of 16..512 tokens
    .venv/bin/python bench/embed_vs_hf.py --n 128 --threads 1

transformers gets its best shot: texts sorted by length, right-padded batches of --hf-batch,
AutoModel's last_hidden_state, the last real token per row, normalized. sentence-transformers: its
own `encode` (sorts by length too) with the same batch size. Both agree with freight to 1e-4
(checked). Throughput counts the prompt tokens; CPU time is the fair ratio on a shared machine.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from worker.demo_model import SIZES, add_pooling_config, make_demo_model
from worker.engine import Engine, EngineConfig


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


@torch.no_grad()
def hf_embed(model, tok, texts: list[str], batch: int) -> list[np.ndarray]:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[np.ndarray | None] = [None] * len(texts)
    for k in range(0, len(order), batch):
        idx = order[k : k + batch]
        enc = tok([texts[i] for i in idx], padding=True, return_tensors="pt")
        hidden = model(**enc).last_hidden_state  # [B, L, H], right-padded
        last = enc["attention_mask"].sum(1) - 1
        vecs = torch.nn.functional.normalize(hidden[torch.arange(len(idx)), last], dim=-1)
        for i, v in zip(idx, vecs, strict=True):
            out[i] = v.numpy()
    return out  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=512, help="texts")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--size", default="medium", choices=list(SIZES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    work = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    model_dir = add_pooling_config(make_demo_model(work / "m", "qwen3", size=args.size), "lasttoken",
                                   normalize=True, append_eos=True)  # fmt: skip
    rng = random.Random(0)
    words = ["def", "class", "return", "import", "yield", "lambda", "value", "index", "table", "batch", "token", "shard"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(12, 400))) for _ in range(args.n)]

    engine = Engine.from_pretrained(model_dir, EngineConfig(num_threads=args.threads))
    engine.embed(texts[:4])  # warm-up: kernels built, first-use costs paid
    outs, f_wall, f_cpu = timed(lambda: engine.embed(texts))
    tokens = sum(o.prompt_tokens for o in outs)

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).float().eval()
    hf_embed(model, tok, texts[:4], args.hf_batch)
    hf, h_wall, h_cpu = timed(lambda: hf_embed(model, tok, texts, args.hf_batch))
    err = max(float(np.abs(o.embedding - v).max()) for o, v in zip(outs, hf, strict=True))

    rows = [("freight Engine.embed", f_wall, f_cpu), ("transformers AutoModel", h_wall, h_cpu)]
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cpu")
        st.encode(texts[:4], batch_size=args.hf_batch)
        got, s_wall, s_cpu = timed(lambda: st.encode(texts, batch_size=args.hf_batch, convert_to_numpy=True))
        err = max(err, float(np.abs(np.stack([o.embedding for o in outs]) - got).max()))
        rows.append(("sentence-transformers encode", s_wall, s_cpu))
    except ImportError:
        pass
    print(f"{args.n} texts, {tokens} tokens ({args.size} qwen3, last-token + normalize), "
          f"threads {torch.get_num_threads()}; max |diff| vs freight {err:.1e}")  # fmt: skip
    print(f"{'':30} {'wall s':>8} {'cpu s':>8} {'tok/s':>9} {'x freight (cpu)':>16}")
    for name, wall, cpu in rows:
        print(f"{name:30} {wall:8.2f} {cpu:8.2f} {tokens / wall:9.0f} {cpu / f_cpu:16.2f}")
    assert err < 1e-4, f"embeddings disagree: {err}"


if __name__ == "__main__":
    main()
