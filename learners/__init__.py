"""Model code of the learners: the multi-adapter LoRA layer, PEFT import/export, the policy-gradient loss,
per-adapter optimizers, batching, and the frozen base shared between processes. No Ray in here."""
