"""The adapter rules the registry and the replica share: what a PEFT LoRA folder must hold to be served.

One implementation, imported by both doors, so an artifact the registry accepts is one the replica serves
and a rejection carries the same code on both sides (errors.RejectCode):

- peft_config: the adapter_config.json fields that are served and what they mean (rank, alpha, rsLoRA
  scaling, rank_pattern / alpha_pattern, target modules); every other feature must be off;
- patterns: PEFT's module-name matching, limited to a regex subset whose cost is bounded;
- safetensors_header: the bounded, strict parse of the weights file's header;
- lora_tensors: tensor names, shapes and ranks against the base and the config;
- finite: NaN/Inf by bit pattern;
- caps: the byte caps on the two files;
- artifact: the checks in their one order, for a whole artifact.

Torch-free: the replica turns the checked plan into tensors itself.
"""
