"""Writes spectrace's trained tiny pair (spectrace/eagle3/data) as two model folders a server loads:
an HF Llama target (tiny-llama) and a SpecForge-format EAGLE-3 draft (tiny-eagle3).
Usage: python make_trained_models.py OUT_DIR [--ids -1,1,3] [--no-lm-head] [--no-d2t]
    [--d2t-arange] [--draft-vocab-null] [--rope-theta X] [--rope-style gptj] [--pad-block]
--d2t-arange: d2t holds arange(draft_vocab) (absolute ids written where offsets belong: draft id i
maps to target id 2i); --draft-vocab-null: the draft config says "draft_vocab_size": null;
--rope-theta X: the draft config's rope_theta is X (the draft was trained at the shipped value);
--rope-style gptj: the draft config says "rope_is_neox_style": false (trained with the neox rotary).
--pad-block: the target gets a no-op block in front (its o_proj and down_proj are zero, so the
residual stream passes unchanged: the same function, one layer more). Its boundary 1 is then the
embedding, which SGLang 0.5.17's Llama, unable to capture boundary 0, can capture: ids [0, 2, 4]
(its +1 rule: boundaries [1, 3, 5]) feed the draft exactly what it was trained on, and the
config states those boundaries in the padded target's numbering.
The draft was trained on boundaries [0, 2, 4] (embedding, block 1, block 3 outputs), SpecForge ids
[-1, 1, 3]; --ids overrides what its config asks the target to capture. No tokenizer: serve with
--skip-tokenizer-init and send input_ids (demo.json's prompts, vocabulary 128).
Needs torch and safetensors only (the GPU image has both); reads the data by path, imports no spectrace."""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "spectrace", "eagle3", "data")

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--ids", default="", help="aux layer ids for the draft config (default: as trained)")
p.add_argument("--no-lm-head", action="store_true")
p.add_argument("--no-d2t", action="store_true")
p.add_argument("--d2t-arange", action="store_true", help="d2t = arange(draft_vocab): target id 2i")
p.add_argument("--draft-vocab-null", action="store_true", help='config "draft_vocab_size": null')
p.add_argument("--rope-theta", type=float, default=None, help="the draft config's rope_theta")
p.add_argument("--rope-style", choices=("neox", "gptj"), default=None, help="the draft config's rope_is_neox_style")
p.add_argument("--pad-block", action="store_true", help="a no-op block in front of the target (boundary 1 = embedding)")
a = p.parse_args()

target_dir = os.path.join(a.out, "tiny-llama")
os.makedirs(target_dir, exist_ok=True)
config = json.load(open(os.path.join(DATA, "target_config.json")))
config.update(torch_dtype="float16", bos_token_id=1, eos_token_id=2)
if a.pad_block:
    state = load_file(os.path.join(DATA, "target.safetensors"))
    padded = {}
    for key, value in state.items():
        parts = key.split(".")
        if key.startswith("model.layers."):
            parts[2] = str(int(parts[2]) + 1)
        padded[".".join(parts)] = value
    for key, value in state.items():
        if key.startswith("model.layers.0."):
            zero = key.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight"))
            padded[key] = torch.zeros_like(value) if zero else value.clone()
    config["num_hidden_layers"] += 1
    save_file(padded, os.path.join(target_dir, "model.safetensors"))
else:
    shutil.copyfile(os.path.join(DATA, "target.safetensors"), os.path.join(target_dir, "model.safetensors"))
json.dump(config, open(os.path.join(target_dir, "config.json"), "w"), indent=1)

draft_dir = os.path.join(a.out, "tiny-eagle3")
os.makedirs(draft_dir, exist_ok=True)
tensors = load_file(os.path.join(DATA, "draft.safetensors"))
if a.no_lm_head:
    del tensors["lm_head.weight"]  # the config keeps draft_vocab_size: SGLang keeps a random head
if a.no_d2t:
    del tensors["d2t"]
elif a.d2t_arange:
    tensors["d2t"] = torch.arange(tensors["d2t"].shape[0], dtype=tensors["d2t"].dtype)
save_file(tensors, os.path.join(draft_dir, "model.safetensors"))
draft = json.load(open(os.path.join(DATA, "draft_config.json")))
if a.pad_block:  # the same trained inputs, in the padded target's numbering (SpecForge ids: block k's output)
    draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 2, 4]
    draft["trained_aux_layer_ids"] = [0, 2, 4]
    draft["trained_aux_boundaries"] = [1, 3, 5]
if a.ids:
    draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [int(x) for x in a.ids.split(",")]
if a.rope_style is not None:
    draft["rope_is_neox_style"] = a.rope_style == "neox"
if a.draft_vocab_null:
    draft["draft_vocab_size"] = None
if a.rope_theta is not None:
    draft["rope_theta"] = a.rope_theta
    if isinstance(draft.get("rope_parameters"), dict):
        draft["rope_parameters"]["rope_theta"] = a.rope_theta
draft.update(torch_dtype="float16", bos_token_id=1, eos_token_id=2)
json.dump(draft, open(os.path.join(draft_dir, "config.json"), "w"), indent=1)
print("wrote", target_dir, draft_dir, "ids", draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"], "tensors", sorted(tensors))
