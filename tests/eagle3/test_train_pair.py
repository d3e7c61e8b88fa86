"""The development script that trains the shipped pair: a short run writes files the
package's own loaders read (the package itself never trains)."""

from __future__ import annotations

import os

import torch

from tests.helpers import paths
from tests.helpers.scripts import load_script

ROOT = str(paths.ROOT)


def _script():
    return load_script(os.path.join(ROOT, "scripts", "train_pair.py"))


def test_a_short_training_run_writes_a_pair_the_loaders_read(tmp_path):
    from spectrace.eagle3.pair import clear_caches, demo_prompts, load_draft, load_target_model

    train = _script()
    plan = train.TrainPlan(target_steps=2, target_batch=2, draft_steps=2, nbr_steps=1, draft_batch=2, seq_len=16)
    report = train.train_all(tmp_path, plan=plan, log=False)
    assert report["weights_bytes"] > 0
    try:
        target = load_target_model(tmp_path)
        draft = load_draft(data_dir=tmp_path)
        assert draft.load_report.ignored == [] and "fc.weight" in draft.load_report.offered
        ids = torch.tensor([demo_prompts(tmp_path)[0]])
        assert target(ids).logits.shape[-1] == 128
    finally:
        clear_caches()


def test_the_package_holds_no_training_code():
    import spectrace.eagle3.pair as pair

    assert not any(hasattr(pair, name) for name in ("train_all", "train_target", "train_draft", "main"))
