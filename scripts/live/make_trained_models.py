"""Writes spectrace's trained tiny pair (spectrace/eagle3/data) as two model folders a server loads:
an HF Llama target (tiny-llama) and a SpecForge-format EAGLE-3 draft (tiny-eagle3).
Usage: python make_trained_models.py OUT_DIR [--ids -1,1,3] [--no-lm-head] [--no-d2t]
The draft was trained on boundaries [0, 2, 4] (embedding, block 1, block 3 outputs), SpecForge ids
[-1, 1, 3]; --ids overrides what its config asks the target to capture. No tokenizer: serve with
--skip-tokenizer-init and send input_ids (demo.json's prompts, vocabulary 128).
Needs torch and safetensors only (the GPU image has both); reads the data by path, imports no spectrace."""

import argparse
import json
import os
import shutil

from safetensors.torch import load_file, save_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "spectrace", "eagle3", "data")

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--ids", default="", help="aux layer ids for the draft config (default: as trained)")
p.add_argument("--no-lm-head", action="store_true")
p.add_argument("--no-d2t", action="store_true")
a = p.parse_args()

target_dir = os.path.join(a.out, "tiny-llama")
os.makedirs(target_dir, exist_ok=True)
config = json.load(open(os.path.join(DATA, "target_config.json")))
config.update(torch_dtype="float16", bos_token_id=1, eos_token_id=2)
json.dump(config, open(os.path.join(target_dir, "config.json"), "w"), indent=1)
shutil.copyfile(os.path.join(DATA, "target.safetensors"), os.path.join(target_dir, "model.safetensors"))

draft_dir = os.path.join(a.out, "tiny-eagle3")
os.makedirs(draft_dir, exist_ok=True)
tensors = load_file(os.path.join(DATA, "draft.safetensors"))
if a.no_lm_head:
    del tensors["lm_head.weight"]  # the config keeps draft_vocab_size: SGLang keeps a random head
if a.no_d2t:
    del tensors["d2t"]
save_file(tensors, os.path.join(draft_dir, "model.safetensors"))
draft = json.load(open(os.path.join(DATA, "draft_config.json")))
if a.ids:
    draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [int(x) for x in a.ids.split(",")]
draft.update(torch_dtype="float16", bos_token_id=1, eos_token_id=2)
json.dump(draft, open(os.path.join(draft_dir, "config.json"), "w"), indent=1)
print("wrote", target_dir, draft_dir, "ids", draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"], "tensors", sorted(tensors))
