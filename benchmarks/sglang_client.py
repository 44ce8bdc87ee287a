"""Runs SGLang's own benchmark client (``sglang.benchmark.serving``) unchanged, recording its schedule.

Run with ``.venv-sglang/bin/python`` (see scripts/sglang_venv.sh). Two additions, neither of which
changes what the client does: ``--make-tokenizer DIR`` trains a tiny local BPE tokenizer (no hub
downloads here) and saves it with ``PreTrainedTokenizerFast.save_pretrained``; and every
inter-arrival gap the client draws (its ``np.random.exponential`` calls) is written to the JSON
file named by ``$SGLANG_GAPS_OUT`` at exit, so its intended schedule can be checked against the
server's arrival log exactly.
"""
from __future__ import annotations

import atexit
import json
import os
import runpy
import sys


def make_tokenizer(out_dir: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = ("the model serves tokens from a cache while the queue grows and batches decode quickly "
             "under load with prefill chunks and memory limits for every request in the benchmark").split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out_dir)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-tokenizer":
        make_tokenizer(sys.argv[2])
        return
    import numpy as np

    drawn: list[float] = []
    original = np.random.exponential

    def recording_exponential(*args, **kwargs):
        value = original(*args, **kwargs)
        drawn.append(float(value))
        return value

    np.random.exponential = recording_exponential
    out = os.environ.get("SGLANG_GAPS_OUT")
    if out:
        atexit.register(lambda: open(out, "w").write(json.dumps(drawn)))
    sys.argv = ["sglang.benchmark.serving", *sys.argv[1:]]
    runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
