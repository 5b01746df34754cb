"""Population machinery with no Ray in it: LoRA weight-space operators, the TrueSkill/PFSP league, replacement.

- ``evolution.adapter_slots``: the (layer, module) slots of a PEFT LoRA state dict.
- ``evolution.thin_svd``: SVD of s B A from the factors, O((d_in + d_out) r^2).
- ``evolution.operators``: ``MUTATIONS`` and ``CROSSOVERS`` that make same-rank children.
- ``evolution.shards``: their per-slot phases split over the CPU's threads; ``evolution.heap``: malloc settings.
- ``evolution.league``: TrueSkill ratings, win probabilities, PFSP matching, decayed win rates.
- ``evolution.replacement``: who is replaced, by which child of which parents, and the lineage.
"""
