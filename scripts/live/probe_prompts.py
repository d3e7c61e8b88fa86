"""Prompts for ``spectrace probe`` on the trained tiny pair, served live (mode ``probe``).

Usage: python probe_prompts.py OUT.json [--n 4] [--length 128] [--max-new 64]

The first N prompts are sequences of the pair's own language (the sampler it was trained on,
seed 7, as tests/probe serves them), LENGTH ids each: sent one at a time first, they are the
forwards ``SPECTRACE_REPLAY`` keeps (the first 4 from position 0), and their rows where the
text is the target's own greedy choice are the ones the probe judges. demo.json's prompts
follow, for the accept length. Needs torch and the repository on the path.
"""

import argparse
import json

import torch

from spectrace.eagle3.pair import demo_prompts, make_language, sample_language

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--n", type=int, default=4)
p.add_argument("--length", type=int, default=128)
p.add_argument("--max-new", type=int, default=64)
a = p.parse_args()
seqs = sample_language(make_language(), a.n, a.length, torch.Generator().manual_seed(7)).tolist()
with open(a.out, "w", encoding="utf-8") as fh:
    json.dump({"prompts": seqs + demo_prompts(), "max_new_tokens": a.max_new}, fh)
print("prompts", a.out, [len(s) for s in seqs], "then", len(demo_prompts()), "demo prompts")
