"""Train freight's reference model: a small Llama on the Python standard library's source.

No model hub is reachable from freight's machines, so the quality of quantization (and the demo) is
judged on a model this script trains itself, on a real corpus every machine has.

Corpus: every `*.py` file of the running interpreter's standard library (`sysconfig` "stdlib"),
skipping site-packages, test suites (`test/`, `tests/`), idlelib and the files that are data rather
than code (`encodings/`: codec tables, one commented literal per line, 13% of the bytes, which
teach a model to answer "#\n#\n#"; `pydoc_data/`: help text; `html/entities.py`;
`_sysconfigdata*`), read as UTF-8. The split is
fixed and independent of file order: a file is held out when the first byte of
sha256(its path relative to the stdlib, POSIX separators) is below 26 (about 10% of files);
everything else trains the tokenizer and the model. `heldout_files()` is the definition
bench/quant_quality.py reuses for perplexity.

Model: LlamaForCausalLM (hidden 256, 4 layers, 8 query heads over 4 KV heads, MLP 768, context 256,
untied 4096-token embeddings; about 5.3M parameters: 10.5 MB in fp16, under the 20 MB the repo
allows a committed model), a byte-level BPE tokenizer of its own (4096 tokens) in which every
newline is a token of its own (worker.demo_model.train_byte_level_bpe, isolate_newlines), so a
prompt ending in "\n" is followed by indentation as it is in the corpus. Forward and backward run
under bf16 autocast (fp32 master weights and loss; AMX / AVX512-BF16 make a step cheaper than fp32;
`--measure 5` prints the seconds per step). Deterministic: fixed seeds, fixed thread count, deterministic torch
algorithms, a fixed batch order from a seeded generator. The result (fp16 safetensors, tokenizer, a
chat template) is written in Hugging Face format so freight's engine and transformers both load it.
The defaults train a model of pycoder-tiny's shape on the corpus alone, and make the tokenizer every
committed model uses. Corpus training alone does not teach a model to copy in context (below), so the
committed pair is made in a chain of runs; each checkpoint's training.json holds its loss, step
count, seconds and the runs it started from:

    DRAFT_SHAPE="--num-layers 2 --hidden-size 128 --intermediate-size 384 --num-heads 4 --num-kv-heads 2"
    # 1. a model of the draft's shape learns to copy (random-token repeat windows), keeps those
    #    weights, then reads the corpus with 30% copy windows (the draft's starting point)
    .venv/bin/python bench/train_reference.py --output /tmp/draft-copy $DRAFT_SHAPE \
        --tokenizer-from examples/models/pycoder-tiny --copy-warmup 3000 --save-warmup /tmp/draft-warm \
        --copy-fraction 0.3 --lr 2e-3
    # 2. the target: the warmed-up weights grown into the default shape, then the corpus; then a
    #    short fine-tune with more copy windows
    .venv/bin/python bench/train_reference.py --output /tmp/target-grown \
        --grow-from /tmp/draft-warm --tokenizer-from examples/models/pycoder-tiny --copy-fraction 0.3 --lr 2e-3
    .venv/bin/python bench/train_reference.py --output /tmp/target-copy \
        --init-from /tmp/target-grown --copy-fraction 0.7 --steps 300 --warmup 20 --lr 1e-3
    # 3. fine-tunes with text repeat windows (`--copy-text`: a corpus stretch over and over, where
    #    only several tokens of context say where to copy from)
    .venv/bin/python bench/train_reference.py --output /tmp/target-text-1 --init-from /tmp/target-copy \
        --copy-text 0.5 --copy-fraction 0.3 --steps 400 --warmup 20 --lr 2e-3
    for i in 2 3 4; do  # the last one is examples/models/pycoder-tiny
        .venv/bin/python bench/train_reference.py --output /tmp/target-text-$i --init-from /tmp/target-text-$((i - 1)) \
            --copy-text 0.6 --copy-fraction 0.3 --steps 500 --warmup 20 --lr 1e-3
    done
    # 4. the draft: step 1's model distilled from /tmp/target-copy, then on text repeats from
    #    target-text-2, then from target-text-4
    .venv/bin/python bench/train_reference.py --output /tmp/draft-17 $DRAFT_SHAPE --init-from /tmp/draft-copy \
        --distill-from /tmp/target-copy --copy-fraction 0.3 --steps 600 --lr 1e-3
    .venv/bin/python bench/train_reference.py --output /tmp/draft-text-2 $DRAFT_SHAPE --init-from /tmp/draft-17 \
        --distill-from /tmp/target-text-2 --copy-text 0.5 --copy-fraction 0.3 --steps 800 --warmup 20 --lr 1e-3
    .venv/bin/python bench/train_reference.py --output examples/models/pycoder-tiny-draft $DRAFT_SHAPE \
        --init-from /tmp/draft-text-2 --distill-from /tmp/target-text-4 --copy-text 0.5 --copy-fraction 0.3 \
        --steps 800 --warmup 20 --lr 1e-3
    .venv/bin/python bench/train_reference.py --measure 5      # seconds per step, then exit

`--distill-from` trains on the target's next-token distribution (forward KL, the target's logits
computed in the same step) instead of the corpus' next tokens: a draft is judged by how often it
agrees with its target, not with the data (DistillSpec, Zhou et al. 2023).

`--init-from DIR` starts from a checkpoint of the same shape (a fine-tune; its training.json is kept
in the new one's). Windows that repeat their own text (bench/copy_windows.py): `--copy-fraction F`
mixes in corpus spans repeated once and random-token repeats, `--copy-text F` corpus stretches
repeated over and over (what teaches greedy copying beyond one token). `--copy-warmup N` first trains
on random-token repeats only, at a constant `--copy-warmup-lr`, until their loss falls below
`--copy-warmup-until` (or N steps): ln(4096) = 8.3 for a plateau of a thousand steps or more, then a
fall once the model has an induction head (a model of the draft's shape leaves the plateau; one of
the target's shape stays on it far longer, hence `--grow-from`). `--save-warmup DIR` keeps the warm-up's weights, config
and tokenizer. `--grow-from DIR` grows a smaller checkpoint (such as a warm-up's) into this run's
shape computing the same function (bench/grow_model.py): the target inherits the draft's induction
circuit instead of waiting out the plateau. Every run records in training.json the held-out loss on
a span and on its repeat (`copy_losses`, also printed every `--report-every` steps): equal losses
mean the model cannot copy in context. The corpus and its split live in bench/stdlib_corpus.py.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from copy_windows import copy_batch, copy_losses, warm_up
from reference_checkpoint import grow_from, init_from, provenance, save, save_weights
from stdlib_corpus import EOS, HELDOUT_THRESHOLD, heldout_files, token_stream, train_files
from train_step import step as train_step

SPECIAL_TOKENS = [EOS, "<|user|>", "<|assistant|>", "<|system|>"]


@dataclass(frozen=True)
class TrainConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 768  # divisible by 128: every Linear's K fits int4 group 32/64/128
    context: int = 256  # tokens per training window (and max_position_embeddings)
    batch_size: int = 16  # windows per step: 4096 tokens
    steps: int = 1600  # 6.6M tokens, ~1 epoch of the filtered corpus (`--measure 5`: CPU seconds a step)
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    seed: int = 1234
    threads: int = 1  # on a busy 2-core machine two threads spin-wait on each other (--measure shows it)
    bf16: bool = True  # autocast forward/backward to bf16 (fp32 master weights, loss and optimizer)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads and num_heads by num_kv_heads")
        if self.steps <= self.warmup:
            raise ValueError(f"steps ({self.steps}) must exceed warmup ({self.warmup})")


def train_tokenizer(texts: list[str], vocab_size: int):
    from worker.demo_model import train_byte_level_bpe

    return train_byte_level_bpe(texts, vocab_size, SPECIAL_TOKENS, isolate_newlines=True)


def build_model(cfg: TrainConfig, eos_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.context * 2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / (cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=Path("examples/models/pycoder-tiny"))
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--warmup", type=int, default=TrainConfig.warmup)
    ap.add_argument("--threads", type=int, default=TrainConfig.threads)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    ap.add_argument("--measure", type=int, default=0, help="time this many steps, print, exit")
    ap.add_argument("--num-layers", type=int, default=TrainConfig.num_layers)
    ap.add_argument("--hidden-size", type=int, default=TrainConfig.hidden_size)
    ap.add_argument("--intermediate-size", type=int, default=TrainConfig.intermediate_size)
    ap.add_argument("--num-heads", type=int, default=TrainConfig.num_heads)
    ap.add_argument("--num-kv-heads", type=int, default=TrainConfig.num_kv_heads)
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="reuse this checkpoint's tokenizer.json (a draft model shares its target's tokenizer)")
    ap.add_argument("--distill-from", type=Path, default=None,
                    help="a teacher checkpoint (the draft's target): train on its next-token distribution")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this checkpoint's weights and tokenizer (same shape) instead of random ones")
    ap.add_argument("--grow-from", type=Path, default=None,
                    help="start from this smaller checkpoint grown into this shape (bench/grow_model.py: the "
                         "same function at step 0, e.g. a draft that copies grown into the target's shape)")
    ap.add_argument("--copy-fraction", type=float, default=0.0,
                    help="share of each batch's windows that repeat a span of their own text (bench/copy_windows.py)")
    ap.add_argument("--copy-text", type=float, default=0.0,
                    help="share of windows that repeat a corpus stretch over and over (text_repeat_window)")
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--copy-warmup", type=int, default=0,
                    help="before the corpus, up to this many steps on random-token repeat windows only "
                         "(bench/copy_windows.py): what taught a fresh model to copy by content")
    ap.add_argument("--copy-warmup-lr", type=float, default=1e-3, help="the warm-up's constant learning rate")
    ap.add_argument("--copy-warmup-until", type=float, default=1.5,
                    help="end the warm-up early once its mean loss over 20 steps falls below this (nats; "
                         "a window's first period is unpredictable: ~14%% of its tokens at 8.3, a floor of ~1.15)")
    ap.add_argument("--save-warmup", type=Path, default=None,
                    help="also write the weights as the warm-up left them (DIR/model.safetensors, fp32, the "
                         "run's tokenizer.json and DIR/training.json) for a later --init-from or --grow-from")
    ap.add_argument("--report-every", type=int, default=200,
                    help="print the held-out span / repeat losses every this many corpus steps")
    args = ap.parse_args()
    cfg = TrainConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        steps=args.steps,
        batch_size=args.batch_size,
        warmup=args.warmup,
        lr=args.lr,
        threads=args.threads,
        bf16=not args.fp32,
    )

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    texts = train_files()
    if args.init_from and args.grow_from:
        raise SystemExit("pass --init-from (the same shape) or --grow-from (a smaller one), not both")
    tok_from = args.tokenizer_from or args.init_from or args.grow_from
    if tok_from is not None and not (tok_from / "tokenizer.json").is_file():
        raise SystemExit(f"{tok_from} has no tokenizer.json: pass the tokenizer its weights are indexed by "
                         "with --tokenizer-from")
    if tok_from is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_from / "tokenizer.json"))
    else:
        tok = train_tokenizer(texts, cfg.vocab_size)
    data = token_stream(tok, texts)
    print(
        f"corpus: {len(texts)} train files, {data.numel()} tokens; tokenizer {time.time() - t0:.0f}s",
        flush=True,
    )

    model = build_model(cfg, tok.token_to_id(EOS))
    if args.init_from is not None:
        init_from(args.init_from, model)
    grown = args.grow_from and grow_from(args.grow_from, model)
    if grown:
        print(f"grown from {args.grow_from}: {grown}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    teacher = None
    if args.distill_from is not None:
        from transformers import LlamaForCausalLM

        teacher = LlamaForCausalLM.from_pretrained(args.distill_from, dtype=torch.float32).eval()
        if teacher.config.vocab_size != cfg.vocab_size:
            raise SystemExit(f"--distill-from {args.distill_from}: vocabulary {teacher.config.vocab_size} "
                             f"!= the draft's {cfg.vocab_size}; pass the teacher's tokenizer with --tokenizer-from")
    gen = torch.Generator().manual_seed(cfg.seed)
    heldout = None if args.measure else token_stream(tok, [text for _, text in heldout_files()])
    warm = None
    if args.copy_warmup and not args.measure:
        model.train()
        warm = warm_up(lambda batch, lr: train_step(model, opt, batch, lr, cfg.bf16), cfg.batch_size, cfg.context + 1,
                       cfg.vocab_size, gen, steps=args.copy_warmup, lr=args.copy_warmup_lr, ramp=cfg.warmup,
                       until=args.copy_warmup_until)  # fmt: skip
    if warm and args.save_warmup:
        save_weights(model, tok, args.save_warmup, {"copy_warmup": warm, "command": sys.argv[1:]})
    n_steps = args.measure or cfg.steps
    model.train()
    t_start = time.time()
    for step in range(n_steps):
        starts = torch.randint(0, data.numel() - cfg.context - 1, (cfg.batch_size,), generator=gen)
        idx = starts[:, None] + torch.arange(cfg.context + 1)  # (B, T+1)
        batch = copy_batch(data[idx], data, args.copy_fraction, gen, cfg.vocab_size, args.copy_text)
        loss = train_step(model, opt, batch, lr_at(step, cfg), cfg.bf16, teacher)
        if step % 10 == 0 or step == n_steps - 1:
            el = time.time() - t_start
            print(
                f"step {step:5d} loss {loss.item():.4f} lr {lr_at(step, cfg):.2e} "
                f"{el / (step + 1):.2f}s/step elapsed {el:.0f}s",
                flush=True,
            )
        if args.report_every and step % args.report_every == args.report_every - 1 and not args.measure:
            model.eval()
            first, again = copy_losses(model, heldout)
            model.train()
            print(f"step {step:5d} held-out loss: a span {first:.3f}, its repeat {again:.3f}", flush=True)
    if args.measure:
        return
    model.eval()
    first, again = copy_losses(model, heldout)
    print(f"held-out loss: a span {first:.3f}, its repeat {again:.3f}", flush=True)
    meta = {
        "config": cfg.__dict__,
        "parameters": n_params,
        "train_files": len(texts),
        "train_tokens": int(data.numel()),
        "objective": "cross entropy on the corpus" if teacher is None else f"KL to {args.distill_from.name}",
        "final_loss": round(loss.item(), 4),
        "copy_fraction": args.copy_fraction,
        "copy_text": args.copy_text,
        "init_from": args.init_from and provenance(args.init_from),
        "grow_from": args.grow_from and {**provenance(args.grow_from), "shape": grown},
        "copy_warmup": warm,
        "heldout_loss": {"span": round(first, 4), "repeat": round(again, 4)},
        "train_seconds": round(time.time() - t_start),
        "torch": torch.__version__,
        "heldout_rule": f"sha256(relpath)[0] < {HELDOUT_THRESHOLD}",
        "command": sys.argv[1:],
    }
    save(model, tok, cfg.context, args.output, meta)
    print(f"saved to {args.output}", flush=True)


if __name__ == "__main__":
    main()
