"""The rules leaf: what spectrace knows about engines and trainers, and what each finding
means. It imports nothing of spectrace but :mod:`spectrace.records`, and no torch, so
checks, the audit and the viewers share one copy of each rule.

- :mod:`.conventions`: layer-index conventions of the trainers and engines, default ids,
  SGLang's versioned capture rules;
- :mod:`.readings`: what a draft's config.json says it was trained on;
- :mod:`.catalogue`: every finding code with its severity, cause and fix;
- :mod:`.roles`: the roles of the EAGLE-3 data path (``draft.fc``, ``target.layer[k]``);
- :mod:`.engines`: what each engine release's draft class expects of a checkpoint;
  :mod:`.vllm`: what vLLM's releases do with a draft; :mod:`.draft_classes`: the class
  SGLang builds for a checkpoint's architectures;
- :mod:`.acceptance`: the mean accept length and the collapse thresholds.
"""
