"""Serve the trained tiny pair through SGLang 0.5.23's own classes on CPU, keeping the replay
inputs and the target's choices, for tests/probe/test_probe.py (run as a subprocess:
SGLang's set-up patches the process).

    python tests/probe/sglang_serve.py ROOT OUT CASE...

Each case writes OUT/CASE/trace (the replay file) and OUT/CASE/ckpt (the checkpoint as the
engine read it: config.json and model.safetensors). Under ``SPECTRACE=1 SPECTRACE_REPLAY=1``
(one case) no spectrace call is made: the process traces itself, as a server does, and
writes its trace and replay file into ``SPECTRACE_DIR`` at exit.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(root: str, out: str, cases: list[str]) -> None:
    sys.path.insert(0, root)
    torch.set_num_threads(1)
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from spectrace.eagle3.pair import DATA_DIR, load_draft_checkpoint, make_language, sample_language
    from spectrace.hooks.replay_capture import keep_replay, keep_target
    from tests.helpers import sglang_harness as sh

    sh.setup()
    tcfg = json.loads((DATA_DIR / "target_config.json").read_text())
    hf = LlamaConfig(**{k: v for k, v in tcfg.items() if k not in ("architectures", "model_type")})
    from safetensors.torch import load_file

    tstate = {k: v.float() for k, v in load_file(str(DATA_DIR / "target.safetensors")).items()}
    targets = {}  # by capture ids; [-1, 1, 3] is boundaries 0, 2, 4 under SGLang's +1 rule: as trained
    os.makedirs(out + "/target", exist_ok=True)  # the target's folder, for spectrace probe --target
    json.dump(tcfg, open(out + "/target/config.json", "w"))
    save_file({k: v.contiguous() for k, v in load_file(str(DATA_DIR / "target.safetensors")).items()}, out + "/target/model.safetensors")
    seqs = sample_language(make_language(), 4, 64, torch.Generator().manual_seed(7)).tolist()
    tensors, base = load_draft_checkpoint()
    for case in cases:
        config, weights = dict(base), dict(tensors)
        if case == "rope":  # the config the engine read says base 100; the draft was trained at the target's 10000
            config["rope_theta"] = 100.0
        elif case == "style":  # ... says the interleaved (gptj) rotary; trained with the half-split (neox) one
            config["rope_is_neox_style"] = False
        elif case == "vocab":  # d2t saved as arange (draft i -> target 2i); t2d is the trained map
            weights["d2t"] = torch.arange(weights["d2t"].numel(), dtype=weights["d2t"].dtype)
        elif case == "capture":  # ids written for boundary k (speculators' reading); SGLang captures 1, 3, 5
            config["eagle_config"] = dict(config["eagle_config"], eagle_aux_hidden_state_layer_ids=[0, 2, 4])
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        key = tuple(ids)
        if key not in targets:
            targets[key] = sh.build_sglang_llama_target(hf, tstate, layer_ids=ids)
        target = targets[key]
        folder = os.path.join(out, case)
        os.makedirs(folder + "/ckpt")
        os.makedirs(folder + "/trace", exist_ok=True)
        json.dump(config, open(folder + "/ckpt/config.json", "w"))
        save_file({k: v.contiguous() for k, v in weights.items()}, folder + "/ckpt/model.safetensors")
        draft = sh.build_sglang_eagle3_draft(config, {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()})
        draft.set_embed(target.model.embed_tokens.weight)  # the EAGLE worker shares the target's embedding
        live = os.environ.get("SPECTRACE") == "1"
        if not live:
            capture = keep_replay(draft, rows=64)
            tap = keep_target(target, rows=64, capture=capture)
        for seq in seqs:
            # SGLang's prefill, then the draft extend on the ids shifted by one plus the target's next token.
            result = sh.run_target(target, torch.tensor(seq))
            nxt = int(result.next_token_logits[-1].argmax())
            sh.run_draft(draft, torch.tensor(seq[1:] + [nxt]), result.hidden_states)
        if not live:
            tap.remove()
            capture.remove()
            capture.write(folder + "/trace", "trace-h-1.jsonl")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
