"""Writes the real engine's tiny model: a Llama with random weights and a locally trained BPE tokenizer.

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers):
    .venv-vllm/bin/python scripts/tiny_llama.py OUT_DIR [--corpus FILE ...]
Nothing is downloaded: the tokenizer is trained on the given text files (the demo logs' message
texts, read as JSON lines when they parse) plus a built-in seed text, and the weights come from a
seeded ``LlamaForCausalLM(config)``. The directory is written next to OUT_DIR and renamed into place,
so a killed build never leaves a half-written model. ``build.json`` records what was built.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SEED_TEXT = ("The quick brown fox jumps over the lazy dog. 0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ "
             "Please summarize the request, list the steps and explain the risks.")


def corpus_texts(paths: list[Path], limit_chars: int = 4_000_000):
    """Message texts of JSON-lines logs (other files: their lines), up to ``limit_chars`` in all."""
    yield SEED_TEXT
    n = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    msgs = (rec.get("request") or rec).get("messages") or []
                    texts = [m["content"] for m in msgs if isinstance(m, dict) and isinstance(m.get("content"), str)]
                except (ValueError, AttributeError, TypeError):
                    texts = [line]
                for t in texts:
                    n += len(t)
                    yield t
                if n >= limit_chars:
                    return


def build(out: Path, corpus: list[Path], *, vocab_size: int, max_len: int, seed: int) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.time()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_texts(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=max_len)
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=max_len,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    fast.save_pretrained(tmp)
    info = {"vocab_size": len(fast), "max_position_embeddings": max_len, "layers": 4, "hidden_size": 256,
            "params": sum(p.numel() for p in model.parameters()), "seed": seed, "dtype": "bfloat16",
            "corpus": [str(p) for p in corpus], "build_s": round(time.time() - t0, 1)}
    (tmp / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--corpus", type=Path, nargs="*", default=[])
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--max-len", type=int, default=16384, help="max_position_embeddings (vLLM's max-model-len cap)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.corpus if not p.is_file()]
    if missing:
        print(f"corpus file(s) not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    info = build(args.out, args.corpus, vocab_size=args.vocab_size, max_len=args.max_len, seed=args.seed)
    print(f"tiny Llama written to {args.out}: {info['params']:,} parameters, vocab {info['vocab_size']}, "
          f"max_position_embeddings {info['max_position_embeddings']}, {info['build_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
